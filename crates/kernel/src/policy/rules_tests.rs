use serde_json::json;

use super::*;
use crate::policy::{ApprovalMode, Policy};

fn policy(text: &str) -> Policy {
    Policy::from_toml(ApprovalMode::Strict, text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn refused(text: &str) -> String {
    Policy::from_toml(ApprovalMode::Strict, text)
        .err()
        .unwrap_or_else(|| panic!("accepted:\n{text}"))
}

/// The id of the rule deciding `tool` with `arguments` for account `a`, session `s1`.
fn decided(policy: &Policy, tool: &str, arguments: Value) -> Option<(String, Decision)> {
    decided_for(policy, tool, "a", Some("s1"), arguments)
}

fn decided_for(
    policy: &Policy,
    tool: &str,
    account: &str,
    session: Option<&str>,
    arguments: Value,
) -> Option<(String, Decision)> {
    let facts = Facts {
        tool,
        account,
        session,
        arguments: &arguments,
    };
    policy
        .rules()
        .decide(&facts)
        .map(|r| (r.id.clone(), r.decision))
}

fn id(id: &str, decision: Decision) -> Option<(String, Decision)> {
    Some((id.to_owned(), decision))
}

#[test]
fn deny_wins_over_ask_over_allow_and_the_first_of_a_decision_is_recorded() {
    let p = policy(
        r#"
[[rules]]
id = "reads"
tools = ["read_*"]
decision = "allow"
[[rules]]
id = "all-files"
tools = ["*_workspace_*"]
decision = "allow"
[[rules]]
id = "writes"
tools = ["write_workspace_file"]
decision = "ask"
[[rules]]
id = "secrets"
tools = ["*"]
decision = "deny"
when = { path = { glob = "secrets/**" } }
[[rules]]
id = "secrets-too"
tools = ["*"]
decision = "deny"
when = { path = { prefix = "secrets" } }
"#,
    );
    use Decision::*;
    let path = |p: &str| json!({"path": p});
    assert_eq!(
        decided(&p, "read_workspace_file", path("a.txt")),
        id("reads", Allow)
    );
    assert_eq!(
        decided(&p, "write_workspace_file", path("a.txt")),
        id("writes", Ask)
    );
    assert_eq!(
        decided(&p, "read_workspace_file", path("secrets/k")),
        id("secrets", Deny)
    );
    assert_eq!(
        decided(&p, "write_workspace_file", path("secrets/k")),
        id("secrets", Deny)
    );
    assert_eq!(decided(&p, "run_command", json!({})), None);
    assert_eq!(p.rules().len(), 5);
    assert_eq!(p.revision().map(str::len), Some(64));
}

#[test]
fn accounts_and_sessions_are_globs_and_a_session_rule_needs_a_session() {
    let p = policy(
        r#"
[[rules]]
id = "ci"
tools = ["run_command"]
accounts = ["ci-*"]
sessions = ["build-*"]
decision = "allow"
"#,
    );
    let allow = id("ci", Decision::Allow);
    let run = |account, session| decided_for(&p, "run_command", account, session, json!({}));
    assert_eq!(run("ci-main", Some("build-7")), allow);
    assert_eq!(run("ci-main", Some("dev-7")), None);
    assert_eq!(run("prod", Some("build-7")), None);
    assert_eq!(run("ci-main", None), None);
}

#[test]
fn every_test_holds_and_fails_as_documented() {
    // (test, value that holds, value that fails)
    let cases = [
        (r#"{ equals = 3 }"#, json!(3.0), json!(4)),
        (r#"{ equals = "x" }"#, json!("x"), json!("y")),
        (r#"{ one_of = ["a", 2] }"#, json!(2), json!("b")),
        (
            r#"{ glob = "src/*.rs" }"#,
            json!("src/a.rs"),
            json!("src/x/a.rs"),
        ),
        (
            r#"{ glob = "src/**" }"#,
            json!("src/x/a.rs"),
            json!("lib/a.rs"),
        ),
        (
            r#"{ regex = "rm\\s+-rf" }"#,
            json!("sudo rm  -rf /"),
            json!("ls"),
        ),
        (r#"{ prefix = "/usr" }"#, json!("/usr/bin"), json!("/bin")),
        (r#"{ max = 10 }"#, json!(10), json!(10.5)),
        (r#"{ min = 1.5 }"#, json!(2), json!(1)),
        (
            r#"{ not = { prefix = "/usr" } }"#,
            json!("/bin"),
            json!("/usr"),
        ),
        (r#"{ absent = false }"#, json!(0), Value::Null),
    ];
    for (test, holds, fails) in cases {
        let p = policy(&format!(
            "[[rules]]\nid = \"t\"\ntools = [\"x\"]\ndecision = \"deny\"\nwhen = {{ v = {test} }}\n"
        ));
        let with = |v: &Value| match v {
            Value::Null => json!({}),
            v => json!({ "v": v }),
        };
        assert!(
            decided(&p, "x", with(&holds)).is_some(),
            "{test} of {holds}"
        );
        assert!(
            decided(&p, "x", with(&fails)).is_none(),
            "{test} of {fails}"
        );
        // A string test fails on a number and a number test on a string.
        let typed = ["glob", "regex", "prefix", "max", "min"];
        if !test.contains("not") && typed.iter().any(|t| test.contains(t)) {
            assert!(
                decided(&p, "x", json!({"v": [1]})).is_none(),
                "{test} of an array"
            );
        }
    }
}

#[test]
fn a_missing_member_fails_every_test_but_absent() {
    let rule = |test: &str| {
        policy(&format!(
            "[[rules]]\nid = \"t\"\ntools = [\"x\"]\ndecision = \"ask\"\nwhen = {{ v = {test} }}\n"
        ))
    };
    for test in [
        r#"{ equals = 1 }"#,
        r#"{ not = { equals = 1 } }"#,
        r#"{ regex = "" }"#,
        r#"{ absent = false }"#,
        r#"{ not = { absent = true } }"#,
    ] {
        assert_eq!(decided(&rule(test), "x", json!({})), None, "{test}");
    }
    for test in [r#"{ absent = true }"#, r#"{ not = { absent = false } }"#] {
        assert!(decided(&rule(test), "x", json!({})).is_some(), "{test}");
        assert!(
            decided(&rule(test), "x", json!({"v": 1})).is_none(),
            "{test}"
        );
    }
}

#[test]
fn a_pointer_tests_a_nested_member_and_all_tests_must_hold() {
    let p = policy(
        r#"
[[rules]]
id = "path-env"
tools = ["run_command"]
decision = "deny"
[rules.when]
"/env/PATH" = { prefix = "/tmp" }
command = { regex = "^curl " }
"#,
    );
    let run = |args| decided(&p, "run_command", args);
    let env = json!({"PATH": "/tmp/bin"});
    assert!(run(json!({"command": "curl x", "env": env})).is_some());
    assert!(run(json!({"command": "ls", "env": env})).is_none());
    assert!(run(json!({"command": "curl x", "env": {"PATH": "/usr/bin"}})).is_none());
    assert!(run(json!({"command": "curl x"})).is_none());
}

#[test]
fn a_bad_rule_is_refused_naming_the_rule_and_the_field() {
    let rule = |body: &str| format!("[[rules]]\nid = \"r1\"\ntools = [\"x\"]\n{body}\n");
    let reviewers = "[reviewers.ops]\nmembers = [\"alice\", \"bob\"]\n";
    let cases = [
        (rule("decision = \"maybe\""), "rules[0] (id \"r1\")"),
        (rule("decision = \"deny\"\ncolour = 1"), "colour"),
        (
            rule("decision = \"deny\"\nwhen = { v = { globb = \"x\" } }"),
            "when.v: unknown test \"globb\"",
        ),
        (
            rule("decision = \"deny\"\nwhen = { v = { regex = \"(\" } }"),
            "when.v: regex:",
        ),
        (
            rule("decision = \"deny\"\nwhen = { v = { glob = \"a[\" } }"),
            "when.v: glob:",
        ),
        (
            rule("decision = \"deny\"\nwhen = { v = { max = \"ten\" } }"),
            "when.v: max: takes a number",
        ),
        (
            rule("decision = \"deny\"\nwhen = { v = { equals = 1, prefix = \"a\" } }"),
            "when.v: a test is a table with one member",
        ),
        (
            rule("decision = \"deny\"\nreviewers = \"ops\""),
            "reviewers: only an ask rule",
        ),
        (
            rule("decision = \"ask\"\nreviewers = \"nobody\""),
            "reviewers: no [reviewers.nobody] group",
        ),
        (
            format!(
                "{reviewers}{}",
                rule("decision = \"ask\"\nreviewers = \"ops\"\nquorum = 3")
            ),
            "quorum: 3 is more than",
        ),
        (
            rule("decision = \"ask\"\nquorum = 2"),
            "quorum: a quorum counts members",
        ),
        (
            format!(
                "{reviewers}{}",
                rule("decision = \"ask\"\non_timeout = \"escalate\"")
            ),
            "escalate_to:",
        ),
        (
            rule("decision = \"ask\"\nexpires_in_s = 0"),
            "expires_in_s: at least 1",
        ),
        (
            format!(
                "{}{}",
                rule("decision = \"deny\""),
                rule("decision = \"allow\"")
            ),
            "rules[1] (id \"r1\"): id: another rule",
        ),
        (
            "[[rules]]\nid = \"a.b\"\ntools = [\"x\"]\ndecision = \"deny\"\n".into(),
            "id: a rule id is",
        ),
        (
            "[[rules]]\nid = \"r\"\ntools = [\"a[\"]\ndecision = \"deny\"\n".into(),
            "tools: bad glob",
        ),
        (
            "[[rules]]\nid = \"r\"\ntools = []\ndecision = \"deny\"\n".into(),
            "tools: name at least one",
        ),
        (
            "[[rules]]\ntools = [\"x\"]\ndecision = \"deny\"\n".into(),
            "rules[0]: missing field `id`",
        ),
        (
            "[reviewers.ops]\nmembers = [\"a.b\"]\n".into(),
            "[reviewers.ops] members",
        ),
    ];
    for (text, names) in cases {
        let error = refused(&text);
        assert!(
            error.contains(names),
            "{error:?} should name {names:?}\n{text}"
        );
    }
}

#[test]
fn no_file_no_rules_no_revision() {
    let p = Policy::uniform(ApprovalMode::Strict);
    assert!(p.rules().is_empty());
    assert_eq!(p.revision(), None);
    assert_eq!(decided_for(&p, "x", "a", None, json!({})), None);
    // Two files differing by a byte have different revisions.
    let one = policy("mode = \"strict\"\n");
    let two = policy("mode = \"strict\" \n");
    assert_ne!(one.revision(), two.revision());
}
