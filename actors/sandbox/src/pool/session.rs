//! One session's sandbox on this worker ([`Session`]), a use that holds it busy
//! ([`SessionUse`]), and why a session could not be opened ([`OpenError`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::{BoxFuture, Shared};
use toolmesh_kernel::{Account, ErrorCode, NodeId, SessionId, ToolError};

use crate::backend::SandboxRef;
use crate::mirror::Mirror;
use crate::tasks::TaskTable;
use crate::templates::Template;

/// `(account, session)`.
pub type SessionKey = (Account, SessionId);

/// One session's sandbox on this worker.
pub struct Session {
    pub account: Account,
    pub session_id: SessionId,
    pub sandbox: SandboxRef,
    /// What the sandbox was made from; the session is bound to it.
    pub template: Arc<Template>,
    pub created_at_ms: u64,
    pub(super) last_used: Mutex<(Instant, u64)>,
    /// Pull before a command, push after; one sync at a time per session.
    pub mirror: tokio::sync::Mutex<Mirror>,
    pub tasks: TaskTable,
    pub(super) active: AtomicUsize,
    /// The registry claim naming this worker and sandbox; settled from the start unless the
    /// session got a warm sandbox before its claim came back.
    pub(super) claim: SessionClaim,
}

/// The outcome of a session's registry claim, awaited by everyone who uses the session.
pub(super) type SessionClaim = Shared<BoxFuture<'static, Result<(), OpenError>>>;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("sandbox", &self.sandbox.sandbox_id)
            .finish_non_exhaustive()
    }
}

/// Holds a session busy (not reclaimable) while alive.
#[derive(Debug)]
pub struct SessionUse(pub(super) Arc<Session>);

impl std::ops::Deref for SessionUse {
    type Target = Arc<Session>;
    fn deref(&self) -> &Arc<Session> {
        &self.0
    }
}

impl Drop for SessionUse {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Session {
    /// Its `(account, session)`, as the registry knows it.
    pub fn key(&self) -> SessionKey {
        (self.account.clone(), self.session_id.clone())
    }

    pub(super) fn touch(&self) {
        *self.last_used.lock().expect("session clock") =
            (Instant::now(), toolmesh_kernel::time::now_ms());
    }

    /// When it was last used: (monotonic, wall ms).
    pub fn last_used(&self) -> (Instant, u64) {
        *self.last_used.lock().expect("session clock")
    }

    pub(super) fn busy(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0 || self.tasks.running() > 0
    }

    /// Waits for the session's registry claim: `Ok` once this worker holds the session, and
    /// at once when it already did. Nothing may run in the sandbox before.
    pub async fn claimed(&self) -> Result<(), OpenError> {
        self.claim.clone().await
    }

    /// The claim held (false while it is on its way or once it was lost).
    pub(super) fn claim_held(&self) -> bool {
        matches!(self.claim.peek(), Some(Ok(())))
    }
}

/// Why a session could not be opened here.
#[derive(Debug, Clone)]
pub enum OpenError {
    /// Another worker holds it (the registry said so when we tried to claim it).
    HeldBy(NodeId),
    Failed(ToolError),
}

impl From<ToolError> for OpenError {
    fn from(e: ToolError) -> Self {
        OpenError::Failed(e)
    }
}

impl From<OpenError> for ToolError {
    /// For a tool that finds its session's claim lost; the worker does not send this reply
    /// (nothing ran, so it places the call anew), but a tool must stop somehow.
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::HeldBy(node) => ToolError::new(
                ErrorCode::Unavailable,
                format!("the session is held by sandbox worker {node}"),
            ),
            OpenError::Failed(e) => e,
        }
    }
}
