//! Integration tests of the workspace actor crate, one module per area.

mod escapes;
mod files;
mod sync;

use std::path::Path;

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
