//! Integration tests of the workspace actor crate, one module per area.

#[path = "../support/actor.rs"]
mod actor;
mod escapes;
mod files;
mod sync;

use std::path::Path;

use toolmesh_kernel::{Account, SessionId};
use toolmesh_workspace::confine::Workspace;

/// A fresh data directory and the workspace of account `acme`, session `s1`, in it.
pub fn workspace() -> (tempfile::TempDir, Workspace) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(
        tmp.path(),
        &Account::parse("acme").unwrap(),
        &SessionId::parse("s1").unwrap(),
    )
    .unwrap();
    (tmp, ws)
}

/// Whether `path` is a symbolic link (not followed).
pub fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink())
}

/// Every name under `root`, recursively, sorted (to see stray temp files).
pub fn tree(root: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            names.push(
                path.strip_prefix(root)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    names.sort();
    names
}
