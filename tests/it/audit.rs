//! The audit trail end to end: real nodes on a JetStream nats-server, Redis, and the
//! `toolmesh audit` command.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::request_json;

use crate::support::{collect, fake_workspace, Cluster, BIN};

/// Every entry of `account`, oldest first, through the query subject.
async fn trail(c: &Cluster, account: &str) -> Vec<Value> {
    let reply = request_json(
        &c.client,
        format!("toolmesh.v1.audit.{account}.query"),
        json!({"limit": 1000}),
    )
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    reply["entries"].as_array().unwrap().clone()
}

/// `toolmesh audit verify --account <a>`: exit code and stdout.
fn verify(c: &Cluster, account: &str, extra: &[&str]) -> (i32, Value, String) {
    let output = std::process::Command::new(BIN)
        .args(["audit", "verify", "--account", account])
        .args(extra)
        .env("TOOLMESH_NATS_URL", c.nats.url())
        .output()
        .expect("the cli runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        output.status.code().unwrap_or(-1),
        report,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn statuses(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["kind"].as_str().unwrap(),
                e["status"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn a_strict_mode_write_is_on_the_trail_which_verifies_until_tampered_with() {
    let mut c = Cluster::servers_with_jetstream().await;
    c.start_node("gateway,approval,workspace", &[]).await;
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let parked = c.call_in_background(
        "acme",
        json!({"tool": "write_workspace_file", "session_id": "s1",
               "invocation_id": "inv-write", "user_id": "ann", "wait_for_approval_s": 60,
               "arguments": {"path": "a.txt", "content": "hello\n"}}),
    );
    let announced = collect(&mut requested, 1, Duration::from_secs(5)).await;
    let id = announced[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(c.decide("acme", &id, true).await["ok"], true);
    let reply = tokio::time::timeout(Duration::from_secs(15), parked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");

    let entries = trail(&c, "acme").await;
    assert_eq!(
        statuses(&entries),
        [
            "approval:requested",
            "approval:approved",
            "approval:used",
            "call:started",
            "call:finished"
        ],
        "{entries:#?}"
    );
    let finished = &entries[4];
    assert_eq!(finished["invocation_id"], "inv-write");
    assert_eq!(finished["ok"], true);
    assert_eq!(finished["approval_id"], id.as_str());
    assert_eq!(finished["user_id"], "ann");
    assert_eq!(
        finished["arguments_sha256"],
        toolmesh_kernel::canonical::arguments_sha256(
            &json!({"path": "a.txt", "content": "hello\n"})
        )
    );
    assert_eq!(entries[1]["decided_by"], "alice");
    assert!(entries[0]["prev_sha256"].is_null());
    for pair in entries.windows(2) {
        assert_eq!(pair[1]["prev_sha256"], pair[0]["sha256"]);
    }
    let (code, report, stderr) = verify(&c, "acme", &[]);
    assert_eq!(code, 0, "{report} {stderr}");
    assert_eq!(report["entries"], 5);
    assert_eq!(report["genesis"], true);

    // Rewrite the stream: purge the subject, republish every entry, `approved` by someone else.
    let js = async_nats::jetstream::new(c.client.clone());
    let stream = js.get_stream("TOOLMESH_AUDIT").await.unwrap();
    stream
        .purge()
        .filter("toolmesh.v1.audit.acme")
        .await
        .unwrap();
    let mut new_seqs = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let mut entry = entry.clone();
        entry.as_object_mut().unwrap().shift_remove("seq");
        if i == 1 {
            entry["decided_by"] = json!("mallory");
        }
        let ack = js
            .publish(
                "toolmesh.v1.audit.acme",
                serde_json::to_vec(&entry).unwrap().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        new_seqs.push(ack.sequence);
    }
    let (code, report, stderr) = verify(&c, "acme", &[]);
    assert_eq!(code, 1, "{report} {stderr}");
    assert_eq!(report["first_bad"]["seq"], new_seqs[1], "{report}");
    assert_eq!(
        report["first_bad"]["invocation_id"], "inv-write",
        "{report}"
    );
    assert!(
        report["first_bad"]["fault"]
            .as_str()
            .unwrap()
            .starts_with("altered"),
        "{report}"
    );
    assert!(
        stderr.contains(&format!("stream seq {}", new_seqs[1])),
        "{stderr}"
    );
}

#[tokio::test]
async fn two_gateways_writing_one_account_at_once_keep_one_linear_chain() {
    let mut c = Cluster::servers_with_jetstream().await;
    c.start_node("gateway,approval", &[]).await;
    c.start_node("gateway", &[]).await;
    const CALLS: usize = 80;
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            c.call_in_background(
                "acme",
                json!({"tool": "component_status", "invocation_id": format!("inv-{i}"), "arguments": {}}),
            )
        })
        .collect();
    for call in calls {
        let reply = call.await.unwrap();
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let entries = trail(&c, "acme").await;
    assert_eq!(entries.len(), CALLS, "one finished entry per call");
    assert!(entries[0]["prev_sha256"].is_null());
    for pair in entries.windows(2) {
        assert_eq!(pair[1]["prev_sha256"], pair[0]["sha256"], "a fork");
    }
    let mut invocations: Vec<&str> = entries
        .iter()
        .map(|e| e["invocation_id"].as_str().unwrap())
        .collect();
    invocations.sort_unstable();
    invocations.dedup();
    assert_eq!(invocations.len(), CALLS);
    let nodes: std::collections::HashSet<&str> = entries
        .iter()
        .map(|e| e["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(nodes.len(), 2, "both gateways wrote: {nodes:?}");
    let (code, report, stderr) = verify(&c, "acme", &[]);
    assert_eq!(code, 0, "{report} {stderr}");
}

#[tokio::test]
async fn the_query_answers_the_subject_s_account_only_and_refuses_bad_input() {
    let mut c = Cluster::servers_with_jetstream().await;
    c.start_node("gateway,approval", &[]).await;
    for account in ["acme", "globex", "acme"] {
        let reply = c
            .call(
                account,
                json!({"tool": "component_status", "arguments": {}}),
            )
            .await;
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let acme = trail(&c, "acme").await;
    assert_eq!(acme.len(), 2);
    assert!(acme.iter().all(|e| e["account"] == "acme"), "{acme:#?}");
    assert_eq!(trail(&c, "globex").await.len(), 1);
    assert!(trail(&c, "initech").await.is_empty());
    // Paging: since the first entry's seq, one at a time.
    let page = request_json(
        &c.client,
        "toolmesh.v1.audit.acme.query",
        json!({"since": acme[0]["seq"], "limit": 1}),
    )
    .await;
    assert_eq!(page["entries"][0]["sha256"], acme[1]["sha256"], "{page}");
    assert_eq!(page["more"], false, "{page}");
    for (subject, body) in [
        ("toolmesh.v1.audit.acme.query", json!({"limit": 0})),
        (
            "toolmesh.v1.audit.acme.query",
            json!({"since": "yesterday"}),
        ),
        ("toolmesh.v1.audit.acme.query", json!([1])),
        ("toolmesh.v1.audit.a$b.query", json!({})),
    ] {
        let reply = request_json(&c.client, subject, body.clone()).await;
        assert_eq!(reply["ok"], false, "{subject} {body}: {reply}");
        assert_eq!(
            reply["error"], "invalid_request",
            "{subject} {body}: {reply}"
        );
    }
    let status = c
        .call("acme", json!({"tool": "component_status", "arguments": {}}))
        .await;
    assert_eq!(status["audit"]["status"], "ok", "{status}");
}

#[tokio::test]
async fn a_gateway_killed_mid_call_leaves_a_gap_that_verify_names() {
    let mut c = Cluster::servers_with_jetstream().await;
    let node = c
        .start_node("gateway", &[("TOOLMESH_TOOL_APPROVAL_MODE", "off")])
        .await;
    // The workspace "actor" takes the routed call and never answers: the tool is running.
    let mut workspace = fake_workspace(&c.client).await;
    let _pending = c.call_in_background(
        "acme",
        json!({"tool": "write_workspace_file", "session_id": "s1", "invocation_id": "inv-lost",
               "arguments": {"path": "a.txt", "content": "x"}}),
    );
    let routed = tokio::time::timeout(Duration::from_secs(10), workspace.next())
        .await
        .expect("the call was routed")
        .unwrap();
    assert!(String::from_utf8_lossy(&routed.payload).contains("inv-lost"));
    c.nodes[node].kill();
    let entries = trail_after_restart(&mut c).await;
    assert_eq!(statuses(&entries), ["call:started"], "{entries:#?}");
    // Within the grace the call may still be running: whole, and listed as open.
    let (code, report, _) = verify(&c, "acme", &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["open_calls"][0]["invocation_id"], "inv-lost");
    let (code, report, stderr) = verify(&c, "acme", &["--grace-s", "0"]);
    assert_eq!(code, 3, "{report} {stderr}");
    assert_eq!(report["gaps"][0]["invocation_id"], "inv-lost", "{report}");
    assert!(stderr.contains("inv-lost"), "{stderr}");
}

/// The trail read through a fresh gateway (the one that wrote it is gone).
async fn trail_after_restart(c: &mut Cluster) -> Vec<Value> {
    c.start_node("gateway", &[]).await;
    trail(c, "acme").await
}

#[tokio::test]
async fn without_jetstream_calls_run_and_component_status_says_there_is_no_trail() {
    let c = Cluster::start().await;
    let status = c
        .call("acme", json!({"tool": "component_status", "arguments": {}}))
        .await;
    assert_eq!(status["ok"], true, "{status}");
    assert_eq!(status["audit"]["status"], "off", "{status}");
    assert!(
        status["audit"]["reason"]
            .as_str()
            .unwrap()
            .contains("JetStream"),
        "{status}"
    );
    let reply = request_json(&c.client, "toolmesh.v1.audit.acme.query", json!({})).await;
    assert_eq!(reply["error"], "unavailable", "{reply}");
}
