//! Redis through Sentinel, end to end: a node finds the primary through the sentinels
//! (`TOOLMESH_REDIS_SENTINELS`), follows it through a failover by itself, and acknowledges a
//! decision only once a replica has it (`WAIT`, one replica by default with sentinels).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;
use toolmesh_testkit::{redis_cli, wait_until, RedisSentinels};

use crate::support::{assert_holds, collect, ok, policy_file, Cluster, GATED_STATUS};

/// Long enough for the sentinels to call the primary down, agree and promote a replica, and
/// for the other replicas to follow it.
const FAILOVER: Duration = Duration::from_secs(30);

/// Servers, a primary with `replicas` replicas under three sentinels, and one node of gateway
/// and approval that finds Redis through the sentinels, `component_status` gated.
async fn through_sentinels(replicas: usize) -> (Cluster, RedisSentinels, tempfile::TempDir) {
    let set = RedisSentinels::start(replicas);
    let (dir, path) = policy_file(GATED_STATUS);
    let mut c = Cluster::servers().await;
    let sentinels = set.sentinels();
    c.start_node(
        "gateway,approval",
        &[
            ("TOOLMESH_POLICY_FILE", path.as_str()),
            ("TOOLMESH_REDIS_SENTINELS", sentinels.as_str()),
        ],
    )
    .await;
    (c, set, dir)
}

fn status_call(session: &str) -> Value {
    json!({"tool": "component_status", "session_id": session})
}

/// The id of a new approval of acme, asked for by a call in `session`.
async fn approval_id(c: &Cluster, session: &str) -> String {
    let reply = c.call("acme", status_call(session)).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    reply["approval_request"]["id"].as_str().unwrap().to_owned()
}

/// alice's decision on `id`, in a task of its own.
fn decide_in_background(c: &Cluster, id: &str, approved: bool) -> JoinHandle<Value> {
    let client = c.client.clone();
    let body = json!({"id": id, "approved": approved, "approver": "alice"});
    tokio::spawn(async move {
        toolmesh_testkit::request_json(&client, "toolmesh.v1.approvals.acme.decide", body).await
    })
}

/// Asks until the answer is `ok` (within [`FAILOVER`]): the answer.
async fn until_ok<F, Fut>(mut ask: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let reply = std::cell::RefCell::new(Value::Null);
    let answered = toolmesh_testkit::wait_until(FAILOVER, || {
        let asked = ask();
        let reply = &reply;
        async move {
            let answer = asked.await;
            let ok = answer["ok"] == true;
            *reply.borrow_mut() = answer;
            ok
        }
    })
    .await;
    let reply = reply.into_inner();
    assert!(answered, "never ok: {reply}");
    reply
}

/// Decides `id` until the node acknowledges it: a decision not acknowledged may or may not be
/// in Redis, and its retry is acknowledged either way.
async fn decide_until_acknowledged(c: &Cluster, id: &str, approved: bool) -> Value {
    let body = json!({"id": id, "approved": approved, "approver": "alice"});
    until_ok(|| c.approvals("acme", "decide", body.clone())).await
}

/// The status of approval `id` in the hash the store keeps, read on the server at `port`.
fn stored_status(port: u16, id: &str) -> Option<String> {
    let key = format!("toolmesh:approval:acme:{id}");
    redis_cli(port, &["HGET", &key, "status"]).map(|s| s.trim().to_owned())
}

#[tokio::test]
async fn a_failover_loses_no_acknowledged_decision_and_the_node_finds_the_new_primary() {
    // Two replicas: after the failover one is left for the decisions to wait for.
    let (c, mut set, _policy) = through_sentinels(2).await;
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        for i in 0..20 {
            ids.push(approval_id(&c, &format!("s{i}")).await);
        }
        ids
    };
    // Calls parked on approvals of their own, decided only once the primary has moved.
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let parked: Vec<JoinHandle<Value>> = (0..4)
        .map(|i| {
            let mut body = status_call(&format!("p{i}"));
            body["wait_for_approval_s"] = json!(120);
            c.call_in_background("acme", body)
        })
        .collect();
    let announced = collect(&mut requested, parked.len(), Duration::from_secs(10)).await;
    let parked_ids: Vec<String> = announced
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(parked_ids.len(), parked.len(), "{announced:?}");
    let approve = |i: usize| i.is_multiple_of(2);

    // Eight decisions before the kill: each acknowledged once a replica has it.
    let mut replies: Vec<(usize, JoinHandle<Value>)> = Vec::new();
    for (i, id) in ids.iter().enumerate().take(8) {
        ok(decide_in_background(&c, id, approve(i)).await.unwrap());
    }
    // Six in flight when the primary dies: its writes are held (CLIENT PAUSE) until one of
    // them is seen waiting there, then it is killed.
    let old = set.primary_port().expect("the sentinels name a primary");
    assert!(redis_cli(old, &["CLIENT", "PAUSE", "20000", "WRITE"]).is_some());
    for (i, id) in ids.iter().enumerate().take(14).skip(8) {
        replies.push((i, decide_in_background(&c, id, approve(i))));
    }
    let held = wait_until(Duration::from_secs(10), || async {
        redis_cli(old, &["INFO", "clients"]).is_some_and(|info| !info.contains("blocked_clients:0"))
    })
    .await;
    assert!(held, "a decision reaches the paused primary");
    assert_eq!(set.kill_primary(), old);
    let killed = Instant::now();
    // Six more while the sentinels fail over.
    for (i, id) in ids.iter().enumerate().skip(14) {
        replies.push((i, decide_in_background(&c, id, approve(i))));
    }
    let new = set
        .failed_over_from(old, FAILOVER)
        .await
        .expect("the sentinels promote a replica");
    eprintln!("failed over from {old} to {new} in {:?}", killed.elapsed());

    let mut acknowledged: Vec<usize> = (0..8).collect();
    let mut unacknowledged = Vec::new();
    for (i, reply) in replies {
        let reply = reply.await.unwrap();
        match reply["ok"] == true {
            true => acknowledged.push(i),
            false => {
                assert_eq!(reply["error"], "unavailable", "{reply}");
                unacknowledged.push(i);
            }
        }
    }
    assert!(
        unacknowledged.iter().any(|i| (8..14).contains(i)),
        "the decisions held by the dead primary were not acknowledged"
    );

    // Every acknowledged decision is on the new primary, and the node reads it there.
    for &i in &acknowledged {
        let want = if approve(i) { "approved" } else { "rejected" };
        assert_eq!(
            stored_status(new, &ids[i]).as_deref(),
            Some(want),
            "{}",
            ids[i]
        );
        let got = until_ok(|| c.approvals("acme", "get", json!({"id": ids[i]}))).await;
        assert_eq!(got["approval"]["status"], want, "{got}");
    }
    // The others can still be decided (their first try may or may not have reached Redis).
    for &i in &unacknowledged {
        let decided = decide_until_acknowledged(&c, &ids[i], approve(i)).await;
        let want = if approve(i) { "approved" } else { "rejected" };
        assert_eq!(decided["approval"]["status"], want, "{decided}");
        assert_eq!(stored_status(new, &ids[i]).as_deref(), Some(want));
    }
    // The parked calls run once their approvals are decided on the new primary.
    for id in &parked_ids {
        decide_until_acknowledged(&c, id, true).await;
    }
    for call in parked {
        let reply = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("a parked call completes")
            .unwrap();
        assert!(ok(reply)["summary"].is_object());
    }
    for id in &parked_ids {
        assert_eq!(stored_status(new, id).as_deref(), Some("used"));
    }
    // The node found the new primary by itself, and said so.
    let switched = format!("from=127.0.0.1:{old} to=127.0.0.1:{new}");
    assert!(
        c.nodes[0].logs(&switched, Duration::from_secs(1)),
        "no log line with {switched}"
    );
}

#[tokio::test]
async fn a_decision_no_replica_confirms_is_unavailable_after_the_wait_and_its_retry_is_ok() {
    let (c, mut set, _policy) = through_sentinels(1).await;
    let id = approval_id(&c, "s1").await;
    let primary = set.primary_port().expect("the sentinels name a primary");
    let replica = *set.ports().iter().find(|p| **p != primary).unwrap();
    set.server(replica).kill();
    let gone = wait_until(Duration::from_secs(10), || async {
        set.has_replicas(primary, 0)
    })
    .await;
    assert!(gone, "the primary sees its replica go");

    let started = Instant::now();
    let reply = c.decide("acme", &id, true).await;
    let took = started.elapsed();
    assert_eq!(reply["error"], "unavailable", "{reply}");
    assert_holds(&reply, "error_message", "replicas");
    // `TOOLMESH_REDIS_WAIT_MS` is 1000 by default.
    assert!(
        (Duration::from_millis(1000)..Duration::from_millis(2500)).contains(&took),
        "answered after {took:?}"
    );
    // The decision is on the primary all the same, not yet safe, and not acknowledged.
    assert_eq!(stored_status(primary, &id).as_deref(), Some("approved"));

    // With the replica back, the retry is acknowledged, as the first decision.
    set.server(replica).restart();
    let back = wait_until(Duration::from_secs(20), || async {
        set.has_replicas(primary, 1)
    })
    .await;
    assert!(back, "the replica is back in sync");
    let retried = ok(c.decide("acme", &id, true).await);
    assert_eq!(retried["approval"]["status"], "approved", "{retried}");
    assert_eq!(retried["approval"]["decided_by"], "alice", "{retried}");
}
