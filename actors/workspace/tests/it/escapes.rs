//! A catalogue of attempts to reach outside the workspace, one data row each.
//!
//! Every row runs on a fresh data directory that holds, beside the workspace, a sentinel file
//! in a sibling directory (`…/sessions/s1/outside/`) and another account's workspace. After
//! the operation the row checks the reply code and that nothing outside the workspace changed
//! or appeared: the whole data directory except the workspace is compared before and after.

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use toolmesh_kernel::{ErrorCode, ToolError};
use toolmesh_workspace::confine::{self, Workspace, WorkspacePath};
use toolmesh_workspace::listing::{self, ListOptions, SortBy};
use toolmesh_workspace::writing;

use crate::{is_symlink, workspace};

struct Fixture {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    ws: Workspace,
    /// A sibling directory of the workspace root.
    outside: PathBuf,
    /// Another account's workspace file.
    other: PathBuf,
}

const SENTINEL: &str = "sentinel, must not change";

impl Fixture {
    fn new() -> Fixture {
        let (tmp, ws) = workspace();
        let data = tmp.path().to_path_buf();
        let outside = ws.root().parent().unwrap().join("outside");
        std::fs::create_dir_all(outside.join("dir")).unwrap();
        std::fs::write(outside.join("sentinel.txt"), SENTINEL).unwrap();
        std::fs::write(outside.join("dir/inner.txt"), SENTINEL).unwrap();
        let other = data.join("accounts/other/sessions/s/workspace/f");
        std::fs::create_dir_all(other.parent().unwrap()).unwrap();
        std::fs::write(&other, "another account's file").unwrap();
        Fixture {
            _tmp: tmp,
            data,
            ws,
            outside,
            other,
        }
    }

    fn root(&self) -> &Path {
        self.ws.root()
    }

    /// Replaces `{outside}`, `{other}` and `{root}` in a row's path by absolute paths.
    fn expand(&self, raw: &str) -> String {
        raw.replace("{outside}", self.outside.to_str().unwrap())
            .replace("{other}", self.other.to_str().unwrap())
            .replace("{root}", self.root().to_str().unwrap())
    }

    fn link(&self, target: &str, link: &str) {
        let link = self.root().join(link);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        symlink(self.expand(target), link).unwrap();
    }

    fn file(&self, rel: &str, content: &str) {
        let path = self.root().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// Everything under the data directory except the workspace: type and content or target.
    fn snapshot_outside(&self) -> BTreeMap<PathBuf, String> {
        let mut seen = BTreeMap::new();
        let mut stack = vec![self.data.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path == self.root() {
                    continue;
                }
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let what = if meta.file_type().is_symlink() {
                    format!("link -> {}", std::fs::read_link(&path).unwrap().display())
                } else if meta.is_dir() {
                    stack.push(path.clone());
                    "dir".to_owned()
                } else {
                    format!("file {:?}", std::fs::read(&path).unwrap())
                };
                seen.insert(path, what);
            }
        }
        seen
    }
}

/// What a row does.
#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Stat,
    Write,
    Batch,
    Delete,
    List { recursive: bool },
}

/// What a row expects.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Fails(ErrorCode),
    Succeeds,
}
use Expect::{Fails, Succeeds};

struct Row {
    name: &'static str,
    setup: fn(&Fixture),
    op: Op,
    path: &'static str,
    expect: Expect,
    /// Further checks on the reply and the workspace.
    check: fn(&Fixture, &Result<Value, ToolError>),
}

fn nothing(_: &Fixture) {}
fn no_check(_: &Fixture, _: &Result<Value, ToolError>) {}

fn run(fx: &Fixture, op: Op, raw: &str) -> Result<Value, ToolError> {
    let raw = fx.expand(raw);
    let path = || WorkspacePath::parse(&raw, "path");
    let ws = &fx.ws;
    match op {
        Op::Read => confine::read(ws, &path()?, 1 << 20)
            .map(|b| json!(String::from_utf8_lossy(&b)))
            .map_err(ToolError::from),
        Op::Stat => confine::stat(ws, &path()?)
            .map(|s| json!(s))
            .map_err(ToolError::from),
        Op::Write => writing::write_atomic(ws, &path()?, b"written by the test", true)
            .map(|o| json!(o))
            .map_err(ToolError::from),
        Op::Batch => {
            let files = vec![
                (
                    WorkspacePath::parse("batch-first.txt", "files/0/path")?,
                    "first".to_owned(),
                ),
                (
                    WorkspacePath::parse(&raw, "files/1/path")?,
                    "second".to_owned(),
                ),
            ];
            writing::write_batch(ws, &files, true)
                .map(|w| json!(w))
                .map_err(ToolError::from)
        }
        Op::Delete => confine::delete(ws, &path()?)
            .map(|o| json!(o))
            .map_err(ToolError::from),
        Op::List { recursive } => {
            let args = ListOptions {
                path: raw.clone(),
                glob: None,
                recursive,
                include_dirs: true,
                max_results: 5000,
                sort_by: SortBy::Name,
            };
            listing::list(ws, &args)
                .map(|o| json!(o))
                .map_err(ToolError::from)
        }
    }
}

fn listed(reply: &Result<Value, ToolError>) -> Vec<(String, String)> {
    reply.as_ref().unwrap()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn link_to_sentinel(fx: &Fixture) {
    fx.link("{outside}/sentinel.txt", "link");
}
fn relative_link_to_sentinel(fx: &Fixture) {
    fx.link("../outside/sentinel.txt", "link");
}
fn link_to_outside_dir(fx: &Fixture) {
    fx.link("{outside}", "d");
}
fn link_chain_out(fx: &Fixture) {
    fx.link("l2", "l1");
    fx.link("sub/l3", "l2");
    fx.link("../../outside/sentinel.txt", "sub/l3");
}
fn link_chain_in(fx: &Fixture) {
    fx.file("real.txt", "inside");
    fx.link("l2", "l1");
    fx.link("real.txt", "l2");
}
fn link_to_parent(fx: &Fixture) {
    fx.link("..", "a");
}
fn link_to_other_account(fx: &Fixture) {
    fx.link("{other}", "o");
}
fn relative_link_to_other_account(fx: &Fixture) {
    fx.link("../../../../other/sessions/s/workspace/f", "o");
}
fn absolute_link_inside(fx: &Fixture) {
    fx.file("real.txt", "inside");
    fx.link("{root}/real.txt", "abs");
}
fn file_a(fx: &Fixture) {
    fx.file("a", "plain a");
}
fn link_loop(fx: &Fixture) {
    fx.link("loop2", "loop1");
    fx.link("loop1", "loop2");
}

/// The delete removed the link `name` itself (and so nothing it points at).
fn deleted_link(fx: &Fixture, reply: &Result<Value, ToolError>, name: &str) {
    assert_eq!(reply.as_ref().unwrap()["kind"], "symlink");
    assert!(std::fs::symlink_metadata(fx.root().join(name)).is_err());
}

fn wrote_literal(rel: &'static str) -> fn(&Fixture, &Result<Value, ToolError>) {
    // One function per literal name keeps the rows plain data.
    match rel {
        "%2e%2e/x" => |fx, _| assert!(fx.root().join("%2e%2e/x").is_file()),
        "%2e%2e%2fx" => |fx, _| assert!(fx.root().join("%2e%2e%2fx").is_file()),
        "..\\x" => |fx, _| assert!(fx.root().join("..\\x").is_file()),
        ".. /x" => |fx, _| assert!(fx.root().join(".. /x").is_file()),
        "..." => |fx, _| assert!(fx.root().join("...").is_file()),
        _ => unreachable!(),
    }
}

fn rows() -> Vec<Row> {
    vec![
        // ---- lexical escapes
        Row {
            name: "dotdot",
            setup: nothing,
            op: Op::Read,
            path: "..",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "dotdot slash x",
            setup: nothing,
            op: Op::Write,
            path: "../x",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "into the sibling",
            setup: nothing,
            op: Op::Write,
            path: "../outside/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "climb after a name",
            setup: nothing,
            op: Op::Write,
            path: "a/../../x",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "climb with dots between",
            setup: nothing,
            op: Op::Delete,
            path: "a/./b/../../../outside/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "absolute /etc/passwd",
            setup: nothing,
            op: Op::Read,
            path: "/etc/passwd",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "absolute path to the sentinel",
            setup: nothing,
            op: Op::Write,
            path: "{outside}/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "absolute path to the sentinel, delete",
            setup: nothing,
            op: Op::Delete,
            path: "{outside}/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "absolute path into the workspace itself",
            setup: nothing,
            op: Op::Write,
            path: "{root}/x",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "list the parent",
            setup: nothing,
            op: Op::List { recursive: true },
            path: "..",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "another account, as briefed",
            setup: nothing,
            op: Op::Read,
            path: "../../../other/sessions/s/workspace/f",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "another account, exact depth",
            setup: nothing,
            op: Op::Write,
            path: "../../../../other/sessions/s/workspace/f",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "a bad path in a batch writes nothing",
            setup: nothing,
            op: Op::Batch,
            path: "../x",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: |fx, _| assert!(!fx.root().join("batch-first.txt").exists()),
        },
        // ---- literal names that only look like escapes
        Row {
            name: "percent-encoded dots are a name",
            setup: nothing,
            op: Op::Write,
            path: "%2e%2e/x",
            expect: Succeeds,
            check: wrote_literal("%2e%2e/x"),
        },
        Row {
            name: "percent-encoded slash is a name",
            setup: nothing,
            op: Op::Write,
            path: "%2e%2e%2fx",
            expect: Succeeds,
            check: wrote_literal("%2e%2e%2fx"),
        },
        Row {
            name: "backslash is a name",
            setup: nothing,
            op: Op::Write,
            path: "..\\x",
            expect: Succeeds,
            check: wrote_literal("..\\x"),
        },
        Row {
            name: "dots with a trailing space are a name",
            setup: nothing,
            op: Op::Write,
            path: ".. /x",
            expect: Succeeds,
            check: wrote_literal(".. /x"),
        },
        Row {
            name: "three dots are a name",
            setup: nothing,
            op: Op::Write,
            path: "...",
            expect: Succeeds,
            check: wrote_literal("..."),
        },
        Row {
            name: "NUL byte",
            setup: nothing,
            op: Op::Write,
            path: "x\0y",
            expect: Fails(ErrorCode::InvalidArguments),
            check: |_, r| {
                assert_eq!(
                    r.as_ref().unwrap_err().details["details"][0]["path"],
                    "/path"
                )
            },
        },
        Row {
            name: "NUL byte after dots",
            setup: nothing,
            op: Op::Read,
            path: "..\0/etc/passwd",
            expect: Fails(ErrorCode::InvalidArguments),
            check: no_check,
        },
        Row {
            name: "trailing space is not trimmed (read)",
            setup: file_a,
            op: Op::Read,
            path: "a ",
            expect: Fails(ErrorCode::NotFound),
            check: no_check,
        },
        Row {
            name: "trailing space is not trimmed (write)",
            setup: file_a,
            op: Op::Write,
            path: "a ",
            expect: Succeeds,
            check: |fx, _| {
                assert_eq!(
                    std::fs::read_to_string(fx.root().join("a")).unwrap(),
                    "plain a"
                );
                assert!(fx.root().join("a ").is_file());
            },
        },
        // ---- a symlink inside pointing at an outside file
        Row {
            name: "read through a link out",
            setup: link_to_sentinel,
            op: Op::Read,
            path: "link",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "stat through a link out",
            setup: link_to_sentinel,
            op: Op::Stat,
            path: "link",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "write through a link out",
            setup: link_to_sentinel,
            op: Op::Write,
            path: "link",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: |fx, _| assert!(is_symlink(&fx.root().join("link"))),
        },
        Row {
            name: "batch write through a link out",
            setup: link_to_sentinel,
            op: Op::Batch,
            path: "link",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: |fx, _| assert!(!fx.root().join("batch-first.txt").exists()),
        },
        Row {
            name: "read through a relative link out",
            setup: relative_link_to_sentinel,
            op: Op::Read,
            path: "link",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "write through a relative link out",
            setup: relative_link_to_sentinel,
            op: Op::Write,
            path: "link",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "delete a link out removes the link only",
            setup: link_to_sentinel,
            op: Op::Delete,
            path: "link",
            expect: Succeeds,
            check: |fx, r| deleted_link(fx, r, "link"),
        },
        Row {
            name: "list shows a link out as a symlink",
            setup: link_to_sentinel,
            op: Op::List { recursive: true },
            path: ".",
            expect: Succeeds,
            check: |_, r| assert_eq!(listed(r), [("link".to_owned(), "symlink".to_owned())]),
        },
        // ---- a symlinked directory leading out
        Row {
            name: "read beneath a dir link out",
            setup: link_to_outside_dir,
            op: Op::Read,
            path: "d/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "overwrite beneath a dir link out",
            setup: link_to_outside_dir,
            op: Op::Write,
            path: "d/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "create beneath a dir link out",
            setup: link_to_outside_dir,
            op: Op::Write,
            path: "d/new.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "create dirs beneath a dir link out",
            setup: link_to_outside_dir,
            op: Op::Write,
            path: "d/sub/deeper/new.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "delete beneath a dir link out",
            setup: link_to_outside_dir,
            op: Op::Delete,
            path: "d/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "delete a dir beneath a dir link out",
            setup: link_to_outside_dir,
            op: Op::Delete,
            path: "d/dir/inner.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "list a dir link out",
            setup: link_to_outside_dir,
            op: Op::List { recursive: false },
            path: "d",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "list beneath a dir link out",
            setup: link_to_outside_dir,
            op: Op::List { recursive: true },
            path: "d/dir",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "a recursive list does not descend a dir link out",
            setup: link_to_outside_dir,
            op: Op::List { recursive: true },
            path: ".",
            expect: Succeeds,
            check: |_, r| assert_eq!(listed(r), [("d".to_owned(), "symlink".to_owned())]),
        },
        Row {
            name: "delete a dir link out removes the link only",
            setup: link_to_outside_dir,
            op: Op::Delete,
            path: "d",
            expect: Succeeds,
            check: |fx, r| deleted_link(fx, r, "d"),
        },
        // ---- chains
        Row {
            name: "read through a chain out",
            setup: link_chain_out,
            op: Op::Read,
            path: "l1",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "write through a chain out",
            setup: link_chain_out,
            op: Op::Write,
            path: "l1",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "a chain that stays inside reads",
            setup: link_chain_in,
            op: Op::Read,
            path: "l1",
            expect: Succeeds,
            check: |_, r| assert_eq!(r.as_ref().unwrap(), "inside"),
        },
        Row {
            name: "a chain that stays inside is written through",
            setup: link_chain_in,
            op: Op::Write,
            path: "l1",
            expect: Succeeds,
            check: |fx, _| {
                assert!(is_symlink(&fx.root().join("l1")));
                assert_eq!(
                    std::fs::read_to_string(fx.root().join("real.txt")).unwrap(),
                    "written by the test"
                );
            },
        },
        Row {
            name: "a loop of links",
            setup: link_loop,
            op: Op::Read,
            path: "loop1",
            expect: Fails(ErrorCode::InvalidArguments),
            check: no_check,
        },
        // ---- `a/b` where `a` is a symlink to `..`: lexically clean, physically outside
        Row {
            name: "read via a link to the parent",
            setup: link_to_parent,
            op: Op::Read,
            path: "a/outside/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "write via a link to the parent",
            setup: link_to_parent,
            op: Op::Write,
            path: "a/outside/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "create via a link to the parent",
            setup: link_to_parent,
            op: Op::Write,
            path: "a/b",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "create dirs via a link to the parent",
            setup: link_to_parent,
            op: Op::Write,
            path: "a/newdir/b",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "delete via a link to the parent",
            setup: link_to_parent,
            op: Op::Delete,
            path: "a/outside/sentinel.txt",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "list via a link to the parent",
            setup: link_to_parent,
            op: Op::List { recursive: true },
            path: "a",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "stat via a link to the parent",
            setup: link_to_parent,
            op: Op::Stat,
            path: "a/outside",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "the workspace itself via a link to the parent",
            setup: link_to_parent,
            op: Op::Read,
            path: "a/workspace/a",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        // ---- another account's workspace through links
        Row {
            name: "read another account through an absolute link",
            setup: link_to_other_account,
            op: Op::Read,
            path: "o",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "write another account through an absolute link",
            setup: link_to_other_account,
            op: Op::Write,
            path: "o",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        Row {
            name: "read another account through a relative link",
            setup: relative_link_to_other_account,
            op: Op::Read,
            path: "o",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
        // ---- absolute links are refused even when they point inside (resolution never starts at `/`)
        Row {
            name: "an absolute link back inside",
            setup: absolute_link_inside,
            op: Op::Read,
            path: "abs",
            expect: Fails(ErrorCode::PathOutsideWorkspace),
            check: no_check,
        },
    ]
}

#[test]
fn every_escape_attempt_is_refused_and_nothing_outside_changes() {
    let mut failures = Vec::new();
    for row in rows() {
        let fx = Fixture::new();
        (row.setup)(&fx);
        let before = fx.snapshot_outside();
        let reply = run(&fx, row.op, row.path);
        let after = fx.snapshot_outside();

        let got = match &reply {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.code.as_str().to_owned(),
        };
        let wanted = match row.expect {
            Succeeds => "ok".to_owned(),
            Fails(code) => code.as_str().to_owned(),
        };
        if got != wanted {
            failures.push(format!("{}: wanted {wanted}, got {reply:?}", row.name));
            continue;
        }
        if before != after {
            failures.push(format!(
                "{}: outside changed: before {before:?}, after {after:?}",
                row.name
            ));
            continue;
        }
        assert_eq!(
            std::fs::read_to_string(fx.outside.join("sentinel.txt")).unwrap(),
            SENTINEL,
            "{}",
            row.name
        );
        if let Err(e) = &reply {
            assert!(
                !e.message.is_empty() && !e.message.contains('\n'),
                "{}: {e:?}",
                row.name
            );
        }
        (row.check)(&fx, &reply);
    }
    assert!(
        failures.is_empty(),
        "{} row(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn escape_messages_name_the_relative_path() {
    let fx = Fixture::new();
    link_to_outside_dir(&fx);
    let err = run(&fx, Op::Read, "d/sentinel.txt").unwrap_err();
    assert!(err.message.contains("'d/sentinel.txt'"), "{}", err.message);
    assert!(
        !err.message.contains(fx.outside.to_str().unwrap()),
        "no host path: {}",
        err.message
    );
    let err = run(&fx, Op::Write, "../x").unwrap_err();
    assert!(err.message.contains("'../x'"), "{}", err.message);
}

#[test]
fn the_outside_snapshot_sees_a_change_and_a_new_file() {
    // Guards the guard: a catalogue that compared nothing would pass every row.
    let fx = Fixture::new();
    let before = fx.snapshot_outside();
    std::fs::write(fx.outside.join("sentinel.txt"), "changed").unwrap();
    assert_ne!(before, fx.snapshot_outside());
    let fx = Fixture::new();
    let before = fx.snapshot_outside();
    std::fs::write(fx.outside.join("dir/new"), "").unwrap();
    assert_ne!(before, fx.snapshot_outside());
    let fx = Fixture::new();
    let before = fx.snapshot_outside();
    std::fs::write(fx.root().join("inside"), "").unwrap();
    assert_eq!(
        before,
        fx.snapshot_outside(),
        "the workspace itself is not compared"
    );
}
