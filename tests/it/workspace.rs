//! The workspace tools end to end: gateway → workspace actor, real NATS and Redis, files on
//! disk checked directly.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::support::{assert_holds, ok, strings, Cluster};

/// Gateway, approval and workspace on one node, approval off (gating is tested separately).
async fn cluster() -> Cluster {
    Cluster::ungated("gateway,approval,workspace").await
}

fn root(c: &Cluster, account: &str, session: &str) -> PathBuf {
    c.data_dir
        .path()
        .join("accounts")
        .join(account)
        .join("sessions")
        .join(session)
        .join("workspace")
}

async fn tool(c: &Cluster, name: &str, args: Value) -> Value {
    c.session_call("acme", "s1", name, args).await
}

async fn write_file(c: &Cluster, path: &str, content: &str) -> Value {
    let args = json!({"path": path, "content": content});
    tool(c, "write_workspace_file", args).await
}

/// `read_workspace_file` of lines `start` to `end` of `path`.
/// Asserts the window a read returned: its first and last line, of how many lines, and
/// whether that is part of the file.
fn assert_window(r: &Value, range: [u64; 2], total_lines: u64, partial: bool) {
    let window = (&r["read_range"], &r["total_lines"], &r["partial"]);
    assert_eq!(window.0, &json!(range), "{window:?}");
    assert_eq!(window.1, &json!(total_lines), "{window:?}");
    assert_eq!(window.2, &json!(partial), "{window:?}");
}

async fn read_lines(c: &Cluster, path: &str, start: u64, end: u64) -> Value {
    let args = json!({"path": path, "start_line": start, "end_line": end});
    tool(c, "read_workspace_file", args).await
}

/// `edit_workspace_file` of `path`: `old` replaced by `new`.
async fn edit_file(c: &Cluster, path: &str, old: &str, new: &str) -> Value {
    let args = json!({"path": path, "old_text": old, "new_text": new});
    tool(c, "edit_workspace_file", args).await
}

async fn read_file(c: &Cluster, path: &str) -> Value {
    tool(c, "read_workspace_file", json!({"path": path})).await
}

#[tokio::test]
async fn write_then_read_with_line_numbers_and_ranges() {
    let c = cluster().await;
    let w = ok(write_file(&c, "src/a.txt", "one\ntwo\nthree\n").await);
    assert_eq!(w["created"], true);
    assert_eq!(
        std::fs::read_to_string(root(&c, "acme", "s1").join("src/a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    let r = ok(read_file(&c, "src/a.txt").await);
    assert_eq!(r["content"], "     1\tone\n     2\ttwo\n     3\tthree\n");
    assert_window(&r, [1, 3], 3, false);
    let r = tool(
        &c,
        "read_workspace_file",
        json!({"path": "src/a.txt", "start_line": 2, "end_line": 2, "include_line_numbers": false}),
    )
    .await;
    assert_eq!(r["content"], "two\n");
    assert_eq!(r["read_range"], json!([2, 2]));
    assert_eq!(r["partial"], true);
    let r = read_file(&c, "missing.txt").await;
    assert_eq!(r["error"], "not_found", "{r}");
    std::fs::write(root(&c, "acme", "s1").join("bin.dat"), [0xff, 0xfe, 0x00]).unwrap();
    let r = read_file(&c, "bin.dat").await;
    assert_eq!(r["error"], "not_utf8", "{r}");
    let big = "x".repeat(1024 * 1024);
    std::fs::write(
        root(&c, "acme", "s1").join("big.txt"),
        format!("{big}\n{big}\n{big}\n"),
    )
    .unwrap();
    let r = read_file(&c, "big.txt").await;
    assert_eq!(r["error"], "file_too_large", "{r}");
    let r = tool(
        &c,
        "write_workspace_file",
        json!({"path": "src/a.txt", "content": "x", "overwrite": false}),
    )
    .await;
    assert_eq!(r["error"], "already_exists", "{r}");
}

#[tokio::test]
async fn edits_need_a_read_and_refuse_stale_ones() {
    let c = cluster().await;
    let file = root(&c, "acme", "s1").join("notes.md");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "alpha\nbeta\ngamma\n").unwrap();
    let e = edit_file(&c, "notes.md", "beta", "BETA").await;
    assert_eq!(e["error"], "file_not_read", "{e}");
    read_file(&c, "notes.md").await;
    let e = ok(edit_file(&c, "notes.md", "beta", "BETA").await);
    assert_eq!(e["replacements"], 1);
    assert_holds(&e, "diff", "-beta\n+BETA");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "alpha\nBETA\ngamma\n"
    );
    // Our own edit counts as a read: a second edit works without reading again.
    ok(edit_file(&c, "notes.md", "gamma", "GAMMA").await);
    // Changed on disk behind our back: conflict, file untouched.
    std::fs::write(&file, "changed elsewhere\n").unwrap();
    let e = edit_file(&c, "notes.md", "alpha", "A").await;
    assert_eq!(e["error"], "conflict", "{e}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "changed elsewhere\n"
    );
    // Snippet errors.
    read_file(&c, "notes.md").await;
    let e = edit_file(&c, "notes.md", "changed elswhere", "x").await;
    assert_eq!(e["error"], "snippet_not_found", "{e}");
    assert!(
        e["nearby_candidates"]
            .as_array()
            .is_some_and(|c| !c.is_empty()),
        "{e}"
    );
    std::fs::write(&file, "a a a\n").unwrap();
    read_file(&c, "notes.md").await;
    let e = edit_file(&c, "notes.md", "a", "b").await;
    assert_eq!(e["error"], "ambiguous_edit", "{e}");
    let e = tool(
        &c,
        "edit_workspace_file",
        json!({"path": "notes.md", "old_text": "a", "new_text": "b", "replace_all": true}),
    )
    .await;
    assert_eq!(e["replacements"], 3, "{e}");
}

#[tokio::test]
async fn multi_edit_is_all_or_nothing() {
    let c = cluster().await;
    write_file(&c, "m.py", "x = 1\ny = 2\n").await;
    let e = tool(
        &c,
        "multi_edit_workspace_file",
        json!({"path": "m.py", "edits": [
            {"old_text": "x = 1", "new_text": "x = 10"},
            {"old_text": "nope", "new_text": "z"}
        ]}),
    )
    .await;
    assert_eq!(e["error"], "snippet_not_found", "{e}");
    assert_eq!(e["failed_edit_index"], 1);
    assert_eq!(
        std::fs::read_to_string(root(&c, "acme", "s1").join("m.py")).unwrap(),
        "x = 1\ny = 2\n"
    );
    let e = ok(tool(
        &c,
        "multi_edit_workspace_file",
        json!({"path": "m.py", "edits": [
            {"old_text": "x = 1", "new_text": "x = 10"},
            {"old_text": "y = 2", "new_text": "y = 20"}
        ]}),
    )
    .await);
    assert_eq!(e["edit_count"], 2);
    assert_eq!(e["replacements"], 2);
    assert_eq!(
        e["edits"],
        json!([{"index": 0, "replacements": 1}, {"index": 1, "replacements": 1}])
    );
}

#[tokio::test]
async fn read_state_is_shared_across_workspace_nodes() {
    let mut c = Cluster::ungated("gateway,approval").await;
    let first = c.start_node("workspace", &[]).await;
    write_file(&c, "f.txt", "hello\n").await;
    let r = read_file(&c, "f.txt").await;
    assert_eq!(r["ok"], true);
    // The node that served the read is gone; another one serves the edit.
    c.nodes[first].kill();
    c.start_node("workspace", &[]).await;
    ok(edit_file(&c, "f.txt", "hello", "bye").await);
}

#[tokio::test]
async fn concurrent_edits_never_lose_an_update_silently() {
    let c = cluster().await;
    let content: String = (0..20).map(|i| format!("line {i}\n")).collect();
    tool(
        &c,
        "write_workspace_file",
        json!({"path": "race.txt", "content": content}),
    )
    .await;
    let replies = futures::future::join_all((0..20).map(|i| {
        tool(&c, "edit_workspace_file", json!({"path": "race.txt", "old_text": format!("line {i}\n"), "new_text": format!("EDITED {i}\n")}))
    }))
    .await;
    let on_disk = std::fs::read_to_string(root(&c, "acme", "s1").join("race.txt")).unwrap();
    let mut applied = 0;
    for (i, reply) in replies.iter().enumerate() {
        if reply["ok"] == true {
            applied += 1;
            assert!(
                on_disk.contains(&format!("EDITED {i}\n")),
                "edit {i} said ok but is lost"
            );
        } else {
            assert_eq!(reply["error"], "conflict", "{reply}");
            assert!(
                !on_disk.contains(&format!("EDITED {i}\n")),
                "edit {i} said conflict but landed"
            );
        }
    }
    assert!(applied >= 1);
}

#[tokio::test]
async fn escapes_are_refused_and_nothing_outside_changes() {
    let c = cluster().await;
    let ws = root(&c, "acme", "s1");
    std::fs::create_dir_all(&ws).unwrap();
    let outside = c.data_dir.path().join("secret.txt");
    std::fs::write(&outside, "secret\n").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
    std::os::unix::fs::symlink(c.data_dir.path(), ws.join("dirlink")).unwrap();
    let absolute = outside.display().to_string();
    for (tool_name, args) in [
        (
            "read_workspace_file",
            json!({"path": "../../../../secret.txt"}),
        ),
        ("read_workspace_file", json!({"path": absolute})),
        ("read_workspace_file", json!({"path": "link"})),
        ("read_workspace_file", json!({"path": "dirlink/secret.txt"})),
        (
            "write_workspace_file",
            json!({"path": "link", "content": "pwned"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "dirlink/new.txt", "content": "pwned"}),
        ),
        (
            "write_workspace_file",
            json!({"path": "../escape.txt", "content": "pwned"}),
        ),
        ("list_workspace_files", json!({"path": "dirlink"})),
        (
            "search_workspace_files",
            json!({"query": "secret", "path": "dirlink"}),
        ),
        (
            "delete_workspace_file",
            json!({"path": "../../../../secret.txt"}),
        ),
    ] {
        let reply = tool(&c, tool_name, args.clone()).await;
        assert_eq!(
            reply["error"], "path_outside_workspace",
            "{tool_name} {args}: {reply}"
        );
    }
    let search = ok(tool(&c, "search_workspace_files", json!({"query": "secret"})).await);
    assert_eq!(
        search["match_count"], 0,
        "content outside must never be searched: {search}"
    );
    let nul = read_file(&c, "a\u{0}b").await;
    assert_eq!(nul["error"], "invalid_arguments", "{nul}");
    // Deleting the link removes the link, not its target.
    ok(tool(&c, "delete_workspace_file", json!({"path": "link"})).await);
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "secret\n");
    assert!(!c.data_dir.path().join("escape.txt").exists());
    assert!(!c.data_dir.path().join("new.txt").exists());
    // Another account's workspace is simply not there.
    write_file(&c, "mine.txt", "a\n").await;
    let other = c.read_workspace_file("evil", "s1", "mine.txt").await;
    assert_eq!(other["error"], "not_found", "{other}");
}

#[tokio::test]
async fn list_delete_batch_lint_search_and_status() {
    let c = cluster().await;
    let files: Vec<Value> = (0..101)
        .map(|i| json!({"path": format!("batch/f{i:03}.txt"), "content": format!("n{i:03}\n")}))
        .collect();
    let b = ok(tool(&c, "write_workspace_files", json!({"files": files})).await);
    assert_eq!(b["truncated"], true);
    assert_eq!(b["count"], 100);
    assert!(!root(&c, "acme", "s1").join("batch/f100.txt").exists());
    let bad = tool(
        &c,
        "write_workspace_files",
        json!({"files": [
            {"path": "ok.txt", "content": "x"}, {"path": "../bad.txt", "content": "x"}
        ]}),
    )
    .await;
    assert_eq!(bad["error"], "path_outside_workspace", "{bad}");
    assert!(!root(&c, "acme", "s1").join("ok.txt").exists());

    let l = ok(tool(
        &c,
        "list_workspace_files",
        json!({"path": "batch", "glob": "f00*.txt", "max_results": 3}),
    )
    .await);
    assert_eq!(
        strings(&l, "entries", "name"),
        ["f000.txt", "f001.txt", "f002.txt"]
    );
    assert_eq!(l["truncated"], true);

    let d = tool(&c, "delete_workspace_file", json!({"path": "batch"})).await;
    assert_eq!(d["error"], "directory_not_empty", "{d}");
    let d = tool(&c, "delete_workspace_file", json!({"path": "."})).await;
    assert_eq!(d["error"], "invalid_arguments", "{d}");
    ok(tool(
        &c,
        "delete_workspace_file",
        json!({"path": "batch/f000.txt"}),
    )
    .await);

    write_file(&c, "bad.py", "def f(:\n    pass\n").await;
    let lint = tool(&c, "lint_workspace_file", json!({"path": "bad.py"})).await;
    assert_eq!(lint["error"], "lint_errors", "{lint}");
    assert_eq!(lint["lint_model"], "built_in_lightweight");
    assert_eq!(lint["issues"][0]["line"], 1);
    write_file(&c, "ok.json", "{\"a\": [1, 2]}\n").await;
    let lint = ok(tool(&c, "lint_workspace_file", json!({"path": "ok.json"})).await);
    assert_eq!(lint["issues"], json!([]));

    let s = ok(tool(
        &c,
        "search_workspace_files",
        json!({"query": "N005", "context_lines": 1}),
    )
    .await);
    assert_eq!(s["match_count"], 1);
    assert_eq!(s["results"][0]["path"], "batch/f005.txt");
    assert_eq!(s["results"][0]["line"], 1);
    assert!(s["search_backend"].is_string());

    let st = ok(tool(&c, "workspace_status", json!({})).await);
    assert!(st["files"].as_array().unwrap().len() <= 50);
    assert!(st["root"]
        .as_str()
        .unwrap()
        .ends_with("/accounts/acme/sessions/s1/workspace"));
}

#[tokio::test]
async fn large_reads_are_cut_and_persisted_for_paging() {
    let c = cluster().await;
    let text: String = (1..=400)
        .map(|i| format!("this is line number {i:04}\n"))
        .collect();
    tool(
        &c,
        "write_workspace_file",
        json!({"path": "long.txt", "content": text}),
    )
    .await;
    let r = ok(tool(
        &c,
        "read_workspace_file",
        json!({"path": "long.txt", "max_chars": 1000}),
    )
    .await);
    assert_eq!(r["content_truncated"], true);
    assert_eq!(r["content_preview_chars"], 1000);
    assert!(r["content_original_chars"].as_u64().unwrap() > 1000);
    assert_eq!(r["partial"], true);
    let persisted = r["persisted_outputs"]["content"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(persisted.starts_with(".toolmesh/outputs/"), "{persisted}");
    let page = ok(read_lines(&c, &persisted, 400, 400).await);
    assert_holds(&page, "content", "this is line number 0400");
}

#[tokio::test]
async fn writes_and_deletes_need_approval_in_strict_mode() {
    let c = Cluster::with_node("gateway,approval,workspace", &[]).await;
    let w = write_file(&c, "a.txt", "x").await;
    assert_eq!(w["error"], "approval_required", "{w}");
    let r = read_file(&c, "a.txt").await;
    assert_eq!(
        r["error"], "not_found",
        "nothing was written before approval: {r}"
    );
    let id = w["approval_request"]["id"].as_str().unwrap();
    c.decide("acme", id, true).await;
    let mut again = json!({"tool": "write_workspace_file", "session_id": "s1", "arguments": {"path": "a.txt", "content": "x"}});
    again["approval"] = json!({"id": id});
    ok(c.call("acme", again).await);
}

#[tokio::test]
async fn a_workspace_removed_from_outside_is_created_again() {
    let c = cluster().await;
    ok(write_file(&c, "a.txt", "1\n").await);
    std::fs::remove_dir_all(root(&c, "acme", "s1")).unwrap();
    ok(write_file(&c, "b.txt", "2\n").await);
    assert_eq!(
        std::fs::read_to_string(root(&c, "acme", "s1").join("b.txt")).unwrap(),
        "2\n",
        "the write must land in the workspace on disk, not in the removed directory"
    );
}

#[tokio::test]
async fn list_sorts_by_name_size_and_mtime() {
    let c = cluster().await;
    let ws = root(&c, "acme", "s1");
    std::fs::create_dir_all(ws.join("d")).unwrap();
    for (name, size, age_s) in [("b.txt", 30, 300), ("a.txt", 10, 100), ("c.txt", 20, 200)] {
        let path = ws.join("d").join(name);
        std::fs::write(&path, "x".repeat(size)).unwrap();
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age_s);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    let order = |sort: &str| {
        let c = &c;
        let sort = sort.to_owned();
        async move {
            let l = ok(tool(
                c,
                "list_workspace_files",
                json!({"path": "d", "sort_by": sort}),
            )
            .await);
            l["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(order("name").await, ["a.txt", "b.txt", "c.txt"]);
    assert_eq!(
        order("size").await,
        ["b.txt", "c.txt", "a.txt"],
        "largest first"
    );
    assert_eq!(
        order("mtime").await,
        ["a.txt", "c.txt", "b.txt"],
        "newest first"
    );
    let l = tool(
        &c,
        "list_workspace_files",
        json!({"path": "d", "sort_by": "age"}),
    )
    .await;
    assert_eq!(l["error"], "invalid_arguments", "{l}");
}

/// Small files are read inline, bigger ones (and results that may need persisting) on the
/// blocking pool: both give the same reply, and both count as a read for the next edit.
#[tokio::test]
async fn reads_small_and_large_count_for_edits() {
    let c = cluster().await;
    let ws = root(&c, "acme", "s1");
    std::fs::create_dir_all(&ws).unwrap();
    for (name, lines) in [("small.txt", 100), ("large.txt", 4000)] {
        let text: String = (1..=lines).map(|i| format!("line {i:05}\n")).collect();
        std::fs::write(ws.join(name), &text).unwrap();
        let r = ok(tool(
            &c,
            "read_workspace_file",
            json!({"path": name, "max_chars": 100000}),
        )
        .await);
        assert_eq!(r["total_lines"], lines, "{name}");
        assert_eq!(r["size"], text.len(), "{name}");
        assert_eq!(r["read_state_recorded"], true, "{name}");
        let content = r["content"].as_str().unwrap();
        assert!(content.starts_with("     1\tline 00001\n"), "{name}");
        assert!(
            content.ends_with(&format!("{lines:>6}\tline {lines:05}\n")),
            "{name}"
        );
        // Straight after the read: the record was sent before the reply.
        let e = tool(
            &c,
            "edit_workspace_file",
            json!({"path": name, "old_text": "line 00001\n", "new_text": "first\n"}),
        )
        .await;
        assert_eq!(e["ok"], true, "{name}: {e}");
    }
}

#[tokio::test]
async fn a_line_range_of_a_file_over_ten_megabytes_is_streamed_to_the_range() {
    let c = cluster().await;
    let dir = root(&c, "acme", "s1");
    std::fs::create_dir_all(&dir).unwrap();
    // 400,000 lines of 31 bytes: 12.4 MB, over the 10 MB a file is read whole up to.
    let mut text = String::with_capacity(400_000 * 31);
    for n in 1..=400_000u32 {
        text.push_str(&format!("line {n:>10} of the big file\n"));
    }
    assert!(text.len() > 10 * 1024 * 1024);
    std::fs::write(dir.join("huge.log"), &text).unwrap();
    let r = ok(read_lines(&c, "huge.log", 350_000, 350_002).await);
    assert_eq!(
        r["content"],
        "350000\tline     350000 of the big file\n350001\tline     350001 of the big file\n350002\tline     350002 of the big file\n"
    );
    assert_window(&r, [350_000, 350_002], 400_000, true);
    // Past the line count: the same error as for a small file.
    let r = tool(
        &c,
        "read_workspace_file",
        json!({"path": "huge.log", "start_line": 400_001}),
    )
    .await;
    assert_eq!(r["error"], "invalid_arguments", "{r}");
    // An open-ended range stops at the 2 MB cap, on a whole line.
    let r = ok(tool(
        &c,
        "read_workspace_file",
        json!({"path": "huge.log", "start_line": 10, "max_chars": 1000}),
    )
    .await);
    let range = r["read_range"].as_array().unwrap();
    assert_eq!(range[0], 10);
    let last = range[1].as_u64().unwrap();
    assert!(
        (60_000..80_000).contains(&last),
        "about 2 MB of 31-byte lines: {last}"
    );
    assert_eq!(r["partial"], true);
    assert_eq!(
        r["content_truncated"], true,
        "over max_chars: persisted for paging"
    );
}

#[tokio::test]
async fn a_line_range_of_a_file_over_two_megabytes_is_capped_at_two_megabytes() {
    let c = cluster().await;
    let dir = root(&c, "acme", "s1");
    std::fs::create_dir_all(&dir).unwrap();
    // 30,000 lines of 100 bytes: 3 MB, over the 2 MB cap and under the 10 MB streaming size.
    let text: String = (1..=30_000u32)
        .map(|n| format!("{n:>8} {}\n", "r".repeat(90)))
        .collect();
    assert_eq!(text.len(), 3_000_000);
    std::fs::write(dir.join("three.log"), &text).unwrap();
    let r = ok(read_lines(&c, "three.log", 1, 30_000).await);
    // 2 MiB of 100-byte lines, ending on a whole line.
    let kept = (2 * 1024 * 1024) / 100;
    assert_window(&r, [1, kept], 30_000, true);
    // The persisted whole text holds the capped range, not the 3 MB.
    let original = r["content_original_chars"].as_u64().unwrap();
    assert_eq!(original, kept * (100 + 7), "with `{{n:>6}}\\t` per line");
    // A range under the cap is read as asked.
    let r = read_lines(&c, "three.log", 29_999, 30_000).await;
    assert_eq!(
        r["read_range"],
        json!([29_999, 30_000]),
        "{}",
        r["read_range"]
    );
}
