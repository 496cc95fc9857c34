//! The local side's file-system work, all of it blocking and run off the async threads
//! ([`on_disk`]): stamps, racy files, and reads, writes and directories that never follow a
//! link.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cap_fs_ext::{
    DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsMaybeDirExt, OpenOptionsSyncExt,
};
use cap_std::fs::{Dir, File, Metadata, MetadataExt, OpenOptions, Permissions, PermissionsExt};
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::sync::{applied_mode, FileStamp};
use toolmesh_kernel::ToolError;

/// A file whose mtime is this close to the moment it was recorded may be rewritten within
/// the same clock tick without its stamp changing; its content hash is kept (see
/// [`crate::mirror`]).
pub const RACY_NS: i64 = 100_000_000;

pub(super) fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{}-{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

pub(super) fn is_racy(mtime_ns: i64) -> bool {
    mtime_ns >= now_ns().saturating_sub(RACY_NS)
}

/// Runs blocking file-system work on the mirror's root on a blocking thread, never on the
/// async threads the node's actors share.
pub(super) async fn on_disk<T, F>(root: &Arc<Dir>, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce(&Dir) -> T + Send + 'static,
{
    let root = root.clone();
    tokio::task::spawn_blocking(move || work(&root))
        .await
        .map_err(blocking_failed)
}

/// Why the mirror's own file-system work failed (not a refusal: nothing a caller can fix), so
/// every one is `internal`.
#[derive(Debug, thiserror::Error)]
pub enum MirrorDiskError {
    /// A blocking task of the mirror panicked or was cancelled.
    #[error("the mirror's file-system work failed ({0})")]
    Task(#[source] tokio::task::JoinError),
    /// A directory operation on the mirror's side failed.
    #[error("could not {op} {what} ({source})")]
    Local {
        op: &'static str,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// `internal` with the sentence of the error; the log line keeps its cause.
impl From<MirrorDiskError> for ToolError {
    fn from(e: MirrorDiskError) -> Self {
        match &e {
            MirrorDiskError::Task(_) => {
                tracing::error!(error = %DisplayChain(&e), "a mirror file-system task failed");
            }
            MirrorDiskError::Local { op, what, .. } => tracing::error!(
                operation = op,
                what,
                error = %DisplayChain(&e),
                "mirror directory operation failed"
            ),
        }
        ToolError::internal(e.to_string())
    }
}

pub(super) fn blocking_failed(e: tokio::task::JoinError) -> ToolError {
    MirrorDiskError::Task(e).into()
}

/// A failed directory operation on the mirror's side. `e` is borrowed (the callers keep it),
/// so the error carries an equal copy: the same OS error code, or the same kind and text.
pub(super) fn local_failure(op: &'static str, what: &'static str, e: &io::Error) -> ToolError {
    let source = match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    };
    MirrorDiskError::Local { op, what, source }.into()
}

/// `(size, mtime_ns, ino, mode)` of local metadata.
pub(super) fn local_stamp(meta: &Metadata) -> FileStamp {
    let modified = meta.modified().ok().map(|m| m.into_std());
    FileStamp::of(meta.len(), modified, meta.ino(), meta.mode())
}

/// Removes the regular file `path` if its local stamp is still `local` (the sandbox left it
/// as the mirror wrote it), on its held-open parent; whether it did.
pub(super) fn remove_if_unchanged(root: &Dir, path: &str, local: FileStamp) -> bool {
    let Ok(Some((dir, name))) = open_parent_local(root, path, false, None) else {
        return false;
    };
    let unchanged = dir
        .symlink_metadata(&name)
        .is_ok_and(|m| m.is_file() && local_stamp(&m) == local);
    unchanged && dir.remove_file(&name).is_ok()
}

/// Opens the parent of `path` under `root` one component at a time without following links;
/// with `create`, missing directories are made (owned by `owner`) and a file or link in the
/// way is removed (the workspace wins). `None` when a parent is missing and not created.
pub(super) fn open_parent_local(
    root: &Dir,
    path: &str,
    create: bool,
    owner: Option<(u32, u32)>,
) -> io::Result<Option<(Dir, String)>> {
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().unwrap_or_default();
    let bad = |s: &str| s.is_empty() || s == "." || s == "..";
    if bad(name) || parts.iter().any(|p| bad(p)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a normalised relative path",
        ));
    }
    Ok(open_dirs_local(root, &parts, create, owner)?.map(|(dir, _)| (dir, name.to_owned())))
}

/// Opens the directories `parts` below `root` one at a time without following links; with
/// `create`, missing ones are made (owned by `owner`) and a file or link in the way is removed
/// (the workspace wins). `None` when one is missing and not created; else the last directory
/// and whether any was created.
fn open_dirs_local(
    root: &Dir,
    parts: &[&str],
    create: bool,
    owner: Option<(u32, u32)>,
) -> io::Result<Option<(Dir, bool)>> {
    let mut dir = root.open_dir_nofollow(".")?;
    let mut created = false;
    for part in parts {
        let next = match dir.open_dir_nofollow(part) {
            Ok(next) => next,
            Err(_) if !create => {
                return Ok(None);
            }
            Err(e) => {
                match dir.symlink_metadata(part) {
                    Err(m) if m.kind() == io::ErrorKind::NotFound => {}
                    // A file or a link where a directory must be: remove it (a link goes as
                    // a link; its target is untouched).
                    Ok(m) if !m.is_dir() => dir.remove_file_or_symlink(part)?,
                    _ => return Err(e),
                }
                match dir.create_dir(part) {
                    Ok(()) => created = true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                open_new_dir(&dir, part, owner)?
            }
        };
        dir = next;
    }
    Ok(Some((dir, created)))
}

/// Makes the directory `path` (and its parents) under `root`, never following a link; whether
/// anything was created.
pub(super) fn ensure_dir_local(
    root: &Dir,
    path: &str,
    owner: Option<(u32, u32)>,
) -> io::Result<bool> {
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a normalised relative path",
        ));
    }
    Ok(open_dirs_local(root, &parts, true, owner)?.is_some_and(|(_, created)| created))
}

/// Opens the directory `name` just created in `dir` (never following a link) and gives it to
/// `owner`. The handle is a plain read-only one: cap-std's `O_PATH` handles cannot be chowned.
fn open_new_dir(dir: &Dir, name: &str, owner: Option<(u32, u32)>) -> io::Result<Dir> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .maybe_dir(true)
        .nonblock(true)
        .follow(FollowSymlinks::No);
    let handle = dir.open_with(name, &options)?;
    if !handle.metadata()?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "replaced by something else while it was created",
        ));
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&handle, Some(uid), Some(gid))?;
    }
    Ok(Dir::from_std_file(handle.into_std()))
}

pub(super) fn parent_exists_local(root: &Dir, path: &str) -> bool {
    matches!(open_parent_local(root, path, false, None), Ok(Some(_)))
}

/// Writes `content` to `path` atomically (temp file + rename in the held-open parent), with
/// the workspace file's mtime and mode (masked by [`applied_mode`]), owned by `owner`; returns
/// the local stamp.
pub(super) fn write_local(
    root: &Dir,
    path: &str,
    content: &[u8],
    ws: FileStamp,
    owner: Option<(u32, u32)>,
) -> io::Result<FileStamp> {
    let mtime_ns = ws.mtime_ns;
    let (dir, name) = open_parent_local(root, path, true, owner)?
        .ok_or_else(|| io::Error::other("parent not created"))?;
    if dir.symlink_metadata(&name).is_ok_and(|m| m.is_dir()) {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "a local directory is in the way",
        ));
    }
    let temp = format!(".toolmesh-mirror-{}", unique());
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .follow(FollowSymlinks::No);
    let file = dir.open_with(&temp, &options)?;
    let written = (|| -> io::Result<FileStamp> {
        let mut file: File = file;
        file.write_all(content)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        if let Some(mode) = ws.mode {
            file.set_permissions(Permissions::from_mode(applied_mode(mode)))?;
        }
        let std_file = file.into_std();
        if mtime_ns >= 0 {
            let mtime = UNIX_EPOCH + Duration::from_nanos(mtime_ns as u64);
            std_file.set_times(std::fs::FileTimes::new().set_modified(mtime))?;
        }
        let file = File::from_std(std_file);
        Ok(local_stamp(&file.metadata()?))
    })();
    let stamp = match written {
        Ok(stamp) => stamp,
        Err(e) => {
            let _ = dir.remove_file(&temp);
            return Err(e);
        }
    };
    if let Err(e) = dir.rename(&temp, &dir, &name) {
        let _ = dir.remove_file(&temp);
        return Err(e);
    }
    Ok(stamp)
}

/// Reads a regular file under `root` without following links (`O_NOFOLLOW | O_NONBLOCK`,
/// type checked on the handle), at most `max_bytes`; `Err` says why not. The stamp is the
/// handle's, and must not change while reading.
pub(super) fn read_local(
    root: &Dir,
    path: &str,
    max_bytes: u64,
) -> Result<(Vec<u8>, FileStamp), String> {
    let (dir, name) = match open_parent_local(root, path, false, None) {
        Ok(Some(found)) => found,
        Ok(None) => return Err("a parent directory is gone".into()),
        Err(e) => return Err(format!("parent not openable: {e}")),
    };
    let mut options = OpenOptions::new();
    options.read(true).nonblock(true).follow(FollowSymlinks::No);
    let file = dir
        .open_with(&name, &options)
        .map_err(|e| format!("not openable without following: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("fstat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > max_bytes {
        return Err(format!(
            "{} bytes, over the limit of {max_bytes}",
            meta.len()
        ));
    }
    let before = local_stamp(&meta);
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    (&file)
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("read: {e}"))?;
    let after = file
        .metadata()
        .map(|m| local_stamp(&m))
        .map_err(|e| format!("fstat: {e}"))?;
    if after != before || bytes.len() as u64 != before.size {
        return Err("changed while it was read".into());
    }
    Ok((bytes, before))
}
