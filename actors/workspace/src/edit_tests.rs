//! Unit tests of [`crate::edit`]: data-driven cases of single edits, batches, nearby
//! candidates, failure replies and diffs.

use super::*;
use serde_json::json;

/// One edit case: `Ok(expected text, replacements)` or `Err(protocol code)`.
fn check(
    content: &str,
    old: &str,
    new: &str,
    expected: u64,
    all: bool,
    want: Result<(&str, u64), &str>,
) {
    let got = apply_edit(content, old, new, expected, all);
    match (got, want) {
        (Ok(applied), Ok((text, n))) => {
            assert_eq!(
                applied.content, text,
                "content of {old:?} -> {new:?} in {content:?}"
            );
            assert_eq!(applied.replacements, n, "count of {old:?} in {content:?}");
        }
        (Err(e), Err(code)) => {
            assert_eq!(e.code().as_str(), code, "{old:?} in {content:?}: {e}")
        }
        (got, want) => panic!("{old:?} -> {new:?} in {content:?}: got {got:?}, want {want:?}"),
    }
}

/// `(content, old_text, new_text, expected_replacements, replace_all, want)`.
type EditCase = (
    &'static str,
    &'static str,
    &'static str,
    u64,
    bool,
    Result<(&'static str, u64), &'static str>,
);

#[test]
fn edits() {
    let cases: &[EditCase] = &[
        ("a b c", "b", "B", 1, false, Ok(("a B c", 1))),
        (
            "x = 1\ny = 2\n",
            "y = 2",
            "y = 3",
            1,
            false,
            Ok(("x = 1\ny = 3\n", 1)),
        ),
        // Deletion.
        (
            "keep drop keep",
            " drop",
            "",
            1,
            false,
            Ok(("keep keep", 1)),
        ),
        // Counting and replace_all.
        ("a a a", "a", "b", 1, false, Err("ambiguous_edit")),
        ("a a a", "a", "b", 3, false, Ok(("b b b", 3))),
        ("a a a", "a", "b", 4, false, Err("ambiguous_edit")),
        ("a a a", "a", "b", 1, true, Ok(("b b b", 3))),
        ("a a a", "a", "b", 0, true, Ok(("b b b", 3))),
        ("a a a", "z", "b", 1, true, Err("snippet_not_found")),
        // Non-overlapping count: "aaaa" holds "aa" twice, not three times.
        ("aaaa", "aa", "b", 2, false, Ok(("bb", 2))),
        ("aaa", "aa", "b", 1, false, Ok(("ba", 1))),
        // Arguments.
        ("abc", "", "x", 1, false, Err("invalid_arguments")),
        ("abc", "b", "b", 1, false, Err("invalid_arguments")),
        ("abc", "b", "x", 0, false, Err("invalid_arguments")),
        ("abc", "zzz", "x", 1, false, Err("snippet_not_found")),
        ("", "zzz", "x", 1, false, Err("snippet_not_found")),
        // Quote-normalised: curly in the file, straight in old_text, and the other way.
        (
            "say \u{201C}hi\u{201D} now",
            "\"hi\"",
            "'yo'",
            1,
            false,
            Ok(("say 'yo' now", 1)),
        ),
        (
            "it's \u{2018}x\u{2019} \u{2032}",
            "it\u{2019}s 'x' '",
            "Z",
            1,
            false,
            Ok(("Z", 1)),
        ),
        // Offsets after several multi-byte quotes map back correctly.
        (
            "\u{201C}a\u{201D} \u{201C}b\u{201D} tail \u{2018}c\u{2019} end",
            "'c' end",
            "C",
            1,
            false,
            Ok(("\u{201C}a\u{201D} \u{201C}b\u{201D} tail C", 1)),
        ),
        (
            "\u{201E}x\u{201F} and \u{201E}x\u{201F}",
            "\"x\"",
            "y",
            2,
            false,
            Ok(("y and y", 2)),
        ),
        // A literal match wins over quote-normalised ones.
        (
            "'q' \u{2018}q\u{2019}",
            "'q'",
            "r",
            1,
            false,
            Ok(("r \u{2018}q\u{2019}", 1)),
        ),
        // Multi-byte text around the match.
        (
            "größe = ‘ä’\n",
            "'ä'",
            "'ö'",
            1,
            false,
            Ok(("größe = 'ö'\n", 1)),
        ),
        // Line endings: a CRLF file stays CRLF even when the agent sends `\n`.
        (
            "one\r\ntwo\r\nthree\r\n",
            "one\ntwo\n",
            "1\n2\n",
            1,
            false,
            Ok(("1\r\n2\r\nthree\r\n", 1)),
        ),
        (
            "one\r\ntwo\r\n",
            "two",
            "2\nextra",
            1,
            false,
            Ok(("one\r\n2\r\nextra\r\n", 1)),
        ),
        // ...and an LF file stays LF when the agent sends CRLF.
        ("a\nb\n", "a\r\nb", "c\r\nd", 1, false, Ok(("c\nd\n", 1))),
        // Mixed endings: text goes in exactly as given.
        ("a\r\nb\nc", "b\nc", "x\ny", 1, false, Ok(("a\r\nx\ny", 1))),
        // CRLF and curly quotes together.
        (
            "p(\u{201C}x\u{201D})\r\nq\r\n",
            "p(\"x\")\nq",
            "r",
            1,
            false,
            Ok(("r\r\n", 1)),
        ),
    ];
    for (content, old, new, expected, all, want) in cases {
        check(content, old, new, *expected, *all, *want);
    }
}

/// The edits of a `multi_edit_workspace_file` call's `edits` array.
fn edits_of(edits: serde_json::Value) -> Vec<Edit> {
    let text = |edit: &serde_json::Value, field: &str| edit[field].as_str().unwrap().to_owned();
    edits
        .as_array()
        .unwrap()
        .iter()
        .map(|edit| Edit {
            old_text: text(edit, "old_text"),
            new_text: text(edit, "new_text"),
            expected_replacements: edit["expected_replacements"].as_u64(),
            replace_all: edit["replace_all"].as_bool(),
        })
        .collect()
}

/// One batch case: `Ok((text, total, per-edit counts))` or `Err((code, failed index))`.
fn check_multi(
    content: &str,
    edits: serde_json::Value,
    default_all: bool,
    want: Result<(&str, u64, Vec<u64>), (&str, usize)>,
) {
    let edits = edits_of(edits);
    match (apply_edits(content, &edits, default_all), want) {
        (Ok(applied), Ok((text, total, counts))) => {
            assert_eq!(applied.content, text);
            assert_eq!(applied.replacements, total);
            let want: Vec<(usize, u64)> = counts.into_iter().enumerate().collect();
            assert_eq!(applied.edits, want);
        }
        (Err(e), Err((code, index))) => {
            assert_eq!(e.code().as_str(), code, "{e}");
            assert_eq!(e.failed_edit_index, Some(index));
            let fields = ToolError::from(e).into_fields();
            assert_eq!(fields["failed_edit_index"], index as u64);
        }
        (got, want) => panic!("{content:?}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn multi_edits() {
    check_multi(
        "alpha beta gamma",
        json!([{"old_text": "alpha", "new_text": "A"}, {"old_text": "gamma", "new_text": "G"}]),
        false,
        Ok(("A beta G", 2, vec![1, 1])),
    );
    // Each edit sees the previous one's result.
    check_multi(
        "x",
        json!([{"old_text": "x", "new_text": "yy"}, {"old_text": "yy", "new_text": "z"}]),
        false,
        Ok(("z", 2, vec![1, 1])),
    );
    // Top-level replace_all applies to edits that say nothing...
    check_multi(
        "a a b b",
        json!([{"old_text": "a", "new_text": "c"}, {"old_text": "b", "new_text": "d", "replace_all": false}]),
        true,
        Err(("ambiguous_edit", 1)),
    );
    check_multi(
        "a a b b",
        json!([{"old_text": "a", "new_text": "c"}, {"old_text": "b", "new_text": "d"}]),
        true,
        Ok(("c c d d", 4, vec![2, 2])),
    );
    // ...but an edit's own expected_replacements is checked.
    check_multi(
        "a a a",
        json!([{"old_text": "a", "new_text": "c", "expected_replacements": 2}]),
        true,
        Err(("ambiguous_edit", 0)),
    );
    check_multi(
        "a a",
        json!([{"old_text": "a", "new_text": "c", "expected_replacements": 2}]),
        false,
        Ok(("c c", 2, vec![2])),
    );
    // The first failure stops the batch and names its index.
    check_multi(
        "one two",
        json!([{"old_text": "one", "new_text": "1"}, {"old_text": "three", "new_text": "3"}, {"old_text": "", "new_text": "x"}]),
        false,
        Err(("snippet_not_found", 1)),
    );
    check_multi(
        "one two",
        json!([{"old_text": "one", "new_text": "1"}, {"old_text": "", "new_text": "x"}]),
        false,
        Err(("invalid_arguments", 1)),
    );
    // An edit whose text was removed by an earlier one fails.
    check_multi(
        "one two",
        json!([{"old_text": "one two", "new_text": "z"}, {"old_text": "two", "new_text": "2"}]),
        false,
        Err(("snippet_not_found", 1)),
    );
    assert_eq!(
        apply_edits("x", &[], false).unwrap_err().code(),
        ErrorCode::InvalidArguments
    );
}

/// One candidate case: the best candidates' `(line, text)` in order.
fn check_candidates(content: &str, old: &str, want: &[(u64, &str)]) {
    let got = nearby_candidates(content, old);
    let got_pairs: Vec<(u64, &str)> = got.iter().map(|c| (c.line, c.text.as_str())).collect();
    assert_eq!(got_pairs, want, "{old:?} in {content:?}: {got:?}");
    for pair in got.windows(2) {
        assert!(pair[0].similarity >= pair[1].similarity, "{got:?}");
    }
    for c in &got {
        assert!((0.0..=1.0).contains(&c.similarity), "{c:?}");
    }
}

#[test]
fn candidates() {
    let file = "def main():\n    print('hello world')\n    return 0\n\ndef other():\n    pass\n";
    check_candidates(
        file,
        "    print('hello, world')",
        &[
            (2, "    print('hello world')"),
            (3, "    return 0"),
            (5, "def other():"),
        ],
    );
    check_candidates(
        file,
        "def main():\n    print(\"hello world\")",
        &[
            (1, "def main():\n    print('hello world')"),
            (5, "def other():\n    pass"),
            (3, "    return 0\n"),
        ],
    );
    // old_text longer than the file: the whole file is the one window.
    check_candidates("a\nb\n", "a\nb\nc\nd\n", &[(1, "a\nb")]);
    // CRLF files report the text as it is in the file.
    check_candidates("x = 1\r\ny = 2\r\n", "y = 3", &[(2, "y = 2"), (1, "x = 1")]);
    check_candidates("", "anything", &[]);
    // Nothing in common at all: no candidates.
    check_candidates("aaa\n", "zzz", &[]);
}

/// The pruned search finds what scoring every window would.
#[test]
fn candidates_match_exhaustive_search() {
    let file = "fn a() {\n    let x = 1;\n    let y = 2;\n}\nfn b() {\n    let x = 10;\n    let z = 3;\n}\n";
    for old in [
        "    let x = 1;\n    let y = 3;",
        "fn c() {",
        "let z = 3",
        "    let x = 100;\n",
    ] {
        let lines: Vec<&str> = file.split_inclusive('\n').collect();
        let window = old.split_inclusive('\n').count();
        let mut target = String::new();
        for line in old.split_inclusive('\n') {
            push_scored_line(&mut target, line);
        }
        let scored: Vec<(f64, usize)> = (0..=lines.len() - window)
            .map(|start| {
                let mut text = String::new();
                for line in &lines[start..start + window] {
                    push_scored_line(&mut text, line);
                }
                (
                    f64::from(TextDiff::from_chars(target.as_str(), text.as_str()).ratio()),
                    start,
                )
            })
            .collect();
        let want: Vec<u64> = choose(&scored, window)
            .iter()
            .map(|&(_, s)| s as u64 + 1)
            .collect();
        let got: Vec<u64> = nearby_candidates(file, old)
            .iter()
            .map(|c| c.line)
            .collect();
        assert_eq!(got, want, "{old:?}");
    }
}

#[test]
fn candidates_are_fast_and_small_on_large_files() {
    let mut file = String::new();
    for i in 0..50_000 {
        file.push_str(&format!("    value_{i} = compute(value_{}, {i})\n", i + 1));
    }
    let started = Instant::now();
    let got = nearby_candidates(&file, "    value_25000 = compute(value_2500l, 25000)");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(got[0].line, 25_001, "{got:?}");

    let long = "x".repeat(5000);
    let got = nearby_candidates(&format!("{long}\n"), &long[..4000]);
    assert!(got[0].truncated && got[0].text.chars().count() == MAX_CANDIDATE_CHARS);
}

#[test]
fn failure_replies() {
    let err = apply_edit("fn main() {}\n", "fn mian() {}", "x", 1, false).unwrap_err();
    let fields = err.clone().into_tool_error("src/main.rs").into_fields();
    assert_eq!(fields["error"], "snippet_not_found");
    assert!(fields["error_message"]
        .as_str()
        .unwrap()
        .contains("src/main.rs"));
    assert_eq!(fields["nearby_candidates"][0]["line"], 1);
    assert_eq!(fields["nearby_candidates"][0]["text"], "fn main() {}");
    assert!(fields["nearby_candidates"][0].get("truncated").is_none());
    let similarity = fields["nearby_candidates"][0]["similarity"]
        .as_f64()
        .unwrap();
    assert!(similarity > 0.8 && similarity < 1.0, "{similarity}");
    assert!(fields.get("failed_edit_index").is_none());

    let fields = ToolError::from(apply_edit("a a", "a", "b", 1, false).unwrap_err()).into_fields();
    assert_eq!(fields["error"], "ambiguous_edit");
    assert_eq!(fields["match_count"], 2);
    let message = fields["error_message"].as_str().unwrap();
    assert!(
        message.contains("2 places") && message.contains("replace_all"),
        "{message}"
    );

    let fields = ToolError::from(apply_edit("a", "a", "a", 1, false).unwrap_err()).into_fields();
    assert_eq!(fields["error"], "invalid_arguments");
    assert_eq!(fields["details"][0]["path"], "/new_text");
    assert!(fields["error_message"]
        .as_str()
        .unwrap()
        .contains("nothing to change"));

    let edits =
        edits_of(json!([{"old_text": "a", "new_text": "b"}, {"old_text": "", "new_text": "b"}]));
    let fields = ToolError::from(apply_edits("a", &edits, false).unwrap_err()).into_fields();
    assert_eq!(fields["details"][0]["path"], "/edits/1/old_text");
    assert_eq!(fields["failed_edit_index"], 1);
}

#[test]
fn diffs() {
    let diff = unified_diff("dir/f.txt", "a\nb\nc\n", "a\nB\nc\n");
    assert_eq!(
        diff,
        "--- a/dir/f.txt\n+++ b/dir/f.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    );
    assert_eq!(unified_diff("f", "same\n", "same\n"), "");
    // Three lines of context, not more.
    let before: String = (1..=10).map(|i| format!("{i}\n")).collect();
    let after = before.replace("5\n", "five\n");
    let diff = unified_diff("f", &before, &after);
    assert!(diff.contains("@@ -2,7 +2,7 @@"), "{diff}");
    // CRLF lines keep their `\r`.
    let diff = unified_diff("w", "x\r\ny\r\n", "x\r\nz\r\n");
    assert!(diff.contains("-y\r\n+z\r\n"), "{diff:?}");
    let diff = unified_diff("n", "end", "end!");
    assert!(diff.contains("No newline at end of file"), "{diff}");
}
