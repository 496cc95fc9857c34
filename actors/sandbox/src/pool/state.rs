//! The pool's state ([`Pool`], [`PoolSettings`]) and its bookkeeping: creations and
//! evictions in flight, admitted sessions being created, egress taps, the worker's folder.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OnceCell, Semaphore};
use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::{Account, ErrorCode, NodeId, ToolError};

use crate::backend::{Backend, BackendError, SandboxRef};
use crate::egress::SandboxEgress;
use crate::mirror::SyncLimits;
use crate::network::{DecisionListener, DecisionTap};
use crate::pool::error::PoolError;
use crate::pool::session::{Session, SessionKey, SessionUse};
use crate::registry::SessionRegistry;
use crate::templates::Templates;

/// What the pool is configured with.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub node: NodeId,
    /// This worker's sandboxes live under `<dir>/<node>/<sandbox_id>/workspace`.
    pub dir: PathBuf,
    /// What sandboxes are made from: limits, image, runtime, network, warm pool, idle TTL.
    pub templates: Templates,
    pub max_sessions: usize,
    /// Sessions one account holds here at most (`TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT`).
    pub max_sessions_per_account: usize,
    /// The default template's idle TTL: the housekeeping's pace and the registry's lease.
    pub idle_ttl: Duration,
    pub concurrency: usize,
    pub sync_limits: SyncLimits,
    /// Each sandbox's own disk (`TOOLMESH_SANDBOX_DISK_MB`, [`crate::disk`]): its folder is
    /// the mount point of an image of `disk.mb` MiB. 0: a plain folder.
    pub disk: crate::disk::DiskPlan,
    /// The node's metrics: each egress decision of a sandbox counts there.
    pub metrics: toolmesh_kernel::metrics::Metrics,
}

pub struct Pool {
    pub backend: Arc<dyn Backend>,
    pub settings: PoolSettings,
    pub(super) registry: SessionRegistry,
    pub(super) sync: WorkspaceSync,
    pub(super) sessions: Mutex<HashMap<SessionKey, Arc<OnceCell<Arc<Session>>>>>,
    /// New sessions admitted and being created, by account ([`Reservation`]); locked after
    /// `sessions`.
    pub(super) creating: Mutex<HashMap<Account, usize>>,
    /// Started sandboxes ready for new sessions, by template.
    pub(super) warm: Mutex<HashMap<String, VecDeque<SandboxRef>>>,
    /// Warm sandboxes being created, by template (they count towards its warm pool's size).
    pub(super) warming: Mutex<HashMap<String, usize>>,
    /// Templates a session of this worker has used: their warm pools are kept filled.
    pub(super) used: Mutex<HashSet<String>>,
    /// Sandbox creations and evictions in flight ([`Busy`]); shutdown waits until none is
    /// left, told by `idle`.
    pub(super) busy: AtomicUsize,
    pub(super) idle: tokio::sync::Notify,
    /// Set by [`Pool::shutdown`]: no new sandboxes, and one finished meanwhile is removed.
    pub(super) closed: std::sync::atomic::AtomicBool,
    /// This worker's folder of the sandbox directory exists, private
    /// ([`crate::backend::make_private`]).
    pub(super) node_dir_made: OnceCell<()>,
    /// Commands running at once on this worker; a fair semaphore, so waiting calls are served
    /// in arrival order.
    pub permits: Arc<Semaphore>,
    /// The worker's egress proxy, when a template has `network = "allow"` ([`Pool::set_egress`]).
    pub(super) egress: Mutex<Option<Arc<SandboxEgress>>>,
    /// Where the egress decisions of each sandbox registered with the proxy go, by sandbox id.
    pub(super) taps: Mutex<HashMap<String, Arc<DecisionTap>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("node", &self.settings.node)
            .finish_non_exhaustive()
    }
}

pub fn backend_error(e: BackendError) -> ToolError {
    match e {
        BackendError::Unavailable(message) => ToolError::new(ErrorCode::Unavailable, message),
        BackendError::MissingProgram(message) => {
            ToolError::new(ErrorCode::InvalidArguments, message)
        }
        BackendError::Gone(id) => ToolError::new(
            ErrorCode::Unavailable,
            format!("sandbox {id} is gone; repeat the call and a new one is created"),
        ),
        BackendError::Failed(message) => ToolError::internal(message),
    }
}

/// One sandbox creation or eviction in flight, counted until dropped: [`Pool::shutdown`] waits
/// for every one, and a creation holds it until its sandbox is where shutdown finds it (the
/// warm pool or a session).
pub(super) struct Busy<'a>(pub(super) &'a Pool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// A new session admitted and being created ([`Pool::admit`]): it counts towards the caps
/// until dropped, once the session is in its cell or its creation failed.
pub(super) struct Reservation {
    pub(super) pool: Arc<Pool>,
    pub(super) account: Account,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut creating = self.pool.creating.lock().expect("creating lock");
        if let Some(n) = creating.get_mut(&self.account) {
            *n -= 1;
            if *n == 0 {
                creating.remove(&self.account);
            }
        }
    }
}

pub(super) fn shutting_down() -> ToolError {
    ToolError::new(
        ErrorCode::Unavailable,
        "this sandbox worker is shutting down; retry and another takes the call",
    )
}

/// How every sandbox id (and so its folder's name) starts.
pub(super) const SANDBOX_ID_PREFIX: &str = "sbx-";

pub(super) fn new_sandbox_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{SANDBOX_ID_PREFIX}{}", &id[..16])
}

impl Pool {
    pub fn new(
        backend: Arc<dyn Backend>,
        settings: PoolSettings,
        registry: SessionRegistry,
        sync: WorkspaceSync,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(settings.concurrency.max(1)));
        Self {
            backend,
            settings,
            registry,
            sync,
            sessions: Mutex::new(HashMap::new()),
            creating: Mutex::new(HashMap::new()),
            warm: Mutex::new(HashMap::new()),
            warming: Mutex::new(HashMap::new()),
            used: Mutex::new(HashSet::new()),
            busy: AtomicUsize::new(0),
            idle: tokio::sync::Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            node_dir_made: OnceCell::new(),
            permits,
            egress: Mutex::new(None),
            taps: Mutex::new(HashMap::new()),
        }
    }

    /// Gives the pool the worker's egress proxy, before the first sandbox of a template with
    /// `network = "allow"` is made.
    pub fn set_egress(&self, egress: SandboxEgress) {
        *self.egress.lock().expect("egress lock") = Some(Arc::new(egress));
    }

    /// The egress decisions of `sandbox_id` while the returned listener lives; `None` when the
    /// sandbox does not use the proxy.
    pub fn decisions_of(&self, sandbox_id: &str) -> Option<DecisionListener> {
        let tap = self
            .taps
            .lock()
            .expect("taps lock")
            .get(sandbox_id)
            .cloned();
        tap.map(|tap| tap.listen())
    }

    /// Ends `sandbox_id`'s use of the egress proxy (nothing when it had none).
    pub(super) fn forget_egress(&self, sandbox_id: &str) {
        if self
            .taps
            .lock()
            .expect("taps lock")
            .remove(sandbox_id)
            .is_none()
        {
            return;
        }
        if let Some(egress) = self.egress.lock().expect("egress lock").as_ref() {
            egress.unregister(sandbox_id);
        }
    }

    /// This deployment's scope label: the sandbox directory, shared by the workers of one
    /// cluster on a host and different between clusters.
    pub fn scope(&self) -> String {
        self.settings.dir.display().to_string()
    }

    /// This worker's folder of the sandbox directory: `<dir>/<node>`.
    pub fn node_dir(&self) -> PathBuf {
        self.settings.dir.join(self.settings.node.as_str())
    }

    /// Counts a creation or eviction in flight; `None` (and nothing counted) once shutdown
    /// began. Sequentially consistent with [`Pool::shutdown`]'s store of `closed`: either
    /// shutdown sees the count, or this sees `closed`.
    pub(super) fn begin(&self) -> Option<Busy<'_>> {
        self.enter();
        let busy = Busy(self);
        (!self.closed.load(Ordering::SeqCst)).then_some(busy)
    }

    pub(super) fn enter(&self) {
        self.busy.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn leave(&self) {
        if self.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until no creation or eviction is in flight.
    pub(super) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.busy.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Makes this worker's folder (once): private to the worker and the backend's sandbox
    /// group ([`crate::backend::make_private`]).
    pub(super) async fn node_dir_ready(&self) -> Result<(), ToolError> {
        self.node_dir_made
            .get_or_try_init(|| async {
                let (dir, group) = (self.node_dir(), self.backend.sandbox_group());
                tokio::task::spawn_blocking(move || {
                    crate::backend::make_private(&dir, group)
                        .map_err(|source| PoolError::NodeDir { dir, source })
                })
                .await
                .map_err(|source| PoolError::Task {
                    what: "preparing the sandbox folder",
                    source,
                })?
                .map_err(ToolError::from)
            })
            .await
            .map(drop)
    }

    pub fn registry(&self) -> &SessionRegistry {
        &self.registry
    }

    pub fn sync(&self) -> &WorkspaceSync {
        &self.sync
    }

    /// Sessions held here.
    pub fn in_use(&self) -> usize {
        self.sessions
            .lock()
            .expect("sessions lock")
            .values()
            .filter(|cell| cell.initialized())
            .count()
    }

    /// Sessions held here, by template.
    pub fn in_use_by_template(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for cell in self.sessions.lock().expect("sessions lock").values() {
            if let Some(session) = cell.get() {
                *counts.entry(session.template.name.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// The sessions this worker holds, with their keys; not those still being created.
    pub(super) fn settled_sessions(&self) -> Vec<(SessionKey, Arc<Session>)> {
        let sessions = self.sessions.lock().expect("sessions lock");
        sessions
            .iter()
            .filter_map(|(k, c)| c.get().map(|s| (k.clone(), s.clone())))
            .collect()
    }

    /// The session's sandbox if this worker holds it.
    pub fn local(&self, key: &SessionKey) -> Option<SessionUse> {
        let sessions = self.sessions.lock().expect("sessions lock");
        let session = sessions.get(key)?.get()?.clone();
        session.active.fetch_add(1, Ordering::AcqRel);
        Some(SessionUse(session))
    }
}
