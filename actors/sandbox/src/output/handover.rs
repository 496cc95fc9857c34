//! Hands a task's spooled text to its session's workspace, one part at a time.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use toolmesh_kernel::ids::{Account, SessionId};
use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::ToolError;

/// Parts on their way to workspaces at once, per worker: each holds a put's part in memory
/// on a blocking thread, and concurrent ones multiply the allocator arenas the worker keeps
/// (four at once grew a worker by over 100 MiB where one stays flat).
pub const MAX_HANDOVERS: usize = 1;

/// Puts the first `bytes` of a spool file at a workspace-relative path.
pub type PutPart = Arc<
    dyn Fn(String, u64, Arc<std::fs::File>) -> BoxFuture<'static, Result<(), ToolError>>
        + Send
        + Sync,
>;

/// Hands a task's spooled text to its session's workspace, one part at a time per task (the
/// settings of both its streams share one `Handover`). Each part is a file
/// `.toolmesh/outputs/<label>-part-<n>.txt`, `n` counting the task's parts.
#[derive(Clone)]
pub struct Handover {
    pub(super) put: PutPart,
    pub(super) slot: Arc<Semaphore>,
    pub(super) next: Arc<AtomicU64>,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("busy", &(self.slot.available_permits() == 0))
            .finish_non_exhaustive()
    }
}

impl Handover {
    pub fn new(put: PutPart) -> Self {
        Self {
            put,
            slot: Arc::new(Semaphore::new(1)),
            next: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The worker's [`MAX_HANDOVERS`] slots, shared by every task's `Handover`.
    pub fn worker_slots() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(MAX_HANDOVERS))
    }

    /// Parts go into the session's workspace through `put_from` (as over-budget outputs do),
    /// at most as many at once on the worker as `worker` has permits.
    pub fn to_workspace(
        sync: WorkspaceSync,
        account: Account,
        session: SessionId,
        worker: Arc<Semaphore>,
    ) -> Self {
        Self::new(Arc::new(move |path, bytes, file| {
            let (sync, account, session) = (sync.clone(), account.clone(), session.clone());
            let worker = worker.clone();
            async move {
                let _one_of_the_worker_s = worker.acquire_owned().await;
                sync.put_from(&account, &session, &path, bytes, file).await
            }
            .boxed()
        }))
    }

    /// Waits until no part of this task is on its way.
    pub async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slot.clone().acquire_owned().await.ok()
    }
}

/// A part of a stream's text in the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Workspace-relative.
    pub path: String,
    pub bytes: u64,
}
