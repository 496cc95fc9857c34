//! Unit tests of [`crate::writing`] that need its private parts.
//!
//! Swaps a parent directory for a symlink at the two points of a write where a race could
//! matter; only here can the swap be timed exactly.

use std::path::{Path, PathBuf};

use toolmesh_kernel::{Account, SessionId};

use super::*;

fn fixture() -> (tempfile::TempDir, Workspace, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let account = Account::parse("acme").unwrap();
    let session = SessionId::parse("s1").unwrap();
    let ws = Workspace::open(tmp.path(), &account, &session).unwrap();
    let outside = ws.root().parent().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    (tmp, ws, outside)
}

fn swap_for_link(ws: &Workspace, outside: &Path) {
    let a = ws.root().join("a");
    std::fs::rename(&a, ws.root().join("a_moved")).unwrap();
    std::os::unix::fs::symlink(outside, &a).unwrap();
}

fn write_hooked(
    ws: &Workspace,
    path: &str,
    at: Stage,
    outside: &Path,
) -> Result<WriteOutcome, ToolError> {
    let path = WorkspacePath::parse(path, "path").unwrap();
    let plan = plan_write(ws, &path, true)?;
    Ok(commit(ws, &path, &plan, b"payload", true, &mut |stage| {
        if stage == at {
            swap_for_link(ws, outside);
        }
    })?)
}

#[test]
fn a_parent_swapped_for_a_symlink_before_it_is_opened_is_refused() {
    let (_tmp, ws, outside) = fixture();
    let err = write_hooked(&ws, "a/b/f.txt", Stage::ParentsCreated, &outside).unwrap_err();
    assert_eq!(err.code, ErrorCode::PathOutsideWorkspace, "{err:?}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside"
    );
}

#[test]
fn a_parent_swapped_after_it_is_opened_keeps_the_write_in_the_original_directory() {
    let (_tmp, ws, outside) = fixture();
    write_hooked(&ws, "a/f.txt", Stage::ParentOpened, &outside).unwrap();
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside"
    );
    assert_eq!(
        std::fs::read(ws.root().join("a_moved/f.txt")).unwrap(),
        b"payload"
    );
}

#[test]
fn a_batch_that_fails_midway_stops_and_names_what_was_written() {
    let (_tmp, ws, _outside) = fixture();
    let files: Vec<(WorkspacePath, String)> = ["one.txt", "two.txt", "sub/three.txt", "four.txt"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                WorkspacePath::parse(p, &format!("files/{i}/path")).unwrap(),
                format!("{i}"),
            )
        })
        .collect();
    // After the checks passed, `sub` turns into a file: the third write cannot happen.
    let err: ToolError = write_batch_with(&ws, &files, true, &mut |index| {
        if index == 2 {
            std::fs::write(ws.root().join("sub"), "in the way").unwrap();
        }
    })
    .unwrap_err()
    .into();
    assert_eq!(err.code, ErrorCode::InvalidArguments, "{err:?}");
    assert_eq!(
        err.details["written"],
        serde_json::json!(["one.txt", "two.txt"])
    );
    assert_eq!(err.details["failed_index"], 2);
    assert_eq!(err.details["failed_path"], "sub/three.txt");
    assert!(
        err.message.contains("2 of 4 files were written"),
        "{}",
        err.message
    );
    assert!(ws.root().join("two.txt").exists());
    assert!(
        !ws.root().join("four.txt").exists(),
        "nothing after the failure is attempted"
    );
}
