//! The audit trail end to end: real nodes on a JetStream nats-server, Redis, and the
//! `toolmesh audit` command; and its append-only guarantees tried as an attacker would
//! (PROTOCOL.md "Tenancy and trust": the deployment's users in docker/nats.conf, a NATS user
//! allowed everything, a misconfigured node).

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::request_json;

use crate::support::{
    collect, fake_workspace, ok, temp_file, toolmesh_cli, Cluster, Deployed, LoggedNode,
};

const STREAM: &str = "TOOLMESH_AUDIT";

/// Every entry of `account`, oldest first, through the query subject.
async fn trail(c: &Cluster, account: &str) -> Vec<Value> {
    let reply = ok(request_json(
        &c.client,
        format!("toolmesh.v1.audit.{account}.query"),
        json!({"limit": 1000}),
    )
    .await);
    reply["entries"].as_array().unwrap().clone()
}

/// `toolmesh <args>` against `nats_url`: exit code, stdout as JSON (null when it is not),
/// stderr.
fn cli(nats_url: &str, args: &[&str]) -> (i32, Value, String) {
    let output = toolmesh_cli(nats_url)
        .args(args)
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

/// `toolmesh audit verify --account <a>`: exit code and stdout.
fn verify(c: &Cluster, account: &str, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["audit", "verify", "--account", account];
    args.extend_from_slice(extra);
    cli(&c.nats.url(), &args)
}

/// The configuration and message count of `TOOLMESH_AUDIT`.
async fn audit_stream(client: &async_nats::Client) -> (jetstream::stream::Config, u64) {
    let info = jetstream::new(client.clone())
        .get_stream(STREAM)
        .await
        .expect("the audit stream exists")
        .cached_info()
        .clone();
    (info.config, info.state.messages)
}

/// Rewrites `TOOLMESH_AUDIT` as a NATS user allowed to delete streams can (the test server's
/// only user; `deny_delete` and `deny_purge` stop entry deletes and purges, not this):
/// deletes it, makes it again with the same configuration and stores `entries` (as the query
/// answered them) on the account's subject. Answers their new stream sequences.
async fn rewrite_stream(c: &Cluster, account: &str, entries: &[Value]) -> Vec<u64> {
    let js = jetstream::new(c.client.clone());
    let (config, _) = audit_stream(&c.client).await;
    js.delete_stream(STREAM).await.unwrap();
    js.create_stream(config).await.unwrap();
    let mut seqs = Vec::new();
    for entry in entries {
        let mut entry = entry.clone();
        entry.as_object_mut().unwrap().shift_remove("seq");
        let ack = js
            .publish(
                format!("toolmesh.v1.audit.{account}"),
                serde_json::to_vec(&entry).unwrap().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        seqs.push(ack.sequence);
    }
    seqs
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
    ok(tokio::time::timeout(Duration::from_secs(15), parked)
        .await
        .unwrap()
        .unwrap());

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

    // Rewrite the stream: every entry again, `approved` by someone else.
    let mut forged = entries.clone();
    forged[1]["decided_by"] = json!("mallory");
    let new_seqs = rewrite_stream(&c, "acme", &forged).await;
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
        ok(call.await.unwrap());
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
        ok(c.call(
            account,
            json!({"tool": "component_status", "arguments": {}}),
        )
        .await);
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
    assert_audit(&c, "ok").await;
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
    let status = ok(assert_audit(&c, "off").await);
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

/// Asserts that acme's `component_status` says the audit trail is `state`: the status.
async fn assert_audit(c: &Cluster, state: &str) -> Value {
    let status = c.tool_call("acme", "component_status", json!({})).await;
    assert_eq!(status["audit"]["status"], state, "{status}");
    status
}

/// A gateway with JetStream after the calls `ids` of acme.
async fn gateway_after_calls(ids: std::ops::Range<usize>) -> Cluster {
    let mut c = Cluster::servers_with_jetstream().await;
    c.start_node("gateway", &[]).await;
    calls(&c, "acme", ids).await;
    c
}

/// `component_status` calls of `account`, each one `finished` entry.
async fn calls(c: &Cluster, account: &str, ids: std::ops::Range<usize>) {
    for i in ids {
        ok(c
            .call(
                account,
                json!({"tool": "component_status", "invocation_id": format!("inv-{i}"), "arguments": {}}),
            )
            .await);
    }
}

/// Waits for the server's permissions violation naming `subject` among `errors`.
async fn refused(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>, subject: &str) {
    let heard = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(error) = errors.recv().await {
            if error.contains("Permissions Violation") && error.contains(subject) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(heard, Ok(true), "no permissions violation for {subject}");
}

/// Finding 9 of issue 28: the node user's `$JS.API.>` let any node, and every tool provider
/// running with its credentials, purge `TOOLMESH_AUDIT`, delete its entries, delete it or
/// shorten its `max_age`. On the deployment's users (docker/nats.conf) the broker refuses
/// each of these to the node user, which still makes the stream and writes the chain.
#[tokio::test]
async fn the_node_user_cannot_purge_delete_or_reconfigure_the_audit_stream() {
    let deployed = Deployed::start();
    let nats = &deployed.nats;
    let _node = deployed
        .start_node("gateway,approval", "audit-auth-1")
        .await;
    let acme = nats.client("acme").await;
    for i in 0..2 {
        ok(request_json(
            &acme,
            "toolmesh.v1.call.acme",
            json!({"tool": "component_status", "invocation_id": format!("inv-{i}"), "arguments": {}}),
        )
        .await);
    }

    // The attacker: a connection with the node user's credentials that hears the server's
    // permission errors.
    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let attacker = async_nats::ConnectOptions::new()
        .user_and_password("toolmesh".into(), "node-pw".into())
        .event_callback(move |event| {
            let errors_tx = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    let _ = errors_tx.send(e.to_string());
                }
            }
        })
        .connect(format!("127.0.0.1:{}", nats.port()))
        .await
        .expect("connect as the node user");
    let mut js = jetstream::new(attacker.clone());
    // A refused request gets no answer; the server's error says why.
    js.set_timeout(Duration::from_secs(2));
    let (config, messages) = audit_stream(&attacker).await;
    assert_eq!(messages, 2);
    let stream = js.get_stream(STREAM).await.unwrap();
    let purge = stream.purge().await;
    assert!(purge.is_err(), "purged: {purge:?}");
    refused(&mut errors, "$JS.API.STREAM.PURGE.TOOLMESH_AUDIT").await;
    let delete = stream.delete_message(1).await;
    assert!(delete.is_err(), "deleted: {delete:?}");
    refused(&mut errors, "$JS.API.STREAM.MSG.DELETE.TOOLMESH_AUDIT").await;
    let shorter = jetstream::stream::Config {
        max_age: Duration::from_secs(1),
        ..config.clone()
    };
    let update = js.update_stream(&shorter).await;
    assert!(update.is_err(), "updated: {update:?}");
    refused(&mut errors, "$JS.API.STREAM.UPDATE.TOOLMESH_AUDIT").await;
    let drop = js.delete_stream(STREAM).await;
    assert!(drop.is_err(), "the stream was deleted");
    refused(&mut errors, "$JS.API.STREAM.DELETE.TOOLMESH_AUDIT").await;
    // A rollup message would purge the subject: the stream allows none.
    let mut rollup = async_nats::HeaderMap::new();
    rollup.insert("Nats-Rollup", "sub");
    let rolled = match js
        .publish_with_headers("toolmesh.v1.audit.acme", rollup, "{}".into())
        .await
    {
        Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    assert!(rolled.is_err(), "a rollup was stored");

    let (after, messages) = audit_stream(&attacker).await;
    assert_eq!(messages, 2, "entries were removed");
    assert_eq!(after, config, "the stream was changed");
    assert!(after.deny_delete && after.deny_purge, "{after:?}");
    let (code, report, stderr) = cli(
        &nats.url("acme"),
        &[
            "--inbox-prefix",
            "_INBOX.acme",
            "audit",
            "verify",
            "--account",
            "acme",
        ],
    );
    assert_eq!(code, 0, "{report} {stderr}");
    assert_eq!(report["entries"], 2, "{report}");
}

/// Below the broker's permissions: the stream itself (`deny_delete`, `deny_purge`) refuses a
/// purge and an entry delete to every NATS user, even one allowed everything.
#[tokio::test]
async fn the_audit_stream_refuses_purges_and_entry_deletes_to_every_user() {
    let c = gateway_after_calls(0..2).await;
    let js = jetstream::new(c.client.clone());
    let stream = js.get_stream(STREAM).await.unwrap();
    let purge = stream.purge().await.expect_err("purged");
    assert!(purge.to_string().contains("not permitted"), "{purge}");
    let filtered = stream
        .purge()
        .filter("toolmesh.v1.audit.acme")
        .await
        .expect_err("purged the account's subject");
    assert!(filtered.to_string().contains("not permitted"), "{filtered}");
    let entries = trail(&c, "acme").await;
    let last = entries[1]["seq"].as_u64().unwrap();
    let delete = stream.delete_message(last).await.expect_err("deleted");
    assert!(delete.to_string().contains("not permitted"), "{delete}");
    assert_eq!(audit_stream(&c.client).await.1, 2, "entries were removed");
    let (code, report, stderr) = verify(&c, "acme", &[]);
    assert_eq!(code, 0, "{report} {stderr}");
    assert_eq!(report["entries"], 2, "{report}");
}

/// Finding 9 of issue 28: a node started with `TOOLMESH_AUDIT_MAX_AGE_S=1` rewrote the
/// stream's `max_age` for the whole cluster, and every entry older than a second went. A node
/// never lowers an existing audit stream's limits: it logs the difference.
#[tokio::test]
async fn a_node_with_a_shorter_max_age_leaves_the_audit_stream_as_it_is_and_says_so() {
    let mut c = gateway_after_calls(0..2).await;
    let (before, _) = audit_stream(&c.client).await;
    assert_eq!(before.max_age, Duration::from_secs(90 * 24 * 3600));

    let spec = c.spec("gateway,approval", &[("TOOLMESH_AUDIT_MAX_AGE_S", "1")]);
    let node = LoggedNode::start(&spec, &c.client).await;
    let (after, messages) = audit_stream(&c.client).await;
    assert_eq!(after, before, "the node changed the stream");
    assert_eq!(messages, 2);
    node.logs(&[
        "max_age is 7776000 s on the stream, 1 s in this node's settings",
        "never lowers",
    ])
    .await;
    // Its trail is on: it writes into the stream as it is.
    assert_audit(&c, "ok").await;
}

/// Finding 9 of issue 28: entries cut from the end of a chain leave a chain that verifies
/// whole. A head kept from `toolmesh audit head` before the cut shows it: `verify --head`
/// exits 1 when the chain no longer holds that entry, 0 for a head it still holds.
#[tokio::test]
async fn a_head_kept_before_a_cut_tail_shows_the_cut_that_verify_alone_cannot() {
    let c = gateway_after_calls(0..3).await;
    let url = c.nats.url();
    let head = toolmesh_cli(&url)
        .args(["audit", "head", "--account", "acme"])
        .output()
        .expect("the cli runs");
    assert!(head.status.success(), "{head:?}");
    let printed = String::from_utf8(head.stdout).unwrap();
    let kept: Value = serde_json::from_str(&printed).unwrap();
    let entries = trail(&c, "acme").await;
    assert_eq!(kept["ok"], true, "{kept}");
    assert_eq!(kept["account"], "acme", "{kept}");
    assert_eq!(kept["seq"], entries[2]["seq"], "{kept}");
    assert_eq!(kept["sha256"], entries[2]["sha256"], "{kept}");
    assert_eq!(kept["at"], entries[2]["at"], "{kept}");
    let kept_sha = kept["sha256"].as_str().unwrap().to_owned();
    calls(&c, "acme", 3..5).await;

    // The cut: the chain keeps its first two entries; the kept one and all after it go.
    let entries = trail(&c, "acme").await;
    assert_eq!(entries.len(), 5);
    rewrite_stream(&c, "acme", &entries[..2]).await;
    // The node goes on writing: its next entry links to the chain's new last one.
    calls(&c, "acme", 5..6).await;
    let now = trail(&c, "acme").await;
    assert_eq!(now.len(), 3);
    assert_eq!(now[2]["prev_sha256"], entries[1]["sha256"]);

    let (code, report, stderr) = verify(&c, "acme", &[]);
    assert_eq!(code, 0, "the cut chain verifies whole: {report} {stderr}");

    let (code, report, stderr) = verify(&c, "acme", &["--head", &kept_sha]);
    assert_eq!(code, 1, "{report} {stderr}");
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["head"]["found"], false, "{report}");
    assert!(
        stderr.contains(&format!("does not hold the kept head {kept_sha}")),
        "{stderr}"
    );
    assert!(stderr.contains("cut from the chain's end"), "{stderr}");
    // What `audit head` printed, kept in a file, reads back as the same head.
    let (_dir, file) = temp_file("acme.head", &printed);
    let at_file = format!("@{}", file.display());
    let (code, report, stderr) = verify(&c, "acme", &["--head", &at_file]);
    assert_eq!(code, 1, "{report} {stderr}");
    assert!(stderr.contains("(stream seq 3)"), "{stderr}");
    // A head the chain still holds.
    let present = entries[1]["sha256"].as_str().unwrap();
    let (code, report, stderr) = verify(&c, "acme", &["--head", present]);
    assert_eq!(code, 0, "{report} {stderr}");
    assert_eq!(report["head"]["found"], true, "{report}");
    assert_eq!(report["head"]["seq"], 2, "{report}");
    // A head of another account's chain is not checked against this one.
    let (code, _, stderr) = verify(&c, "globex", &["--head", &at_file]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not of \"globex\""), "{stderr}");
}

/// On the deployment's users a node may not update `TOOLMESH_AUDIT`: against a stream made
/// before the trail was append-only (purge and delete allowed) it says what an operator must
/// raise, and keeps writing its trail into the stream as it is.
#[tokio::test]
async fn a_node_that_may_not_raise_an_older_audit_stream_says_so_and_keeps_its_trail() {
    let deployed = Deployed::start();
    let nats = &deployed.nats;
    let node_client = nats.client("node").await;
    let older = jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["toolmesh.v1.audit.*".into()],
        max_age: Duration::from_secs(90 * 24 * 3600),
        allow_direct: true,
        ..Default::default()
    };
    jetstream::new(node_client.clone())
        .create_stream(older)
        .await
        .unwrap();
    let (before, _) = audit_stream(&node_client).await;
    let spec = deployed.spec("gateway,approval", "audit-auth-older");
    let node = LoggedNode::start(&spec, &node_client).await;
    node.logs(&[
        "deny_purge is false on the stream, true in this node's settings",
        "could not be raised",
    ])
    .await;
    assert_eq!(audit_stream(&node_client).await.0, before);
    let acme = nats.client("acme").await;
    let status = request_json(
        &acme,
        "toolmesh.v1.call.acme",
        json!({"tool": "component_status", "arguments": {}}),
    )
    .await;
    assert_eq!(status["audit"]["status"], "ok", "{status}");
    assert_eq!(
        audit_stream(&node_client).await.1,
        1,
        "its entry was written"
    );
}
