//! Unit tests of [`crate::search`]: the engine on a temporary workspace, one behaviour a test.

use super::*;
use std::fs;
use toolmesh_kernel::{Account, SessionId};

struct Fixture {
    _data: tempfile::TempDir,
    ws: Workspace,
}

impl Fixture {
    fn new() -> Fixture {
        let data = tempfile::tempdir().unwrap();
        let ws = Workspace::open(
            data.path(),
            &Account::parse("a").unwrap(),
            &SessionId::parse("s").unwrap(),
        )
        .unwrap();
        Fixture { _data: data, ws }
    }

    /// A workspace holding one file, `rel` with `content`.
    fn with(rel: &str, content: &str) -> Fixture {
        let f = Fixture::new();
        f.write(rel, content);
        f
    }

    fn write(&self, rel: &str, content: impl AsRef<[u8]>) {
        let path = self.ws.root().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    /// Files at `rels` that hold one line, `needle`.
    fn needles(&self, rels: &[&str]) {
        for rel in rels {
            self.write(rel, "needle\n");
        }
    }

    fn search(&self, args: SearchOptions) -> SearchOutcome {
        self.search_in("", args).unwrap()
    }

    fn search_in(&self, rel: &str, args: SearchOptions) -> Result<SearchOutcome, ToolError> {
        Ok(search(&self.ws, Path::new(rel), &args)?)
    }
}

fn args(query: &str) -> SearchOptions {
    SearchOptions {
        query: query.to_owned(),
        is_regex: false,
        glob: None,
        case_sensitive: false,
        context_lines: 0,
        max_results: 100,
    }
}

fn places(outcome: &SearchOutcome) -> Vec<(String, u64)> {
    outcome
        .results
        .iter()
        .map(|h| (h.path.clone(), h.line))
        .collect()
}

fn place(path: &str, line: u64) -> (String, u64) {
    (path.to_owned(), line)
}

#[test]
fn literal_query_matches_regex_metacharacters_literally() {
    let f = Fixture::with("a.txt", "call foo(1)\ncall foo1\nfoo.*\n");
    let out = f.search(args("foo("));
    assert_eq!(places(&out), vec![place("a.txt", 1)]);
    assert_eq!(out.results[0].text, "call foo(1)");
    let out = f.search(args(".*"));
    assert_eq!(places(&out), vec![place("a.txt", 3)]);
    assert_eq!(out.match_count, 1);
    assert!(!out.truncated);
    assert_eq!(out.search_backend, "grep-searcher");
    assert_eq!(out.files_searched, 1);
}

#[test]
fn regex_query_and_line_anchors() {
    let f = Fixture::with("a.rs", "fn alpha() {}\nlet x = alpha();\n  fn beta() {}\n");
    let mut a = args(r"^\s*fn\s+(\w+)\(");
    a.is_regex = true;
    let out = f.search(a);
    assert_eq!(places(&out), vec![place("a.rs", 1), place("a.rs", 3)]);
    let mut a = args(r"\);$");
    a.is_regex = true;
    assert_eq!(places(&f.search(a)), vec![place("a.rs", 2)]);
}

#[test]
fn case_insensitive_unless_asked() {
    let f = Fixture::with("a.txt", "Hello\nhello\nHELLO\n");
    assert_eq!(f.search(args("hello")).match_count, 3);
    let mut a = args("hello");
    a.case_sensitive = true;
    assert_eq!(places(&f.search(a)), vec![place("a.txt", 2)]);
    let mut a = args("h[e]llo");
    a.is_regex = true;
    assert_eq!(f.search(a).match_count, 3);
}

#[test]
fn context_lines_belong_to_each_hit() {
    let f = Fixture::new();
    let lines: Vec<String> = (1..=10).map(|n| format!("line {n}")).collect();
    let mut content = lines.join("\n");
    content = content
        .replace("line 4", "match 4")
        .replace("line 6", "match 6");
    f.write("a.txt", content + "\n");
    let mut a = args("match");
    a.context_lines = 2;
    let out = f.search(a);
    assert_eq!(out.match_count, 2);
    let (first, second) = (&out.results[0], &out.results[1]);
    assert_eq!(first.line, 4);
    assert_eq!(first.context_before, ["line 2", "line 3"]);
    assert_eq!(first.context_after, ["line 5", "match 6"]);
    assert_eq!(second.line, 6);
    assert_eq!(second.context_before, ["match 4", "line 5"]);
    assert_eq!(second.context_after, ["line 7", "line 8"]);
}

#[test]
fn context_is_cut_at_file_edges_and_capped_at_20() {
    let f = Fixture::new();
    let lines: Vec<String> = (1..=100).map(|n| format!("l{n}")).collect();
    let content = lines.join("\n").replace("l50\n", "needle\n");
    f.write("a.txt", format!("needle top\n{content}\nneedle bottom\n"));
    let mut a = args("needle");
    a.context_lines = 1000;
    let out = f.search(a);
    assert_eq!(out.match_count, 3);
    let top = &out.results[0];
    assert!(top.context_before.is_empty());
    assert_eq!(top.context_after.len(), 20);
    let middle = &out.results[1];
    assert_eq!(middle.line, 51);
    assert_eq!(middle.context_before.len(), 20);
    assert_eq!(middle.context_before[0], "l30");
    assert_eq!(middle.context_after.len(), 20);
    assert_eq!(middle.context_after[19], "l70");
    let bottom = &out.results[2];
    assert_eq!(bottom.context_before.len(), 20);
    assert!(bottom.context_after.is_empty());
}

#[test]
fn glob_is_relative_to_the_searched_dir_and_double_star_crosses_dirs() {
    let f = Fixture::new();
    f.needles(&[
        "top.rs",
        "src/a.rs",
        "src/deep/b.rs",
        "src/c.txt",
        "other/d.rs",
    ]);
    let mut a = args("needle");
    a.glob = Some("src/**/*.rs".into());
    assert_eq!(
        places(&f.search(a.clone())),
        vec![place("src/a.rs", 1), place("src/deep/b.rs", 1)]
    );
    a.glob = Some("*.rs".into());
    assert_eq!(
        f.search(a.clone()).match_count,
        4,
        "no slash: file name at any depth"
    );
    a.glob = Some("deep/*.rs".into());
    let out = f.search_in("src", a.clone()).unwrap();
    assert_eq!(places(&out), vec![place("src/deep/b.rs", 1)]);
    a.glob = Some("!*.rs".into());
    assert_eq!(places(&f.search(a.clone())), vec![place("src/c.txt", 1)]);
    a.glob = Some("src/[".into());
    let err = f.search_in("", a).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert_eq!(err.details["details"][0]["path"], "/glob");
}

#[test]
fn gitignore_and_ignore_files_are_respected_without_a_repository() {
    let f = Fixture::with(".gitignore", "build/\n*.log\n");
    f.write("sub/.ignore", "secret.txt\n");
    f.needles(&[
        "keep.txt",
        "build/out.txt",
        "app.log",
        "sub/secret.txt",
        "sub/deeper/x.log",
        "sub/deeper/y.txt",
    ]);
    let out = f.search(args("needle"));
    assert_eq!(
        places(&out),
        vec![place("keep.txt", 1), place("sub/deeper/y.txt", 1)]
    );
    // The root as the caller names it (`WorkspacePath::as_path` gives `.`): same reply.
    assert_eq!(f.search_in(".", args("needle")).unwrap(), out);
    // Searching below the root: the root's rules still apply, nothing above the root does.
    let out = f.search_in("sub/deeper", args("needle")).unwrap();
    assert_eq!(places(&out), vec![place("sub/deeper/y.txt", 1)]);
}

#[test]
fn nothing_above_the_root_shapes_the_reply() {
    let f = Fixture::new();
    // The workspace root's parent directory (host data) ignores everything.
    fs::write(f.ws.root().parent().unwrap().join(".gitignore"), "*\n").unwrap();
    f.write("sub/a.txt", "needle\n");
    assert_eq!(f.search(args("needle")).match_count, 1);
    assert_eq!(f.search_in("sub", args("needle")).unwrap().match_count, 1);
}

#[test]
fn hidden_entries_git_and_persisted_outputs_are_skipped() {
    let f = Fixture::new();
    f.needles(&[
        "visible.txt",
        ".hidden.txt",
        ".config/x.txt",
        ".git/config",
        ".toolmesh/outputs/o.txt",
    ]);
    assert_eq!(
        places(&f.search(args("needle"))),
        vec![place("visible.txt", 1)]
    );
    // Named explicitly, a persisted output can be searched.
    let out = f.search_in(".toolmesh/outputs", args("needle")).unwrap();
    assert_eq!(places(&out), vec![place(".toolmesh/outputs/o.txt", 1)]);
}

#[test]
fn files_over_one_mebibyte_are_skipped_and_counted() {
    let f = Fixture::new();
    let mut big = "x".repeat(MAX_FILE_BYTES as usize);
    big.push_str("\nneedle\n");
    f.write("big.txt", big);
    let mut exact = "y".repeat(MAX_FILE_BYTES as usize - 7);
    exact.push_str("needle\n");
    f.write("exact.txt", exact);
    let out = f.search(args("needle"));
    assert_eq!(places(&out), vec![place("exact.txt", 1)]);
    assert_eq!(out.files_skipped_large, 1);
    assert_eq!(out.files_searched, 1);
}

#[test]
fn max_results_stops_and_truncates() {
    let f = Fixture::new();
    for i in 0..20 {
        f.write(&format!("f{i:02}.txt"), "needle\nneedle\nneedle\n");
    }
    let mut a = args("needle");
    a.max_results = 7;
    let out = f.search(a.clone());
    assert_eq!(out.results.len(), 7);
    assert_eq!(out.match_count, 7);
    assert!(out.truncated);
    let mut sorted = places(&out);
    sorted.sort();
    assert_eq!(places(&out), sorted, "sorted by (path, line)");
    // Exactly as many as asked for: nothing left out, so not truncated.
    a.max_results = 60;
    let out = f.search(a.clone());
    assert_eq!(out.match_count, 60);
    assert!(!out.truncated);
    // Clamped to 5000.
    a.max_results = u64::MAX;
    assert_eq!(f.search(a).match_count, 60);
}

#[test]
fn truncation_keeps_the_context_of_returned_hits_whole() {
    let f = Fixture::with("a.txt", "before\nneedle 1\nneedle 2\nafter 1\nafter 2\n");
    let mut a = args("needle");
    a.max_results = 1;
    a.context_lines = 2;
    let out = f.search(a);
    assert!(out.truncated);
    assert_eq!(out.results.len(), 1);
    assert_eq!(out.results[0].context_before, ["before"]);
    assert_eq!(out.results[0].context_after, ["needle 2", "after 1"]);
}

#[cfg(unix)]
#[test]
fn symlinks_pointing_outside_are_never_read() {
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret.txt"), "TOPSECRET needle\n").unwrap();
    fs::create_dir(outside.path().join("dir")).unwrap();
    fs::write(outside.path().join("dir/s.txt"), "TOPSECRET needle\n").unwrap();
    f.write("inside.txt", "needle\n");
    let root = f.ws.root();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("dir"), root.join("linkdir")).unwrap();

    for query in ["needle", "TOPSECRET"] {
        let out = f.search(args(query));
        let json = serde_json::to_string(&out).unwrap();
        assert!(!json.contains("TOPSECRET"), "{json}");
    }
    assert_eq!(
        places(&f.search(args("needle"))),
        vec![place("inside.txt", 1)]
    );

    // Named as the search path, an escaping symlink is refused outright.
    let err = f.search_in("linkdir", args("needle")).unwrap_err();
    assert_eq!(err.code, ErrorCode::PathOutsideWorkspace);
    // A file reached through a directory that became a symlink after listing: the confined
    // open (what the walker's threads use) refuses it.
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true);
    assert!(open_confined(&f.ws, Path::new("linkdir/s.txt"), &options).is_none());
    assert!(open_confined(&f.ws, Path::new("link.txt"), &options).is_none());
    assert!(open_confined(&f.ws, Path::new("inside.txt"), &options).is_some());
}

#[cfg(unix)]
#[test]
fn a_start_path_that_is_a_symlink_inside_is_searched_at_its_target() {
    let f = Fixture::with("real/a.txt", "needle\n");
    std::os::unix::fs::symlink("real", f.ws.root().join("alias")).unwrap();
    let out = f.search_in("alias", args("needle")).unwrap();
    assert_eq!(places(&out), vec![place("real/a.txt", 1)]);
}

#[test]
fn a_file_as_the_search_path_and_a_missing_one() {
    let f = Fixture::new();
    f.needles(&["dir/a.txt", "dir/b.txt"]);
    let out = f.search_in("dir/a.txt", args("needle")).unwrap();
    assert_eq!(places(&out), vec![place("dir/a.txt", 1)]);
    let err = f.search_in("nope", args("needle")).unwrap_err();
    assert_eq!(err.code, ErrorCode::NotFound);
}

#[test]
fn invalid_regex_is_invalid_arguments_on_query() {
    let f = Fixture::new();
    for (query, is_regex) in [
        ("foo(", true),
        (r"a\nb", true),
        ("a\nb", false),
        ("a\0b", false),
    ] {
        let mut a = args(query);
        a.is_regex = is_regex;
        let err = f.search_in("", a).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{query:?}");
        assert_eq!(err.details["details"][0]["path"], "/query");
    }
}

#[test]
fn crlf_lines_are_returned_without_the_carriage_return() {
    let f = Fixture::with("dos.txt", "first\r\nneedle end;\r\nlast\r\n");
    let mut a = args("needle");
    a.context_lines = 1;
    let out = f.search(a);
    let hit = &out.results[0];
    assert_eq!(hit.text, "needle end;");
    assert_eq!(hit.context_before, ["first"]);
    assert_eq!(hit.context_after, ["last"]);
    let mut a = args("end;$");
    a.is_regex = true;
    assert_eq!(places(&f.search(a)), vec![place("dos.txt", 2)]);
}

#[test]
fn binary_files_stop_at_nul_and_text_is_utf8_lossy() {
    let f = Fixture::new();
    f.write("bin.dat", b"needle\0needle\n");
    f.write("latin1.txt", b"caf\xe9 needle\n");
    let out = f.search(args("needle"));
    assert_eq!(places(&out), vec![place("latin1.txt", 1)]);
    assert_eq!(out.results[0].text, "caf\u{fffd} needle");
}

#[test]
fn long_lines_are_cut_around_the_match() {
    let f = Fixture::new();
    let line = format!("{}needle{}", "a".repeat(50_000), "b".repeat(50_000));
    f.write("min.js", format!("{line}\n"));
    let out = f.search(args("needle"));
    let text = &out.results[0].text;
    assert!(text.contains("needle"));
    assert!(text.starts_with('…') && text.ends_with('…'));
    assert_eq!(text.chars().count(), MAX_LINE_CHARS + 2);
}
