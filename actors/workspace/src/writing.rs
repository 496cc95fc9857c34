//! Writing files into a workspace (`write_workspace_file`, `write_workspace_files`, the edits
//! and persisted outputs): every write is checked first, then made atomic (a temp file in the
//! same directory, fsynced, renamed or hard-linked over the target) while the parent directory
//! is held open, so a parent swapped for a symlink mid-write cannot redirect it. Paths and
//! errors follow [`crate::confine`]'s rules.

use std::collections::HashSet;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use cap_std::fs::{Dir, File, OpenOptions};
use serde::Serialize;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::confine::{self, is_escape, ConfineError, Workspace, WorkspacePath};

/// Why a write was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A path rule refused it, or the file system failed ([`crate::confine`]).
    #[error(transparent)]
    Confine(#[from] ConfineError),
    #[error("'{0}' already exists; pass overwrite: true to replace it")]
    Exists(String),
    /// A write of a batch failed after the files before it were written.
    #[error(
        "{source} ({} of {total} files were written before it; the rest were not attempted)",
        .written.len()
    )]
    Batch {
        #[source]
        source: Box<WriteError>,
        /// The paths written before it.
        written: Vec<String>,
        total: usize,
        failed_index: usize,
        failed_path: String,
    },
}

/// What kind of [`WriteError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteErrorKind {
    /// See [`ConfineError::kind`].
    Confine(confine::ConfineErrorKind),
    /// `already_exists`.
    Exists,
}

impl WriteError {
    /// The kind of the failure; a batch's is that of the write that failed.
    pub fn kind(&self) -> WriteErrorKind {
        match self {
            WriteError::Confine(e) => WriteErrorKind::Confine(e.kind()),
            WriteError::Exists(_) => WriteErrorKind::Exists,
            WriteError::Batch { source, .. } => source.kind(),
        }
    }
}

/// PROTOCOL.md's code and sentence; a batch keeps its failing write's code and adds `written`,
/// `failed_index` and `failed_path`.
impl From<WriteError> for ToolError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Confine(e) => e.into(),
            WriteError::Exists(_) => ToolError::new(ErrorCode::AlreadyExists, e.to_string()),
            WriteError::Batch { .. } => {
                let message = e.to_string();
                let WriteError::Batch {
                    source,
                    written,
                    failed_index,
                    failed_path,
                    ..
                } = e
                else {
                    unreachable!()
                };
                let mut error = ToolError::from(*source);
                error.message = message;
                error
                    .with("written", written)
                    .with("failed_index", failed_index)
                    .with("failed_path", failed_path)
            }
        }
    }
}

fn outside(path: &WorkspacePath) -> WriteError {
    confine::outside(path).into()
}

fn is_a_directory(path: &WorkspacePath) -> WriteError {
    confine::is_a_directory(path).into()
}

fn internal(op: &'static str, path: &WorkspacePath, err: io::Error) -> WriteError {
    confine::internal(op, path, err).into()
}

fn map_io(op: &'static str, path: &WorkspacePath, err: io::Error) -> WriteError {
    confine::map_io(op, path, err).into()
}

fn argument(pointer: &str, message: impl Into<String>) -> WriteError {
    ConfineError::argument(pointer, message).into()
}

/// The result of [`write_atomic`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WriteOutcome {
    /// No file was there before.
    pub created: bool,
    /// Bytes written.
    pub bytes: u64,
}

/// One file written by [`write_batch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WrittenFile {
    pub path: String,
    pub created: bool,
    pub bytes: u64,
}

/// Where a checked write will land.
#[derive(Debug)]
struct WritePlan {
    /// The requested path, or the file a final in-workspace symlink leads to.
    target: WorkspacePath,
}

/// Points in a write where the test suite swaps directories for symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Parent directories exist; the parent is not open yet.
    ParentsCreated,
    /// The parent is open; the temp file is not created yet.
    ParentOpened,
}

/// Checks everything a write of `path` can be refused for, without changing anything:
/// escapes, a parent that is a file, a target that is a directory, `already_exists`.
fn plan_write(
    ws: &Workspace,
    path: &WorkspacePath,
    overwrite: bool,
) -> Result<WritePlan, WriteError> {
    if path.is_root() {
        return Err(argument(
            path.pointer(),
            "names the workspace root, which is a directory; name a file",
        ));
    }
    // Walk the parents top-down until one is missing (the write creates the rest).
    for ancestor in path.ancestors() {
        match ws.dir().metadata(ancestor) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(parent_is_file(path, ancestor)),
            Err(e) if is_escape(&e) => return Err(outside(path)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(e) => return Err(internal("inspect a parent of", path, e)),
        }
    }
    match ws.dir().symlink_metadata(path.as_path()) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(WritePlan {
            target: path.clone(),
        }),
        Err(e) => Err(map_io("inspect", path, e)),
        Ok(_) if !overwrite => Err(exists(path)),
        Ok(meta) if meta.is_dir() => Err(is_a_directory(path)),
        Ok(meta) if meta.file_type().is_symlink() => {
            // Write through the link (so `README.md -> docs/README.md` stays a link), but only
            // to a file beneath the root: cap-std's canonicalize resolves beneath it too.
            let resolved = ws.dir().canonicalize(path.as_path()).map_err(|e| {
                if is_escape(&e) {
                    outside(path)
                } else if e.kind() == io::ErrorKind::NotFound {
                    argument(
                        path.pointer(),
                        format!("'{path}' is a symbolic link to a missing file; delete the link or write to its target"),
                    )
                } else {
                    internal("resolve the symbolic link", path, e)
                }
            })?;
            let Some(resolved) = resolved.to_str() else {
                return Err(internal(
                    "resolve the symbolic link",
                    path,
                    io::Error::other("its target is not UTF-8"),
                ));
            };
            let target = WorkspacePath::parse(resolved, path.pointer())?;
            match ws.dir().metadata(target.as_path()) {
                Ok(meta) if meta.is_dir() => Err(is_a_directory(path)),
                Ok(_) => Ok(WritePlan { target }),
                Err(e) => Err(map_io("inspect", path, e)),
            }
        }
        Ok(_) => Ok(WritePlan {
            target: path.clone(),
        }),
    }
}

fn exists(path: &WorkspacePath) -> WriteError {
    WriteError::Exists(path.to_string())
}

fn parent_is_file(path: &WorkspacePath, ancestor: &str) -> WriteError {
    argument(
        path.pointer(),
        format!(
            "'{ancestor}' is a file, so '{path}' cannot be created beneath it; pick another path"
        ),
    )
}

/// Writes `bytes` to `path` atomically: parent directories are created, the bytes go to a
/// temp file in the same directory, which is fsynced and then renamed over the target (or,
/// with `overwrite == false`, hard-linked to it, which fails if the target appeared in the
/// meantime). Readers see the old file or the new one, never a part; the temp file is removed
/// on failure. A final symlink inside the workspace is written through; the permissions of
/// a replaced file are kept.
pub fn write_atomic(
    ws: &Workspace,
    path: &WorkspacePath,
    bytes: &[u8],
    overwrite: bool,
) -> Result<WriteOutcome, WriteError> {
    let plan = plan_write(ws, path, overwrite)?;
    commit(ws, path, &plan, bytes, overwrite, &mut |_| {})
}

/// Writes several files. All paths are checked first ([`write_atomic`]'s refusals, plus a
/// path named twice or a path that is a parent of another): one bad path writes nothing.
/// Then each file is written atomically, in order.
///
/// If a write fails midway (the disk fills, the tree changed under us), the batch stops there:
/// the files before it stay written, the rest are not attempted, and the error (the failing
/// write's code) carries `written` (the paths written), `failed_index` and `failed_path`.
/// The caller truncates to 100 files before calling.
pub fn write_batch(
    ws: &Workspace,
    files: &[(WorkspacePath, String)],
    overwrite: bool,
) -> Result<Vec<WrittenFile>, WriteError> {
    write_batch_with(ws, files, overwrite, &mut |_| {})
}

/// [`write_batch`] with `before` run ahead of each file's write (tests only).
fn write_batch_with(
    ws: &Workspace,
    files: &[(WorkspacePath, String)],
    overwrite: bool,
    before: &mut dyn FnMut(usize),
) -> Result<Vec<WrittenFile>, WriteError> {
    let mut seen: HashSet<&str> = HashSet::with_capacity(files.len());
    for (path, _) in files {
        if !seen.insert(path.as_str()) {
            return Err(argument(
                path.pointer(),
                format!("'{path}' is named twice in this batch; give each file once"),
            ));
        }
    }
    for (path, _) in files {
        if let Some(ancestor) = path.ancestors().find(|a| seen.contains(a)) {
            return Err(argument(
                path.pointer(),
                format!("'{ancestor}' is written as a file in this batch, so '{path}' cannot be created beneath it"),
            ));
        }
    }
    let plans = files
        .iter()
        .map(|(path, _)| plan_write(ws, path, overwrite))
        .collect::<Result<Vec<_>, _>>()?;
    let mut written = Vec::with_capacity(files.len());
    for (index, ((path, content), plan)) in files.iter().zip(&plans).enumerate() {
        before(index);
        match commit(ws, path, plan, content.as_bytes(), overwrite, &mut |_| {}) {
            Ok(outcome) => written.push(WrittenFile {
                path: path.display(),
                created: outcome.created,
                bytes: outcome.bytes,
            }),
            Err(err) => {
                return Err(WriteError::Batch {
                    source: Box::new(err),
                    written: written.into_iter().map(|w| w.path).collect(),
                    total: files.len(),
                    failed_index: index,
                    failed_path: path.display(),
                });
            }
        }
    }
    Ok(written)
}

/// Performs a planned write. `requested` names the file in messages; `hook` runs between the
/// steps where a concurrent swap matters (tests only).
fn commit(
    ws: &Workspace,
    requested: &WorkspacePath,
    plan: &WritePlan,
    bytes: &[u8],
    overwrite: bool,
    hook: &mut dyn FnMut(Stage),
) -> Result<WriteOutcome, WriteError> {
    let target = &plan.target;
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(argument(
            requested.pointer(),
            "names the workspace root, which is a directory; name a file",
        ));
    };
    if !parent.is_root() {
        ws.dir().create_dir_all(parent.as_path()).map_err(|e| {
            if is_escape(&e) {
                outside(requested)
            } else if matches!(
                e.kind(),
                io::ErrorKind::NotADirectory | io::ErrorKind::AlreadyExists
            ) {
                parent_is_file(requested, parent.as_str())
            } else {
                internal("create the parent directories of", requested, e)
            }
        })?;
    }
    hook(Stage::ParentsCreated);
    // From here on the parent is held open: a parent swapped for a symlink after this point
    // cannot redirect the write, and one swapped before it is refused by this open.
    let opened;
    let dir: &Dir = if parent.is_root() {
        ws.dir()
    } else {
        opened = ws.dir().open_dir(parent.as_path()).map_err(|e| {
            if is_escape(&e) {
                outside(requested)
            } else if e.kind() == io::ErrorKind::NotADirectory {
                parent_is_file(requested, parent.as_str())
            } else {
                map_io("open the parent directory of", requested, e)
            }
        })?;
        &opened
    };
    hook(Stage::ParentOpened);

    let previous = match dir.symlink_metadata(name) {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(internal("inspect", requested, e)),
    };
    if let Some(meta) = &previous {
        if meta.is_dir() {
            return Err(is_a_directory(requested));
        }
        if !overwrite {
            return Err(exists(requested));
        }
    }
    let (temp_name, mut temp) =
        create_temp(dir).map_err(|e| internal("create a temporary file for", requested, e))?;
    let cleanup = |dir: &Dir| {
        if let Err(e) = dir.remove_file(&temp_name) {
            tracing::warn!(temp = %temp_name, error = %e, "could not remove a temporary file");
        }
    };
    let written = (|| {
        temp.write_all(bytes)?;
        if let Some(meta) = previous.as_ref().filter(|m| m.is_file()) {
            temp.set_permissions(meta.permissions())?;
        }
        // Durable before it becomes visible: after a crash the target is the old file or the
        // whole new one.
        temp.sync_all()
    })();
    drop(temp);
    if let Err(e) = written {
        cleanup(dir);
        return Err(internal("write", requested, e));
    }
    if overwrite {
        if let Err(e) = dir.rename(&temp_name, dir, name) {
            cleanup(dir);
            return Err(match e.kind() {
                io::ErrorKind::IsADirectory => is_a_directory(requested),
                _ => internal("replace", requested, e),
            });
        }
    } else {
        // link(2) fails if the name exists: no check-then-rename race can clobber a file
        // that appeared since the check above.
        match dir.hard_link(&temp_name, dir, name) {
            Ok(()) => cleanup(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                cleanup(dir);
                return Err(exists(requested));
            }
            // A file system without hard links (EPERM/ENOTSUP): check, then rename. Only a
            // file created in the instant between the two could be replaced.
            Err(e)
                if e.kind() == io::ErrorKind::Unsupported
                    || (e.kind() == io::ErrorKind::PermissionDenied && !is_escape(&e)) =>
            {
                let renamed = match dir.symlink_metadata(name) {
                    Ok(_) => Err(exists(requested)),
                    Err(_) => dir
                        .rename(&temp_name, dir, name)
                        .map_err(|e| internal("create", requested, e)),
                };
                if let Err(err) = renamed {
                    cleanup(dir);
                    return Err(err);
                }
            }
            Err(e) => {
                cleanup(dir);
                return Err(internal("create", requested, e));
            }
        }
    }
    // Persist the directory entry too; failing that only weakens crash durability.
    if let Ok(handle) = dir.open(".") {
        let _ = handle.sync_all();
    }
    Ok(WriteOutcome {
        created: previous.is_none(),
        bytes: bytes.len() as u64,
    })
}

/// A new, empty temp file in `dir` (hidden, short name so that a 255-byte target name still
/// fits).
fn create_temp(dir: &Dir) -> io::Result<(String, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    let mut last = None;
    for _ in 0..16 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(".toolmesh-tmp-{}-{n}-{nanos:x}", std::process::id());
        match dir.open_with(&name, &options) {
            Ok(file) => return Ok((name, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
}

#[cfg(test)]
#[path = "writing_tests.rs"]
mod tests;
