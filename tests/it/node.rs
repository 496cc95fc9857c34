//! Nodes: status and readiness, heartbeats across nodes, queue groups, SIGTERM drain.

use std::time::Duration;

use serde_json::{json, Value};
use toolmesh_testkit::{request_json, wait_until};

use crate::support::{collect, ok, policy_file, strings, Cluster, GATED_STATUS};

fn node_ids(status: &Value) -> Vec<String> {
    strings(status, "nodes", "node_id")
}

#[tokio::test]
async fn status_shows_every_live_node_and_drops_dead_ones() {
    let mut c = Cluster::with_node("gateway,approval", &[]).await;
    c.start_node("gateway", &[]).await;
    let own = request_json(&c.client, "toolmesh.v1.status.test-node-2", json!({})).await;
    assert_eq!(own["ok"], true);
    assert_eq!(own["node_id"], "test-node-2");
    assert_eq!(own["roles"], json!(["gateway"]));
    assert_eq!(own["sandbox"], Value::Null);
    assert!(own["version"].is_string() && own["uptime_s"].is_u64() && own["in_flight"].is_u64());

    // Newcomers are announced at once, not after a heartbeat period.
    let status = request_json(&c.client, "toolmesh.v1.status", json!({})).await;
    assert_eq!(
        node_ids(&status),
        ["test-node-1", "test-node-2"],
        "{status}"
    );
    let first = &status["nodes"][0];
    assert_eq!(first["roles"], json!(["gateway", "approval"]));

    c.nodes[1].kill();
    let dropped = wait_until(Duration::from_secs(10), || async {
        node_ids(&request_json(&c.client, "toolmesh.v1.status", json!({})).await) == ["test-node-1"]
    })
    .await;
    assert!(dropped, "a killed node must drop out of the cluster view");
}

#[tokio::test]
async fn every_call_is_answered_once_across_gateways() {
    let mut c = Cluster::with_node("gateway,approval", &[]).await;
    c.start_node("gateway", &[]).await;
    let mut finished = c.watch("toolmesh.v1.events.acme.*").await;
    let replies = futures::future::join_all((0..50).map(|i| {
        c.call(
            "acme",
            json!({"tool": "component_status", "invocation_id": format!("inv-q{i}")}),
        )
    }))
    .await;
    assert!(replies.iter().all(|r| r["ok"] == true));
    // started + finished per call, and no more: the queue group gave each call to one gateway.
    let events = collect(&mut finished, 101, Duration::from_secs(2)).await;
    assert_eq!(events.len(), 100);
}

#[tokio::test]
async fn sigterm_drains_parked_calls_and_exits_zero() {
    let (_dir, path) = policy_file(GATED_STATUS);
    let mut c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let parked = c.call_in_background(
        "acme",
        json!({"tool": "component_status", "session_id": "s1", "wait_for_approval_s": 120}),
    );
    let announced = collect(&mut requested, 1, Duration::from_secs(5)).await;
    assert_eq!(announced.len(), 1);
    c.nodes[0].terminate();
    let reply = tokio::time::timeout(Duration::from_secs(10), parked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply["error"], "approval_pending", "{reply}");
    assert_eq!(reply["approval_request"]["status"], "pending");
    let status = c.nodes[0].wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.map(|s| s.code()), Some(Some(0)));
    // The approval itself is still there for the next node.
    c.start_node("approval", &[]).await;
    let id = announced[0]["id"].as_str().unwrap();
    assert_eq!(c.approval_status("acme", id).await, "pending");
}

/// The drain bound holds when the bus is gone: SIGTERM during a NATS outage still ends the
/// node by `TOOLMESH_DRAIN_TIMEOUT_S` plus the node's fixed grace (5 s for the actors, 2 s for
/// the last heartbeat, 3 s of margin).
#[tokio::test]
async fn a_node_told_to_stop_during_a_nats_outage_exits_within_its_drain_bound() {
    let mut c = Cluster::with_node(
        "gateway,approval,workspace",
        &[("TOOLMESH_DRAIN_TIMEOUT_S", "2")],
    )
    .await;
    c.nats.kill();
    let asked = std::time::Instant::now();
    c.nodes[0].terminate();
    let status = c.nodes[0].wait_exit(Duration::from_secs(20)).await;
    assert_eq!(
        status.map(|s| s.code()),
        Some(Some(0)),
        "the node must exit 0 within its drain bound (2 + 10 s), not hang on NATS"
    );
    assert!(
        asked.elapsed() <= Duration::from_secs(13),
        "{:?}",
        asked.elapsed()
    );
}

#[tokio::test]
async fn a_drained_node_stops_taking_calls_while_another_serves_them() {
    let mut c = Cluster::with_node("gateway,approval", &[]).await;
    c.start_node("gateway", &[]).await;
    c.nodes[0].terminate();
    let exit = c.nodes[0].wait_exit(Duration::from_secs(10)).await;
    assert_eq!(exit.map(|s| s.code()), Some(Some(0)));
    for _ in 0..20 {
        ok(c.call("acme", json!({"tool": "component_status"})).await);
    }
    let status = request_json(&c.client, "toolmesh.v1.status", json!({})).await;
    assert_eq!(
        node_ids(&status),
        ["test-node-2"],
        "a drained node says goodbye"
    );
}

/// A log written to a pipe (a file, journald, `docker logs`) carries no ANSI colour codes;
/// a terminal still gets them (issue 29, item 8).
#[tokio::test]
async fn a_log_to_a_pipe_has_no_colour_codes() {
    // Without JetStream the node warns that RunEvents are live only: a line to look at.
    let mut c = Cluster::servers().await;
    let spec = c.spec("gateway", &[]);
    let node = crate::support::LoggedNode::start(&spec, &c.client).await;
    node.logs(&["RunEvents are live only"]).await;
    assert!(
        !node.log().contains('\u{1b}'),
        "the log holds colour codes: {:?}",
        node.log()
    );
}

/// A bad value of a variable the binary reads itself stops the node at once, naming it (as
/// the kernel's config does for its own), instead of falling back silently.
#[test]
fn a_bad_runtime_or_log_format_stops_the_node_naming_the_variable() {
    for (var, value) in [
        ("TOOLMESH_WORKER_THREADS", "four"),
        ("TOOLMESH_LOG_FORMAT", "yaml"),
    ] {
        let out = std::process::Command::new(crate::support::BIN)
            .args([
                "node",
                "--roles",
                "gateway",
                "--nats-url",
                "nats://127.0.0.1:1",
            ])
            .env(var, value)
            .output()
            .expect("toolmesh runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{var}={value} started the node: {stderr}"
        );
        assert!(stderr.contains(var), "{var}={value}: {stderr}");
    }
}
