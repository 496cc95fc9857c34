//! The mirror's state: its limits, what it knows of each synced file and directory, and its
//! root's handle.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use cap_std::fs::Dir;
use toolmesh_kernel::sync::{FileStamp, ManifestLimits, WorkspaceSync};
use toolmesh_kernel::{Account, SessionId, ToolError};

use crate::config::{DEFAULT_SYNC_MAX_DEPTH, DEFAULT_SYNC_MAX_ENTRIES};
use crate::mirror::local::{blocking_failed, local_failure};

/// The uid and gid of the sandbox user, who must own what the mirror creates.
pub const SANDBOX_OWNER: (u32, u32) = (1000, 1000);

/// Caps of what is synced, both ways (`max_entries` and `max_depth` bound the local walk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncLimits {
    /// Files and directories synced.
    pub max_files: usize,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    /// Entries of every kind the local walk reads.
    pub max_entries: usize,
    /// Levels below the root the local walk goes (a file at the top is at depth 1).
    pub max_depth: usize,
}

impl Default for SyncLimits {
    fn default() -> Self {
        Self {
            max_files: 2000,
            max_file_bytes: 10 * 1024 * 1024,
            max_total_bytes: 64 * 1024 * 1024,
            max_entries: DEFAULT_SYNC_MAX_ENTRIES,
            max_depth: DEFAULT_SYNC_MAX_DEPTH,
        }
    }
}

impl SyncLimits {
    pub(super) fn wire(self) -> ManifestLimits {
        ManifestLimits {
            max_files: self.max_files as u64,
            max_file_bytes: self.max_file_bytes,
            max_total_bytes: self.max_total_bytes,
        }
    }
}

/// What the mirror knows of one synced file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Known {
    /// The workspace file's stamp …
    pub(super) ws: FileStamp,
    /// … and the local file's stamp, when both held the same content.
    pub(super) local: FileStamp,
    /// sha256 of that content, kept while the local stamp is racy.
    pub(super) hash: Option<String>,
}

/// A local copy of one session's workspace.
pub struct Mirror {
    pub(super) sync: WorkspaceSync,
    pub(super) account: Account,
    pub(super) session: SessionId,
    pub(super) local_root: PathBuf,
    pub(super) limits: SyncLimits,
    /// Owner given to every file and directory the mirror creates; `Some(1000, 1000)` by
    /// default when running as root (so the sandbox user can change them), else `None`.
    pub owner: Option<(u32, u32)>,
    pub(super) known: HashMap<String, Known>,
    /// Directories known to exist on both sides.
    pub(super) known_dirs: HashSet<String>,
    /// The last manifest listed directories: the workspace syncs them.
    pub(super) dirs_synced: bool,
    /// The local directory, opened once; shared with the blocking threads that use it.
    pub(super) root: Option<Arc<Dir>>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("account", &self.account)
            .field("session", &self.session)
            .field("local_root", &self.local_root)
            .field("known_files", &self.known.len())
            .field("known_dirs", &self.known_dirs.len())
            .finish_non_exhaustive()
    }
}

impl Mirror {
    pub fn new(
        sync: WorkspaceSync,
        account: Account,
        session: SessionId,
        local_root: PathBuf,
        limits: SyncLimits,
    ) -> Self {
        let owner = rustix::process::geteuid()
            .is_root()
            .then_some(SANDBOX_OWNER);
        Self {
            sync,
            account,
            session,
            local_root,
            limits,
            owner,
            known: HashMap::new(),
            known_dirs: HashSet::new(),
            dirs_synced: false,
            root: None,
        }
    }

    /// The local directory.
    pub fn local_root(&self) -> &std::path::Path {
        &self.local_root
    }

    /// The local directory's handle, made and opened the first time (off the async threads).
    pub(super) async fn root(&mut self) -> Result<Arc<Dir>, ToolError> {
        if let Some(root) = &self.root {
            return Ok(root.clone());
        }
        let (local_root, owner) = (self.local_root.clone(), self.owner);
        let opened = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&local_root)
                .map_err(|e| local_failure("create", "the mirror directory", &e))?;
            // A plain read-only handle (cap-std's own are `O_PATH`, which cannot be chowned).
            let handle = std::fs::File::open(&local_root)
                .map_err(|e| local_failure("open", "the mirror directory", &e))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::fchown(&handle, Some(uid), Some(gid))
                    .map_err(|e| local_failure("chown", "the mirror directory", &e))?;
            }
            Ok::<_, ToolError>(Dir::from_std_file(handle))
        })
        .await
        .map_err(blocking_failed)??;
        let root = Arc::new(opened);
        self.root = Some(root.clone());
        Ok(root)
    }
}
