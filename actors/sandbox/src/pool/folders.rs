//! The sandbox folders on disk: their removal, off the async threads, and the reapers of
//! what dead workers, a previous run or a failed removal left behind.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use toolmesh_kernel::NodeId;

use crate::backend::SandboxRef;
use crate::pool::state::{Pool, SANDBOX_ID_PREFIX};

/// How long a folder of the sandbox directory whose node is not in the cluster view stays
/// untouched before it is reaped: a worker that has just started makes its folder before the
/// others hear its first heartbeat.
pub const DEAD_FOLDER_AGE: Duration = Duration::from_secs(60);

impl Pool {
    /// [`Backend::reap_orphans`] in this pool's scope, logged (a failure only delays it), and
    /// the same for the folders of the sandbox directory: with no `live_nodes` (at start),
    /// `this_node`'s own, which its previous run left; given them, each node's folder whose
    /// node is not live and that nothing touched for [`DEAD_FOLDER_AGE`] (never this
    /// worker's own).
    ///
    /// [`Backend::reap_orphans`]: crate::backend::Backend::reap_orphans
    pub async fn reap_orphans(&self, this_node: &str, live_nodes: Option<&[String]>) {
        let previous_run = live_nodes.is_none();
        match self
            .backend
            .reap_orphans(&self.scope(), this_node, live_nodes)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, previous_run, "removed orphaned sandboxes"),
            Err(e) => {
                tracing::warn!(error = %e, previous_run, "cannot look for orphaned sandboxes")
            }
        }
        let dir = self.settings.dir.clone();
        let own = self.settings.node.as_str().to_owned();
        let (this_node, live) = (this_node.to_owned(), live_nodes.map(<[String]>::to_vec));
        let reaped = tokio::task::spawn_blocking(move || {
            reap_folders(&dir, &own, &this_node, live.as_deref())
        })
        .await;
        match reaped {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(
                removed = n,
                previous_run,
                "removed orphaned sandbox folders"
            ),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, previous_run, "cannot look for orphaned sandbox folders")
            }
            Err(e) => tracing::warn!(error = %e, "the sandbox folder reaper failed"),
        }
        if !previous_run {
            self.reap_own_folders().await;
        }
    }

    /// Removes the sandbox folders in this worker's own folder that no sandbox of the pool
    /// holds and that nothing touched for [`DEAD_FOLDER_AGE`]: those whose removal failed
    /// (logged when it did). Not while a creation or an eviction is in flight: a sandbox being
    /// made or removed is in no list (one made after the look is younger than the age).
    async fn reap_own_folders(&self) {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return;
        }
        let mut held: HashSet<String> = self
            .warm
            .lock()
            .expect("warm lock")
            .values()
            .flatten()
            .map(|s| s.sandbox_id.clone())
            .collect();
        held.extend(
            self.sessions
                .lock()
                .expect("sessions lock")
                .values()
                .filter_map(|c| c.get().map(|s| s.sandbox.sandbox_id.clone())),
        );
        let dir = self.node_dir();
        let reaped = tokio::task::spawn_blocking(move || reap_sandbox_folders(&dir, &held)).await;
        match reaped {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "removed sandbox folders left behind"),
            Err(e) => tracing::warn!(error = %e, "the sandbox folder reaper failed"),
        }
    }
}

/// Removes a sandbox's folder (its workspace, skills and run directory), off the async threads.
/// A failure is logged and the folder left to the reaper ([`reap_own_folders`], every
/// minute), which tries again.
pub(super) async fn remove_folder_of(sandbox: &SandboxRef) {
    let folder = sandbox
        .workspace_dir
        .parent()
        .unwrap_or(&sandbox.workspace_dir)
        .to_owned();
    remove_folder(folder, "a sandbox folder").await;
}

/// Unmounts the sandbox disks at or below `folder` (a removal must not walk into a mounted
/// disk), then removes it without recursion ([`crate::remove::remove_tree`]). Blocking.
fn remove_sandbox_tree(folder: &std::path::Path) -> std::io::Result<()> {
    crate::disk::unmount_below(folder)?;
    crate::remove::remove_tree(folder)
}

/// [`remove_sandbox_tree`] on a blocking thread; a failure is logged.
pub(super) async fn remove_folder(folder: PathBuf, what: &'static str) {
    let path = folder.clone();
    let removed = tokio::task::spawn_blocking(move || remove_sandbox_tree(&path)).await;
    let error = match removed {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::warn!(folder = %folder.display(), error = %error, "cannot remove {what}; the reaper tries again");
}

/// Removes the sandbox folders (`sbx-…`) of the worker folder `dir` that are not `held` and
/// that nothing touched for [`DEAD_FOLDER_AGE`]; how many. Blocking.
fn reap_sandbox_folders(dir: &std::path::Path, held: &HashSet<String>) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(SANDBOX_ID_PREFIX)) else {
            continue;
        };
        if held.contains(name) || !untouched(&entry).unwrap_or(false) {
            continue;
        }
        removed += usize::from(reap(&entry.path(), "a sandbox folder left behind"));
    }
    removed
}

/// Whether nothing touched `entry` for [`DEAD_FOLDER_AGE`].
fn untouched(entry: &std::fs::DirEntry) -> std::io::Result<bool> {
    Ok(entry
        .metadata()?
        .modified()?
        .elapsed()
        .is_ok_and(|age| age >= DEAD_FOLDER_AGE))
}

/// [`remove_sandbox_tree`] of a folder a reaper found, `what` named in the log line of a
/// failure (the next sweep tries it again); whether it went. Blocking.
fn reap(folder: &std::path::Path, what: &str) -> bool {
    match remove_sandbox_tree(folder) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(folder = %folder.display(), error = %e, "cannot remove {what}");
            false
        }
    }
}

/// Removes the folders of `dir` that belong to nodes: `this_node`'s when `live` is `None`
/// (its previous run's), otherwise those of nodes not in `live` untouched for
/// [`DEAD_FOLDER_AGE`], never `own`'s. Returns how many. Blocking.
fn reap_folders(
    dir: &std::path::Path,
    own: &str,
    this_node: &str,
    live: Option<&[String]>,
) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        other => other?,
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // Node folders only: the staged spawners' folder starts with a dot, no node id does.
        if NodeId::parse(name.as_str()).is_err() || !entry.file_type()?.is_dir() {
            continue;
        }
        let orphan = match live {
            None => name == this_node,
            Some(live) => name != own && !live.contains(&name) && untouched(&entry)?,
        };
        if orphan {
            removed += usize::from(reap(&entry.path(), "an orphaned sandbox folder"));
        }
    }
    Ok(removed)
}
