//! Why the pool's own preparation failed ([`PoolError`]): the worker's folder, a sandbox's
//! folder and disk, and the tasks that do this work. None is a caller's fault: each is
//! `internal`.

use std::io;
use std::path::PathBuf;

use toolmesh_kernel::ToolError;

/// Why the pool could not prepare what a sandbox needs.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// This worker's folder could not be made private to it and the sandbox group.
    #[error("preparing {}: {source}", .dir.display())]
    NodeDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A sandbox's folder, or its own disk, could not be made.
    #[error("preparing a sandbox's disk: {0}")]
    Disk(#[source] io::Error),
    /// A task doing the pool's work panicked or was cancelled; `what` says which.
    #[error("{what}: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// `internal` with the sentence of the error; the log line keeps its cause.
impl From<PoolError> for ToolError {
    fn from(e: PoolError) -> Self {
        ToolError::internal_logged(&e, "the sandbox pool failed")
    }
}
