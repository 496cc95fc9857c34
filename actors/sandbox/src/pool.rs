//! The pool of one worker: the sandboxes of the sessions it holds, a few started ones kept
//! warm for new sessions, and the cap on commands running at once.
//!
//! Each sandbox is made from a template ([`crate::templates`]); each template has a warm pool
//! of its own, filled only when the template declares `warm > 0` or once it has been used on
//! this worker ([`LAZY_WARM`] then, unless it declares `warm = 0`).
//!
//! Invariants:
//! * one sandbox per `(account, session)` on this worker; the registry says which worker;
//! * a session's sandbox is of one template for its whole life (a call naming another is
//!   refused `conflict` before it reaches the pool);
//! * a session's sandbox is created at most once at a time (a per-session `OnceCell`), so two
//!   first calls of one session racing each other share one sandbox;
//! * a sandbox leaves the pool only when no call and no background task uses it;
//! * nothing runs in a session's sandbox before its registry claim holds: a warm sandbox is
//!   handed to a new session at once with the claim still on its way ([`Session::claimed`]),
//!   so the first command's exec is created meanwhile, but it starts only once the claim holds;
//!   a lost claim puts the untouched sandbox back in the warm pool;
//! * a drain ([`Pool::shutdown`]) waits for every creation in flight, warm ones too, and removes
//!   what they made, then every sandbox and this worker's folder of the sandbox directory;
//! * a new session is admitted by [`crate::admission`] under the sessions lock, which also
//!   counts it from then until it is in its cell (`Reservation`): the per-account quota, and
//!   on a full worker the one session that makes room (the caller's own idle one first; never
//!   one with a running background task).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::{OnceCell, Semaphore};
use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::{Account, ErrorCode, NodeId, SessionId, ToolError};

use crate::admission::{self, Admission, Held, Limits, Snapshot};
use crate::backend::{Backend, BackendError, SandboxRef, SandboxSpec};
use crate::egress::SandboxEgress;
use crate::mirror::{Mirror, SyncLimits};
use crate::network::{DecisionListener, DecisionTap};
use crate::registry::{Claim, SessionRegistry};
use crate::tasks::TaskTable;
use crate::templates::{Template, Templates, LAZY_WARM};

/// `(account, session)`.
pub type SessionKey = (Account, SessionId);

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

/// One session's sandbox on this worker.
pub struct Session {
    pub account: Account,
    pub session_id: SessionId,
    pub sandbox: SandboxRef,
    /// What the sandbox was made from; the session is bound to it.
    pub template: Arc<Template>,
    pub created_at_ms: u64,
    last_used: Mutex<(Instant, u64)>,
    /// Pull before a command, push after; one sync at a time per session.
    pub mirror: tokio::sync::Mutex<Mirror>,
    pub tasks: TaskTable,
    active: AtomicUsize,
    /// The registry claim naming this worker and sandbox; settled from the start unless the
    /// session got a warm sandbox before its claim came back.
    claim: SessionClaim,
}

/// The outcome of a session's registry claim, awaited by everyone who uses the session.
type SessionClaim = Shared<BoxFuture<'static, Result<(), OpenError>>>;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("sandbox", &self.sandbox.sandbox_id)
            .finish_non_exhaustive()
    }
}

/// Holds a session busy (not reclaimable) while alive.
#[derive(Debug)]
pub struct SessionUse(Arc<Session>);

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
    fn touch(&self) {
        *self.last_used.lock().expect("session clock") =
            (Instant::now(), toolmesh_kernel::time::now_ms());
    }

    /// When it was last used: (monotonic, wall ms).
    pub fn last_used(&self) -> (Instant, u64) {
        *self.last_used.lock().expect("session clock")
    }

    fn busy(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0 || self.tasks.running() > 0
    }

    /// Waits for the session's registry claim: `Ok` once this worker holds the session, and
    /// at once when it already did. Nothing may run in the sandbox before.
    pub async fn claimed(&self) -> Result<(), OpenError> {
        self.claim.clone().await
    }

    /// The claim held (false while it is on its way or once it was lost).
    fn claim_held(&self) -> bool {
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

pub struct Pool {
    pub backend: Arc<dyn Backend>,
    pub settings: PoolSettings,
    registry: SessionRegistry,
    sync: WorkspaceSync,
    sessions: Mutex<HashMap<SessionKey, Arc<OnceCell<Arc<Session>>>>>,
    /// New sessions admitted and being created, by account ([`Reservation`]); locked after
    /// `sessions`.
    creating: Mutex<HashMap<Account, usize>>,
    /// Started sandboxes ready for new sessions, by template.
    warm: Mutex<HashMap<String, VecDeque<SandboxRef>>>,
    /// Warm sandboxes being created, by template (they count towards its warm pool's size).
    warming: Mutex<HashMap<String, usize>>,
    /// Templates a session of this worker has used: their warm pools are kept filled.
    used: Mutex<HashSet<String>>,
    /// Sandbox creations and evictions in flight ([`Busy`]); shutdown waits until none is
    /// left, told by `idle`.
    busy: AtomicUsize,
    idle: tokio::sync::Notify,
    /// Set by [`Pool::shutdown`]: no new sandboxes, and one finished meanwhile is removed.
    closed: std::sync::atomic::AtomicBool,
    /// This worker's folder of the sandbox directory exists, private
    /// ([`crate::backend::make_private`]).
    node_dir_made: OnceCell<()>,
    /// Commands running at once on this worker; a fair semaphore, so waiting calls are served
    /// in arrival order.
    pub permits: Arc<Semaphore>,
    /// The worker's egress proxy, when a template has `network = "allow"` ([`Pool::set_egress`]).
    egress: Mutex<Option<Arc<SandboxEgress>>>,
    /// Where the egress decisions of each sandbox registered with the proxy go, by sandbox id.
    taps: Mutex<HashMap<String, Arc<DecisionTap>>>,
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

/// How long a folder of the sandbox directory whose node is not in the cluster view stays
/// untouched before it is reaped: a worker that has just started makes its folder before the
/// others hear its first heartbeat.
pub const DEAD_FOLDER_AGE: Duration = Duration::from_secs(60);

/// One sandbox creation or eviction in flight, counted until dropped: [`Pool::shutdown`] waits
/// for every one, and a creation holds it until its sandbox is where shutdown finds it (the
/// warm pool or a session).
struct Busy<'a>(&'a Pool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// A new session admitted and being created ([`Pool::admit`]): it counts towards the caps
/// until dropped, once the session is in its cell or its creation failed.
struct Reservation {
    pool: Arc<Pool>,
    account: Account,
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

fn shutting_down() -> ToolError {
    ToolError::new(
        ErrorCode::Unavailable,
        "this sandbox worker is shutting down; retry and another takes the call",
    )
}

/// How every sandbox id (and so its folder's name) starts.
const SANDBOX_ID_PREFIX: &str = "sbx-";

fn new_sandbox_id() -> String {
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
    fn forget_egress(&self, sandbox_id: &str) {
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

    /// [`Backend::reap_orphans`] in this pool's scope, logged (a failure only delays it), and
    /// the same for the folders of the sandbox directory: with no `live_nodes` (at start),
    /// `this_node`'s own, which its previous run left; given them, each node's folder whose
    /// node is not live and that nothing touched for [`DEAD_FOLDER_AGE`] (never this
    /// worker's own).
    pub async fn reap_orphans(&self, this_node: &str, live_nodes: Option<&[String]>) {
        let previous_run = live_nodes.is_none();
        match self
            .backend
            .reap_orphans(&self.scope(), this_node, live_nodes)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, previous_run, "removed orphaned sandboxes"),
            Err(e) => {
                tracing::warn!(error = %e, previous_run, "cannot look for orphaned sandboxes")
            }
        }
        let dir = self.settings.dir.clone();
        let own = self.settings.node.as_str().to_owned();
        let (this_node, live) = (this_node.to_owned(), live_nodes.map(<[String]>::to_vec));
        let reaped = tokio::task::spawn_blocking(move || {
            reap_folders(&dir, &own, &this_node, live.as_deref())
        })
        .await;
        match reaped {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(
                removed = n,
                previous_run,
                "removed orphaned sandbox folders"
            ),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, previous_run, "cannot look for orphaned sandbox folders")
            }
            Err(e) => tracing::warn!(error = %e, "the sandbox folder reaper failed"),
        }
        if !previous_run {
            self.reap_own_folders().await;
        }
    }

    /// Removes the sandbox folders in this worker's own folder that no sandbox of the pool
    /// holds and that nothing touched for [`DEAD_FOLDER_AGE`]: those whose removal failed
    /// (logged when it did). Not while a creation or an eviction is in flight: a sandbox being
    /// made or removed is in no list (one made after the look is younger than the age).
    async fn reap_own_folders(&self) {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return;
        }
        let mut held: HashSet<String> = self
            .warm
            .lock()
            .expect("warm lock")
            .values()
            .flatten()
            .map(|s| s.sandbox_id.clone())
            .collect();
        held.extend(
            self.sessions
                .lock()
                .expect("sessions lock")
                .values()
                .filter_map(|c| c.get().map(|s| s.sandbox.sandbox_id.clone())),
        );
        let dir = self.node_dir();
        let reaped = tokio::task::spawn_blocking(move || reap_sandbox_folders(&dir, &held)).await;
        match reaped {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "removed sandbox folders left behind"),
            Err(e) => tracing::warn!(error = %e, "the sandbox folder reaper failed"),
        }
    }

    /// This worker's folder of the sandbox directory: `<dir>/<node>`.
    pub fn node_dir(&self) -> PathBuf {
        self.settings.dir.join(self.settings.node.as_str())
    }

    /// Counts a creation or eviction in flight; `None` (and nothing counted) once shutdown
    /// began. Sequentially consistent with [`Pool::shutdown`]'s store of `closed`: either
    /// shutdown sees the count, or this sees `closed`.
    fn begin(&self) -> Option<Busy<'_>> {
        self.enter();
        let busy = Busy(self);
        (!self.closed.load(Ordering::SeqCst)).then_some(busy)
    }

    fn enter(&self) {
        self.busy.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        if self.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until no creation or eviction is in flight.
    async fn wait_idle(&self) {
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
    async fn node_dir_ready(&self) -> Result<(), ToolError> {
        self.node_dir_made
            .get_or_try_init(|| async {
                let (dir, group) = (self.node_dir(), self.backend.sandbox_group());
                tokio::task::spawn_blocking(move || {
                    crate::backend::make_private(&dir, group).map_err(|e| {
                        ToolError::internal(format!("preparing {}: {e}", dir.display()))
                    })
                })
                .await
                .map_err(|e| ToolError::internal(format!("preparing the sandbox folder: {e}")))?
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

    /// The session's sandbox if this worker holds it.
    pub fn local(&self, key: &SessionKey) -> Option<SessionUse> {
        let sessions = self.sessions.lock().expect("sessions lock");
        let session = sessions.get(key)?.get()?.clone();
        session.active.fetch_add(1, Ordering::AcqRel);
        Some(SessionUse(session))
    }

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
                        let _ = self
                            .registry
                            .release(&key.0, &key.1, &self.settings.node)
                            .await;
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
        let node = &self.settings.node;
        match self
            .registry
            .claim(&key.0, &key.1, node, sandbox_id, replacing)
            .await
        {
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
                Err(OpenError::Failed(ToolError::internal(format!(
                    "the session's registry claim failed: {e}"
                ))))
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

    /// Creates a sandbox, counted as busy until the caller drops the returned guard (once the
    /// sandbox is where shutdown finds it).
    async fn create_sandbox(
        &self,
        sandbox_id: String,
        template: &Template,
    ) -> Result<(SandboxRef, Busy<'_>), ToolError> {
        let busy = self.begin().ok_or_else(shutting_down)?;
        self.node_dir_ready().await?;
        let folder = self.node_dir().join(&sandbox_id);
        self.attach_disk(&folder).await?;
        let egress = self.egress.lock().expect("egress lock").clone();
        let tap = DecisionTap::new(&sandbox_id, self.settings.metrics.clone());
        let network =
            match crate::network::network_of(template, egress.as_deref(), &sandbox_id, || {
                tap.on_decision()
            }) {
                Ok(network) => network,
                Err(e) => {
                    remove_folder(folder, "a sandbox folder").await;
                    return Err(ToolError::new(ErrorCode::Unavailable, e.to_string()));
                }
            };
        if network.registered {
            self.taps
                .lock()
                .expect("taps lock")
                .insert(sandbox_id.clone(), tap);
        }
        let spec = SandboxSpec {
            workspace_dir: folder.join("workspace"),
            sandbox_id,
            node_id: self.settings.node.as_str().to_owned(),
            scope: self.scope(),
            limits: crate::backend::SandboxLimits {
                network: network.mode,
                ..template.limits.clone()
            },
            image: Some(template.image.clone()),
            env: network.env,
        };
        let sandbox = match self.backend.create(&spec).await {
            Ok(sandbox) => sandbox,
            Err(e) => {
                self.forget_egress(&spec.sandbox_id);
                remove_folder(folder, "a sandbox folder").await;
                return Err(backend_error(e));
            }
        };
        if self.closed.load(Ordering::SeqCst) {
            // Finished after shutdown began, which removes only what it finds: this goes now.
            self.discard(&sandbox).await;
            return Err(shutting_down());
        }
        Ok((sandbox, busy))
    }

    /// Makes a sandbox's folder and, with a disk quota, mounts its own disk over it
    /// ([`crate::disk::attach`]), before the backend fills it.
    async fn attach_disk(&self, folder: &std::path::Path) -> Result<(), ToolError> {
        let (folder, group, mb) = (
            folder.to_owned(),
            self.backend.sandbox_group(),
            self.settings.disk.mb,
        );
        tokio::task::spawn_blocking(move || {
            crate::backend::make_private(&folder, group)?;
            if mb > 0 {
                if let Err(e) = crate::disk::attach(&folder, mb) {
                    let _ = std::fs::remove_dir(&folder);
                    return Err(e);
                }
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(|e| ToolError::internal(format!("preparing a sandbox's disk: {e}")))?
        .map_err(|e| ToolError::internal(format!("preparing a sandbox's disk: {e}")))
    }

    async fn discard(&self, sandbox: &SandboxRef) {
        let _ = self.backend.destroy(sandbox).await;
        self.forget_egress(&sandbox.sandbox_id);
        remove_folder_of(sandbox).await;
    }

    /// How many warm sandboxes of `template` this worker keeps: what it declares, else
    /// [`LAZY_WARM`] once a session here has used it (none before).
    pub fn warm_target(&self, template: &Template) -> usize {
        template.warm.unwrap_or_else(|| {
            if self
                .used
                .lock()
                .expect("used lock")
                .contains(&template.name)
            {
                LAZY_WARM
            } else {
                0
            }
        })
    }

    /// Warm sandboxes of `template` ready now.
    pub fn warm_ready(&self, template: &str) -> usize {
        self.warm
            .lock()
            .expect("warm lock")
            .get(template)
            .map_or(0, VecDeque::len)
    }

    /// Tops every template's warm pool up to its size (sandboxes being created count), one
    /// template after the other.
    pub async fn fill_warm(self: &Arc<Self>) {
        let templates: Vec<Arc<Template>> = self.settings.templates.iter().cloned().collect();
        for template in templates {
            self.fill_warm_of(&template).await;
        }
    }

    async fn fill_warm_of(self: &Arc<Self>, template: &Template) {
        let name = &template.name;
        loop {
            {
                let warming = self.warming.lock().expect("warming lock");
                let have = self.warm_ready(name) + warming.get(name.as_str()).copied().unwrap_or(0);
                if have >= self.warm_target(template) {
                    return;
                }
            }
            *self
                .warming
                .lock()
                .expect("warming lock")
                .entry(name.clone())
                .or_default() += 1;
            // Busy until it is in the warm pool, so that shutdown waits for it and then finds
            // it there (one finished after shutdown began is removed by `create_sandbox`).
            let created = match self.create_sandbox(new_sandbox_id(), template).await {
                Ok((sandbox, busy)) => {
                    self.warm
                        .lock()
                        .expect("warm lock")
                        .entry(name.clone())
                        .or_default()
                        .push_back(sandbox);
                    drop(busy);
                    Ok(())
                }
                Err(e) => Err(e),
            };
            if let Some(n) = self.warming.lock().expect("warming lock").get_mut(name) {
                *n -= 1;
            }
            if let Err(e) = created {
                tracing::warn!(error = %e, template = %name, "cannot create a warm sandbox");
                return;
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

    async fn remove(&self, key: &SessionKey, session: &Arc<Session>) {
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
        let _ = self
            .registry
            .release(&session.account, &session.session_id, &self.settings.node)
            .await;
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
        let all: Vec<(SessionKey, Arc<Session>)> = {
            let sessions = self.sessions.lock().expect("sessions lock");
            sessions
                .iter()
                .filter_map(|(k, c)| c.get().map(|s| (k.clone(), s.clone())))
                .collect()
        };
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
                .touch(&session.account, &session.session_id, &self.settings.node)
                .await
            {
                Ok(true) | Err(_) => {}
                Ok(false) if !session.busy() => {
                    tracing::warn!(sandbox = %session.sandbox.sandbox_id, "another worker took this session over; removing the sandbox here");
                    self.remove(&key, &session).await;
                }
                Ok(false) => {}
            }
        }
    }

    /// Removes every sandbox of this worker and its folder of the sandbox directory (drain).
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Creations in flight (warm ones, started at the worker's start) land first, in the
        // warm pool or removed by `create_sandbox`, and evicted sessions finish going; the
        // process may exit right after this returns. (The node's drain bounds the wait.)
        self.wait_idle().await;
        let all: Vec<(SessionKey, Arc<Session>)> = {
            let sessions = self.sessions.lock().expect("sessions lock");
            sessions
                .iter()
                .filter_map(|(k, c)| c.get().map(|s| (k.clone(), s.clone())))
                .collect()
        };
        for (key, session) in all {
            self.remove(&key, &session).await;
        }
        let warm: Vec<SandboxRef> = self
            .warm
            .lock()
            .expect("warm lock")
            .drain()
            .flat_map(|(_, warm)| warm)
            .collect();
        for sandbox in warm {
            self.discard(&sandbox).await;
        }
        let dir = self.node_dir();
        // What is left (a removal that failed) goes at the next start: see `reap_orphans`.
        remove_folder(dir, "this worker's sandbox folder").await;
        // The sandboxes are gone, so the egress network can go too. (A creation still holding
        // the proxy leaves the network to the next start's reaper.)
        let egress = self.egress.lock().expect("egress lock").take();
        if let Some(egress) = egress.and_then(Arc::into_inner) {
            egress.shutdown().await;
        }
    }
}

/// Removes a sandbox's folder (its workspace, skills and run directory), off the async threads.
/// A failure is logged and the folder left to the reaper ([`reap_own_folders`], every
/// minute), which tries again.
async fn remove_folder_of(sandbox: &SandboxRef) {
    let folder = sandbox
        .workspace_dir
        .parent()
        .unwrap_or(&sandbox.workspace_dir)
        .to_owned();
    remove_folder(folder, "a sandbox folder").await;
}

/// Unmounts the sandbox disks at or below `folder` (a removal must not walk into a mounted
/// disk), then removes it without recursion ([`crate::remove::remove_tree`]). Blocking.
fn remove_sandbox_tree(folder: &std::path::Path) -> std::io::Result<()> {
    crate::disk::unmount_below(folder)?;
    crate::remove::remove_tree(folder)
}

/// [`remove_sandbox_tree`] on a blocking thread; a failure is logged.
async fn remove_folder(folder: PathBuf, what: &'static str) {
    let path = folder.clone();
    let removed = tokio::task::spawn_blocking(move || remove_sandbox_tree(&path)).await;
    let error = match removed {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::warn!(folder = %folder.display(), error = %error, "cannot remove {what}; the reaper tries again");
}

/// Removes the sandbox folders (`sbx-…`) of the worker folder `dir` that are not `held` and
/// that nothing touched for [`DEAD_FOLDER_AGE`]; how many. Blocking.
fn reap_sandbox_folders(dir: &std::path::Path, held: &HashSet<String>) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(SANDBOX_ID_PREFIX)) else {
            continue;
        };
        if held.contains(name) || !untouched(&entry).unwrap_or(false) {
            continue;
        }
        removed += usize::from(reap(&entry.path(), "a sandbox folder left behind"));
    }
    removed
}

/// Whether nothing touched `entry` for [`DEAD_FOLDER_AGE`].
fn untouched(entry: &std::fs::DirEntry) -> std::io::Result<bool> {
    Ok(entry
        .metadata()?
        .modified()?
        .elapsed()
        .is_ok_and(|age| age >= DEAD_FOLDER_AGE))
}

/// [`remove_sandbox_tree`] of a folder a reaper found, `what` named in the log line of a
/// failure (the next sweep tries it again); whether it went. Blocking.
fn reap(folder: &std::path::Path, what: &str) -> bool {
    match remove_sandbox_tree(folder) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(folder = %folder.display(), error = %e, "cannot remove {what}");
            false
        }
    }
}

/// Removes the folders of `dir` that belong to nodes: `this_node`'s when `live` is `None`
/// (its previous run's), otherwise those of nodes not in `live` untouched for
/// [`DEAD_FOLDER_AGE`], never `own`'s. Returns how many. Blocking.
fn reap_folders(
    dir: &std::path::Path,
    own: &str,
    this_node: &str,
    live: Option<&[String]>,
) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        other => other?,
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // Node folders only: the staged spawners' folder starts with a dot, no node id does.
        if NodeId::parse(name.as_str()).is_err() || !entry.file_type()?.is_dir() {
            continue;
        }
        let orphan = match live {
            None => name == this_node,
            Some(live) => name != own && !live.contains(&name) && untouched(&entry)?,
        };
        if orphan {
            removed += usize::from(reap(&entry.path(), "an orphaned sandbox folder"));
        }
    }
    Ok(removed)
}
