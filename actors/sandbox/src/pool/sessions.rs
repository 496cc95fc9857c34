//! The sessions a pool holds: opening one (warm or new, claimed in the registry), admitting
//! it, the sweep of idle and taken-over ones, and their removal.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::FutureExt;
use tokio::sync::OnceCell;
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::{Account, NodeId, ToolError};

use crate::admission::{self, Admission, Held, Limits, Snapshot};
use crate::backend::SandboxRef;
use crate::mirror::Mirror;
use crate::pool::error::PoolError;
use crate::pool::folders::remove_folder_of;
use crate::pool::session::{OpenError, Session, SessionClaim, SessionKey, SessionUse};
use crate::pool::state::{new_sandbox_id, Busy, Pool, Reservation};
use crate::registry::{Claim, Claimant};
use crate::tasks::TaskTable;
use crate::templates::Template;

impl Pool {
    /// Opens the session's sandbox here: the local one, or a new one of `template` (warm if
    /// one is ready) claimed in the registry. `replacing`: the holder the caller found gone.
    /// A local one of another template (two first calls racing) is `conflict`.
    pub async fn open(
        self: &Arc<Self>,
        key: &SessionKey,
        replacing: Option<&NodeId>,
        template: &Arc<Template>,
    ) -> Result<SessionUse, OpenError> {
        let cell = {
            let mut sessions = self.sessions.lock().expect("sessions lock");
            sessions.entry(key.clone()).or_default().clone()
        };
        // Counts the creation until the session is in its cell (or it failed).
        let mut reservation = None;
        let result = cell
            .get_or_try_init(|| {
                self.create_session(key, replacing, &cell, template, &mut reservation)
            })
            .await
            .cloned();
        drop(reservation);
        match result {
            Ok(session) if session.template.name != template.name => Err(OpenError::Failed(
                crate::templates::bound_elsewhere(&session.template.name, &template.name),
            )),
            Ok(session) => {
                session.active.fetch_add(1, Ordering::AcqRel);
                Ok(SessionUse(session))
            }
            Err(e) => {
                // Leave no empty cell behind (unless a concurrent call filled it meanwhile).
                let mut sessions = self.sessions.lock().expect("sessions lock");
                if sessions.get(key).is_some_and(|c| !c.initialized()) {
                    sessions.remove(key);
                }
                Err(e)
            }
        }
    }

    async fn create_session(
        self: &Arc<Self>,
        key: &SessionKey,
        replacing: Option<&NodeId>,
        cell: &Arc<OnceCell<Arc<Session>>>,
        template: &Arc<Template>,
        reservation: &mut Option<Reservation>,
    ) -> Result<Arc<Session>, OpenError> {
        *reservation = Some(self.admit(&key.0)?);
        // The claim names the warm sandbox this session gets or the id of the one created
        // for it once the claim holds (callers skip the registry lookup for a new session, so
        // it may find the session held elsewhere).
        self.used
            .lock()
            .expect("used lock")
            .insert(template.name.clone());
        let warm = self
            .warm
            .lock()
            .expect("warm lock")
            .get_mut(&template.name)
            .and_then(VecDeque::pop_front);
        let (sandbox, claim) = match warm {
            // The session gets the started sandbox at once and its claim settles meanwhile
            // (a Redis round trip beside the first command's exec creation, not before it).
            Some(sandbox) => {
                let claim = self.claim_in_background(key, replacing, &sandbox, cell, template);
                (sandbox, claim)
            }
            None => {
                let sandbox_id = new_sandbox_id();
                self.claim(key, replacing, &sandbox_id).await?;
                let sandbox = match self.create_sandbox(sandbox_id, template).await {
                    // Shutdown runs once every call has been answered: this session is in
                    // the pool by then.
                    Ok((sandbox, _busy)) => sandbox,
                    Err(e) => {
                        if let Err(e) = self.registry.release(key, &self.settings.node).await {
                            tracing::warn!(error = %DisplayChain(&e), "cannot release a session whose sandbox was not made");
                        }
                        return Err(e.into());
                    }
                };
                (sandbox, futures::future::ready(Ok(())).boxed().shared())
            }
        };
        let (account, session_id) = key;
        let mirror = Mirror::new(
            self.sync.clone(),
            account.clone(),
            session_id.clone(),
            sandbox.workspace_dir.clone(),
            self.settings.sync_limits,
        );
        tracing::info!(
            account = %account,
            session = %session_id,
            sandbox = %sandbox.sandbox_id,
            template = %template.name,
            "session sandbox ready"
        );
        let now = toolmesh_kernel::time::now_ms();
        Ok(Arc::new(Session {
            account: account.clone(),
            session_id: session_id.clone(),
            sandbox,
            template: template.clone(),
            created_at_ms: now,
            last_used: Mutex::new((Instant::now(), now)),
            mirror: tokio::sync::Mutex::new(mirror),
            tasks: TaskTable::default(),
            active: AtomicUsize::new(0),
            claim,
        }))
    }

    /// Claims `key` in the registry for this worker and `sandbox_id`.
    async fn claim(
        &self,
        key: &SessionKey,
        replacing: Option<&NodeId>,
        sandbox_id: &str,
    ) -> Result<(), OpenError> {
        let by = Claimant {
            node: &self.settings.node,
            sandbox_id,
            replacing,
        };
        match self.registry.claim(key, &by).await {
            Ok(Claim::Taken) => Ok(()),
            Ok(Claim::HeldBy(node)) => Err(OpenError::HeldBy(node)),
            Err(e) => Err(e.into()),
        }
    }

    /// Claims `key` for the warm `sandbox` in a task of its own (it settles even if the call
    /// that opened the session is dropped). A lost claim takes the session's cell out of the
    /// pool and puts the sandbox back among the warm ones: whoever awaits the claim runs
    /// nothing in it.
    fn claim_in_background(
        self: &Arc<Self>,
        key: &SessionKey,
        replacing: Option<&NodeId>,
        sandbox: &SandboxRef,
        cell: &Arc<OnceCell<Arc<Session>>>,
        template: &Template,
    ) -> SessionClaim {
        let (pool, key, replacing) = (self.clone(), key.clone(), replacing.cloned());
        let template = template.name.clone();
        let (sandbox, cell) = (sandbox.clone(), cell.clone());
        let task = tokio::spawn(async move {
            let claimed = pool
                .claim(&key, replacing.as_ref(), &sandbox.sandbox_id)
                .await;
            if claimed.is_err() {
                {
                    let mut sessions = pool.sessions.lock().expect("sessions lock");
                    if sessions.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                        sessions.remove(&key);
                    }
                }
                pool.give_back(sandbox, &template).await;
            }
            claimed
        });
        async move {
            task.await.unwrap_or_else(|e| {
                Err(OpenError::Failed(
                    PoolError::Task {
                        what: "the session's registry claim failed",
                        source: e,
                    }
                    .into(),
                ))
            })
        }
        .boxed()
        .shared()
    }

    /// A sandbox taken for a claim that failed goes back to the warm pool (nothing ran in
    /// it), or away once the pool has shut down.
    async fn give_back(&self, sandbox: SandboxRef, template: &str) {
        let id = sandbox.sandbox_id.clone();
        self.warm
            .lock()
            .expect("warm lock")
            .entry(template.to_owned())
            .or_default()
            .push_front(sandbox);
        if self.closed.load(Ordering::Acquire) {
            // Shut down meanwhile: take it out again unless the shutdown's drain did.
            let taken = {
                let mut warm = self.warm.lock().expect("warm lock");
                warm.get_mut(template).and_then(|warm| {
                    let at = warm.iter().position(|s| s.sandbox_id == id);
                    at.and_then(|i| warm.remove(i))
                })
            };
            if let Some(sandbox) = taken {
                self.discard(&sandbox).await;
            }
        }
    }

    /// Admits a new session of `account` ([`crate::admission`]) and counts it as being created
    /// until the returned reservation drops. A session that makes room leaves the pool at once
    /// and its sandbox is removed in the background (a container removal takes tens of
    /// milliseconds, which the new session should not wait for).
    fn admit(self: &Arc<Self>, account: &Account) -> Result<Reservation, ToolError> {
        let mut sessions = self.sessions.lock().expect("sessions lock");
        let mut creating = self.creating.lock().expect("creating lock");
        let snapshot = Snapshot {
            held: sessions
                .iter()
                .filter_map(|(key, cell)| cell.get().map(|s| (key, s)))
                .map(|(key, s)| Held {
                    key: key.clone(),
                    account: s.account.clone(),
                    last_used: s.last_used().0,
                    evictable: !s.busy() && s.claim_held(),
                })
                .collect(),
            creating: creating.clone(),
        };
        let limits = Limits {
            max_sessions: self.settings.max_sessions,
            per_account: self.settings.max_sessions_per_account,
        };
        match admission::admit(account, &snapshot, limits) {
            Admission::Admit => {}
            Admission::Evict(key) => {
                // Out of the count at once, under the same lock that found it idle.
                let cell = sessions.remove(&key).expect("a session of the snapshot");
                let session = cell.get().expect("a held session").clone();
                tracing::info!(
                    sandbox = %session.sandbox.sandbox_id,
                    account = %session.account,
                    for_account = %account,
                    "evicting an idle session to make room"
                );
                // Counted even while shutting down: shutdown waits for it.
                self.enter();
                let pool = self.clone();
                tokio::spawn(async move {
                    let _busy = Busy(&pool);
                    pool.remove(&key, &session).await;
                });
            }
            Admission::Refuse(refusal) => {
                tracing::debug!(account = %account, refusal = %refusal, "new session refused");
                return Err(refusal.into_tool_error(&self.settings.node));
            }
        }
        *creating.entry(account.clone()).or_default() += 1;
        Ok(Reservation {
            pool: self.clone(),
            account: account.clone(),
        })
    }

    /// Drops a session whose sandbox died under it (the backend answered `Gone`: its container
    /// was removed, or a command killed a process sandbox's spawner), so that the next call of
    /// the session creates a new one, as the `unavailable` reply says.
    pub async fn remove_gone(&self, session: &Session) {
        let key: SessionKey = (session.account.clone(), session.session_id.clone());
        let held = {
            let sessions = self.sessions.lock().expect("sessions lock");
            sessions
                .get(&key)
                .and_then(|c| c.get())
                .filter(|s| std::ptr::eq(Arc::as_ptr(s), session))
                .cloned()
        };
        if let Some(held) = held {
            tracing::warn!(sandbox = %session.sandbox.sandbox_id, "the session's sandbox is gone; removing it");
            self.remove(&key, &held).await;
        }
    }

    pub(super) async fn remove(&self, key: &SessionKey, session: &Arc<Session>) {
        {
            let mut sessions = self.sessions.lock().expect("sessions lock");
            if sessions
                .get(key)
                .and_then(|c| c.get())
                .is_some_and(|s| Arc::ptr_eq(s, session))
            {
                sessions.remove(key);
            }
        }
        // The registry first: the session's next call may then claim it anew (here or
        // elsewhere) while the old sandbox goes, and a claim made meanwhile is not released.
        if let Err(e) = self
            .registry
            .release(&session.key(), &self.settings.node)
            .await
        {
            tracing::warn!(error = %DisplayChain(&e), sandbox = %session.sandbox.sandbox_id, "cannot release a removed session in the registry");
        }
        session.tasks.kill_all().await;
        if let Err(e) = self.backend.destroy(&session.sandbox).await {
            tracing::warn!(error = %e, sandbox = %session.sandbox.sandbox_id, "cannot remove a sandbox");
        }
        self.forget_egress(&session.sandbox.sandbox_id);
        remove_folder_of(&session.sandbox).await;
        tracing::info!(sandbox = %session.sandbox.sandbox_id, "session sandbox removed");
    }

    /// One sweep: removes sessions idle past the TTL, keeps the registry entries of the others
    /// alive, and drops sessions another worker has taken over.
    pub async fn sweep(&self) {
        let all = self.settled_sessions();
        for (key, session) in all {
            match session.claim.peek() {
                // On its way: its first call settles it.
                None => continue,
                // Lost, yet still here: only when the claim's task died before it could put
                // the session away (a lost claim normally takes it out of the pool).
                Some(Err(_)) => {
                    self.remove(&key, &session).await;
                    continue;
                }
                Some(Ok(())) => {}
            }
            let idle = session.last_used().0.elapsed();
            if idle >= session.template.idle_ttl && !session.busy() {
                self.remove(&key, &session).await;
                continue;
            }
            match self
                .registry
                .touch(&session.key(), &self.settings.node)
                .await
            {
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(error = %DisplayChain(&e), sandbox = %session.sandbox.sandbox_id, "cannot keep a session's registry entry alive");
                }
                Ok(false) if !session.busy() => {
                    tracing::warn!(sandbox = %session.sandbox.sandbox_id, "another worker took this session over; removing the sandbox here");
                    self.remove(&key, &session).await;
                }
                Ok(false) => {}
            }
        }
    }
}
