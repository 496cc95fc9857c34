//! Confined access to one workspace: every path resolves beneath the root in the kernel.
//!
//! This module holds the rules: the [`Workspace`] capability, [`WorkspacePath`], the mapping of
//! io errors onto PROTOCOL.md codes, and the reading, stat and delete operations. Writes live in
//! [`crate::writing`] and listings in [`crate::listing`]; both go through these rules.
//!
//! Two layers keep a tool inside its workspace:
//!
//! 1. [`WorkspacePath::parse`] refuses what is wrong on its face (absolute paths, `..` that
//!    climbs above the root, NUL bytes) and normalises the rest lexically, so every path handed
//!    to the file system is relative and free of `.`/`..`.
//! 2. Every operation goes through the workspace's [`cap_std::fs::Dir`]. cap-std resolves each
//!    path beneath that directory (`openat2(RESOLVE_BENEATH)` on Linux, a careful component walk
//!    elsewhere), so a symlink inside the workspace that points out of it — directly, through a
//!    chain, through a symlinked parent, or one swapped in while an operation runs — is refused
//!    by the kernel instead of by comparing strings. cap-std reports such a refusal as
//!    `PermissionDenied` without an OS error number; [`is_escape`] turns it into
//!    `path_outside_workspace`.
//!
//! A consequence of (2): a symlink whose target is absolute is refused even when the target
//! lies inside the workspace, since a resolution beneath the root never starts at `/`.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use cap_fs_ext::{DirExt, OpenOptionsSyncExt};
use cap_std::fs::{File, Metadata, OpenOptions};
use serde::Serialize;
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{Account, ErrorCode, SessionId, ToolError};

/// Longest relative path accepted (Linux `PATH_MAX`); longer ones could never be opened.
pub const PATH_MAX_BYTES: usize = 4096;
/// Longest single name accepted (Linux `NAME_MAX`).
pub const NAME_MAX_BYTES: usize = 255;

/// One session's workspace, opened as a directory capability.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    dir: cap_std::fs::Dir,
}

impl Workspace {
    /// Opens (creating it when missing) the workspace of `(account, session)` under `data_dir`.
    /// Account and session are validated subject tokens, so the joined path cannot climb.
    pub fn open(
        data_dir: &Path,
        account: &Account,
        session: &SessionId,
    ) -> Result<Workspace, ConfineError> {
        let root = data_dir
            .join("accounts")
            .join(account.as_str())
            .join("sessions")
            .join(session.as_str())
            .join("workspace");
        std::fs::create_dir_all(&root).map_err(|source| ConfineError::Root {
            op: "create",
            source,
        })?;
        let dir = cap_std::fs::Dir::open_ambient_dir(&root, cap_std::ambient_authority())
            .map_err(|source| ConfineError::Root { op: "open", source })?;
        Ok(Workspace { root, dir })
    }

    /// The root on the host (for replies and for the search walker).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The capability every access goes through.
    pub fn dir(&self) -> &cap_std::fs::Dir {
        &self.dir
    }
}

// ------------------------------------------------------------------------------------------
// Paths

/// A path inside the workspace: relative, `/`-separated, without `.`, `..` or empty
/// components. The root is the empty path (shown as `.`).
///
/// It remembers the JSON pointer of the argument it came from, so that a later
/// `invalid_arguments` (say, "is a directory") points at the right member.
///
/// Equality and hashing look at the path only, not at the pointer.
#[derive(Debug, Clone)]
pub struct WorkspacePath {
    rel: String,
    pointer: String,
}

impl WorkspacePath {
    /// The workspace root, as named by the argument `field`.
    pub fn root(field: &str) -> WorkspacePath {
        WorkspacePath {
            rel: String::new(),
            pointer: pointer_of(field),
        }
    }

    /// Parses the argument `field` (a JSON pointer without its leading `/`, e.g. `path` or
    /// `files/3/path`).
    ///
    /// Nothing is decoded: `%2e%2e` is a name, a trailing space is part of a name, and `\` is
    /// an ordinary character (this is a Unix file system).
    pub fn parse(raw: &str, field: &str) -> Result<WorkspacePath, ConfineError> {
        let pointer = pointer_of(field);
        if raw.contains('\0') {
            return Err(ConfineError::argument(
                &pointer,
                "contains a NUL byte, which no file name can hold; remove it",
            ));
        }
        if raw.starts_with('/') {
            return Err(ConfineError::Outside(format!(
                "'{raw}' is an absolute path; give a path relative to the workspace root"
            )));
        }
        if raw.len() > PATH_MAX_BYTES {
            return Err(ConfineError::argument(
                &pointer,
                format!(
                    "is {} bytes long, over the limit of {PATH_MAX_BYTES}; use a shorter path",
                    raw.len()
                ),
            ));
        }
        let mut parts: Vec<&str> = Vec::new();
        for part in raw.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    // Lexical: `a/..` is the root again, whatever `a` is on disk. That never
                    // reaches further than the root, and cap-std confines the result anyway.
                    if parts.pop().is_none() {
                        return Err(ConfineError::Outside(format!(
                            "'{raw}' climbs above the workspace root with '..'; use a path inside the workspace"
                        )));
                    }
                }
                name => {
                    if name.len() > NAME_MAX_BYTES {
                        return Err(ConfineError::argument(
                            &pointer,
                            format!("has a name of {} bytes, over the limit of {NAME_MAX_BYTES}; use a shorter name", name.len()),
                        ));
                    }
                    parts.push(name);
                }
            }
        }
        Ok(WorkspacePath {
            rel: parts.join("/"),
            pointer,
        })
    }

    /// The path to hand to the workspace's `Dir` (`.` for the root).
    pub fn as_path(&self) -> &Path {
        if self.rel.is_empty() {
            Path::new(".")
        } else {
            Path::new(&self.rel)
        }
    }

    /// The relative path, `/`-separated; empty for the root.
    pub fn as_str(&self) -> &str {
        &self.rel
    }

    pub fn is_root(&self) -> bool {
        self.rel.is_empty()
    }

    /// The path as replies show it: relative, `/`-separated, `.` for the root.
    pub fn display(&self) -> String {
        if self.rel.is_empty() {
            ".".to_owned()
        } else {
            self.rel.clone()
        }
    }

    /// The JSON pointer of the argument this path came from (e.g. `/path`).
    pub fn pointer(&self) -> &str {
        &self.pointer
    }

    /// The last component; `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        if self.rel.is_empty() {
            None
        } else {
            self.rel.rsplit('/').next()
        }
    }

    /// The containing directory; `None` for the root.
    pub fn parent(&self) -> Option<WorkspacePath> {
        if self.rel.is_empty() {
            return None;
        }
        let rel = match self.rel.rfind('/') {
            Some(i) => self.rel[..i].to_owned(),
            None => String::new(),
        };
        Some(WorkspacePath {
            rel,
            pointer: self.pointer.clone(),
        })
    }

    /// Every proper ancestor below the root, outermost first (`a`, `a/b` for `a/b/c`).
    pub(crate) fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.rel.match_indices('/').map(|(i, _)| &self.rel[..i])
    }

    /// `self/name` (`name` is one component read from a directory).
    fn child(&self, name: &str) -> WorkspacePath {
        WorkspacePath {
            rel: join(&self.rel, name),
            pointer: self.pointer.clone(),
        }
    }

    /// `self/rel`, or `self` when `rel` is empty.
    pub(crate) fn child_or_self(&self, rel: &str) -> WorkspacePath {
        if rel.is_empty() {
            self.clone()
        } else {
            self.child(rel)
        }
    }
}

impl PartialEq for WorkspacePath {
    fn eq(&self, other: &Self) -> bool {
        self.rel == other.rel
    }
}

impl Eq for WorkspacePath {}

impl std::hash::Hash for WorkspacePath {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.rel.hash(state);
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.rel.is_empty() { "." } else { &self.rel })
    }
}

fn pointer_of(field: &str) -> String {
    if field.starts_with('/') {
        field.to_owned()
    } else {
        format!("/{field}")
    }
}

pub(crate) fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_owned()
    } else {
        format!("{base}/{name}")
    }
}

// ------------------------------------------------------------------------------------------
// Errors

/// Why a path or an operation on it was refused or failed. [`From`] makes it PROTOCOL.md's
/// code and sentence at the actor's edge.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// An argument names something the operation cannot take: `invalid_arguments` at
    /// `pointer`.
    #[error("argument {pointer}: {message}")]
    Argument { pointer: String, message: String },
    /// Absolute, climbing above the root, or leading out through a symbolic link.
    #[error("{0}")]
    Outside(String),
    #[error("{0}")]
    NotFound(String),
    #[error("'{path}' is {size} bytes, over the limit of {max} bytes for this operation")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("'{0}' is a directory that is not empty; delete what is inside it first")]
    NotEmpty(String),
    /// The entry changed under the operation.
    #[error("'{0}' changed while it was being deleted; try again")]
    Changed(String),
    /// The file system failed in a way no caller can fix.
    #[error("could not {op} '{path}' ({source}); the workspace actor's log has the details")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    /// The workspace directory itself could not be made or opened.
    #[error("cannot {op} the workspace directory: {source}")]
    Root {
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

/// What kind of [`ConfineError`] it is; one PROTOCOL.md code each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfineErrorKind {
    InvalidArgument,
    Outside,
    NotFound,
    TooLarge,
    NotEmpty,
    Conflict,
    Internal,
}

impl ConfineError {
    pub fn kind(&self) -> ConfineErrorKind {
        match self {
            ConfineError::Argument { .. } => ConfineErrorKind::InvalidArgument,
            ConfineError::Outside(_) => ConfineErrorKind::Outside,
            ConfineError::NotFound(_) => ConfineErrorKind::NotFound,
            ConfineError::TooLarge { .. } => ConfineErrorKind::TooLarge,
            ConfineError::NotEmpty(_) => ConfineErrorKind::NotEmpty,
            ConfineError::Changed(_) => ConfineErrorKind::Conflict,
            ConfineError::Io { .. } | ConfineError::Root { .. } => ConfineErrorKind::Internal,
        }
    }

    /// `invalid_arguments` at the JSON pointer `pointer`.
    pub fn argument(pointer: &str, message: impl Into<String>) -> Self {
        ConfineError::Argument {
            pointer: pointer.to_owned(),
            message: message.into(),
        }
    }
}

/// PROTOCOL.md's code and sentence; an `internal` one logs its operation, path and cause here.
impl From<ConfineError> for ToolError {
    fn from(e: ConfineError) -> Self {
        let code = match e.kind() {
            ConfineErrorKind::InvalidArgument => {
                let ConfineError::Argument { pointer, message } = e else {
                    unreachable!("only Argument is InvalidArgument")
                };
                return ToolError::invalid_argument(&pointer, message);
            }
            ConfineErrorKind::Outside => ErrorCode::PathOutsideWorkspace,
            ConfineErrorKind::NotFound => ErrorCode::NotFound,
            ConfineErrorKind::TooLarge => ErrorCode::FileTooLarge,
            ConfineErrorKind::NotEmpty => ErrorCode::DirectoryNotEmpty,
            ConfineErrorKind::Conflict => ErrorCode::Conflict,
            ConfineErrorKind::Internal => {
                match &e {
                    ConfineError::Io { op, path, source } => tracing::error!(
                        operation = op,
                        path = %DisplaySafe(path),
                        error = %DisplayChain(source),
                        "workspace file operation failed"
                    ),
                    _ => tracing::error!(error = %DisplayChain(&e), "workspace unavailable"),
                }
                ErrorCode::Internal
            }
        };
        ToolError::new(code, e.to_string())
    }
}

/// Whether cap-std refused `err` because the path led outside the directory.
///
/// cap-std builds that error itself (`PermissionDenied`, "a path led outside of the
/// filesystem"), also from the kernel's `EXDEV` under `RESOLVE_BENEATH`; a real `EACCES` from
/// the kernel always carries its OS error number, which tells the two apart.
pub fn is_escape(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::PermissionDenied && err.raw_os_error().is_none()
}

pub(crate) fn outside(path: &WorkspacePath) -> ConfineError {
    ConfineError::Outside(format!(
        "'{path}' leads outside the workspace through a symbolic link; use a path inside the workspace"
    ))
}

fn not_found(path: &WorkspacePath) -> ConfineError {
    ConfineError::NotFound(format!(
        "'{path}' does not exist in the workspace; list_workspace_files shows what does"
    ))
}

pub(crate) fn is_a_directory(path: &WorkspacePath) -> ConfineError {
    ConfineError::argument(
        path.pointer(),
        format!("'{path}' is a directory, not a file; name a file inside it"),
    )
}

/// A failure of `op` on `path` that no caller can fix: `internal`, logged with its cause where
/// it becomes a [`ToolError`].
pub(crate) fn internal(op: &'static str, path: &WorkspacePath, err: io::Error) -> ConfineError {
    ConfineError::Io {
        op,
        path: path.to_string(),
        source: err,
    }
}

/// The PROTOCOL.md code of an io error met while doing `op` on `path`.
pub(crate) fn map_io(op: &'static str, path: &WorkspacePath, err: io::Error) -> ConfineError {
    if is_escape(&err) {
        return outside(path);
    }
    match err.kind() {
        io::ErrorKind::NotFound => not_found(path),
        // `a/b` where `a` is a file: there is no such path.
        io::ErrorKind::NotADirectory => ConfineError::NotFound(format!(
            "'{path}' does not exist: one of its parents is a file, not a directory"
        )),
        // `ErrorKind::FilesystemLoop` is not stable yet; its name is the only portable handle.
        kind if format!("{kind:?}") == "FilesystemLoop" => ConfineError::argument(
            path.pointer(),
            format!("'{path}' goes through a loop of symbolic links; fix or delete the links"),
        ),
        _ => internal(op, path, err),
    }
}

// ------------------------------------------------------------------------------------------
// Types

/// What a directory entry is. Anything that is neither a directory nor a symlink (FIFOs,
/// sockets, devices as well as regular files) counts as `file`, the closed list of PROTOCOL.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    File,
    Dir,
    Symlink,
}

impl EntryType {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryType::File => "file",
            EntryType::Dir => "dir",
            EntryType::Symlink => "symlink",
        }
    }

    pub(crate) fn of(file_type: cap_std::fs::FileType) -> EntryType {
        if file_type.is_symlink() {
            EntryType::Symlink
        } else if file_type.is_dir() {
            EntryType::Dir
        } else {
            EntryType::File
        }
    }
}

impl fmt::Display for EntryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Size and time of a path (symlinks followed, beneath the root).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stat {
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// Bytes.
    pub len: u64,
    /// Last modification, nanoseconds since the Unix epoch (negative before it).
    pub mtime_ns: i64,
}

/// The result of [`delete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeleteOutcome {
    /// What was removed; a symlink is removed as a link.
    pub kind: EntryType,
}

pub(crate) fn mtime_ns(meta: &Metadata) -> i64 {
    let Ok(modified) = meta.modified() else {
        return 0;
    };
    match modified.into_std().duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

// ------------------------------------------------------------------------------------------
// Reading

/// Metadata of `path`, symlinks followed beneath the root.
pub fn metadata(ws: &Workspace, path: &WorkspacePath) -> Result<Metadata, ConfineError> {
    ws.dir()
        .metadata(path.as_path())
        .map_err(|e| map_io("inspect", path, e))
}

/// Metadata of `path` itself: a final symlink is described, not followed.
pub fn symlink_metadata(ws: &Workspace, path: &WorkspacePath) -> Result<Metadata, ConfineError> {
    ws.dir()
        .symlink_metadata(path.as_path())
        .map_err(|e| map_io("inspect", path, e))
}

/// Type, size and mtime of `path`, symlinks followed beneath the root.
pub fn stat(ws: &Workspace, path: &WorkspacePath) -> Result<Stat, ConfineError> {
    let meta = metadata(ws, path)?;
    Ok(Stat {
        kind: EntryType::of(meta.file_type()),
        len: meta.len(),
        mtime_ns: mtime_ns(&meta),
    })
}

/// Opens a regular file for reading (a directory is `invalid_arguments`, and so is a FIFO,
/// socket or device). For other modules that read through the capability (search, lint).
pub fn open_file(ws: &Workspace, path: &WorkspacePath) -> Result<File, ConfineError> {
    open_sized(ws, path).map(|(file, _)| file)
}

/// [`open_file`], with the file's size from the same handle: one open and one `fstat`, and
/// no window for the file to be swapped between looking at it and reading it.
pub fn open_sized(ws: &Workspace, path: &WorkspacePath) -> Result<(File, u64), ConfineError> {
    let mut options = OpenOptions::new();
    options.read(true);
    // A FIFO opened for reading blocks until a writer comes; non-blocking open returns at
    // once and the type check below refuses it. On a regular file the flag changes nothing.
    options.nonblock(true);
    let file = ws
        .dir()
        .open_with(path.as_path(), &options)
        .map_err(|e| map_io("open", path, e))?;
    let meta = file.metadata().map_err(|e| internal("inspect", path, e))?;
    if meta.is_dir() {
        return Err(is_a_directory(path));
    }
    if !meta.is_file() {
        return Err(ConfineError::argument(
            path.pointer(),
            format!("'{path}' is not a regular file (a FIFO, socket or device); only regular files can be read"),
        ));
    }
    Ok((file, meta.len()))
}

/// The whole file; over `max_bytes` it is `file_too_large` (checked before reading, and again
/// while reading in case the file grows).
pub fn read(ws: &Workspace, path: &WorkspacePath, max_bytes: u64) -> Result<Vec<u8>, ConfineError> {
    let (file, len) = open_sized(ws, path)?;
    let too_large = |size: u64| ConfineError::TooLarge {
        path: path.to_string(),
        size,
        max: max_bytes,
    };
    if len > max_bytes {
        return Err(too_large(len));
    }
    let bytes = read_opened(file, path, max_bytes.saturating_add(1), len)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// At most the first `max_bytes` of the file, whatever its size (for ranged reads of big
/// files). Directories and special files are refused as in [`open_file`].
pub fn read_prefix(
    ws: &Workspace,
    path: &WorkspacePath,
    max_bytes: u64,
) -> Result<Vec<u8>, ConfineError> {
    let (file, len) = open_sized(ws, path)?;
    read_opened(file, path, max_bytes, len)
}

/// Reads at most `limit` bytes of a file from [`open_sized`] (`size` sizes the buffer).
pub fn read_opened(
    file: File,
    path: &WorkspacePath,
    limit: u64,
    size: u64,
) -> Result<Vec<u8>, ConfineError> {
    let capacity = usize::try_from(size.min(limit)).unwrap_or(0);
    let mut bytes = Vec::with_capacity(capacity);
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| internal("read", path, e))?;
    Ok(bytes)
}

/// Hex sha256 of `bytes` (the read state compares files by it).
pub use toolmesh_kernel::canonical::sha256_hex as sha256_of;

// ------------------------------------------------------------------------------------------
// Deleting

/// Deletes a file, an empty directory or a symlink (as a link: its target is untouched, even
/// outside the workspace). The root is `invalid_arguments`; a non-empty directory is
/// `directory_not_empty`.
pub fn delete(ws: &Workspace, path: &WorkspacePath) -> Result<DeleteOutcome, ConfineError> {
    if path.is_root() {
        return Err(ConfineError::argument(
            path.pointer(),
            "names the workspace root, which cannot be deleted; delete the files inside it instead",
        ));
    }
    let meta = symlink_metadata(ws, path)?;
    let kind = EntryType::of(meta.file_type());
    let removed = match kind {
        // unlinkat on the final component: the link goes, its target stays.
        EntryType::Symlink => ws.dir().remove_file_or_symlink(path.as_path()),
        EntryType::Dir => ws.dir().remove_dir(path.as_path()),
        EntryType::File => ws.dir().remove_file(path.as_path()),
    };
    removed.map_err(|e| match e.kind() {
        io::ErrorKind::DirectoryNotEmpty => ConfineError::NotEmpty(path.to_string()),
        // The entry changed type between the check and the removal.
        io::ErrorKind::IsADirectory | io::ErrorKind::NotADirectory => {
            ConfineError::Changed(path.to_string())
        }
        _ => map_io("delete", path, e),
    })?;
    Ok(DeleteOutcome { kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalise() {
        let p = WorkspacePath::parse("a/./b//c/", "path").unwrap();
        assert_eq!(p.as_str(), "a/b/c");
        assert_eq!(p.parent().unwrap().as_str(), "a/b");
        assert_eq!(p.file_name(), Some("c"));
        assert_eq!(p.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
        assert_eq!(WorkspacePath::parse("x/..", "path").unwrap().display(), ".");
    }
}

#[cfg(test)]
mod logs {
    //! What the workspace actor logs about a path a caller chose.

    use super::*;

    #[test]
    fn a_failed_operation_logs_its_path_escaped_on_one_line() {
        let path = WorkspacePath::parse("a.txt\n2026-12-01 INFO forged\u{1b}[2K", "path").unwrap();
        let logs = toolmesh_testkit::captured_logs(false, || {
            let _ = ToolError::from(internal("read", &path, io::Error::other("disk on fire")));
        });
        assert_eq!(logs.lines().count(), 1, "{logs}");
        assert!(
            logs.contains(r"a.txt\u000a2026-12-01 INFO forged\u001b[2K"),
            "{logs}"
        );
    }
}
