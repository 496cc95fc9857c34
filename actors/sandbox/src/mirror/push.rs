//! [`Mirror::push`]: local directory → workspace, files (small ones batched, big ones in
//! parts) and then directories.

use std::collections::HashSet;

use bytes::Bytes;
use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_kernel::sync::{
    Change, ChangeOp, ChangeOutcome, Expected, FileStamp, BODY_CONTENT_BUDGET, MODE_PERMISSION_BITS,
};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::mirror::local::{is_racy, on_disk, parent_exists_local, read_local, unique};
use crate::mirror::state::{Known, Mirror};
use crate::mirror::walk::{walk_local, Walked};

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

impl Mirror {
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

        // What changed locally; a racy file (see the `mirror` docs) by its content.
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
