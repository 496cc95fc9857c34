//! The local walk: the regular files and directories of the mirror, bounded in entries, depth
//! and path length whatever the sandbox makes.

use std::collections::HashSet;
use std::ffi::OsString;

use cap_fs_ext::DirExt;
use cap_std::fs::Dir;
use toolmesh_kernel::sync::{is_skipped_dir, FileStamp};

use crate::mirror::local::local_stamp;
use crate::mirror::state::SyncLimits;

/// Longest relative path the walk builds: Linux `PATH_MAX`, which the workspace actor
/// enforces on every path it takes (`toolmesh_workspace::confine::PATH_MAX_BYTES`).
pub const MAX_PATH_BYTES: usize = 4096;

pub(super) struct Walked {
    pub(super) files: Vec<(String, FileStamp)>,
    /// Every directory walked (not the root).
    pub(super) dirs: Vec<String>,
    /// Regular files present but over `max_file_bytes` (not deleted, not sent).
    pub(super) oversized: HashSet<String>,
    pub(super) skipped: usize,
    /// Stopped at a cap, or a directory could not be read: there may be more.
    pub(super) truncated: bool,
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
/// read, of which there are at most `max_entries` (see [`crate::mirror`]). Blocking.
pub(super) fn walk_local(root: &Dir, limits: SyncLimits) -> Walked {
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
