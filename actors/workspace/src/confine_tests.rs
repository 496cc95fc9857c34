//! Unit tests of [`crate::confine`] that need its private parts.

use super::*;

#[test]
fn paths_normalise() {
    let p = WorkspacePath::parse("a/./b//c/", "path").unwrap();
    assert_eq!(p.as_str(), "a/b/c");
    assert_eq!(p.parent().unwrap().as_str(), "a/b");
    assert_eq!(p.file_name(), Some("c"));
    assert_eq!(p.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
    assert_eq!(WorkspacePath::parse("x/..", "path").unwrap().display(), ".");
}

mod logs {
    //! What the workspace actor logs about a path a caller chose.

    use super::*;

    #[test]
    fn a_failed_operation_logs_its_path_escaped_on_one_line() {
        let path = WorkspacePath::parse("a.txt\n2026-12-01 INFO forged\u{1b}[2K", "path").unwrap();
        let logs = toolmesh_testkit::captured_logs(false, || {
            let _ = internal("read", &path, &io::Error::other("disk on fire"));
        });
        assert_eq!(logs.lines().count(), 1, "{logs}");
        assert!(
            logs.contains(r"a.txt\u000a2026-12-01 INFO forged\u001b[2K"),
            "{logs}"
        );
    }
}
