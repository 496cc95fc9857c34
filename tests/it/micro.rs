//! NATS micro-service discovery: `$SRV.PING|INFO|STATS` answered by every node for itself and
//! each of its actors, in the shapes async-nats's own `service` types read.

use std::time::Duration;

use async_nats::service::{Info, PingResponse, Stats};
use bytes::Bytes;
use futures::StreamExt;

use crate::support::Cluster;

/// Every reply to one request on `subject`, until none came for 500 ms (the server's
/// "no responders" status message is not a reply).
async fn gather(client: &async_nats::Client, subject: &str) -> Vec<Bytes> {
    let inbox = client.new_inbox();
    let mut sub = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(subject.to_owned(), inbox, Bytes::new())
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        if msg.status.is_none() {
            out.push(msg.payload);
        }
    }
    out
}

/// The replies [`gather`] gets on `subject`, each parsed as a `T`.
async fn gather_as<T: serde::de::DeserializeOwned>(
    client: &async_nats::Client,
    subject: &str,
) -> Vec<T> {
    let replies = gather(client, subject).await;
    let parse = |b: &Bytes| {
        serde_json::from_slice(b).unwrap_or_else(|e| panic!("a reply on {subject}: {e}"))
    };
    replies.iter().map(parse).collect()
}

/// The name, subject and queue group of each of a service's endpoints.
fn endpoints(info: &Info) -> Vec<(&str, &str, &str)> {
    let endpoints = info.endpoints.iter();
    endpoints
        .map(|e| (e.name.as_str(), e.subject.as_str(), e.queue_group.as_str()))
        .collect()
}

#[tokio::test]
async fn every_node_answers_srv_ping_info_and_stats_for_its_actors() {
    let mut cluster = Cluster::with_env(&[]).await; // test-node-1: gateway, approval
    cluster.start_node("workspace", &[]).await; // test-node-2
    let client = cluster.client.clone();

    let pings: Vec<PingResponse> = gather_as(&client, "$SRV.PING").await;
    let mut seen: Vec<(String, String)> = pings
        .iter()
        .map(|p| (p.name.clone(), p.id.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("toolmesh-approval", "test-node-1"),
            ("toolmesh-gateway", "test-node-1"),
            ("toolmesh-node", "test-node-1"),
            ("toolmesh-node", "test-node-2"),
            ("toolmesh-workspace", "test-node-2"),
        ]
        .map(|(n, i)| (n.to_owned(), i.to_owned()))
    );
    assert!(pings
        .iter()
        .all(|p| p.kind == "io.nats.micro.v1.ping_response" && !p.version.is_empty()));
    assert_eq!(pings[0].metadata["node_id"], pings[0].id);

    // By name: only that service's instances answer.
    let infos: Vec<Info> = gather_as(&client, "$SRV.INFO.toolmesh-gateway").await;
    assert_eq!(infos.len(), 1);
    let info = &infos[0];
    assert_eq!(info.kind, "io.nats.micro.v1.info_response");
    assert_eq!(
        endpoints(info),
        [
            ("call", "toolmesh.v1.call.>", "toolmesh.gateway"),
            ("cancel", "toolmesh.v1.cancel.>", "toolmesh.gateway"),
            (
                "check",
                "toolmesh.internal.v1.gateway.check",
                "toolmesh.gateway"
            ),
        ]
    );

    // The approval actor's endpoints: the public subjects, then the gateway's internal ones.
    let infos: Vec<Info> = gather_as(&client, "$SRV.INFO.toolmesh-approval").await;
    assert_eq!(infos.len(), 1);
    assert_eq!(
        endpoints(&infos[0]),
        [
            ("approvals", "toolmesh.v1.approvals.>", "toolmesh.approval"),
            (
                "gate",
                "toolmesh.internal.v1.approval.gate",
                "toolmesh.approval"
            ),
            (
                "release",
                "toolmesh.internal.v1.approval.release",
                "toolmesh.approval"
            ),
            (
                "withdraw",
                "toolmesh.internal.v1.approval.withdraw",
                "toolmesh.approval"
            ),
        ]
    );

    // By name and id: that one instance; the node's live load rides in each endpoint's data.
    let stats = gather(&client, "$SRV.STATS.toolmesh-workspace.test-node-2").await;
    assert_eq!(stats.len(), 1);
    let stats: Stats = serde_json::from_slice(&stats[0]).expect("a stats_response");
    assert_eq!(stats.kind, "io.nats.micro.v1.stats_response");
    assert_eq!(stats.id, "test-node-2");
    assert!(stats
        .endpoints
        .iter()
        .any(|e| e.subject == "toolmesh.internal.v1.run.workspace"
            && e.queue_group == "toolmesh.workspace"));
    for endpoint in &stats.endpoints {
        assert_eq!((endpoint.requests, endpoint.errors), (0, 0));
        let data = endpoint.data.as_ref().expect("load data");
        assert_eq!(data["in_flight"], 0, "{data}");
    }

    // Another instance id, or another name: nobody answers.
    assert!(gather(&client, "$SRV.PING.toolmesh-workspace.test-node-1")
        .await
        .is_empty());
    assert!(gather(&client, "$SRV.PING.toolmesh-sandbox")
        .await
        .is_empty());
}
