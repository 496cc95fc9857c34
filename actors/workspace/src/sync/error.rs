//! Why a sync request, or one file or change of it, was refused or failed ([`SyncError`]),
//! and what each failure is on the wire.

use std::io;

use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::confine::{is_escape, ConfineError, Workspace, WorkspacePath};

/// Why a sync request, or one file or change of it, was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A path rule refused it (an argument, a path outside, a missing path), or the workspace
    /// could not be opened ([`crate::confine`]).
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// The request itself is wrong (an upload id, a part out of place).
    #[error("{0}")]
    Request(String),
    /// A put larger than the sync limit.
    #[error("'{path}' is {total} bytes, over the sync limit of {max}")]
    TooBig { path: String, total: u64, max: u64 },
    /// A part does not fit the upload staged so far.
    #[error("upload of '{path}': {source}")]
    Upload {
        path: String,
        #[source]
        source: io::Error,
    },
    /// The file system failed in a way no caller can fix.
    #[error("could not {op} '{path}' ({source})")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    /// The staging area failed in a way no caller can fix.
    #[error("could not stage '{path}' ({source})")]
    Stage {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the workspace: {0}")]
    OpenRoot(#[source] io::Error),
}

/// What kind of [`SyncError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncErrorKind {
    /// See [`ConfineError::kind`].
    Confine(crate::confine::ConfineErrorKind),
    /// `invalid_request`.
    Request,
    /// `limit_exceeded`.
    TooBig,
    /// `internal`.
    Internal,
}

impl SyncError {
    pub fn kind(&self) -> SyncErrorKind {
        match self {
            SyncError::Confine(e) => SyncErrorKind::Confine(e.kind()),
            SyncError::Request(_) | SyncError::Upload { .. } => SyncErrorKind::Request,
            SyncError::TooBig { .. } => SyncErrorKind::TooBig,
            SyncError::Io { .. } | SyncError::Stage { .. } | SyncError::OpenRoot(_) => {
                SyncErrorKind::Internal
            }
        }
    }
}

/// PROTOCOL.md's code and sentence, for a whole reply or one file's or change's failure; an
/// `internal` one logs its path and cause here.
impl From<SyncError> for ToolError {
    fn from(e: SyncError) -> Self {
        let code = match e.kind() {
            SyncErrorKind::Confine(_) => {
                let SyncError::Confine(e) = e else {
                    unreachable!("only Confine has a confine kind")
                };
                return e.into();
            }
            SyncErrorKind::Request => ErrorCode::InvalidRequest,
            SyncErrorKind::TooBig => ErrorCode::LimitExceeded,
            SyncErrorKind::Internal => {
                match &e {
                    SyncError::Io { op, path, source } => tracing::error!(
                        path = %DisplaySafe(path),
                        operation = op,
                        error = %DisplayChain(source),
                        "workspace sync file operation failed"
                    ),
                    SyncError::Stage { path, source } => tracing::error!(
                        path = %DisplaySafe(path),
                        error = %DisplayChain(source),
                        "workspace sync staging failed"
                    ),
                    _ => tracing::error!(error = %DisplayChain(&e), "workspace sync failed"),
                }
                ErrorCode::Internal
            }
        };
        ToolError::new(code, e.to_string())
    }
}

pub(super) fn argument(pointer: &str, message: impl Into<String>) -> SyncError {
    ConfineError::argument(pointer, message).into()
}

pub(super) fn request(message: impl Into<String>) -> SyncError {
    SyncError::Request(message.into())
}

/// The PROTOCOL.md code of an io error met on `path`.
pub(super) fn io_error(
    ws: &Workspace,
    path: &WorkspacePath,
    op: &'static str,
    e: io::Error,
) -> SyncError {
    if is_escape(&e) {
        return ConfineError::Outside(format!(
            "'{path}' leads outside the workspace through a symbolic link"
        ))
        .into();
    }
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => {
            ConfineError::NotFound(format!("'{path}' does not exist in the workspace")).into()
        }
        _ if e.raw_os_error() == Some(40) /* ELOOP: O_NOFOLLOW met a link */
            || is_symlink(ws, path) =>
        {
            argument(
                path.pointer(),
                format!("'{path}' is a symbolic link; sync never follows links"),
            )
        }
        _ => SyncError::Io {
            op,
            path: path.to_string(),
            source: e,
        },
    }
}

pub(super) fn is_symlink(ws: &Workspace, path: &WorkspacePath) -> bool {
    ws.dir()
        .symlink_metadata(path.as_path())
        .is_ok_and(|m| m.file_type().is_symlink())
}
