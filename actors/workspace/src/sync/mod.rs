//! The workspace side of workspace sync (`toolmesh_kernel::sync`): manifest, fetch and apply,
//! served by the `WorkspaceSyncer` actor on the three `toolmesh.internal.v1.workspace.*`
//! subjects.
//!
//! Every access goes through the session's [`crate::confine::Workspace`] capability. On top of its
//! confinement, sync never follows a symlink it meets: the manifest walk opens directories
//! with `O_NOFOLLOW` and skips links, fetch opens files with `O_NOFOLLOW`, and apply walks the
//! parents of a path one `open_dir_nofollow` at a time — a link on the way is refused
//! (`path_outside_workspace` when it leads out, `invalid_arguments` otherwise), and a link at
//! the path itself is replaced as a link by an unconditional put, never written through.
//!
//! Puts are staged under `.toolmesh/sync/` and renamed into place, so a reader of the
//! workspace sees the old file or the whole new one, never a part. A put's mode is applied to
//! the staged file (`fchmod` on its handle) before the rename, masked by
//! [`wire::applied_mode`]: whatever a sandbox sends, no workspace file becomes setuid, setgid,
//! sticky or writable by others through sync.
//!
//! Directory changes go through the same parent walk: `make_dir` creates missing parents one
//! `create_dir` + `open_dir_nofollow` at a time, `remove_dir` is one `unlinkat(AT_REMOVEDIR)`
//! on the held-open parent, which removes only an empty directory and never a link's target.
//! Neither may name a skipped directory or lie beneath one.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::{Client, Message};
use bytes::Bytes;
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::fs::{
    Dir, File, FileExt, Metadata, MetadataExt, OpenOptions, Permissions, PermissionsExt,
};
use serde_json::Value;
use toolmesh_actix_host::Handler;
use toolmesh_kernel::host::respond;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::sync::{
    self as wire, Change, ChangeOp, ChangeOutcome, Chunk, Current, Expected, FetchFailure,
    FetchRequest, Fetched, FileStamp, Manifest, ManifestEntry, ManifestLimits, ManifestRequest,
    BODY_CONTENT_BUDGET, MANIFEST_REPLY_BUDGET, MAX_PUT_BYTES, STAGING_DIR,
};
use toolmesh_kernel::{Account, SessionId, ToolError};

use crate::confine::{is_escape, ConfineError, Workspace, WorkspacePath};

mod error;

use error::{argument, io_error, request};
pub use error::{SyncError, SyncErrorKind};

/// A staging file not touched for this long belongs to an abandoned upload and is removed.
const STAGING_MAX_AGE: Duration = Duration::from_secs(3600);

/// The sync operations of every workspace under one data directory.
#[derive(Debug, Clone)]
pub struct SyncService {
    pub data_dir: PathBuf,
}

impl SyncService {
    pub fn new(data_dir: PathBuf) -> Self {
        Self { data_dir }
    }

    fn open(&self, account: &Account, session: &SessionId) -> Result<Workspace, SyncError> {
        Ok(Workspace::open(&self.data_dir, account, session)?)
    }

    /// Answers one request body that arrived on `subject` (blocking: run it off the reactor).
    pub fn handle(&self, subject: &str, payload: &Bytes) -> Vec<u8> {
        let json = |value: Value| serde_json::to_vec(&value).expect("a sync reply serializes");
        match subject {
            internal::WORKSPACE_MANIFEST => {
                json(match serde_json::from_slice::<ManifestRequest>(payload) {
                    Err(e) => wire::error_body(ToolError::invalid_request(format!(
                        "malformed manifest request: {e}"
                    ))),
                    Ok(req) => match self.manifest(&req.account, &req.session_id, req.limits) {
                        Ok(manifest) => wire::ok_body(&manifest),
                        Err(e) => wire::error_body(e.into()),
                    },
                })
            }
            internal::WORKSPACE_FETCH => match serde_json::from_slice::<FetchRequest>(payload) {
                Err(e) => wire::encode_frame(
                    &wire::error_body(ToolError::invalid_request(format!(
                        "malformed fetch request: {e}"
                    ))),
                    &[],
                ),
                Ok(req) => match self.fetch(&req) {
                    Ok(fetched) => wire::encode_fetched(&fetched),
                    Err(e) => wire::encode_frame(&wire::error_body(e.into()), &[]),
                },
            },
            internal::WORKSPACE_APPLY => json(match wire::decode_apply(payload) {
                Err(e) => wire::error_body(e),
                Ok((account, session, changes)) => match self.apply(&account, &session, changes) {
                    Ok(outcomes) => wire::ok_body(&wire::ApplyReply { outcomes }),
                    Err(e) => wire::error_body(e.into()),
                },
            }),
            other => json(wire::error_body(ToolError::invalid_request(format!(
                "no sync operation on {other}"
            )))),
        }
    }

    // --------------------------------------------------------------------------------------
    // Manifest

    /// The regular files of the workspace (see `kernel::sync` for the rules).
    pub fn manifest(
        &self,
        account: &Account,
        session: &SessionId,
        limits: ManifestLimits,
    ) -> Result<Manifest, SyncError> {
        let ws = self.open(account, session)?;
        let root = ws
            .dir()
            .open_dir_nofollow(".")
            .map_err(SyncError::OpenRoot)?;
        Ok(walk(Rc::new(root), limits))
    }

    // --------------------------------------------------------------------------------------
    // Fetch

    /// Chunks of the files asked for, in order, until [`BODY_CONTENT_BUDGET`] is used.
    pub fn fetch(&self, req: &FetchRequest) -> Result<Fetched, SyncError> {
        let ws = self.open(&req.account, &req.session_id)?;
        let mut fetched = Fetched::default();
        let mut used = 0usize;
        for (i, file) in req.files.iter().enumerate() {
            let budget = BODY_CONTENT_BUDGET - used;
            if budget == 0 {
                break;
            }
            match read_chunk(&ws, &file.path, file.offset, budget, i) {
                Ok(chunk) => {
                    used += chunk.content.len();
                    fetched.chunks.push(chunk);
                }
                Err(e) => {
                    let e = ToolError::from(e);
                    fetched.failed.push(FetchFailure {
                        path: file.path.clone(),
                        error: e.code,
                        error_message: e.message,
                    })
                }
            }
        }
        Ok(fetched)
    }

    // --------------------------------------------------------------------------------------
    // Apply

    /// Applies the changes in order; one outcome each.
    pub fn apply(
        &self,
        account: &Account,
        session: &SessionId,
        changes: Vec<Change>,
    ) -> Result<Vec<ChangeOutcome>, SyncError> {
        let ws = self.open(account, session)?;
        Ok(changes
            .into_iter()
            .enumerate()
            .map(|(i, change)| {
                let path = change.path.clone();
                apply_one(&ws, change, i)
                    .unwrap_or_else(|e| ChangeOutcome::rejected(&path, &ToolError::from(e)))
            })
            .collect())
    }
}

// ------------------------------------------------------------------------------------------
// The walk

struct Pending {
    parent: Rc<Dir>,
    name: OsString,
    rel: String,
    top_level: bool,
}

fn walk(root: Rc<Dir>, limits: ManifestLimits) -> Manifest {
    let mut manifest = Manifest::default();
    let mut dirs: Vec<String> = Vec::new();
    let mut total = 0u64;
    let mut reply_bytes = 64usize;
    let mut stack: Vec<Pending> = Vec::new();
    push_children(&root, "", &mut stack, &mut manifest.skipped);
    while let Some(item) = stack.pop() {
        let Ok(meta) = item.parent.symlink_metadata(&item.name) else {
            continue; // gone since the listing
        };
        let kind = meta.file_type();
        if kind.is_dir() {
            if wire::is_skipped_dir(&item.rel_name(), item.top_level) {
                continue;
            }
            // Opened by handle without following: a directory swapped for a link since the
            // listing is not entered.
            if let Ok(dir) = item.parent.open_dir_nofollow(&item.name) {
                // Directories count toward `max_files` with the files.
                let cost = item.rel.len() + 4;
                if manifest.entries.len() + dirs.len() >= limits.max_files as usize
                    || reply_bytes + cost > MANIFEST_REPLY_BUDGET
                {
                    manifest.truncated = true;
                    break;
                }
                reply_bytes += cost;
                push_children(&Rc::new(dir), &item.rel, &mut stack, &mut manifest.skipped);
                dirs.push(item.rel);
            }
        } else if kind.is_file() {
            let size = meta.len();
            if size > limits.max_file_bytes {
                manifest.skipped += 1;
                continue;
            }
            let cost = item.rel.len() + 96;
            if (manifest.entries.len() + dirs.len()) as u64 >= limits.max_files
                || total.saturating_add(size) > limits.max_total_bytes
                || reply_bytes + cost > MANIFEST_REPLY_BUDGET
            {
                manifest.truncated = true;
                break;
            }
            total += size;
            reply_bytes += cost;
            let stamp = stamp_of(&meta);
            manifest.entries.push(ManifestEntry {
                path: item.rel,
                size: stamp.size,
                mtime_ns: stamp.mtime_ns,
                ino: stamp.ino,
                mode: stamp.mode,
            });
        }
        // Symlinks, FIFOs, sockets, devices: never synced.
    }
    manifest.dirs = Some(dirs);
    manifest
}

impl Pending {
    fn rel_name(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }
}

/// Pushes the entries of `dir` so that they pop in byte order of their names.
fn push_children(dir: &Rc<Dir>, rel: &str, stack: &mut Vec<Pending>, skipped: &mut u64) {
    let Ok(read) = dir.entries() else {
        return;
    };
    let mut names: Vec<OsString> = read.filter_map(Result::ok).map(|e| e.file_name()).collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    for name in names {
        let Some(utf8) = name.to_str() else {
            *skipped += 1;
            continue;
        };
        let child_rel = if rel.is_empty() {
            utf8.to_owned()
        } else {
            format!("{rel}/{utf8}")
        };
        stack.push(Pending {
            parent: dir.clone(),
            name,
            rel: child_rel,
            top_level: rel.is_empty(),
        });
    }
}

/// `(size, mtime_ns, ino, mode)` of a file's metadata.
pub fn stamp_of(meta: &Metadata) -> FileStamp {
    let modified = meta.modified().ok().map(|m| m.into_std());
    FileStamp::of(meta.len(), modified, meta.ino(), meta.mode())
}

// ------------------------------------------------------------------------------------------
// Reading

fn pointer(i: usize, field: &str) -> String {
    format!("files/{i}/{field}")
}

fn read_chunk(
    ws: &Workspace,
    raw: &str,
    offset: u64,
    budget: usize,
    index: usize,
) -> Result<Chunk, SyncError> {
    let path = WorkspacePath::parse(raw, &pointer(index, "path"))?;
    if path.is_root() {
        return Err(argument(
            path.pointer(),
            "names the workspace root; name a file",
        ));
    }
    let mut options = OpenOptions::new();
    options.read(true).nonblock(true).follow(FollowSymlinks::No);
    let file = ws
        .dir()
        .open_with(path.as_path(), &options)
        .map_err(|e| io_error(ws, &path, "open", e))?;
    let meta = file
        .metadata()
        .map_err(|e| io_error(ws, &path, "inspect", e))?;
    if !meta.is_file() {
        return Err(argument(
            path.pointer(),
            format!("'{path}' is not a regular file; only regular files are synced"),
        ));
    }
    let stamp = stamp_of(&meta);
    let offset = offset.min(stamp.size);
    let want = usize::try_from(stamp.size - offset)
        .unwrap_or(usize::MAX)
        .min(budget);
    let mut content = vec![0u8; want];
    let mut filled = 0usize;
    while filled < want {
        match file.read_at(&mut content[filled..], offset + filled as u64) {
            Ok(0) => break, // shrank while read: the next fetch sees another stamp
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(ws, &path, "read", e)),
        }
    }
    content.truncate(filled);
    Ok(Chunk {
        path: path.as_str().to_owned(),
        offset,
        stamp,
        eof: offset + filled as u64 >= stamp.size,
        content: Bytes::from(content),
    })
}

// ------------------------------------------------------------------------------------------
// Writing

/// The parent directory of a path, opened without following links.
enum Parent {
    Open(Dir),
    /// A parent is missing (and was not to be created): the path is absent.
    Missing,
}

/// Opens the parent directory of `path` component by component, never following a link;
/// with `create`, missing directories are made.
fn open_parent(ws: &Workspace, path: &WorkspacePath, create: bool) -> Result<Parent, SyncError> {
    let mut dir = ws
        .dir()
        .open_dir_nofollow(".")
        .map_err(|e| io_error(ws, path, "open the workspace for", e))?;
    let Some(parent) = path.parent() else {
        return Ok(Parent::Open(dir));
    };
    let mut walked = String::new();
    for name in parent.as_str().split('/').filter(|s| !s.is_empty()) {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(name);
        let next = match dir.open_dir_nofollow(name) {
            Ok(next) => next,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(Parent::Missing);
                }
                match dir.create_dir(name) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_error(ws, path, "create a parent of", e)),
                }
                dir.open_dir_nofollow(name)
                    .map_err(|e| parent_error(ws, path, &walked, e))?
            }
            Err(e) => {
                if !create && dir.symlink_metadata(name).is_ok_and(|m| m.is_file()) {
                    return Ok(Parent::Missing);
                }
                return Err(parent_error(ws, path, &walked, e));
            }
        };
        dir = next;
    }
    Ok(Parent::Open(dir))
}

/// Why the parent `walked` of `path` cannot be opened without following.
fn parent_error(ws: &Workspace, path: &WorkspacePath, walked: &str, e: io::Error) -> SyncError {
    match ws.dir().symlink_metadata(walked) {
        Ok(meta) if meta.file_type().is_symlink() => {
            if ws.dir().open_dir(walked).is_err_and(|e| is_escape(&e)) {
                ConfineError::Outside(format!(
                    "'{path}' leads outside the workspace through the symbolic link '{walked}'"
                ))
                .into()
            } else {
                argument(
                    path.pointer(),
                    format!("'{walked}' is a symbolic link; sync never writes through links"),
                )
            }
        }
        Ok(meta) if !meta.is_dir() => argument(
            path.pointer(),
            format!("'{walked}' is a file, so '{path}' cannot be created beneath it"),
        ),
        _ => io_error(ws, path, "open a parent of", e),
    }
}

/// What is at `name` in `parent` now, without following.
fn current(parent: &Parent, name: &str) -> Result<Current, io::Error> {
    match parent {
        Parent::Open(dir) => current_in(dir, name),
        Parent::Missing => Ok(Current::Absent),
    }
}

/// What is at `name` in `dir` now, without following.
fn current_in(dir: &Dir, name: &str) -> Result<Current, io::Error> {
    match dir.symlink_metadata(name) {
        Ok(meta) => {
            let kind = meta.file_type();
            Ok(if kind.is_symlink() {
                Current::Symlink
            } else if kind.is_dir() {
                Current::Dir
            } else if kind.is_file() {
                Current::File(stamp_of(&meta))
            } else {
                Current::Other
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Current::Absent),
        Err(e) => Err(e),
    }
}

fn holds(expected: Expected, current: Current) -> bool {
    match (expected, current) {
        (Expected::Any, _) | (Expected::Absent, Current::Absent) => true,
        (Expected::Stamp(want), Current::File(have)) => want.holds_for(&have),
        _ => false,
    }
}

fn apply_one(ws: &Workspace, change: Change, index: usize) -> Result<ChangeOutcome, SyncError> {
    let path = WorkspacePath::parse(&change.path, &format!("changes/{index}/path"))?;
    let Some(name) = path.file_name().map(str::to_owned) else {
        return Err(argument(
            path.pointer(),
            "names the workspace root; name a file",
        ));
    };
    if path.as_str() == STAGING_DIR || path.as_str().starts_with(&format!("{STAGING_DIR}/")) {
        return Err(argument(
            path.pointer(),
            format!("'{path}' is inside the sync staging area {STAGING_DIR}; pick another path"),
        ));
    }
    let display = path.as_str().to_owned();
    let applied = |display: String| ChangeOutcome::Applied {
        path: display,
        stamp: None,
    };
    let conflict = |display: String, current: Current| ChangeOutcome::Conflict {
        path: display,
        current,
    };
    // What the folder `dir` holds at the path's name.
    let inspect = |dir: &Dir| current_in(dir, &name).map_err(|e| io_error(ws, &path, "inspect", e));
    if matches!(change.op, ChangeOp::MakeDir | ChangeOp::RemoveDir)
        && wire::is_skipped_path(&format!("{path}/x"))
    {
        return Err(argument(
            path.pointer(),
            format!("'{path}' is a directory sync skips (or lies beneath one); it is never synced"),
        ));
    }
    match change.op {
        ChangeOp::MakeDir => {
            let dir = match open_parent(ws, &path, true)? {
                Parent::Open(dir) => dir,
                Parent::Missing => unreachable!("open_parent creates missing parents"),
            };
            match inspect(&dir)? {
                Current::Dir => Ok(applied(display)),
                Current::Absent => match dir.create_dir(&name) {
                    Ok(()) => Ok(applied(display)),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match inspect(&dir)? {
                        Current::Dir => Ok(applied(display)),
                        now => Ok(conflict(display, now)),
                    },
                    Err(e) => Err(io_error(ws, &path, "create", e)),
                },
                now => Ok(conflict(display, now)),
            }
        }
        ChangeOp::RemoveDir => {
            let Parent::Open(dir) = open_parent(ws, &path, false)? else {
                return Ok(applied(display));
            };
            match inspect(&dir)? {
                Current::Absent => Ok(applied(display)),
                // unlinkat(AT_REMOVEDIR): only an empty directory goes, a link never.
                Current::Dir => match dir.remove_dir(&name) {
                    Ok(()) => Ok(applied(display)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(applied(display)),
                    Err(e)
                        if e.kind() == io::ErrorKind::DirectoryNotEmpty
                            || e.kind() == io::ErrorKind::NotADirectory
                            || e.raw_os_error() == Some(17) /* EEXIST, ENOTEMPTY's alias */ =>
                    {
                        Ok(conflict(display, inspect(&dir)?))
                    }
                    Err(e) => Err(io_error(ws, &path, "remove", e)),
                },
                now => Ok(conflict(display, now)),
            }
        }
        ChangeOp::Delete { prune_empty_dirs } => {
            let parent = open_parent(ws, &path, false)?;
            let now = current(&parent, &name).map_err(|e| io_error(ws, &path, "inspect", e))?;
            let Parent::Open(dir) = &parent else {
                return Ok(applied(display));
            };
            match now {
                Current::Absent => {}
                Current::File(_) if holds(change.expected, now) => {
                    remove_entry(dir, &name).map_err(|e| io_error(ws, &path, "delete", e))?
                }
                Current::Symlink if change.expected == Expected::Any => {
                    remove_entry(dir, &name).map_err(|e| io_error(ws, &path, "delete", e))?
                }
                Current::Dir | Current::Other if change.expected == Expected::Any => {
                    return Err(argument(
                        path.pointer(),
                        format!("'{path}' is not a regular file; sync deletes files only"),
                    ))
                }
                _ => return Ok(conflict(display, now)),
            }
            if prune_empty_dirs {
                prune(ws, &path);
            }
            Ok(applied(display))
        }
        ChangeOp::Put {
            upload,
            offset,
            total,
            content,
            mode,
        } => {
            let len = content.len() as u64;
            if total > MAX_PUT_BYTES {
                return Err(SyncError::TooBig {
                    path: path.to_string(),
                    total,
                    max: MAX_PUT_BYTES,
                });
            }
            if offset.checked_add(len).is_none_or(|end| end > total) {
                return Err(request(format!(
                    "a part of '{path}' ends past its total of {total} bytes"
                )));
            }
            let single = offset == 0 && len == total;
            let staging_name = match (&upload, single) {
                (Some(id), _) => {
                    if id.is_empty()
                        || id.len() > 64
                        || !id
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                    {
                        return Err(request("an upload id must match [A-Za-z0-9_-]{1,64}"));
                    }
                    format!("up-{id}")
                }
                (None, true) => format!("tmp-{}", uuid::Uuid::new_v4().simple()),
                (None, false) => {
                    return Err(request(format!(
                        "a put of '{path}' in several parts needs an upload id"
                    )))
                }
            };
            let last = offset + len == total;
            // The precondition: at the first part (a conflict costs no upload) …
            if offset == 0 {
                let parent = open_parent(ws, &path, false)?;
                let now = current(&parent, &name).map_err(|e| io_error(ws, &path, "inspect", e))?;
                if !holds(change.expected, now) {
                    return Ok(conflict(display, now));
                }
                if now == Current::Dir {
                    return Err(argument(
                        path.pointer(),
                        format!(
                            "'{path}' is a directory in the workspace; it cannot become a file"
                        ),
                    ));
                }
            }
            let staging = open_staging(ws)?;
            if offset == 0 && !single {
                sweep_staging(&staging);
            }
            let file = stage_part(&staging, &staging_name, offset, &content)
                .map_err(|e| staging_error(&path, e))?;
            if !last {
                return Ok(ChangeOutcome::Staged {
                    path: display,
                    received: offset + len,
                });
            }
            let discard = || {
                let _ = staging.remove_file(&staging_name);
            };
            // fchmod on the staged file's handle, masked: never setuid, setgid or sticky.
            if let Some(mode) = mode {
                let permissions = Permissions::from_mode(wire::applied_mode(mode));
                if let Err(e) = file.set_permissions(permissions) {
                    discard();
                    return Err(staging_error(&path, e));
                }
            }
            if let Err(e) = file.sync_all() {
                discard();
                return Err(staging_error(&path, e));
            }
            let meta = match file.metadata() {
                Ok(meta) => meta,
                Err(e) => {
                    discard();
                    return Err(staging_error(&path, e));
                }
            };
            if meta.len() != total {
                discard();
                return Err(request(format!(
                    "the parts of '{path}' add up to {} bytes, not {total}",
                    meta.len()
                )));
            }
            drop(file);
            // … and again just before the rename.
            let dir = match open_parent(ws, &path, true) {
                Ok(Parent::Open(dir)) => dir,
                Ok(Parent::Missing) => unreachable!("open_parent creates missing parents"),
                Err(e) => {
                    discard();
                    return Err(e);
                }
            };
            let now = match current_in(&dir, &name) {
                Ok(now) => now,
                Err(e) => {
                    discard();
                    return Err(io_error(ws, &path, "inspect", e));
                }
            };
            if !holds(change.expected, now) {
                discard();
                return Ok(conflict(display, now));
            }
            if let Err(e) = staging.rename(&staging_name, &dir, &name) {
                discard();
                return Err(match e.kind() {
                    io::ErrorKind::IsADirectory | io::ErrorKind::DirectoryNotEmpty => argument(
                        path.pointer(),
                        format!(
                            "'{path}' is a directory in the workspace; it cannot become a file"
                        ),
                    ),
                    _ => io_error(ws, &path, "replace", e),
                });
            }
            Ok(ChangeOutcome::Applied {
                path: display,
                stamp: Some(stamp_of(&meta)),
            })
        }
    }
}

fn remove_entry(dir: &Dir, name: &str) -> io::Result<()> {
    dir.remove_file_or_symlink(name)
}

/// Removes the now-empty parents of `path`, innermost first, up to the root.
fn prune(ws: &Workspace, path: &WorkspacePath) {
    let mut at = path.parent();
    while let Some(dir) = at.filter(|d| !d.is_root()) {
        let is_real_dir = ws
            .dir()
            .symlink_metadata(dir.as_path())
            .is_ok_and(|m| m.is_dir());
        if !is_real_dir || ws.dir().remove_dir(dir.as_path()).is_err() {
            break;
        }
        at = dir.parent();
    }
}

/// `.toolmesh/sync`, created when missing, opened without following links.
fn open_staging(ws: &Workspace) -> Result<Dir, SyncError> {
    let marker = WorkspacePath::parse(&format!("{STAGING_DIR}/x"), "path")
        .expect("the staging path is valid");
    match open_parent(ws, &marker, true)? {
        Parent::Open(dir) => Ok(dir),
        Parent::Missing => unreachable!("open_parent creates missing parents"),
    }
}

/// Writes one part to the staging file: the first part creates (or restarts) it, later ones
/// must start where the file ends (a sender sends one part at a time, in order).
fn stage_part(staging: &Dir, name: &str, offset: u64, content: &[u8]) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).follow(FollowSymlinks::No);
    if offset == 0 {
        options.create(true).truncate(true);
    }
    let file = staging.open_with(name, &options)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the staging entry is not a regular file",
        ));
    }
    if meta.len() != offset {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "part out of order: {} bytes are staged, the part starts at {offset}",
                meta.len()
            ),
        ));
    }
    file.write_all_at(content, offset)?;
    Ok(file)
}

fn staging_error(path: &WorkspacePath, e: io::Error) -> SyncError {
    match e.kind() {
        io::ErrorKind::NotFound => request(format!(
            "no upload of '{path}' is staged (its first part is missing or expired); start again at offset 0"
        )),
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => SyncError::Upload {
            path: path.to_string(),
            source: e,
        },
        _ => SyncError::Stage {
            path: path.to_string(),
            source: e,
        },
    }
}

/// Removes staging files older than [`STAGING_MAX_AGE`] (abandoned uploads).
fn sweep_staging(staging: &Dir) {
    let Ok(entries) = staging.entries() else {
        return;
    };
    let now = SystemTime::now();
    for entry in entries.filter_map(Result::ok) {
        let old = entry
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .and_then(|m| now.duration_since(m.into_std()).ok())
            .is_some_and(|age| age > STAGING_MAX_AGE);
        if old {
            let _ = staging.remove_file(entry.file_name());
        }
    }
}

// ------------------------------------------------------------------------------------------
// The actor

/// Serves the sync subjects; each request runs as a task of its own (hosted by
/// [`toolmesh_actix_host`]), file work on tokio's blocking pool.
pub struct WorkspaceSyncer {
    pub client: Client,
    pub service: Arc<SyncService>,
}

impl Handler for WorkspaceSyncer {
    type Request = Message;

    async fn handle(&self, msg: Message) {
        let service = self.service.clone();
        let subject = msg.subject.to_string();
        let payload = msg.payload.clone();
        let body = tokio::task::spawn_blocking(move || service.handle(&subject, &payload))
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "a workspace sync request panicked");
                let error = wire::error_body(ToolError::internal(
                    "the workspace sync request failed; the workspace actor's log has the details",
                ));
                if msg.subject.as_str() == internal::WORKSPACE_FETCH {
                    wire::encode_frame(&error, &[])
                } else {
                    serde_json::to_vec(&error).expect("an error serializes")
                }
            });
        respond(&self.client, msg.reply.as_ref(), body).await;
    }
}
