//! The claim protocol of long-running roles: a worker that takes a sandbox call names itself on
//! the call's reply subject (`Toolmesh-Claimed-By`), and a caller whose worker is lost mid-call
//! gets `unavailable` naming it long before the call's deadline.
//!
//! There is no sandbox actor in these clusters: a fake worker (a plain NATS subscriber in the
//! sandbox queue group, heartbeating as a node when a test needs it) stands in for one.

use std::future::Future;
use std::time::{Duration, Instant};

use async_nats::{Client, Subject, Subscriber};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::task::JoinHandle;
use toolmesh_kernel::host::{confirm_subscriptions, publish_claim};
use toolmesh_kernel::subjects::{internal, queue};
use toolmesh_kernel::wire::{ActorCall, ActorReply, Heartbeat, NodeStatus};
use toolmesh_kernel::{NodeId, Role};
use toolmesh_testkit::{request_json, wait_until};

use crate::support::{take_call, Cluster};

/// How long a call answered by its worker may take.
const SOON: Duration = Duration::from_secs(10);

/// How long a call whose worker holds it a while may take.
const SLOW: Duration = Duration::from_secs(30);

/// `run_command` with a 120 s timeout: the gateway waits up to 150 s for it.
fn long_command() -> Value {
    json!({
        "tool": "run_command",
        "session_id": "s1",
        "arguments": {"command": "sleep 100", "timeout": 120},
    })
}

/// Gateway and approval, with approvals off so that `run_command` runs without one.
async fn cluster() -> Cluster {
    Cluster::ungated("gateway,approval").await
}

/// Sends a call and waits up to `within` for the reply; returns it and how long it took.
async fn call_timed(c: &Cluster, body: Value, within: Duration) -> (Value, Duration) {
    let started = Instant::now();
    let reply = tokio::time::timeout(
        within,
        c.client.request(
            "toolmesh.v1.call.acme",
            Bytes::from(serde_json::to_vec(&body).unwrap()),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("no reply within {within:?}"))
    .expect("the call is answered");
    let reply: Value = serde_json::from_slice(&reply.payload).expect("the reply is JSON");
    (reply, started.elapsed())
}

/// A fake sandbox worker: takes calls on `toolmesh.internal.v1.run.sandbox` in the sandbox
/// queue group, like the real actor would.
async fn fake_worker(client: &Client) -> Subscriber {
    let sub = client
        .queue_subscribe(internal::run(Role::Sandbox), queue::of(Role::Sandbox))
        .await
        .unwrap();
    confirm_subscriptions(client).await.unwrap();
    sub
}

fn node(id: &str) -> NodeId {
    NodeId::parse(id).unwrap()
}

async fn beat(client: &Client, id: &str, leaving: bool) {
    let beat = Heartbeat {
        status: NodeStatus {
            in_flight: 1,
            ..NodeStatus::bare(node(id), vec![Role::Sandbox])
        },
        leaving,
    };
    client
        .publish(
            internal::HEARTBEAT,
            Bytes::from(serde_json::to_vec(&beat).unwrap()),
        )
        .await
        .unwrap();
    client.flush().await.unwrap();
}

/// Heartbeats as node `id` every 2 s (as a node does) until aborted, and returns once the
/// cluster view (`toolmesh.v1.status`) lists it.
async fn heartbeating(c: &Cluster, id: &str) -> JoinHandle<()> {
    let client = c.client.clone();
    let name = id.to_owned();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tick.tick().await;
            beat(&client, &name, false).await;
        }
    });
    let listed = wait_until(Duration::from_secs(5), || async {
        let status = request_json(&c.client, "toolmesh.v1.status", json!({})).await;
        status["nodes"]
            .as_array()
            .is_some_and(|nodes| nodes.iter().any(|n| n["node_id"] == id))
    })
    .await;
    assert!(listed, "{id} joins the cluster view");
    task
}

fn reply_body(fields: Value) -> Bytes {
    let Value::Object(fields) = fields else {
        unreachable!()
    };
    Bytes::from(serde_json::to_vec(&ActorReply::ok(fields)).unwrap())
}

fn assert_lost(reply: &Value, id: &str, took: Duration) {
    assert_eq!(reply["ok"], false, "{reply}");
    assert_eq!(reply["error"], "unavailable", "{reply}");
    assert_eq!(reply["details"]["node_id"], id, "{reply}");
    let message = reply["error_message"].as_str().unwrap();
    assert!(
        message.contains(&format!("sandbox worker {id} was lost")),
        "{message}"
    );
    assert!(reply.get("approval_released").is_none(), "{reply}");
    // Heartbeats stop at most 2 s before the claim and a node drops out after 6 s of silence:
    // the answer comes after about 4–6 s, far from the 150 s deadline.
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// The fake worker in a task of its own: it takes the next call and hands it to `then` with
/// a client and the call's reply subject; the task answers the worker's subscription, kept
/// until then (a worker still "running" the call).
fn serve<F, Fut>(c: &Cluster, mut worker: Subscriber, then: F) -> JoinHandle<Subscriber>
where
    F: FnOnce(Client, ActorCall, Subject) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let client = c.client.clone();
    tokio::spawn(async move {
        let (call, reply) = take_call(&mut worker).await;
        then(client, call, reply).await;
        worker
    })
}

/// Claims the call of `reply` as worker `id`.
async fn claim(client: &Client, reply: &Subject, id: &str) {
    publish_claim(client, reply, &node(id)).await.unwrap();
}

/// Worker `id` (heartbeating as `heart`) claims the call, then is killed with -9: no more
/// heartbeats, no reply, no goodbye; it keeps its subscription (it is "running" the call).
/// `call` is answered as lost, naming `id`, long before its deadline: the reply and its time.
async fn lost_after_claim(
    c: &Cluster,
    heart: JoinHandle<()>,
    id: &'static str,
    call: Value,
) -> (Value, Duration) {
    let worker = fake_worker(&c.client).await;
    let serve = serve(c, worker, move |client, _call, reply| async move {
        claim(&client, &reply, id).await;
        heart.abort();
    });
    let (reply, took) = call_timed(c, call, Duration::from_secs(30)).await;
    let _worker = serve.await.unwrap();
    assert_lost(&reply, id, took);
    (reply, took)
}

/// `then` as the fake worker for a `long_command` answered `within`: the reply and its time,
/// when the worker is done.
async fn served<F, Fut>(c: &Cluster, within: Duration, then: F) -> (Value, Duration)
where
    F: FnOnce(Client, ActorCall, Subject) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let worker = fake_worker(&c.client).await;
    let serve = serve(c, worker, then);
    let timed = call_timed(c, long_command(), within).await;
    serve.await.unwrap();
    timed
}

#[tokio::test]
async fn a_claimed_call_gets_the_reply_of_its_worker() {
    let c = cluster().await;
    let (reply, _) = served(&c, SOON, |client, call, reply| async move {
        assert_eq!(call.tool, "run_command");
        claim(&client, &reply, "worker-a").await;
        // The worker's own run time, not a wait: the reply comes a while after the
        // claim (both on the reply subject, so in that order anyway).
        tokio::time::sleep(Duration::from_millis(300)).await;
        client
            .publish(reply, reply_body(json!({"exit_code": 0, "stdout": "hi"})))
            .await
            .unwrap();
    })
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["exit_code"], 0, "{reply}");
    assert_eq!(reply["stdout"], "hi", "{reply}");
}

#[tokio::test]
async fn a_worker_lost_mid_call_is_unavailable_long_before_the_deadline() {
    let c = cluster().await;
    let heart = heartbeating(&c, "worker-b").await;
    let (_, took) = lost_after_claim(&c, heart, "worker-b", long_command()).await;
    assert!(took > Duration::from_secs(3), "lost too early: {took:?}");
}

#[tokio::test]
async fn an_approval_stays_used_when_its_worker_is_lost() {
    // Strict mode: run_command needs an approval. The call may have run on the lost worker, so
    // the approval it used is not given back (unlike "no responders").
    let c = Cluster::start().await;
    let reply = c.call("acme", long_command()).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    let id = reply["approval_request"]["id"].as_str().unwrap().to_owned();
    assert_eq!(c.decide("acme", &id, true).await["ok"], true);

    let heart = heartbeating(&c, "worker-g").await;
    let mut approved = long_command();
    approved["approval"] = json!({"id": id});
    lost_after_claim(&c, heart, "worker-g", approved).await;
    let got = c.approvals("acme", "get", json!({"id": id})).await;
    assert_eq!(got["approval"]["status"], "used", "{got}");
}

#[tokio::test]
async fn the_latest_claim_is_the_one_watched() {
    let c = cluster().await;
    // A stays alive throughout; B, to which A hands the call, dies.
    let heart_a = heartbeating(&c, "worker-ha").await;
    let heart_b = heartbeating(&c, "worker-hb").await;
    let worker = fake_worker(&c.client).await;
    let serve = serve(&c, worker, |client, _call, reply| async move {
        claim(&client, &reply, "worker-ha").await;
        // A's own time with the call before it hands it on, not a wait: the claims
        // reach the gateway in order on the reply subject anyway.
        tokio::time::sleep(Duration::from_millis(200)).await;
        claim(&client, &reply, "worker-hb").await;
        heart_b.abort();
    });
    let (reply, took) = call_timed(&c, long_command(), Duration::from_secs(30)).await;
    let _worker = serve.await.unwrap();
    heart_a.abort();
    assert_lost(&reply, "worker-hb", took);
}

#[tokio::test]
async fn a_draining_worker_is_not_lost() {
    // A `leaving` heartbeat means the node drains: it still answers its calls.
    let c = cluster().await;
    let heart = heartbeating(&c, "worker-d").await;
    let (reply, took) = served(&c, SLOW, |client, _call, reply| async move {
        claim(&client, &reply, "worker-d").await;
        heart.abort();
        beat(&client, "worker-d", true).await;
        // Longer than a node takes to drop out of the view: the test's subject (the
        // reply still counts after it), not a wait for an event.
        tokio::time::sleep(Duration::from_secs(8)).await;
        client
            .publish(reply, reply_body(json!({"exit_code": 0})))
            .await
            .unwrap();
    })
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    assert!(took >= Duration::from_secs(8), "{took:?}");
}

#[tokio::test]
async fn a_claimless_call_waits_for_its_reply() {
    // A worker that never claims is treated as before the claim protocol: the reply counts.
    let c = cluster().await;
    let (reply, _) = served(&c, SOON, |client, call, reply| async move {
        let mut fields = Map::new();
        fields.insert("seq".into(), Value::from(call.event_seq));
        client
            .publish(reply, reply_body(Value::Object(fields)))
            .await
            .unwrap();
    })
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["seq"], 1, "after `started` (seq 0): {reply}");
}

#[tokio::test]
async fn a_long_call_without_a_worker_is_unavailable_at_once() {
    let c = cluster().await;
    let (reply, took) = call_timed(&c, long_command(), Duration::from_secs(10)).await;
    assert_eq!(reply["error"], "unavailable", "{reply}");
    let message = reply["error_message"].as_str().unwrap();
    assert!(message.contains("no sandbox actor"), "{message}");
    assert!(reply.get("approval_released").is_none(), "{reply}");
    assert!(took < Duration::from_secs(1), "{took:?}");
}
