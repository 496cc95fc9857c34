//! The pre-reviewer (PROTOCOL.md "Approval policy", "Pre-review"): a `[review]` command or URL
//! answers `allow` (the call runs, `decided_by: "review"`), `deny` (`policy_denied`,
//! `reviewed_by: "review"`) or `ask` (people decide); anything else is `ask`, so a broken
//! reviewer never lets a call through.

use std::time::Duration;

use serde_json::{json, Value};
use toolmesh_kernel::canonical::{arguments_sha256, sha256_hex};

use crate::policies::{policy, NOTES, NO_SECRETS};
use crate::support::{
    assert_error, assert_policy_denied, events_until_finished, ok, policy_file, trail_entries,
    Cluster, Recorder,
};

/// The test's reviewer: it appends each request to `requests.jsonl` beside it and decides by
/// the first folder of the `path` it is asked about; anything else it allows.
const REVIEWER: &str = r#"#!/bin/sh
request=$(cat)
printf '%s\n' "$request" >> "$(dirname "$0")/requests.jsonl"
case "$request" in
  *'"path":"deny/'*) echo '{"decision": "deny", "reason": "not in deny/"}' ;;
  *'"path":"ask/'*) echo '{"decision": "ask", "reason": "a person should look"}' ;;
  *'"path":"garbage/'*) echo 'sure, go ahead' ;;
  *'"path":"fails/'*) echo '{"decision": "allow"}'; exit 3 ;;
  *'"path":"slow/'*) sleep 5; echo '{"decision": "allow"}' ;;
  *) echo '{"decision": "allow", "reason": "looks harmless"}' ;;
esac
"#;

/// The reviewer script in a temp dir of its own: the dir (keep it while the node runs) and the
/// policy naming it, with the rules that decide before it.
fn reviewer_policy() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("review.sh");
    std::fs::write(&script, REVIEWER).unwrap();
    let review = format!(
        "\n[review]\ncommand = \"sh {}\"\ntimeout_s = 1\n",
        script.display()
    );
    (dir, policy("strict", &[&review, NO_SECRETS, NOTES]))
}

/// The requests the reviewer was shown, oldest first.
fn reviewed(dir: &tempfile::TempDir) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.path().join("requests.jsonl")).unwrap_or_default();
    text.lines()
        .map(|line| serde_json::from_str(line).expect("a request is one JSON line"))
        .collect()
}

/// The paths the reviewer was asked about, oldest first.
fn reviewed_paths(dir: &tempfile::TempDir) -> Vec<String> {
    reviewed(dir)
        .iter()
        .map(|r| r["arguments"]["path"].as_str().unwrap().to_owned())
        .collect()
}

fn write(path: &str) -> Value {
    json!({"path": path, "content": "hello\n"})
}

#[tokio::test]
async fn a_reviewer_command_allows_denies_or_asks_and_a_broken_one_asks() {
    let (dir, policy) = reviewer_policy();
    let (_policy_dir, path) = policy_file(&policy);
    let revision = sha256_hex(&std::fs::read(&path).unwrap());
    let mut c = Cluster::servers_with_jetstream().await;
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    c.start_node("gateway,approval,workspace", &env).await;

    // allow: a medium-risk write runs in strict mode without an approval; the reply, the
    // events and the audit trail say the reviewer decided.
    let mut events = c.watch("toolmesh.v1.events.acme.inv-allowed").await;
    let body = json!({"tool": "write_workspace_file", "session_id": "s1",
        "invocation_id": "inv-allowed", "arguments": write("docs/a.txt")});
    let allowed = ok(c.call("acme", body).await);
    assert_eq!(allowed["decided_by"], "review", "{allowed}");
    assert_eq!(allowed["review_reason"], "looks harmless", "{allowed}");
    assert!(allowed.get("approval_request").is_none(), "{allowed}");
    let seen = events_until_finished(&mut events, Duration::from_secs(5)).await;
    let kinds: Vec<_> = seen.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["started", "finished"],
        "no approval events: {seen:?}"
    );
    let finished = &seen[1];
    assert_eq!(finished["decided_by"], "review", "{finished}");
    assert_eq!(finished["review_reason"], "looks harmless", "{finished}");
    assert_eq!(finished["policy_revision"], revision.as_str(), "{finished}");
    let read = ok(c.read_workspace_file("acme", "s1", "docs/a.txt").await);
    assert!(
        read["content"].as_str().unwrap().contains("hello"),
        "{read}"
    );

    // What the reviewer saw: the approval as far as it is known, and the arguments in full.
    let shown = reviewed(&dir);
    assert_eq!(shown.len(), 1, "{shown:?}");
    let approval = &shown[0]["approval"];
    assert!(approval["id"].is_null(), "{approval}");
    assert_eq!(approval["status"], "pending", "{approval}");
    assert_eq!(approval["account"], "acme", "{approval}");
    assert_eq!(approval["session_id"], "s1", "{approval}");
    assert_eq!(approval["invocation_id"], "inv-allowed", "{approval}");
    assert_eq!(approval["tool_name"], "write_workspace_file", "{approval}");
    assert_eq!(approval["risk_level"], "medium", "{approval}");
    assert_eq!(approval["policy_revision"], revision.as_str(), "{approval}");
    assert!(approval["rule_id"].is_null(), "{approval}");
    let sha = arguments_sha256(&write("docs/a.txt"));
    assert_eq!(approval["arguments_sha256"], sha.as_str(), "{approval}");
    assert!(
        approval["arguments_preview"]
            .as_str()
            .unwrap()
            .contains("docs/a.txt"),
        "{approval}"
    );
    assert_eq!(shown[0]["arguments"], write("docs/a.txt"));

    // deny: policy_denied naming the reviewer and its reason; nothing was written.
    let denied = c
        .session_call("acme", "s1", "write_workspace_file", write("deny/b.txt"))
        .await;
    assert_policy_denied(&denied, "not in deny/", "not in deny/", &revision);
    assert_eq!(denied["reviewed_by"], "review", "{denied}");
    let missing = c.read_workspace_file("acme", "s1", "deny/b.txt").await;
    assert_eq!(missing["error"], "not_found", "nothing ran: {missing}");

    // ask, and every unclear answer: approval_required, as without a reviewer. The slow
    // reviewer is cut off at `timeout_s`.
    for folder in ["ask", "garbage", "fails", "slow"] {
        let file = format!("{folder}/c.txt");
        let asked = c
            .session_call("acme", "s1", "write_workspace_file", write(&file))
            .await;
        assert_eq!(asked["error"], "approval_required", "{folder}: {asked}");
        assert!(asked.get("decided_by").is_none(), "{folder}: {asked}");
        let unwritten = c.read_workspace_file("acme", "s1", &file).await;
        assert_eq!(unwritten["error"], "not_found", "{folder}: {unwritten}");
    }

    // An approval people gave is redeemed without a second review.
    let asked = c
        .session_call("acme", "s1", "write_workspace_file", write("ask/d.txt"))
        .await;
    let id = asked["approval_request"]["id"].as_str().unwrap().to_owned();
    ok(c.decide("acme", &id, true).await);
    let body = json!({"tool": "write_workspace_file", "session_id": "s1",
        "arguments": write("ask/d.txt"), "approval": {"id": id}});
    let redeemed = ok(c.call("acme", body).await);
    assert!(redeemed.get("decided_by").is_none(), "{redeemed}");

    // Rules decide first: a deny rule refuses and an allow rule lets run, unreviewed. A caller's
    // own in-band rejection is not reviewed either.
    let secret = c
        .session_call("acme", "s1", "write_workspace_file", write("secrets/e"))
        .await;
    assert_error(&secret, "policy_denied", "no-secrets");
    assert!(secret.get("reviewed_by").is_none(), "{secret}");
    let note = ok(c
        .session_call("acme", "s1", "write_workspace_file", write("notes/f.txt"))
        .await);
    assert!(note.get("decided_by").is_none(), "{note}");
    let body = json!({"tool": "write_workspace_file", "session_id": "s1",
        "arguments": write("docs/g.txt"), "approval": {"approved": false}});
    let rejected = c.call("acme", body).await;
    assert_eq!(rejected["error"], "approval_rejected", "{rejected}");
    assert_eq!(
        reviewed_paths(&dir),
        [
            "docs/a.txt",
            "deny/b.txt",
            "ask/c.txt",
            "garbage/c.txt",
            "fails/c.txt",
            "slow/c.txt",
            "ask/d.txt"
        ]
    );

    // The audit trail names the reviewer for the call it let run and the one it refused.
    let trail = c.audit_trail("acme", 1000).await;
    let calls: Vec<&Value> = trail_entries(&trail)
        .iter()
        .filter(|e| e["kind"] == "call" && e["decided_by"] == "review")
        .collect();
    let statuses: Vec<_> = calls
        .iter()
        .map(|e| (e["status"].as_str().unwrap(), e["ok"].as_bool()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("started", None),
            ("finished", Some(true)),
            ("finished", Some(false))
        ],
        "{trail}"
    );
    assert!(
        calls
            .iter()
            .all(|e| e["policy_revision"] == revision.as_str()),
        "{trail}"
    );
}

/// A reviewer URL on loopback (`<base>/review`): the bodies it was POSTed.
async fn review_server() -> Recorder<Value> {
    Recorder::serve(|seen| {
        axum::Router::new().route(
            "/review",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                seen.lock().unwrap().push(request);
                r#"{"decision": "allow", "reason": "the URL says yes"}"#
            }),
        )
    })
    .await
}

#[tokio::test]
async fn a_reviewer_url_is_posted_through_the_web_egress_policy() {
    let server = review_server().await;
    let policy = format!(
        "[tools.component_status]\nrisk_level = \"high\"\n\n[review]\nurl = \"{}/review\"\n",
        server.base
    );
    let (_dir, path) = policy_file(&policy);

    // The allowed networks open loopback: the URL is asked and its allow runs the call.
    let mut c = Cluster::servers().await;
    let opened = [
        ("TOOLMESH_POLICY_FILE", path.as_str()),
        ("TOOLMESH_WEB_ALLOWED_NETWORKS", "127.0.0.0/8"),
    ];
    c.start_node("gateway,approval", &opened).await;
    let allowed = ok(c.tool_call("acme", "component_status", json!({})).await);
    assert_eq!(allowed["decided_by"], "review", "{allowed}");
    assert_eq!(allowed["review_reason"], "the URL says yes", "{allowed}");
    let posted = server.records();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0]["approval"]["tool_name"], "component_status");
    assert_eq!(posted[0]["approval"]["risk_level"], "high");
    assert_eq!(posted[0]["arguments"], json!({}));

    // Without them, loopback is refused before anything is sent: people decide.
    c.nodes.pop();
    let closed = [("TOOLMESH_POLICY_FILE", path.as_str())];
    let node = c.start_node("gateway,approval", &closed).await;
    let asked = c.tool_call("acme", "component_status", json!({})).await;
    assert_eq!(asked["error"], "approval_required", "{asked}");
    assert_eq!(server.records().len(), 1, "nothing more was posted");
    assert!(
        c.nodes[node].logs("refuses the reviewer's URL", Duration::from_secs(5)),
        "the gateway logs why the reviewer gave no answer"
    );
}
