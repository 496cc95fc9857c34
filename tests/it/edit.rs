//! Edit before approving (PROTOCOL.md "Approval policy"): a reviewer approves other arguments
//! than the call's; they are checked against the tool's schema and the policy, the approval is
//! bound to them, and the call runs with them and says so.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_kernel::canonical::arguments_sha256;

use crate::policies::{policy, NO_SECRETS, TWO_OF_OPS};
use crate::support::{assert_error, ok, policy_file, trail_entry, Cluster};

/// Strict: writes ask anyone of the account, but not under `secrets/` ([`NO_SECRETS`]), and
/// `component_status` needs two of `ops` ([`TWO_OF_OPS`]).
fn policy_text() -> String {
    policy("strict", &[NO_SECRETS, TWO_OF_OPS])
}

fn write(path: &str, content: &str) -> Value {
    json!({"path": path, "content": content})
}

/// A decision approving approval `id` of acme with `arguments` in place of the call's.
async fn approve_edited(c: &Cluster, id: &str, arguments: Value) -> Value {
    let body = json!({"id": id, "approved": true, "approver": "alice", "arguments": arguments});
    c.approvals("acme", "decide", body).await
}

async fn content(c: &Cluster, path: &str) -> String {
    let arguments = json!({"path": path, "include_line_numbers": false});
    let read = ok(c
        .session_call("acme", "s1", "read_workspace_file", arguments)
        .await);
    read["content"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_parked_call_runs_the_arguments_its_reviewer_approved_and_says_so() {
    let (_dir, path) = policy_file(&policy_text());
    let mut c = Cluster::servers_with_jetstream().await;
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    c.start_node("gateway,approval,workspace", &env).await;

    let original = write("draft.sh", "rm -rf /\n");
    let edited = write("draft.sh", "echo safe\n");
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let parked = c.call_in_background(
        "acme",
        json!({"tool": "write_workspace_file", "session_id": "s1", "invocation_id": "inv-edit",
               "arguments": original, "wait_for_approval_s": 9}),
    );
    let msg = tokio::time::timeout(Duration::from_secs(5), requested.next()).await;
    let approval: Value = serde_json::from_slice(&msg.unwrap().unwrap().payload).unwrap();
    let id = approval["id"].as_str().unwrap().to_owned();

    // Arguments the tool's schema refuses, or a deny rule matches, change nothing.
    let invalid = approve_edited(&c, &id, json!({"path": 7, "content": "x"})).await;
    assert_eq!(invalid["error"], "invalid_arguments", "{invalid}");
    let denied = approve_edited(&c, &id, write("secrets/key", "x")).await;
    assert_error(&denied, "policy_denied", "no-secrets");
    assert_eq!(c.approval_status("acme", &id).await, "pending");

    let decided = ok(approve_edited(&c, &id, edited.clone()).await);
    let approval = &decided["approval"];
    assert_eq!(approval["status"], "approved", "{decided}");
    assert_eq!(approval["edited"], true, "{decided}");
    assert_eq!(
        approval["arguments_sha256"],
        arguments_sha256(&edited),
        "{decided}"
    );
    assert_eq!(
        approval["original_arguments_sha256"],
        arguments_sha256(&original),
        "{decided}"
    );
    assert!(
        approval["arguments_preview"]
            .as_str()
            .unwrap()
            .contains("echo safe"),
        "{decided}"
    );
    let got = ok(c.approvals("acme", "get", json!({"id": id})).await);
    assert_eq!(got["arguments"], edited, "{got}");

    let reply = ok(parked.await.unwrap());
    assert_eq!(reply["approval_edited"], true, "{reply}");
    assert_eq!(content(&c, "draft.sh").await, "echo safe\n");

    // Decided once: another edit is a contrary decision.
    let late = approve_edited(&c, &id, write("draft.sh", "other\n")).await;
    assert_eq!(late["error"], "conflict", "{late}");

    // The trail says the call ran the edited arguments, and that the approval was edited.
    let trail = c.audit_trail("acme", 100).await;
    let started = trail_entry(&trail, |e| {
        e["invocation_id"] == "inv-edit" && e["status"] == "started"
    });
    assert_eq!(started["arguments_sha256"], arguments_sha256(&edited));
    assert_eq!(started["edited"], true, "{started}");
    let approved = trail_entry(&trail, |e| {
        e["approval_id"] == id.as_str() && e["status"] == "approved"
    });
    assert_eq!(approved["edited"], true, "{approved}");
}

#[tokio::test]
async fn a_repeated_call_with_the_original_arguments_runs_the_edited_ones() {
    let (_dir, path) = policy_file(&policy_text());
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    let c = Cluster::with_node("gateway,approval,workspace", &env).await;
    let original = write("notes.txt", "first\n");
    let required = c
        .session_call("acme", "s1", "write_workspace_file", original.clone())
        .await;
    assert_eq!(required["error"], "approval_required", "{required}");
    let id = required["approval_request"]["id"].as_str().unwrap();

    // An edit is an approval: a rejection carrying arguments is refused.
    let body = json!({"id": id, "approved": false, "arguments": write("notes.txt", "x")});
    let refused = c.approvals("acme", "decide", body).await;
    assert_eq!(refused["error"], "invalid_request", "{refused}");

    ok(approve_edited(&c, id, write("notes.txt", "second\n")).await);
    let repeat = json!({"tool": "write_workspace_file", "session_id": "s1",
                        "arguments": original, "approval": {"id": id}});
    let reply = ok(c.call("acme", repeat.clone()).await);
    assert_eq!(reply["approval_edited"], true, "{reply}");
    assert_eq!(content(&c, "notes.txt").await, "second\n");
    // Used once, as any approval.
    let again = c.call("acme", repeat).await;
    assert_eq!(again["error"], "approval_expired", "{again}");
}

#[tokio::test]
async fn an_approval_that_needs_several_reviewers_takes_no_edit() {
    let (_dir, path) = policy_file(&policy_text());
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let required = c
        .call(
            "acme",
            json!({"tool": "component_status", "session_id": "s1"}),
        )
        .await;
    let id = required["approval_request"]["id"].as_str().unwrap();
    let subject = "toolmesh.v1.approvals.acme.decide.alice";
    let body = json!({"id": id, "approved": true, "arguments": {}});
    let refused = toolmesh_testkit::request_json(&c.client, subject, body).await;
    assert_error(&refused, "invalid_request", "needs 2 approvals");
    let got = ok(c.approvals("acme", "get", json!({"id": id})).await);
    assert_eq!(
        got["approval"]["decisions"],
        json!([]),
        "nothing counted: {got}"
    );
}
