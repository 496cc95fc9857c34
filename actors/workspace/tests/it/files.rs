//! The confined file operations one by one: every field of their results and every error.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use toolmesh_kernel::{ErrorCode, ToolError};
use toolmesh_workspace::confine::{self, EntryType, Workspace, WorkspacePath};
use toolmesh_workspace::listing::{self, ListOptions, SortBy};
use toolmesh_workspace::writing;

use crate::{is_symlink, tree, workspace};

/// An engine's error as the tools answer it: code, message and details.
trait Wire {
    fn wire(self) -> ToolError;
}

impl<E: Into<ToolError>> Wire for E {
    fn wire(self) -> ToolError {
        self.into()
    }
}

/// The bytes of the file at `rel` in the workspace.
fn bytes_at(ws: &Workspace, rel: &str) -> Vec<u8> {
    std::fs::read(ws.root().join(rel)).unwrap()
}

/// The error of a write that must fail.
fn write_err(ws: &Workspace, path: &str, content: &[u8], overwrite: bool) -> ToolError {
    writing::write_atomic(ws, &p(path), content, overwrite)
        .unwrap_err()
        .wire()
}

/// Asserts that the workspace holds exactly `names` (see [`tree`]).
#[track_caller]
fn assert_tree(ws: &Workspace, names: &[&str], why: &str) {
    assert_eq!(tree(ws.root()), names, "{why}");
}

/// Asserts an error's code and that its message holds each of `words`.
fn assert_refused(err: &ToolError, code: ErrorCode, words: &[&str]) {
    assert_eq!(err.code, code, "{err:?}");
    for word in words {
        assert!(err.message.contains(word), "{word:?}: {}", err.message);
    }
}

fn p(raw: &str) -> WorkspacePath {
    WorkspacePath::parse(raw, "path").unwrap()
}

fn put(ws: &Workspace, rel: &str, content: &str) {
    let path = ws.root().join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn set_mtime(ws: &Workspace, rel: &str, secs: u64) {
    let file = std::fs::File::options()
        .write(true)
        .open(ws.root().join(rel))
        .unwrap();
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        .unwrap();
}

/// [`list_args`], recursive.
fn recursive(path: &str) -> ListOptions {
    ListOptions {
        recursive: true,
        ..list_args(path)
    }
}

fn list_args(path: &str) -> ListOptions {
    ListOptions {
        path: path.to_owned(),
        glob: None,
        recursive: false,
        include_dirs: true,
        max_results: 500,
        sort_by: SortBy::Name,
    }
}

fn paths(outcome: &listing::ListOutcome) -> Vec<&str> {
    outcome.entries.iter().map(|e| e.path.as_str()).collect()
}

// ------------------------------------------------------------------------------------ paths

#[test]
fn parse_normalises_and_keeps_names_literal() {
    for (raw, rel) in [
        ("a/./b//c", "a/b/c"),
        ("a/b/", "a/b"),
        ("./a", "a"),
        ("a/../b", "b"),
        ("a/b/../../c", "c"),
        ("%2e%2e/x", "%2e%2e/x"),
        ("a ", "a "),
        (" a/ b ", " a/ b "),
        ("..\\x", "..\\x"),
        ("...", "..."),
    ] {
        let path = WorkspacePath::parse(raw, "path").unwrap();
        assert_eq!(path.as_str(), rel, "{raw:?}");
        assert_eq!(path.display(), rel, "{raw:?}");
        assert_eq!(path.as_path(), Path::new(rel), "{raw:?}");
        assert!(!path.is_root(), "{raw:?}");
    }
}

#[test]
fn parse_names_the_root_in_several_ways() {
    for raw in ["", ".", "./", "./.", "a/..", "a/b/../.."] {
        let path = WorkspacePath::parse(raw, "path").unwrap();
        assert!(path.is_root(), "{raw:?}");
        assert_eq!(path.display(), ".");
        assert_eq!(path.to_string(), ".");
        assert_eq!(path.as_str(), "");
        assert_eq!(path.as_path(), Path::new("."));
        assert_eq!(path.parent(), None);
        assert_eq!(path.file_name(), None);
    }
}

#[test]
fn parse_refusals_carry_the_right_code_and_pointer() {
    let err = WorkspacePath::parse("x\0y", "files/3/path")
        .unwrap_err()
        .wire();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert_eq!(err.details["details"][0]["path"], "/files/3/path");

    for raw in [
        "/",
        "/etc/passwd",
        "..",
        "../x",
        "a/../../x",
        "./..",
        "a/./../..",
    ] {
        let err = WorkspacePath::parse(raw, "path").unwrap_err().wire();
        assert_eq!(err.code, ErrorCode::PathOutsideWorkspace, "{raw:?}");
        assert!(err.message.contains(&format!("'{raw}'")), "{}", err.message);
    }

    let long_name = "n".repeat(256);
    let err = WorkspacePath::parse(&long_name, "path").unwrap_err().wire();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert!(WorkspacePath::parse(&"n".repeat(255), "path").is_ok());
    let long_path = "a/".repeat(2049);
    assert_eq!(
        WorkspacePath::parse(&long_path, "path")
            .unwrap_err()
            .wire()
            .code,
        ErrorCode::InvalidArguments
    );
}

#[test]
fn path_parts_and_pointer() {
    let path = WorkspacePath::parse("a/b/c.txt", "files/0/path").unwrap();
    assert_eq!(path.file_name(), Some("c.txt"));
    assert_eq!(path.parent().unwrap().as_str(), "a/b");
    assert_eq!(path.pointer(), "/files/0/path");
    assert_eq!(WorkspacePath::root("path").pointer(), "/path");
    assert_eq!(path, p("a/./b/c.txt"), "equality ignores the pointer");
}

// ------------------------------------------------------------------------------------ read

#[test]
fn read_returns_the_bytes() {
    let (_tmp, ws) = workspace();
    put(&ws, "dir/hello.txt", "hello\nworld\n");
    assert_eq!(
        confine::read(&ws, &p("dir/hello.txt"), 100).unwrap(),
        b"hello\nworld\n"
    );
    assert_eq!(
        confine::read(&ws, &p("dir/./hello.txt"), 12).unwrap().len(),
        12,
        "exactly the limit is fine"
    );
}

#[test]
fn read_refusals() {
    let (_tmp, ws) = workspace();
    put(&ws, "dir/big.txt", &"x".repeat(1000));

    let err = confine::read(&ws, &p("dir/big.txt"), 999)
        .unwrap_err()
        .wire();
    assert_refused(&err, ErrorCode::FileTooLarge, &["'dir/big.txt'", "1000"]);

    let err = confine::read(&ws, &p("dir/missing.txt"), 10)
        .unwrap_err()
        .wire();
    assert_refused(&err, ErrorCode::NotFound, &["'dir/missing.txt'"]);

    let err = confine::read(&ws, &p("dir/big.txt/below"), 10)
        .unwrap_err()
        .wire();
    assert_eq!(err.code, ErrorCode::NotFound, "a file used as a directory");

    for dir in ["dir", "."] {
        let err = confine::read(&ws, &p(dir), 10).unwrap_err().wire();
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{dir}");
        assert_eq!(err.details["details"][0]["path"], "/path");
    }
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let (_tmp, ws) = workspace();
    let status = std::process::Command::new("mkfifo")
        .arg(ws.root().join("pipe"))
        .status()
        .unwrap();
    assert!(status.success());
    let err = confine::read(&ws, &p("pipe"), 10).unwrap_err().wire();
    assert_eq!(err.code, ErrorCode::InvalidArguments, "{err:?}");
    assert!(
        err.message.contains("not a regular file"),
        "{}",
        err.message
    );
}

#[test]
fn read_prefix_caps_instead_of_refusing() {
    let (_tmp, ws) = workspace();
    put(&ws, "big.txt", "0123456789");
    for (limit, prefix) in [(4, &b"0123"[..]), (100, b"0123456789")] {
        let read = confine::read_prefix(&ws, &p("big.txt"), limit).unwrap();
        assert_eq!(read, prefix, "{limit}");
    }
}

#[test]
fn open_file_and_stat() {
    use std::io::Read;
    let (_tmp, ws) = workspace();
    put(&ws, "a.txt", "abc");
    set_mtime(&ws, "a.txt", 1_700_000_000);
    let mut text = String::new();
    confine::open_file(&ws, &p("a.txt"))
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "abc");
    assert_eq!(
        confine::open_file(&ws, &p(".")).unwrap_err().wire().code,
        ErrorCode::InvalidArguments
    );

    let stat = confine::stat(&ws, &p("a.txt")).unwrap();
    assert_eq!(stat.kind, EntryType::File);
    assert_eq!(stat.len, 3);
    assert_eq!(stat.mtime_ns, 1_700_000_000 * 1_000_000_000);
    assert_eq!(confine::stat(&ws, &p(".")).unwrap().kind, EntryType::Dir);
    assert_eq!(
        confine::stat(&ws, &p("nope")).unwrap_err().wire().code,
        ErrorCode::NotFound
    );

    symlink("a.txt", ws.root().join("link")).unwrap();
    assert_eq!(
        confine::stat(&ws, &p("link")).unwrap().kind,
        EntryType::File,
        "stat follows links"
    );
    assert!(confine::symlink_metadata(&ws, &p("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(confine::metadata(&ws, &p("link")).unwrap().is_file());
}

#[test]
fn sha256_is_lowercase_hex() {
    assert_eq!(
        confine::sha256_of(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        confine::sha256_of(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

// ------------------------------------------------------------------------------------ write

#[test]
fn write_creates_parents_then_replaces() {
    let (_tmp, ws) = workspace();
    // In order: (path, content, whether the write creates the file).
    let writes: [(&str, &[u8], bool); 3] = [
        ("a/b/c.txt", b"first", true),
        ("a/b/c.txt", b"second!", false),
        ("empty", b"", true),
    ];
    for (path, content, created) in writes {
        let outcome = writing::write_atomic(&ws, &p(path), content, true).unwrap();
        assert_eq!(outcome.created, created, "{path} <- {content:?}");
        assert_eq!(outcome.bytes, content.len() as u64, "{path} <- {content:?}");
        assert_eq!(bytes_at(&ws, path), content);
    }
    let written = ["a", "a/b", "a/b/c.txt", "empty"];
    assert_tree(&ws, &written, "no temp file left behind");
}

#[test]
fn write_without_overwrite() {
    let (_tmp, ws) = workspace();
    let outcome = writing::write_atomic(&ws, &p("new.txt"), b"one", false).unwrap();
    assert!(outcome.created);
    let err = write_err(&ws, "new.txt", b"two", false);
    assert_refused(&err, ErrorCode::AlreadyExists, &["'new.txt'", "overwrite"]);
    assert_eq!(bytes_at(&ws, "new.txt"), b"one");

    symlink("new.txt", ws.root().join("link")).unwrap();
    let err = write_err(&ws, "link", b"two", false);
    assert_eq!(
        err.code,
        ErrorCode::AlreadyExists,
        "a link counts as existing"
    );
    assert_tree(&ws, &["link", "new.txt"], "no temp file left behind");
}

#[test]
fn write_refusals() {
    let (_tmp, ws) = workspace();
    put(&ws, "dir/file.txt", "content");

    for (path, what) in [
        (".", "the root"),
        ("dir", "a directory"),
        ("dir/file.txt/x", "beneath a file"),
        ("dir/file.txt/x/y", "deep beneath a file"),
    ] {
        let err = write_err(&ws, path, b"x", true);
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{what}: {err:?}");
        assert_eq!(err.details["details"][0]["path"], "/path", "{what}");
    }
    let err = write_err(&ws, "dir/file.txt/x", b"x", true);
    assert!(
        err.message.contains("'dir/file.txt' is a file"),
        "{}",
        err.message
    );

    // Links a write does not go through: to a missing file, to a directory.
    symlink("missing-target", ws.root().join("dangling")).unwrap();
    symlink("dir", ws.root().join("dirlink")).unwrap();
    let err = write_err(&ws, "dangling", b"x", true);
    assert_refused(&err, ErrorCode::InvalidArguments, &["missing file"]);
    let err = write_err(&ws, "dirlink", b"x", true);
    assert_eq!(
        err.code,
        ErrorCode::InvalidArguments,
        "a link to a directory"
    );

    assert_eq!(bytes_at(&ws, "dir/file.txt"), b"content");
    let unchanged = ["dangling", "dir", "dir/file.txt", "dirlink"];
    assert_tree(&ws, &unchanged, "nothing created");
}

#[test]
fn write_through_an_inside_link_keeps_the_link_and_permissions() {
    let (_tmp, ws) = workspace();
    put(&ws, "docs/readme.md", "old");
    std::fs::set_permissions(
        ws.root().join("docs/readme.md"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    symlink("docs/readme.md", ws.root().join("README.md")).unwrap();

    let outcome = writing::write_atomic(&ws, &p("README.md"), b"new", true).unwrap();
    assert!(!outcome.created);
    assert!(is_symlink(&ws.root().join("README.md")));
    assert_eq!(bytes_at(&ws, "docs/readme.md"), b"new");
    let mode = std::fs::metadata(ws.root().join("docs/readme.md"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750, "a replaced file keeps its permissions");
}

#[test]
fn a_symlinked_parent_pointing_out_writes_nothing_outside() {
    let (_tmp, ws) = workspace();
    let outside = ws.root().parent().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    symlink(&outside, ws.root().join("out")).unwrap();
    for path in ["out/f.txt", "out/a/b/f.txt"] {
        let err = write_err(&ws, path, b"x", true);
        assert_eq!(err.code, ErrorCode::PathOutsideWorkspace, "{path}");
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}

#[test]
fn many_writes_leave_no_temp_files() {
    let (_tmp, ws) = workspace();
    for i in 0..50 {
        writing::write_atomic(&ws, &p("same.txt"), format!("version {i}").as_bytes(), true)
            .unwrap();
    }
    let _ = write_err(&ws, "same.txt", b"refused", false);
    let _ = write_err(&ws, "same.txt/x", b"refused", true);
    assert_eq!(tree(ws.root()), ["same.txt"]);
    assert_eq!(bytes_at(&ws, "same.txt"), b"version 49");
}

#[test]
fn the_longest_name_still_writes() {
    let (_tmp, ws) = workspace();
    let name = "n".repeat(255);
    writing::write_atomic(&ws, &p(&name), b"x", true).unwrap();
    assert_eq!(tree(ws.root()), [name]);
}

// ------------------------------------------------------------------------------------ batch

fn batch(entries: &[(&str, &str)]) -> Vec<(WorkspacePath, String)> {
    entries
        .iter()
        .enumerate()
        .map(|(i, (path, content))| {
            (
                WorkspacePath::parse(path, &format!("files/{i}/path")).unwrap(),
                (*content).to_owned(),
            )
        })
        .collect()
}

#[test]
fn batch_writes_every_file_and_reports_each() {
    let (_tmp, ws) = workspace();
    put(&ws, "exists.txt", "old");
    let written = writing::write_batch(
        &ws,
        &batch(&[
            ("a/one.txt", "1"),
            ("exists.txt", "22"),
            ("b/c/three.txt", "333"),
        ]),
        true,
    )
    .unwrap();
    let got: Vec<(&str, bool, u64)> = written
        .iter()
        .map(|w| (w.path.as_str(), w.created, w.bytes))
        .collect();
    assert_eq!(
        got,
        [
            ("a/one.txt", true, 1),
            ("exists.txt", false, 2),
            ("b/c/three.txt", true, 3)
        ]
    );
    assert_eq!(bytes_at(&ws, "exists.txt"), b"22");
    assert_eq!(
        serde_json::to_value(&written[0]).unwrap(),
        serde_json::json!({"path": "a/one.txt", "created": true, "bytes": 1})
    );
    assert!(writing::write_batch(&ws, &[], true).unwrap().is_empty());
}

#[test]
fn a_bad_path_in_a_batch_writes_nothing() {
    let (_tmp, ws) = workspace();
    put(&ws, "exists.txt", "old");
    put(&ws, "dir/inside.txt", "old");
    // A refused batch (each file holding `x`) leaves the tree as it was.
    let refused = |files: &[&str], overwrite: bool| {
        let entries: Vec<(&str, &str)> = files.iter().map(|path| (*path, "x")).collect();
        let err = writing::write_batch(&ws, &batch(&entries), overwrite)
            .unwrap_err()
            .wire();
        let unchanged = ["dir", "dir/inside.txt", "exists.txt"];
        assert_eq!(tree(ws.root()), unchanged, "{files:?}");
        err
    };
    let err = refused(&["new1.txt", "exists.txt"], false);
    assert_eq!(err.code, ErrorCode::AlreadyExists, "{err:?}");
    // The batch's paths, and the index of the one the refusal points at.
    let invalid: [(&[&str], usize); 5] = [
        (&["new1.txt", "dir"], 1),
        (&["new1.txt", "exists.txt/below"], 1),
        (&["new1.txt", "new2.txt", "new1.txt"], 2),
        (&["new1/x.txt", "new1"], 0),
        (&["new1.txt", "."], 1),
    ];
    for (files, at) in invalid {
        let err = refused(files, true);
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{files:?}: {err:?}");
        let pointer = format!("/files/{at}/path");
        assert_eq!(err.details["details"][0]["path"], pointer, "{files:?}");
    }
    assert_eq!(bytes_at(&ws, "exists.txt"), b"old");
}

// ------------------------------------------------------------------------------------ delete

#[test]
fn delete_files_dirs_and_links() {
    let (_tmp, ws) = workspace();
    put(&ws, "f.txt", "x");
    put(&ws, "full/inner.txt", "x");
    std::fs::create_dir(ws.root().join("empty")).unwrap();
    symlink("full/inner.txt", ws.root().join("flink")).unwrap();
    symlink("full", ws.root().join("dlink")).unwrap();

    for (path, kind) in [
        ("f.txt", EntryType::File),
        ("empty", EntryType::Dir),
        ("flink", EntryType::Symlink),
        ("dlink", EntryType::Symlink),
    ] {
        assert_eq!(confine::delete(&ws, &p(path)).unwrap().kind, kind, "{path}");
    }
    assert_tree(&ws, &["full", "full/inner.txt"], "link targets stay");
    assert_eq!(
        serde_json::to_value(confine::delete(&ws, &p("full/inner.txt")).unwrap()).unwrap(),
        serde_json::json!({"kind": "file"})
    );
}

#[test]
fn delete_refusals() {
    let (_tmp, ws) = workspace();
    put(&ws, "full/inner.txt", "x");

    let err = confine::delete(&ws, &p("full")).unwrap_err().wire();
    assert_refused(&err, ErrorCode::DirectoryNotEmpty, &["'full'"]);

    for root in [".", "", "full/.."] {
        let err = confine::delete(&ws, &p(root)).unwrap_err().wire();
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{root:?}");
        assert_eq!(err.details["details"][0]["path"], "/path");
    }

    let err = confine::delete(&ws, &p("nope")).unwrap_err().wire();
    assert_refused(&err, ErrorCode::NotFound, &["'nope'"]);
    assert_eq!(tree(ws.root()), ["full", "full/inner.txt"]);
    assert!(ws.root().is_dir());
}

// ------------------------------------------------------------------------------------ list

fn sample_tree(ws: &Workspace) {
    put(ws, "b.py", "12345");
    put(ws, "a.txt", "1");
    put(ws, "src/main.rs", "123");
    put(ws, "src/lib.rs", "1234567");
    put(ws, "src/deep/x.py", "12");
    put(ws, ".toolmesh/outputs/o.txt", "output");
    std::fs::create_dir(ws.root().join("empty")).unwrap();
}

#[test]
fn list_entry_fields() {
    let (_tmp, ws) = workspace();
    put(&ws, "src/lib.rs", "1234567");
    set_mtime(&ws, "src/lib.rs", 1_600_000_000);
    symlink("src/lib.rs", ws.root().join("link")).unwrap();

    let outcome = listing::list(&ws, &list_args("src")).unwrap();
    assert!(!outcome.truncated);
    assert_eq!(
        serde_json::to_value(&outcome).unwrap(),
        serde_json::json!({"entries": [{
            "name": "lib.rs", "path": "src/lib.rs", "type": "file", "size": 7,
            "mtime_ns": 1_600_000_000_000_000_000_i64,
        }], "truncated": false})
    );
    let outcome = listing::list(&ws, &list_args(".")).unwrap();
    let kinds: Vec<(&str, EntryType)> = outcome
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e.kind))
        .collect();
    assert_eq!(
        kinds,
        [("link", EntryType::Symlink), ("src", EntryType::Dir)]
    );
}

#[test]
fn list_recursion_dirs_and_dot_toolmesh() {
    let (_tmp, ws) = workspace();
    sample_tree(&ws);
    let top = listing::list(&ws, &list_args(".")).unwrap();
    assert_eq!(paths(&top), [".toolmesh", "a.txt", "b.py", "empty", "src"]);

    let all = listing::list(&ws, &recursive(".")).unwrap();
    assert_eq!(
        paths(&all),
        [
            ".toolmesh",
            ".toolmesh/outputs",
            ".toolmesh/outputs/o.txt",
            "a.txt",
            "b.py",
            "empty",
            "src",
            "src/deep",
            "src/deep/x.py",
            "src/lib.rs",
            "src/main.rs"
        ]
    );

    let files = listing::list(
        &ws,
        &ListOptions {
            include_dirs: false,
            ..recursive(".")
        },
    )
    .unwrap();
    assert_eq!(
        paths(&files),
        [
            ".toolmesh/outputs/o.txt",
            "a.txt",
            "b.py",
            "src/deep/x.py",
            "src/lib.rs",
            "src/main.rs"
        ]
    );

    let sub = listing::list(&ws, &recursive("src/")).unwrap();
    assert_eq!(
        paths(&sub),
        ["src/deep", "src/deep/x.py", "src/lib.rs", "src/main.rs"]
    );
}

#[test]
fn list_globs() {
    let (_tmp, ws) = workspace();
    sample_tree(&ws);
    let glob = |path: &str, glob: &str, recursive: bool| {
        let outcome = listing::list(
            &ws,
            &ListOptions {
                glob: Some(glob.to_owned()),
                recursive,
                ..list_args(path)
            },
        )
        .unwrap();
        paths(&outcome)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        glob(".", "*.py", false),
        ["b.py"],
        "`*` stays in one directory"
    );
    assert_eq!(
        glob(".", "*.py", true),
        ["b.py"],
        "the glob matches the relative path, so `*` never crosses `/`"
    );
    assert_eq!(
        glob(".", "**/*.py", false),
        ["b.py", "src/deep/x.py"],
        "`**` crosses directories"
    );
    assert_eq!(
        glob(".", "src/*.rs", false),
        ["src/lib.rs", "src/main.rs"],
        "a glob reaches as deep as its `/`s"
    );
    assert_eq!(
        glob("src", "*.rs", false),
        ["src/lib.rs", "src/main.rs"],
        "relative to the listed directory"
    );
    assert_eq!(glob("src", "**/*.py", false), ["src/deep/x.py"]);
    assert_eq!(glob(".", "src", false), ["src"], "directories match too");
    assert_eq!(glob(".", "{a.txt,b.py}", false), ["a.txt", "b.py"]);
    assert_eq!(glob(".", "**", true).len(), 11);

    let err = listing::list(
        &ws,
        &ListOptions {
            glob: Some("a[".into()),
            ..list_args(".")
        },
    )
    .unwrap_err()
    .wire();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert_eq!(err.details["details"][0]["path"], "/glob");
}

#[test]
fn list_sorts() {
    let (_tmp, ws) = workspace();
    for (name, content, mtime) in [
        ("b", "22", 300),
        ("a", "1", 100),
        ("c", "333", 200),
        ("d", "22", 200),
    ] {
        put(&ws, name, content);
        set_mtime(&ws, name, mtime);
    }
    let sorted = |sort_by| {
        let outcome = listing::list(
            &ws,
            &ListOptions {
                sort_by,
                ..list_args(".")
            },
        )
        .unwrap();
        paths(&outcome)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(sorted(SortBy::Name), ["a", "b", "c", "d"]);
    assert_eq!(
        sorted(SortBy::Mtime),
        ["b", "c", "d", "a"],
        "newest first, ties by path"
    );
    assert_eq!(
        sorted(SortBy::Size),
        ["c", "b", "d", "a"],
        "largest first, ties by path"
    );
}

#[test]
fn list_truncates_and_clamps() {
    let (_tmp, ws) = workspace();
    for i in 0..5001 {
        std::fs::write(ws.root().join(format!("f{i:05}")), "").unwrap();
    }
    let three = listing::list(
        &ws,
        &ListOptions {
            max_results: 3,
            ..list_args(".")
        },
    )
    .unwrap();
    assert!(three.truncated);
    assert_eq!(
        paths(&three),
        ["f00000", "f00001", "f00002"],
        "the first of the sorted whole, not of the walk"
    );

    let clamped = listing::list(
        &ws,
        &ListOptions {
            max_results: 1_000_000,
            ..list_args(".")
        },
    )
    .unwrap();
    assert_eq!(clamped.entries.len(), 5000);
    assert!(clamped.truncated);

    std::fs::remove_file(ws.root().join("f05000")).unwrap();
    let exact = listing::list(
        &ws,
        &ListOptions {
            max_results: 5000,
            ..list_args(".")
        },
    )
    .unwrap();
    assert_eq!(exact.entries.len(), 5000);
    assert!(!exact.truncated);
}

#[test]
fn list_refusals() {
    let (_tmp, ws) = workspace();
    put(&ws, "f.txt", "x");
    let err = listing::list(&ws, &list_args("missing"))
        .unwrap_err()
        .wire();
    assert_refused(&err, ErrorCode::NotFound, &["'missing'"]);
    let err = listing::list(&ws, &list_args("f.txt")).unwrap_err().wire();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    let err = listing::list(&ws, &list_args("../x")).unwrap_err().wire();
    assert_eq!(err.code, ErrorCode::PathOutsideWorkspace);
}

#[test]
fn list_never_descends_symlinked_dirs_but_lists_through_a_named_one() {
    let (_tmp, ws) = workspace();
    put(&ws, "real/x.txt", "x");
    symlink("real", ws.root().join("alias")).unwrap();
    let all = listing::list(&ws, &recursive(".")).unwrap();
    assert_eq!(paths(&all), ["alias", "real", "real/x.txt"]);
    // Naming an inside link as the listed path resolves it beneath the root.
    let through = listing::list(&ws, &list_args("alias")).unwrap();
    assert_eq!(paths(&through), ["alias/x.txt"]);
}

// ------------------------------------------------------------------------------------ sample

#[test]
fn sample_is_bounded_and_breadth_first() {
    let (_tmp, ws) = workspace();
    put(&ws, "z/deep.txt", "x");
    put(&ws, "b.txt", "x");
    put(&ws, "a.txt", "x");
    symlink("a.txt", ws.root().join("link")).unwrap();
    let (files, count) = listing::sample(&ws, 50).unwrap();
    assert_eq!(files, ["a.txt", "b.txt", "z/deep.txt"]);
    assert_eq!(count, 3);

    let (files, count) = listing::sample(&ws, 2).unwrap();
    assert_eq!(files, ["a.txt", "b.txt"]);
    assert_eq!(count, 3, "counts beyond the sample");

    for i in 0..6000 {
        std::fs::write(ws.root().join(format!("many{i:04}")), "").unwrap();
    }
    let (files, count) = listing::sample(&ws, 50).unwrap();
    assert_eq!(files.len(), 50);
    // The walk stops after SAMPLE_WALK_LIMIT entries, names sorted: a.txt, b.txt, link (not a
    // file), then the `many…` files; `z/` is never reached.
    assert_eq!(count, listing::SAMPLE_WALK_LIMIT - 1);
    assert!(!files.contains(&"z/deep.txt".to_owned()));
}

#[test]
fn sample_of_an_empty_workspace() {
    let (_tmp, ws) = workspace();
    assert_eq!(listing::sample(&ws, 50).unwrap(), (Vec::new(), 0));
}
