//! The caps that cut a stream's kept text, and the shared [`Quota`]s a task's spools take from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The cap that cut a stream's kept text first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// One stream's cap (`TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES`).
    Stream,
    /// Unread background-task output one session keeps (`TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES`).
    Session,
    /// Unread background-task output one worker keeps (`TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES`).
    Worker,
    /// The workspace did not take a part handed to it (its text and what followed are lost).
    Workspace,
}

impl Cap {
    pub fn as_str(self) -> &'static str {
        match self {
            Cap::Stream => "stream",
            Cap::Session => "session",
            Cap::Worker => "worker",
            Cap::Workspace => "workspace",
        }
    }
}

/// Bytes of spooled text several streams share (a session's tasks, a worker's tasks). A
/// stream takes from it what it keeps and gives it back when its spool file goes.
#[derive(Debug)]
pub struct Quota {
    pub(super) cap: Cap,
    pub(super) limit: u64,
    used: AtomicU64,
    /// Told whenever a take leaves more than half of it taken.
    pressed: tokio::sync::Notify,
}

impl Quota {
    pub fn new(cap: Cap, limit: u64) -> Arc<Self> {
        Arc::new(Self {
            cap,
            limit,
            used: AtomicU64::new(0),
            pressed: tokio::sync::Notify::new(),
        })
    }

    /// Resolves at the next take that leaves more than half of it taken.
    pub fn pressed(&self) -> tokio::sync::futures::Notified<'_> {
        self.pressed.notified()
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn is_full(&self) -> bool {
        self.used() >= self.limit
    }

    /// More than half of it is taken: spools that can hand text to the workspace do.
    pub(super) fn is_pressed(&self) -> bool {
        self.used() > self.limit / 2
    }

    /// Takes up to `want` bytes; how many it got.
    pub(super) fn take(&self, want: u64) -> u64 {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let got = want.min(self.limit.saturating_sub(used));
            if got == 0 {
                return 0;
            }
            match self.used.compare_exchange_weak(
                used,
                used + got,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if used + got > self.limit / 2 {
                        self.pressed.notify_waiters();
                    }
                    return got;
                }
                Err(now) => used = now,
            }
        }
    }

    pub(super) fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Takes `want` bytes from every quota of `quotas`: as many as all of them have, and the cap
/// of the first one short.
pub(super) fn take_all(quotas: &[Arc<Quota>], want: u64) -> (u64, Option<Cap>) {
    let mut got = want;
    let mut short = None;
    for (i, quota) in quotas.iter().enumerate() {
        let this = quota.take(got);
        if this < got {
            short = short.or(Some(quota.cap));
            for earlier in &quotas[..i] {
                earlier.give(got - this);
            }
            got = this;
        }
    }
    (got, short)
}
