//! [`Mirror::pull`]: workspace → local directory, files and then directories.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::Arc;

use bytes::BytesMut;
use cap_std::fs::Dir;
use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_kernel::sync::{is_skipped_path, FetchFile, FileStamp, Manifest};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::mirror::local::{
    ensure_dir_local, is_racy, on_disk, open_parent_local, remove_if_unchanged, write_local,
};
use crate::mirror::state::{Known, Mirror};

/// Files asked for in one fetch request.
const FETCH_BATCH_FILES: usize = 256;

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

impl Mirror {
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
        let mut gone = unlisted(manifest.truncated, self.known.keys(), &listed);

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
        let mut gone = unlisted(truncated, self.known_dirs.iter(), &listed);
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
}

/// The known paths a manifest no longer lists: gone from the workspace. None when the manifest
/// was cut short, since what it leaves out may still be there.
fn unlisted<'a>(
    truncated: bool,
    known: impl Iterator<Item = &'a String>,
    listed: &HashSet<&str>,
) -> Vec<String> {
    if truncated {
        return Vec::new();
    }
    known
        .filter(|p| !listed.contains(p.as_str()))
        .cloned()
        .collect()
}
