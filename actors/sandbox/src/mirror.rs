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
//! **The walk is bounded** whatever the sandbox makes. It reads at most `max_entries` entries
//! of every kind (files, directories, links, FIFOs, skipped and non-UTF-8 names all count),
//! goes at most `max_depth` levels down and builds no path longer than [`MAX_PATH_BYTES`] (the
//! workspace refuses longer ones). It is depth first with one directory handle per level and
//! one path buffer it pushes names onto and truncates back, so its cost is linear in what it
//! reads. Past any cap, or where a directory cannot be read, the push is `truncated`: what lies
//! beyond is not synced and nothing is deleted in the workspace.
//!
//! **No file-system work on the async threads.** The walk, every local read and write and the
//! directory work run in `tokio::task::spawn_blocking` (`on_disk`) on a shared handle of the
//! mirror's root, so a sandbox's tree never stalls the other actors of the node.
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
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use cap_fs_ext::{
    DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsMaybeDirExt, OpenOptionsSyncExt,
};
use cap_std::fs::{Dir, File, Metadata, MetadataExt, OpenOptions, Permissions, PermissionsExt};
use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_kernel::config::{DEFAULT_SYNC_MAX_DEPTH, DEFAULT_SYNC_MAX_ENTRIES};
use toolmesh_kernel::sync::{
    applied_mode, is_skipped_dir, is_skipped_path, Change, ChangeOp, ChangeOutcome, Expected,
    FetchFile, FileStamp, Manifest, ManifestLimits, WorkspaceSync, BODY_CONTENT_BUDGET,
    MODE_PERMISSION_BITS,
};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{Account, ErrorCode, SessionId, ToolError};

/// A file whose mtime is this close to the moment it was recorded may be rewritten within
/// the same clock tick without its stamp changing; its content hash is kept (see module docs).
pub const RACY_NS: i64 = 100_000_000;
/// The uid and gid of the sandbox user, who must own what the mirror creates.
pub const SANDBOX_OWNER: (u32, u32) = (1000, 1000);
/// Files asked for in one fetch request.
const FETCH_BATCH_FILES: usize = 256;
/// Longest relative path the walk builds: Linux `PATH_MAX`, which the workspace actor
/// enforces on every path it takes (`toolmesh_workspace::confine::PATH_MAX_BYTES`).
pub const MAX_PATH_BYTES: usize = 4096;

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
    /// The walk stopped at a cap (or could not read a directory): files and directories past
    /// it were not looked at, and nothing was deleted in the workspace.
    pub truncated: bool,
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
    /// The local directory, opened once; shared with the blocking threads that use it.
    root: Option<Arc<Dir>>,
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
    async fn root(&mut self) -> Result<Arc<Dir>, ToolError> {
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
        let root = self.root().await?;
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
                    tracing::warn!(path = %DisplaySafe(&failure.path), error = %DisplaySafe(&failure.error_message), "workspace file not pulled");
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
                let (path, content) = (chunk.path.clone(), content.freeze());
                let written = on_disk(&root, move |root| {
                    let local = write_local(root, &path, &content, ws_stamp, owner)?;
                    let hash = is_racy(local.mtime_ns).then(|| sha256_hex(&content));
                    Ok::<_, io::Error>((local, hash))
                })
                .await?;
                match written {
                    Ok((local, hash)) => {
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
                        tracing::warn!(path = %DisplaySafe(&chunk.path), error = %e, "workspace file not written to the mirror");
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
        let doomed: Vec<(String, FileStamp)> = gone
            .into_iter()
            .filter_map(|path| self.known.remove(&path).map(|k| (path, k.local)))
            .collect();
        if !doomed.is_empty() {
            report.removed = on_disk(&root, move |root| {
                doomed
                    .iter()
                    .filter(|(path, local)| remove_if_unchanged(root, path, *local))
                    .count()
            })
            .await?;
        }
        self.dirs_synced = manifest.dirs.is_some();
        if let Some(dirs) = manifest.dirs {
            self.pull_dirs(&root, dirs, manifest.truncated, &mut report)
                .await?;
        }
        Ok(report)
    }

    /// The directory half of a pull: creates listed directories the mirror does not know,
    /// removes known ones the workspace no longer lists if they are empty here.
    async fn pull_dirs(
        &mut self,
        root: &Arc<Dir>,
        dirs: Vec<String>,
        truncated: bool,
        report: &mut PullReport,
    ) -> Result<(), ToolError> {
        let owner = self.owner;
        let listed: HashSet<&str> = dirs
            .iter()
            .map(String::as_str)
            .filter(|d| !is_skipped_path(&format!("{d}/x")))
            .collect();
        let mut gone: Vec<String> = if truncated {
            Vec::new()
        } else {
            self.known_dirs
                .iter()
                .filter(|d| !listed.contains(d.as_str()))
                .cloned()
                .collect()
        };
        gone.sort_unstable_by(|a, b| b.cmp(a)); // children first
        let make: Vec<String> = dirs
            .iter()
            .filter(|d| listed.contains(d.as_str()) && !self.known_dirs.contains(*d))
            .cloned()
            .collect();
        for dir in &gone {
            self.known_dirs.remove(dir);
        }
        if make.is_empty() && gone.is_empty() {
            return Ok(());
        }
        let (made, removed) = on_disk(root, move |root| {
            let made: Vec<(String, io::Result<bool>)> = make
                .into_iter()
                .map(|dir| {
                    let created = ensure_dir_local(root, &dir, owner);
                    (dir, created)
                })
                .collect();
            // rmdir on the held-open parent: only if empty here, never through a link.
            let removed = gone
                .iter()
                .filter(|dir| {
                    matches!(open_parent_local(root, dir, false, None),
                        Ok(Some((parent, name))) if parent.remove_dir(&name).is_ok())
                })
                .count();
            (made, removed)
        })
        .await?;
        for (dir, created) in made {
            match created {
                Ok(created) => {
                    report.dirs_created += usize::from(created);
                    self.known_dirs.insert(dir);
                }
                Err(e) => {
                    tracing::warn!(path = %DisplaySafe(&dir), error = %e, "workspace directory not made in the mirror");
                    report.skipped += 1;
                }
            }
        }
        report.dirs_removed += removed;
        Ok(())
    }

    /// Local directory → workspace: files created or changed since the last pull or push (by
    /// local size, mtime and inode) are sent, conditional on the workspace stamp last seen;
    /// files the mirror knew that are gone are deleted the same way. Conflicts are reported.
    pub async fn push(&mut self) -> Result<PushReport, ToolError> {
        let limits = self.limits;
        let root = self.root().await?;
        let walked = on_disk(&root, move |root| walk_local(root, limits)).await?;
        let mut report = PushReport {
            skipped: walked.skipped,
            truncated: walked.truncated,
            ..PushReport::default()
        };

        // What changed locally; a racy file (see module docs) by its content.
        let mut candidates: Vec<(String, Expected)> = Vec::new();
        let mut racy: Vec<(String, FileStamp, String)> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::with_capacity(walked.files.len());
        for (path, stamp) in &walked.files {
            seen.insert(path);
            match self.known.get(path) {
                Some(known) if known.local == *stamp => {
                    if let Some(hash) = &known.hash {
                        racy.push((path.clone(), *stamp, hash.clone()));
                    }
                }
                Some(known) => candidates.push((path.clone(), Expected::Stamp(known.ws))),
                None => candidates.push((path.clone(), Expected::Absent)),
            }
        }
        if !racy.is_empty() {
            let same = on_disk(&root, move |root| {
                racy.into_iter()
                    .map(|(path, stamp, hash)| {
                        let same = matches!(read_local(root, &path, limits.max_file_bytes),
                            Ok((bytes, now)) if now == stamp && sha256_hex(&bytes) == hash);
                        (path, stamp, same)
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
            for (path, stamp, same) in same {
                let known = self.known.get_mut(&path).expect("listed above");
                if !same {
                    candidates.push((path, Expected::Stamp(known.ws)));
                } else if !is_racy(stamp.mtime_ns) {
                    known.hash = None;
                }
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
        // With directories synced, each gone directory is removed by a change of its own
        // (below); pruning here could remove a directory that still exists here.
        let prune: Vec<bool> = if self.dirs_synced || deletions.is_empty() {
            vec![false; deletions.len()]
        } else {
            let paths: Vec<String> = deletions.iter().map(|(p, _)| p.clone()).collect();
            on_disk(&root, move |root| {
                paths
                    .iter()
                    .map(|p| !parent_exists_local(root, p))
                    .collect()
            })
            .await?
        };

        // Send them: small files together, big ones in parts of their own.
        let mut batch = Batch::default();
        for (path, expected) in candidates {
            let max_bytes = limits.max_file_bytes;
            let file = path.clone();
            let read = on_disk(&root, move |root| {
                let (bytes, local) = read_local(root, &file, max_bytes)?;
                let hash = is_racy(local.mtime_ns).then(|| sha256_hex(&bytes));
                Ok::<_, String>((Bytes::from(bytes), local, hash))
            })
            .await?;
            let (bytes, local, hash) = match read {
                Ok(read) => read,
                Err(why) => {
                    tracing::debug!(path = %DisplaySafe(&path), why = %why, "local file not pushed");
                    report.skipped += 1;
                    continue;
                }
            };
            if bytes.len() > BODY_CONTENT_BUDGET {
                self.send(&mut batch, &mut report).await?;
                self.put_in_parts(path, expected, bytes, (local, hash), &mut report)
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
                    path,
                    expected,
                    op: ChangeOp::Put {
                        upload: None,
                        offset: 0,
                        total,
                        content: bytes,
                        mode: local.mode.map(|m| m & MODE_PERMISSION_BITS),
                    },
                },
                Some((local, hash)),
            ));
        }
        for ((path, ws), prune_empty_dirs) in deletions.into_iter().zip(prune) {
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
                    tracing::warn!(error = %DisplaySafe(&e.message), "the workspace refused directory changes");
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
                        tracing::warn!(path = %DisplaySafe(&change.path), outcome = ?outcome, "the workspace refused a mirrored directory change");
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
        (local, hash): Sent,
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
                    self.record(path, Some((local, hash)), outcome, report);
                    return Ok(());
                }
            }
        }
    }

    /// Records a change's outcome; `local` is the file's local stamp and, while it was racy
    /// when read, its content hash.
    fn record(
        &mut self,
        path: String,
        local: Option<Sent>,
        outcome: ChangeOutcome,
        report: &mut PushReport,
    ) {
        match outcome {
            ChangeOutcome::Applied {
                stamp: Some(ws), ..
            } => {
                if let Some((local, hash)) = local {
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
                tracing::warn!(path = %DisplaySafe(&path), "a put ended staged; the workspace did not take its last part");
                report.skipped += 1;
            }
            ChangeOutcome::Rejected { error_message, .. } => {
                tracing::warn!(path = %DisplaySafe(&path), error = %DisplaySafe(&error_message), "the workspace refused a mirrored change");
                report.skipped += 1;
            }
        }
    }
}

/// A file as sent: its local stamp and, while that was racy when it was read, its content's
/// sha256.
type Sent = (FileStamp, Option<String>);

#[derive(Default)]
struct Batch {
    items: Vec<(Change, Option<Sent>)>,
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

/// Runs blocking file-system work on the mirror's root on a blocking thread, never on the
/// async threads the node's actors share.
async fn on_disk<T, F>(root: &Arc<Dir>, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce(&Dir) -> T + Send + 'static,
{
    let root = root.clone();
    tokio::task::spawn_blocking(move || work(&root))
        .await
        .map_err(blocking_failed)
}

fn blocking_failed(e: tokio::task::JoinError) -> ToolError {
    tracing::error!(error = %e, "a mirror file-system task failed");
    ToolError::internal(format!("the mirror's file-system work failed ({e})"))
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
    /// Stopped at a cap, or a directory could not be read: there may be more.
    truncated: bool,
}

/// One directory the walk is in: its handle, its entries being read, and its path's length
/// in the walk's path buffer.
struct Level {
    dir: Dir,
    entries: cap_std::fs::ReadDir,
    path_len: usize,
}

/// The regular files and directories under `root`, by lstat through directory handles, never
/// following; directories count toward `max_files` with the files. Depth first, one handle
/// and one entry stream per level (at most `max_depth`), one path buffer: linear in the entries
/// read, of which there are at most `max_entries` (see module docs). Blocking.
fn walk_local(root: &Dir, limits: SyncLimits) -> Walked {
    let mut walked = Walked {
        files: Vec::new(),
        dirs: Vec::new(),
        oversized: HashSet::new(),
        skipped: 0,
        truncated: false,
    };
    let opened = root
        .open_dir_nofollow(".")
        .and_then(|dir| Ok((dir.entries()?, dir)));
    let Ok((entries, top)) = opened else {
        // Nothing can be told about what is there: delete nothing.
        walked.truncated = true;
        return walked;
    };
    let mut levels = vec![Level {
        dir: top,
        entries,
        path_len: 0,
    }];
    let mut path = String::new();
    let (mut total, mut read) = (0u64, 0usize);
    loop {
        // Entries of the root are at depth 1.
        let depth = levels.len();
        let Some(level) = levels.last_mut() else {
            break;
        };
        let Some(entry) = level.entries.next() else {
            levels.pop();
            continue;
        };
        read += 1;
        if read > limits.max_entries {
            walked.truncated = true;
            break;
        }
        let Ok(entry) = entry else {
            walked.truncated = true;
            continue;
        };
        let name: OsString = entry.file_name();
        let Some(utf8) = name.to_str() else {
            walked.skipped += 1;
            continue;
        };
        // Gone since it was listed: as if it had not been.
        let Ok(meta) = entry.metadata() else { continue };
        let top_level = depth == 1;
        path.truncate(level.path_len);
        if !top_level {
            path.push('/');
        }
        path.push_str(utf8);
        let kind = meta.file_type();
        if kind.is_dir() && is_skipped_dir(utf8, top_level) || !(kind.is_dir() || kind.is_file()) {
            // Skipped directories; symlinks, FIFOs, sockets, devices: never read, never sent.
            continue;
        }
        if depth > limits.max_depth || path.len() > MAX_PATH_BYTES {
            walked.truncated = true;
            continue;
        }
        if kind.is_dir() {
            if walked.files.len() + walked.dirs.len() >= limits.max_files {
                walked.truncated = true;
                break;
            }
            let opened = level
                .dir
                .open_dir_nofollow(&name)
                .and_then(|dir| Ok((dir.entries()?, dir)));
            let Ok((entries, dir)) = opened else {
                walked.truncated = true;
                continue;
            };
            walked.dirs.push(path.clone());
            levels.push(Level {
                dir,
                entries,
                path_len: path.len(),
            });
        } else {
            if meta.len() > limits.max_file_bytes {
                walked.skipped += 1;
                walked.oversized.insert(path.clone());
                continue;
            }
            if walked.files.len() + walked.dirs.len() >= limits.max_files
                || total.saturating_add(meta.len()) > limits.max_total_bytes
            {
                walked.truncated = true;
                break;
            }
            total += meta.len();
            walked.files.push((path.clone(), local_stamp(&meta)));
        }
    }
    walked
}

/// Removes the regular file `path` if its local stamp is still `local` (the sandbox left it
/// as the mirror wrote it), on its held-open parent; whether it did.
fn remove_if_unchanged(root: &Dir, path: &str, local: FileStamp) -> bool {
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
