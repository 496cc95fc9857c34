//! A worker site behind a NATS leaf node (issue 32, "Workers elsewhere"): a sandbox worker that
//! reaches the cluster only through its site's leaf server, with the session registry in
//! JetStream (`TOOLMESH_SANDBOX_REGISTRY=jetstream`) and no Redis at all. Its sessions run
//! there like anywhere; when the leaf link drops its calls answer `unavailable` within 10 s and
//! new sessions go to the workers that remain; once the link is back, it takes sessions again.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::{
    request_json, request_json_within, AuthNats, ClosedPort, LeafSite, NodeSpec,
};

use crate::support::{assert_unavailable_within, ok, Deployed, BIN};

const REMOTE: &str = "leaf-site-worker";
const HUB: &str = "leaf-hub-worker";

/// How long a call of a session whose site lost its link may take to be answered.
const WITHIN: Duration = Duration::from_secs(10);

/// A sandbox worker from `spec`: process sandboxes, the registry in JetStream.
fn worker(spec: NodeSpec) -> NodeSpec {
    spec.env("TOOLMESH_SANDBOX_BACKEND", "process")
        .env("TOOLMESH_SANDBOX_REGISTRY", "jetstream")
        .env("TOOLMESH_SANDBOX_DISK_MB", "0")
}

async fn call(client: &async_nats::Client, session: &str, tool: &str, arguments: Value) -> Value {
    let body = json!({"tool": tool, "session_id": session, "arguments": arguments});
    request_json(client, "toolmesh.v1.call.acme", body).await
}

async fn run(client: &async_nats::Client, session: &str, command: &str) -> Value {
    ok(call(
        client,
        session,
        "run_command",
        json!({ "command": command }),
    )
    .await)
}

/// The worker holding `session`'s sandbox (opening one if it has none).
async fn holder(client: &async_nats::Client, session: &str) -> String {
    let status = ok(call(client, session, "sandbox_status", json!({})).await);
    status["node_id"]
        .as_str()
        .expect("sandbox_status names its worker")
        .to_owned()
}

#[tokio::test]
async fn a_worker_site_behind_a_leaf_node_keeps_its_sessions_and_loses_them_cleanly() {
    // The deployment's users (docker/nats.conf) on the hub, docker/nats-leaf.conf at the site.
    let deployed = Deployed::on(AuthNats::start_hub());
    let site = LeafSite::deployed(deployed.nats.leaf_port()).await;
    let client = deployed.nats.client("acme").await;
    // Nodes are started (and asked for their status) as the node user.
    let nodes = deployed.nats.client("node").await;
    let _front = deployed
        .spec("gateway,approval,workspace", "leaf-front")
        .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
        .start(&nodes)
        .await;
    // The site's worker: NATS through its leaf server, the hub's JetStream through its domain,
    // and no Redis (nothing listens there).
    let no_redis = ClosedPort::new();
    let site_data = tempfile::tempdir().unwrap();
    let _remote = worker(NodeSpec::new(BIN, "sandbox", REMOTE))
        .env("TOOLMESH_NATS_URL", site.node_url())
        .env("TOOLMESH_JETSTREAM_DOMAIN", "toolmesh")
        .env(
            "TOOLMESH_REDIS_URL",
            format!("redis://127.0.0.1:{}", no_redis.port()),
        )
        .env("TOOLMESH_DATA_DIR", site_data.path().display().to_string())
        .start(&nodes)
        .await;

    // The link carries a worker's traffic, not the cluster's JetStream: from the site, nothing
    // answers a purge of the audit trail (the user `site` may not send it to the cluster).
    let at_site =
        async_nats::ConnectOptions::with_user_and_password("toolmesh".into(), "node-pw".into())
            .connect(site.url())
            .await
            .unwrap();
    let purge = at_site
        .request("$JS.toolmesh.API.STREAM.PURGE.TOOLMESH_AUDIT", "{}".into())
        .await;
    assert!(
        matches!(&purge, Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders),
        "{:?}",
        purge.map(|m| m.payload)
    );

    // The only worker: the first session opens there, and its workspace syncs over the link.
    let file = json!({"path": "from-hub.txt", "content": "synced"});
    ok(call(&client, "remote-1", "write_workspace_file", file).await);
    let first = run(
        &client,
        "remote-1",
        "cat from-hub.txt; echo here > /tmp/mark",
    )
    .await;
    assert_eq!(first["stdout"], "synced", "{first}");
    assert_eq!(holder(&client, "remote-1").await, REMOTE);
    let mut hub_worker = worker(deployed.spec("sandbox", HUB)).start(&nodes).await;
    // The hub's server hands a call to a worker of its own before one behind a leaf, so the
    // hub's worker takes these and hands them to the site, which holds the session.
    for _ in 0..6 {
        let again = run(&client, "remote-1", "cat /tmp/mark").await;
        assert_eq!(again["stdout"], "here\n", "{again}");
    }

    // A command running at the site when its link drops.
    let mut events = client.subscribe("toolmesh.v1.events.acme.>").await.unwrap();
    let long = tokio::spawn({
        let client = client.clone();
        async move {
            let body = json!({
                "tool": "run_command",
                "session_id": "remote-1",
                "arguments": {"command": "echo running; sleep 60", "timeout": 90},
            });
            request_json_within(
                &client,
                "toolmesh.v1.call.acme",
                body,
                Duration::from_secs(150),
            )
            .await
        }
    });
    let running = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(msg) = events.next().await {
            let event: Value = serde_json::from_slice(&msg.payload).unwrap();
            if event["kind"] == "stdout" && event["data"].as_str().unwrap_or("").contains("running")
            {
                return;
            }
        }
    })
    .await;
    assert!(running.is_ok(), "the long command never started");
    let cut = Instant::now();
    site.cut().await;
    assert_unavailable_within(&long.await.unwrap(), cut, WITHIN);

    // A call of the site's session now is answered in time: unavailable, or run on a new
    // sandbox elsewhere once the site's worker counts as lost; never at the unreachable site.
    let asked = Instant::now();
    let after = call(
        &client,
        "remote-1",
        "run_command",
        json!({"command": "cat /tmp/mark"}),
    )
    .await;
    assert!(
        asked.elapsed() < WITHIN,
        "answered after {:?}",
        asked.elapsed()
    );
    assert!(
        after["error"] == "unavailable" || (after["ok"] == true && after["stdout"] != "here\n"),
        "{after}"
    );
    // New sessions go to the worker that remains.
    for i in 0..4 {
        assert_eq!(holder(&client, &format!("new-{i}")).await, HUB);
    }

    // The link is back: with the hub's worker gone, the site's worker takes new sessions.
    site.restore().await;
    hub_worker.kill();
    let back = tokio::time::timeout(WITHIN, holder(&client, "later-1")).await;
    assert_eq!(back.expect("answered in time"), REMOTE);
}
