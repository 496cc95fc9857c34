//! The mirror: a worker-local copy of one session's workspace, bind-mounted as `/workspace`
//! in its sandbox, kept in step with the workspace actor over NATS (`kernel::sync`).
//!
//! Before a command, [`Mirror::pull`] brings workspace changes in; after it, [`Mirror::push`]
//! sends back what the command created, changed or deleted.
//!
//! **The local directory is hostile.** The sandbox (uid 1000 in a container) writes it and may
//! plant symlinks to anywhere, FIFOs, devices, hard links or huge files, and may swap a
//! directory for a symlink while the mirror reads. So every access goes through a
//! `cap_std::fs::Dir` opened on `local_root`: directories are entered only by
//! `open_dir_nofollow` on the handle of their parent, files are opened with `O_NOFOLLOW |
//! O_NONBLOCK` and their type is checked on the opened handle (`fstat`), sizes are capped while
//! reading, and only regular files are ever read or sent. Writes go to a fresh temp file
//! (`O_CREAT | O_EXCL`, which never follows a link) in the held-open parent, then are renamed
//! over the name — so a planted link is replaced as a link, never written through. A hard link
//! can only join files the sandbox can see already (inside the mirror), and the mirror never
//! writes into an existing file, so hard links cannot carry a write elsewhere.
//!
//! **What the mirror remembers** (`known`): for each file it synced, the workspace stamp and
//! the local stamp `(size, mtime_ns, ino)` that hold the same content. A local file whose stamp
//! differs changed in the sandbox; a workspace file whose stamp differs changed in the
//! workspace. mtimes come from a coarse clock, so a file recorded less than [`RACY_NS`] after
//! its mtime is "racy" (a rewrite of the same size within the same tick would keep its stamp):
//! its content hash is kept and compared on the next push, as git does for racily clean files.
//!
//! **Modes.** The local stamp carries the mode (`st_mode & 0o7777`), so a `chmod` in the
//! sandbox is a change: the file is sent again with its permission bits, and the workspace
//! applies them masked (`kernel::sync::applied_mode`: never setuid, setgid or sticky). A pull
//! writes each file with the workspace file's mode, masked the same way.
//!
//! **Directories** (with a workspace whose manifest lists them). The mirror remembers the
//! directories it knows on both sides (`known_dirs`). A pull creates each listed directory it
//! does not know (removing a file or link in the way: the workspace wins), and removes a known
//! directory the workspace no longer lists only if it is empty here (`rmdir` on its held-open
//! parent, which never follows a link). A push sends a `make_dir` for each local directory it
//! does not know and a `remove_dir` for each known directory that is gone here, children
//! first, after the file changes; the workspace removes one only while it is empty there, and
//! a conflict (not empty there, or a file there) leaves the workspace's state to the next pull.
//! Directories count toward `max_files`. Dirs travel in applies of their own, so a workspace of
//! an older version that refuses them still takes the file changes.
//!
//! **Who wins.** The workspace: a pull overwrites a local file when the workspace changed it,
//! and a push is conditional on the workspace stamp the mirror last saw, so a file changed on
//! both sides comes back as a conflict (reported, not fatal) and the next pull brings the
//! workspace version. A pull removes a local file the workspace no longer has only when the
//! mirror put it there and the sandbox has not changed it since.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use cap_fs_ext::{
    DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsMaybeDirExt, OpenOptionsSyncExt,
};
use cap_std::fs::{Dir, File, Metadata, MetadataExt, OpenOptions, Permissions, PermissionsExt};
use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_kernel::sync::{
    applied_mode, is_skipped_dir, is_skipped_path, Change, ChangeOp, ChangeOutcome, Expected,
    FetchFile, FileStamp, Manifest, ManifestLimits, WorkspaceSync, BODY_CONTENT_BUDGET,
    MODE_PERMISSION_BITS,
};
use toolmesh_kernel::{Account, ErrorCode, SessionId, ToolError};

/// A file whose mtime is this close to the moment it was recorded may be rewritten within
/// the same clock tick without its stamp changing; its content hash is kept (see module docs).
pub const RACY_NS: i64 = 100_000_000;
/// The uid and gid of the sandbox user, who must own what the mirror creates.
pub const SANDBOX_OWNER: (u32, u32) = (1000, 1000);
/// Files asked for in one fetch request.
const FETCH_BATCH_FILES: usize = 256;

/// Caps of what is synced, both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncLimits {
    pub max_files: usize,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

impl Default for SyncLimits {
    fn default() -> Self {
        Self {
            max_files: 2000,
            max_file_bytes: 10 * 1024 * 1024,
            max_total_bytes: 64 * 1024 * 1024,
        }
    }
}

impl SyncLimits {
    fn wire(self) -> ManifestLimits {
        ManifestLimits {
            max_files: self.max_files as u64,
            max_file_bytes: self.max_file_bytes,
            max_total_bytes: self.max_total_bytes,
        }
    }
}

/// What a pull did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullReport {
    /// Files written locally (new or changed in the workspace).
    pub copied: usize,
    /// Local files removed because the workspace no longer has them.
    pub removed: usize,
    /// Local directories created for directories of the workspace (beyond the parents of
    /// files written).
    pub dirs_created: usize,
    /// Empty local directories removed because the workspace no longer has them.
    pub dirs_removed: usize,
    /// Files not synced: over the limits, unreadable, or in the way of a directory.
    pub skipped: usize,
    /// The workspace has more than the limits allow; files past them were not looked at
    /// (and no local file was removed).
    pub truncated: bool,
}

/// What a push did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushReport {
    /// Files created or changed (content or mode) in the workspace, and directories created
    /// there (named with a trailing `/`).
    pub changed: Vec<String>,
    /// Files deleted from the workspace, and directories removed there (trailing `/`).
    pub deleted: Vec<String>,
    /// Changes not applied because the workspace changed too (its version wins; the next
    /// pull brings it).
    pub conflicts: Vec<String>,
    /// Files not sent: over the limits, not regular files' names, changing while read, or
    /// refused by the workspace.
    pub skipped: usize,
}

/// What the mirror knows of one synced file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Known {
    /// The workspace file's stamp …
    ws: FileStamp,
    /// … and the local file's stamp, when both held the same content.
    local: FileStamp,
    /// sha256 of that content, kept while the local stamp is racy.
    hash: Option<String>,
}

/// A local copy of one session's workspace.
pub struct Mirror {
    sync: WorkspaceSync,
    account: Account,
    session: SessionId,
    local_root: PathBuf,
    limits: SyncLimits,
    /// Owner given to every file and directory the mirror creates; `Some(1000, 1000)` by
    /// default when running as root (so the sandbox user can change them), else `None`.
    pub owner: Option<(u32, u32)>,
    known: HashMap<String, Known>,
    /// Directories known to exist on both sides.
    known_dirs: HashSet<String>,
    /// The last manifest listed directories: the workspace syncs them.
    dirs_synced: bool,
    root: Option<Dir>,
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

    fn root(&mut self) -> Result<&Dir, ToolError> {
        if self.root.is_none() {
            std::fs::create_dir_all(&self.local_root)
                .map_err(|e| local_failure("create", "the mirror directory", &e))?;
            // A plain read-only handle (cap-std's own are `O_PATH`, which cannot be chowned).
            let handle = std::fs::File::open(&self.local_root)
                .map_err(|e| local_failure("open", "the mirror directory", &e))?;
            if let Some((uid, gid)) = self.owner {
                std::os::unix::fs::fchown(&handle, Some(uid), Some(gid))
                    .map_err(|e| local_failure("chown", "the mirror directory", &e))?;
            }
            self.root = Some(Dir::from_std_file(handle));
        }
        Ok(self.root.as_ref().expect("opened above"))
    }

    /// Workspace → local directory: copies new and changed files (by workspace stamp),
    /// removes local files the workspace no longer has (only those this mirror put there and
    /// the sandbox did not change since). One manifest round trip when nothing changed.
    pub async fn pull(&mut self) -> Result<PullReport, ToolError> {
        let manifest = self.manifest().await?;
        self.pull_listed(manifest).await
    }

    /// The workspace's manifest: the first half of [`Self::pull`], which changes nothing here
    /// (so it may be asked for before it is sure the pull may go on).
    pub async fn manifest(&self) -> Result<Manifest, ToolError> {
        self.sync
            .manifest(&self.account, &self.session, self.limits.wire())
            .await
    }

    /// The rest of [`Self::pull`], from the manifest [`Self::manifest`] returned.
    pub async fn pull_listed(&mut self, manifest: Manifest) -> Result<PullReport, ToolError> {
        let owner = self.owner;
        self.root()?;
        let mut report = PullReport {
            skipped: usize::try_from(manifest.skipped).unwrap_or(usize::MAX),
            truncated: manifest.truncated,
            ..PullReport::default()
        };
        let mut listed: HashSet<&str> = HashSet::with_capacity(manifest.entries.len());
        let mut queue: VecDeque<FetchFile> = VecDeque::new();
        for entry in &manifest.entries {
            if is_skipped_path(&entry.path) {
                continue;
            }
            listed.insert(&entry.path);
            if self.known.get(&entry.path).map(|k| k.ws) != Some(entry.stamp()) {
                queue.push_back(FetchFile {
                    path: entry.path.clone(),
                    offset: 0,
                });
            }
        }
        let mut gone: Vec<String> = if manifest.truncated {
            Vec::new()
        } else {
            self.known
                .keys()
                .filter(|p| !listed.contains(p.as_str()))
                .cloned()
                .collect()
        };

        // Fetch what changed, a budget's worth of chunks per round trip.
        let mut partial: HashMap<String, (BytesMut, FileStamp)> = HashMap::new();
        let mut restarts: HashMap<String, u32> = HashMap::new();
        while !queue.is_empty() {
            let batch: Vec<FetchFile> = queue.drain(..queue.len().min(FETCH_BATCH_FILES)).collect();
            let fetched = self
                .sync
                .fetch(&self.account, &self.session, batch.clone())
                .await?;
            let mut answered: HashSet<String> = HashSet::new();
            for failure in fetched.failed {
                answered.insert(failure.path.clone());
                partial.remove(&failure.path);
                if failure.error == ErrorCode::NotFound {
                    gone.push(failure.path);
                } else {
                    tracing::warn!(path = %failure.path, error = %failure.error_message, "workspace file not pulled");
                    report.skipped += 1;
                }
            }
            for chunk in fetched.chunks {
                answered.insert(chunk.path.clone());
                let (buf, stamp) = partial
                    .entry(chunk.path.clone())
                    .or_insert_with(|| (BytesMut::new(), chunk.stamp));
                if *stamp != chunk.stamp || buf.len() as u64 != chunk.offset {
                    // Changed between chunks: start over, a few times at most.
                    let tries = restarts.entry(chunk.path.clone()).or_default();
                    *tries += 1;
                    partial.remove(&chunk.path);
                    if *tries > 3 {
                        report.skipped += 1;
                    } else {
                        queue.push_back(FetchFile {
                            path: chunk.path,
                            offset: 0,
                        });
                    }
                    continue;
                }
                buf.extend_from_slice(&chunk.content);
                if !chunk.eof {
                    queue.push_back(FetchFile {
                        path: chunk.path.clone(),
                        offset: buf.len() as u64,
                    });
                    continue;
                }
                let (content, ws_stamp) = partial.remove(&chunk.path).expect("inserted above");
                let root = self.root.as_ref().expect("opened above");
                match write_local(root, &chunk.path, &content, ws_stamp, owner) {
                    Ok(local) => {
                        let hash = is_racy(local.mtime_ns).then(|| sha256_hex(&content));
                        self.known.insert(
                            chunk.path,
                            Known {
                                ws: ws_stamp,
                                local,
                                hash,
                            },
                        );
                        report.copied += 1;
                    }
                    // The sandbox's disk is full (`TOOLMESH_SANDBOX_DISK_MB`): say so, and run
                    // nothing on a workspace that is only partly there.
                    Err(e) if crate::disk::is_full(&e) => {
                        self.known.remove(&chunk.path);
                        return Err(crate::disk::full_error(&chunk.path));
                    }
                    Err(e) => {
                        tracing::warn!(path = %chunk.path, error = %e, "workspace file not written to the mirror");
                        self.known.remove(&chunk.path);
                        report.skipped += 1;
                    }
                }
            }
            // Files the reply did not reach go first in the next round.
            for file in batch.into_iter().rev() {
                if !answered.contains(&file.path) {
                    queue.push_front(file);
                }
            }
        }

        // Remove what the workspace no longer has, if the sandbox left it as the mirror wrote it.
        let root = self.root.as_ref().expect("opened above");
        for path in gone {
            let Some(known) = self.known.remove(&path) else {
                continue;
            };
            if let Ok(Some((dir, name))) = open_parent_local(root, &path, false, None) {
                let unchanged = dir
                    .symlink_metadata(&name)
                    .is_ok_and(|m| m.is_file() && local_stamp(&m) == known.local);
                if unchanged && dir.remove_file(&name).is_ok() {
                    report.removed += 1;
                }
            }
        }
        self.dirs_synced = manifest.dirs.is_some();
        if let Some(dirs) = &manifest.dirs {
            self.pull_dirs(dirs, manifest.truncated, &mut report);
        }
        Ok(report)
    }

    /// The directory half of a pull: creates listed directories the mirror does not know,
    /// removes known ones the workspace no longer lists if they are empty here.
    fn pull_dirs(&mut self, dirs: &[String], truncated: bool, report: &mut PullReport) {
        let owner = self.owner;
        let root = self.root.as_ref().expect("opened by the pull");
        let listed: HashSet<&str> = dirs
            .iter()
            .map(String::as_str)
            .filter(|d| !is_skipped_path(&format!("{d}/x")))
            .collect();
        for dir in dirs {
            if !listed.contains(dir.as_str()) || self.known_dirs.contains(dir) {
                continue;
            }
            match ensure_dir_local(root, dir, owner) {
                Ok(created) => {
                    report.dirs_created += usize::from(created);
                    self.known_dirs.insert(dir.clone());
                }
                Err(e) => {
                    tracing::warn!(path = %dir, error = %e, "workspace directory not made in the mirror");
                    report.skipped += 1;
                }
            }
        }
        if truncated {
            return;
        }
        let mut gone: Vec<String> = self
            .known_dirs
            .iter()
            .filter(|d| !listed.contains(d.as_str()))
            .cloned()
            .collect();
        gone.sort_unstable_by(|a, b| b.cmp(a)); // children first
        for dir in gone {
            self.known_dirs.remove(&dir);
            // rmdir on the held-open parent: only if empty here, never through a link.
            if let Ok(Some((parent, name))) = open_parent_local(root, &dir, false, None) {
                if parent.remove_dir(&name).is_ok() {
                    report.dirs_removed += 1;
                }
            }
        }
    }

    /// Local directory → workspace: files created or changed since the last pull or push (by
    /// local size, mtime and inode) are sent, conditional on the workspace stamp last seen;
    /// files the mirror knew that are gone are deleted the same way. Conflicts are reported.
    pub async fn push(&mut self) -> Result<PushReport, ToolError> {
        let limits = self.limits;
        let root = self
            .root()?
            .try_clone()
            .map_err(|e| local_failure("open", "the mirror directory", &e))?;
        let walked = walk_local(&root, limits);
        let mut report = PushReport {
            skipped: walked.skipped,
            ..PushReport::default()
        };

        // What changed locally.
        let mut candidates: Vec<(String, Expected)> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::with_capacity(walked.files.len());
        for (path, stamp) in &walked.files {
            seen.insert(path);
            match self.known.get_mut(path) {
                Some(known) if known.local == *stamp => {
                    let Some(hash) = &known.hash else { continue };
                    // Racy: the stamp alone cannot tell; compare content.
                    match read_local(&root, path, limits.max_file_bytes) {
                        Ok((bytes, now)) if now == *stamp && sha256_hex(&bytes) == *hash => {
                            if !is_racy(stamp.mtime_ns) {
                                known.hash = None;
                            }
                        }
                        _ => candidates.push((path.clone(), Expected::Stamp(known.ws))),
                    }
                }
                Some(known) => candidates.push((path.clone(), Expected::Stamp(known.ws))),
                None => candidates.push((path.clone(), Expected::Absent)),
            }
        }
        let deletions: Vec<(String, FileStamp)> = if walked.truncated {
            Vec::new()
        } else {
            self.known
                .iter()
                .filter(|(p, _)| !seen.contains(p.as_str()) && !walked.oversized.contains(*p))
                .map(|(p, k)| (p.clone(), k.ws))
                .collect()
        };

        // Send them: small files together, big ones in parts of their own.
        let mut batch = Batch::default();
        for (path, expected) in candidates {
            let (bytes, local) = match read_local(&root, &path, limits.max_file_bytes) {
                Ok(read) => read,
                Err(why) => {
                    tracing::debug!(path = %path, why = %why, "local file not pushed");
                    report.skipped += 1;
                    continue;
                }
            };
            let bytes = Bytes::from(bytes);
            if bytes.len() > BODY_CONTENT_BUDGET {
                self.send(&mut batch, &mut report).await?;
                self.put_in_parts(path, expected, bytes, local, &mut report)
                    .await?;
                continue;
            }
            if batch.bytes + bytes.len() > BODY_CONTENT_BUDGET {
                self.send(&mut batch, &mut report).await?;
            }
            batch.bytes += bytes.len();
            let total = bytes.len() as u64;
            batch.items.push((
                Change {
                    path: path.clone(),
                    expected,
                    op: ChangeOp::Put {
                        upload: None,
                        offset: 0,
                        total,
                        content: bytes.clone(),
                        mode: local.mode.map(|m| m & MODE_PERMISSION_BITS),
                    },
                },
                Some((local, bytes)),
            ));
        }
        for (path, ws) in deletions {
            // With directories synced, each gone directory is removed by a change of its own
            // (below); pruning here could remove a directory that still exists here.
            let prune_empty_dirs = !self.dirs_synced && !parent_exists_local(&root, &path);
            batch.items.push((
                Change {
                    path,
                    expected: Expected::Stamp(ws),
                    op: ChangeOp::Delete { prune_empty_dirs },
                },
                None,
            ));
            if batch.items.len() >= 1000 {
                self.send(&mut batch, &mut report).await?;
            }
        }
        self.send(&mut batch, &mut report).await?;
        if self.dirs_synced {
            self.push_dirs(&walked, &mut report).await?;
        }
        Ok(report)
    }

    /// The directory half of a push: `make_dir` for local directories the mirror does not know
    /// (parents first), `remove_dir` for known ones gone here (children first).
    async fn push_dirs(
        &mut self,
        walked: &Walked,
        report: &mut PushReport,
    ) -> Result<(), ToolError> {
        let mut made: Vec<&String> = walked
            .dirs
            .iter()
            .filter(|d| !self.known_dirs.contains(*d))
            .collect();
        made.sort_unstable();
        let mut removed: Vec<String> = if walked.truncated {
            Vec::new()
        } else {
            let here: HashSet<&str> = walked.dirs.iter().map(String::as_str).collect();
            self.known_dirs
                .iter()
                .filter(|d| !here.contains(d.as_str()))
                .cloned()
                .collect()
        };
        removed.sort_unstable_by(|a, b| b.cmp(a));
        let changes: Vec<Change> = made
            .into_iter()
            .map(|d| (d.clone(), ChangeOp::MakeDir))
            .chain(removed.into_iter().map(|d| (d, ChangeOp::RemoveDir)))
            .map(|(path, op)| Change {
                path,
                expected: Expected::Any,
                op,
            })
            .collect();
        for batch in changes.chunks(1000) {
            let outcomes = match self.sync.apply(&self.account, &self.session, batch).await {
                Ok(outcomes) => outcomes,
                Err(e) if e.code == ErrorCode::InvalidRequest => {
                    // A workspace of an older version: it knows no directory changes.
                    tracing::warn!(error = %e.message, "the workspace refused directory changes");
                    report.skipped += batch.len();
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (change, outcome) in batch.iter().zip(outcomes) {
                let shown = format!("{}/", change.path);
                let making = change.op == ChangeOp::MakeDir;
                match outcome {
                    ChangeOutcome::Applied { .. } if making => {
                        self.know_dir_and_parents(&change.path);
                        report.changed.push(shown);
                    }
                    ChangeOutcome::Applied { .. } => {
                        self.known_dirs.remove(&change.path);
                        report.deleted.push(shown);
                    }
                    ChangeOutcome::Conflict { .. } => {
                        // The workspace's state wins: the next pull brings it.
                        self.known_dirs.remove(&change.path);
                        report.conflicts.push(shown);
                    }
                    ChangeOutcome::Staged { .. } | ChangeOutcome::Rejected { .. } => {
                        tracing::warn!(path = %change.path, outcome = ?outcome, "the workspace refused a mirrored directory change");
                        report.skipped += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Records `path` and its parents as directories on both sides.
    fn know_dir_and_parents(&mut self, path: &str) {
        let mut at = Some(path);
        while let Some(dir) = at.filter(|d| !d.is_empty()) {
            if !self.known_dirs.insert(dir.to_owned()) {
                break;
            }
            at = dir.rsplit_once('/').map(|(parent, _)| parent);
        }
    }

    /// Sends a batch and records its outcomes.
    async fn send(&mut self, batch: &mut Batch, report: &mut PushReport) -> Result<(), ToolError> {
        if batch.items.is_empty() {
            return Ok(());
        }
        let items = std::mem::take(&mut batch.items);
        batch.bytes = 0;
        let changes: Vec<Change> = items.iter().map(|(c, _)| c.clone()).collect();
        let outcomes = self
            .sync
            .apply(&self.account, &self.session, &changes)
            .await?;
        for ((change, local), outcome) in items.into_iter().zip(outcomes) {
            self.record(change.path, local, outcome, report);
        }
        Ok(())
    }

    /// A file over one body's budget: parts of its own, stopping at a conflict.
    async fn put_in_parts(
        &mut self,
        path: String,
        expected: Expected,
        bytes: Bytes,
        local: FileStamp,
        report: &mut PushReport,
    ) -> Result<(), ToolError> {
        let upload = format!("mirror-{}", unique());
        let total = bytes.len() as u64;
        let mut offset = 0usize;
        loop {
            let end = (offset + BODY_CONTENT_BUDGET).min(bytes.len());
            let change = Change {
                path: path.clone(),
                expected,
                op: ChangeOp::Put {
                    upload: Some(upload.clone()),
                    offset: offset as u64,
                    total,
                    content: bytes.slice(offset..end),
                    mode: local.mode.map(|m| m & MODE_PERMISSION_BITS),
                },
            };
            let outcome = self
                .sync
                .apply(&self.account, &self.session, std::slice::from_ref(&change))
                .await?
                .pop()
                .expect("one outcome per change");
            match outcome {
                ChangeOutcome::Staged { .. } if end < bytes.len() => offset = end,
                outcome => {
                    self.record(path, Some((local, bytes)), outcome, report);
                    return Ok(());
                }
            }
        }
    }

    fn record(
        &mut self,
        path: String,
        local: Option<(FileStamp, Bytes)>,
        outcome: ChangeOutcome,
        report: &mut PushReport,
    ) {
        match outcome {
            ChangeOutcome::Applied {
                stamp: Some(ws), ..
            } => {
                if let Some((local, bytes)) = local {
                    let hash = is_racy(local.mtime_ns).then(|| sha256_hex(&bytes));
                    self.known.insert(path.clone(), Known { ws, local, hash });
                }
                if self.dirs_synced {
                    // The put made the file's parents in the workspace.
                    if let Some((parent, _)) = path.rsplit_once('/') {
                        let parent = parent.to_owned();
                        self.know_dir_and_parents(&parent);
                    }
                }
                report.changed.push(path);
            }
            ChangeOutcome::Applied { stamp: None, .. } => {
                self.known.remove(&path);
                report.deleted.push(path);
            }
            ChangeOutcome::Conflict { .. } => report.conflicts.push(path),
            ChangeOutcome::Staged { .. } => {
                tracing::warn!(path = %path, "a put ended staged; the workspace did not take its last part");
                report.skipped += 1;
            }
            ChangeOutcome::Rejected { error_message, .. } => {
                tracing::warn!(path = %path, error = %error_message, "the workspace refused a mirrored change");
                report.skipped += 1;
            }
        }
    }
}

#[derive(Default)]
struct Batch {
    items: Vec<(Change, Option<(FileStamp, Bytes)>)>,
    bytes: usize,
}

fn unique() -> String {
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

fn is_racy(mtime_ns: i64) -> bool {
    mtime_ns >= now_ns().saturating_sub(RACY_NS)
}

fn local_failure(op: &str, what: &str, e: &io::Error) -> ToolError {
    tracing::error!(operation = op, what, error = %e, "mirror directory operation failed");
    ToolError::internal(format!("could not {op} {what} ({e})"))
}

/// `(size, mtime_ns, ino, mode)` of local metadata.
fn local_stamp(meta: &Metadata) -> FileStamp {
    let mtime_ns = meta
        .modified()
        .map_or(0, |m| match m.into_std().duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
        });
    FileStamp {
        size: meta.len(),
        mtime_ns,
        ino: meta.ino(),
        mode: Some(meta.mode() & 0o7777),
    }
}

// ------------------------------------------------------------------------------------------
// The local walk

struct Walked {
    files: Vec<(String, FileStamp)>,
    /// Every directory walked (not the root).
    dirs: Vec<String>,
    /// Regular files present but over `max_file_bytes` (not deleted, not sent).
    oversized: HashSet<String>,
    skipped: usize,
    truncated: bool,
}

/// The regular files and directories under `root`, by lstat through directory handles, never
/// following; directories count toward `max_files` with the files.
fn walk_local(root: &Dir, limits: SyncLimits) -> Walked {
    let mut walked = Walked {
        files: Vec::new(),
        dirs: Vec::new(),
        oversized: HashSet::new(),
        skipped: 0,
        truncated: false,
    };
    let mut total = 0u64;
    let Ok(top) = root.open_dir_nofollow(".") else {
        return walked;
    };
    let mut stack: Vec<(Dir, String)> = vec![(top, String::new())];
    'walk: while let Some((dir, rel)) = stack.pop() {
        let Ok(entries) = dir.entries() else { continue };
        for entry in entries.filter_map(Result::ok) {
            let name: OsString = entry.file_name();
            let Some(utf8) = name.to_str() else {
                walked.skipped += 1;
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            let child = if rel.is_empty() {
                utf8.to_owned()
            } else {
                format!("{rel}/{utf8}")
            };
            let kind = meta.file_type();
            if kind.is_dir() {
                if !is_skipped_dir(utf8, rel.is_empty()) {
                    if let Ok(sub) = dir.open_dir_nofollow(&name) {
                        if walked.files.len() + walked.dirs.len() >= limits.max_files {
                            walked.truncated = true;
                            break 'walk;
                        }
                        walked.dirs.push(child.clone());
                        stack.push((sub, child));
                    }
                }
            } else if kind.is_file() {
                if meta.len() > limits.max_file_bytes {
                    walked.skipped += 1;
                    walked.oversized.insert(child);
                    continue;
                }
                if walked.files.len() + walked.dirs.len() >= limits.max_files
                    || total.saturating_add(meta.len()) > limits.max_total_bytes
                {
                    walked.truncated = true;
                    break 'walk;
                }
                total += meta.len();
                walked.files.push((child, local_stamp(&meta)));
            }
            // Symlinks, FIFOs, sockets, devices: never read, never sent.
        }
    }
    walked
}

/// Opens the parent of `path` under `root` one component at a time without following links;
/// with `create`, missing directories are made (owned by `owner`) and a file or link in the
/// way is removed (the workspace wins). `None` when a parent is missing and not created.
fn open_parent_local(
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
fn ensure_dir_local(root: &Dir, path: &str, owner: Option<(u32, u32)>) -> io::Result<bool> {
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

fn parent_exists_local(root: &Dir, path: &str) -> bool {
    matches!(open_parent_local(root, path, false, None), Ok(Some(_)))
}

/// Writes `content` to `path` atomically (temp file + rename in the held-open parent), with
/// the workspace file's mtime and mode (masked by [`applied_mode`]), owned by `owner`; returns
/// the local stamp.
fn write_local(
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
fn read_local(root: &Dir, path: &str, max_bytes: u64) -> Result<(Vec<u8>, FileStamp), String> {
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
