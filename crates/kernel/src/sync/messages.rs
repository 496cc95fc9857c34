//! The sync requests and replies and what they are made of: stamps, manifests, fetched chunks,
//! changes with their preconditions, and outcomes.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, ToolError};
use crate::ids::{Account, SessionId};

/// Identity of a regular file's content as seen by `stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileStamp {
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    pub ino: u64,
    /// `st_mode & 0o7777`; `None` from a peer of an older version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

impl FileStamp {
    /// The stamp of a file's `stat`: its size, last modification (`None` when the platform
    /// gives none: 0), inode and `st_mode` (kept `& 0o7777`). A modification before the epoch
    /// counts negative; one past `i64` nanoseconds either way saturates.
    pub fn of(size: u64, modified: Option<SystemTime>, ino: u64, mode: u32) -> Self {
        let mtime_ns = modified.map_or(0, |m| match m.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
        });
        FileStamp {
            size,
            mtime_ns,
            ino,
            mode: Some(mode & 0o7777),
        }
    }

    /// Whether a precondition stamp holds for the file stamp `have`: the same size, mtime and
    /// inode, and the same mode unless the precondition names none (an older peer).
    pub fn holds_for(&self, have: &FileStamp) -> bool {
        self.size == have.size
            && self.mtime_ns == have.mtime_ns
            && self.ino == have.ino
            && (self.mode.is_none() || self.mode == have.mode)
    }
}

/// Caps of one manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestLimits {
    /// Listing stops (`truncated`) after this many files and directories together.
    pub max_files: u64,
    /// Bigger files are left out and counted in `skipped`.
    pub max_file_bytes: u64,
    /// Listing stops (`truncated`) before the listed sizes would add up past this.
    pub max_total_bytes: u64,
}

/// `manifest` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestRequest {
    pub account: Account,
    pub session_id: SessionId,
    pub limits: ManifestLimits,
}

/// One regular file of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
    /// See [`FileStamp::mode`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

impl ManifestEntry {
    pub fn stamp(&self) -> FileStamp {
        FileStamp {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ino: self.ino,
            mode: self.mode,
        }
    }
}

/// `manifest` reply (beside `"ok": true`). Entries are in walk order: depth first, names
/// sorted byte-wise within a directory. A missing workspace is an empty manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub entries: Vec<ManifestEntry>,
    /// Every synced directory (relative, `/`-separated), parents before children; `None`
    /// from a workspace of an older version, which syncs no directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirs: Option<Vec<String>>,
    /// Regular files left out: over `max_file_bytes`, or a name that is not UTF-8.
    pub skipped: u64,
    /// The walk stopped early (`max_files`, `max_total_bytes`, or the reply's size): files
    /// and directories not listed may exist.
    pub truncated: bool,
}

/// One file to read, from `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchFile {
    pub path: String,
    #[serde(default)]
    pub offset: u64,
}

/// `fetch` request: files are answered in order until the content budget is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchRequest {
    pub account: Account,
    pub session_id: SessionId,
    pub files: Vec<FetchFile>,
}

/// Head of one chunk in a fetch reply; its `len` content bytes follow in the frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkHeader {
    pub path: String,
    pub offset: u64,
    pub len: u64,
    /// The file's stamp when this chunk was read (a changed stamp between chunks means the
    /// file changed: start over).
    pub stamp: FileStamp,
    /// `offset + len` reached the size in `stamp`.
    pub eof: bool,
}

/// A file of a fetch that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchFailure {
    pub path: String,
    pub error: ErrorCode,
    pub error_message: String,
}

/// `fetch` reply head. Files of the request that appear in neither list were not reached
/// (the content budget ran out): ask again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchReplyHeader {
    pub chunks: Vec<ChunkHeader>,
    pub failed: Vec<FetchFailure>,
}

/// A chunk with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub path: String,
    pub offset: u64,
    pub stamp: FileStamp,
    pub eof: bool,
    pub content: Bytes,
}

/// A fetch reply, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fetched {
    pub chunks: Vec<Chunk>,
    pub failed: Vec<FetchFailure>,
}

/// The precondition of a change (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Expected {
    /// Unconditional.
    Any,
    /// Nothing may exist at the path.
    Absent,
    /// A regular file with exactly this stamp.
    Stamp(FileStamp),
}

/// What a change does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeOp {
    /// Bytes `offset..offset+content.len()` of a file of `total` bytes. A put in one part
    /// (`offset == 0`, `content.len() == total`) needs no `upload`; a put in several parts
    /// names its staging file by `upload` (`[A-Za-z0-9_-]{1,64}`, unique per put), sends its
    /// parts in order, and the last part moves the file into place.
    /// `mode` is the sender's permission bits: the file gets [`applied_mode`] of the last
    /// part's `mode`, or the default mode of a new file when it is `None`.
    ///
    /// [`applied_mode`]: crate::sync::applied_mode
    Put {
        upload: Option<String>,
        offset: u64,
        total: u64,
        content: Bytes,
        mode: Option<u32>,
    },
    /// Creates the directory, and its missing parents. A directory already there counts as
    /// applied; a file, link or anything else there is a conflict (`expected` is not looked at).
    MakeDir,
    /// Removes the directory only if it is empty; a path already absent counts as applied; a
    /// directory that is not empty, a file, a link or anything else there is a conflict
    /// (`expected` is not looked at). Parents are left alone: remove each one by name.
    RemoveDir,
    /// Removes the regular file (or, with [`Expected::Any`], a symlink) at the path; a path
    /// already absent counts as applied. With `prune_empty_dirs`, its parent directories that
    /// became empty are removed too, up to the root.
    Delete { prune_empty_dirs: bool },
}

/// One change of an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: String,
    pub expected: Expected,
    pub op: ChangeOp,
}

/// Wire head of a change; a put's `len` content bytes follow in the frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeHeader {
    pub path: String,
    pub expected: Expected,
    #[serde(flatten)]
    pub op: OpHeader,
}

/// Wire head of a [`ChangeOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpHeader {
    Put {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upload: Option<String>,
        offset: u64,
        total: u64,
        len: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
    Delete {
        #[serde(default)]
        prune_empty_dirs: bool,
    },
    MakeDir,
    RemoveDir,
}

/// `apply` request head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequestHeader {
    pub account: Account,
    pub session_id: SessionId,
    pub changes: Vec<ChangeHeader>,
}

/// What is at a path in the workspace now (in a conflict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Current {
    Absent,
    File(FileStamp),
    Dir,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// The outcome of one change, in the order of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ChangeOutcome {
    /// Done: a put's new stamp (`None` for a delete or a directory change).
    Applied {
        path: String,
        stamp: Option<FileStamp>,
    },
    /// A part that is not the last was stored; `received` bytes so far.
    Staged { path: String, received: u64 },
    /// The precondition failed; nothing changed. The workspace's state wins.
    Conflict { path: String, current: Current },
    /// Refused (e.g. `path_outside_workspace`); nothing changed.
    Rejected {
        path: String,
        error: ErrorCode,
        error_message: String,
    },
}

impl ChangeOutcome {
    pub fn path(&self) -> &str {
        match self {
            ChangeOutcome::Applied { path, .. }
            | ChangeOutcome::Staged { path, .. }
            | ChangeOutcome::Conflict { path, .. }
            | ChangeOutcome::Rejected { path, .. } => path,
        }
    }

    pub fn rejected(path: &str, error: &ToolError) -> ChangeOutcome {
        ChangeOutcome::Rejected {
            path: path.to_owned(),
            error: error.code,
            error_message: error.message.clone(),
        }
    }
}

/// `apply` reply (beside `"ok": true`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReply {
    pub outcomes: Vec<ChangeOutcome>,
}
