//! A node on a three-server NATS cluster (`toolmesh_testkit::NatsCluster`): given every
//! server's URL it keeps its streams at three replicas, and under a steady load of calls from
//! two accounts it survives the death of the server it is connected to and of the audit
//! stream's leader: every call gets one answer, the node is back within 5 s, each account's
//! audit chain stays one whole line, and the replay holds `finished` for every call answered
//! ok.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, consumer::DeliverPolicy};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use toolmesh_testkit::{wait_until, NatsCluster, NodeSpec, RedisServer};

use crate::support::BIN;

const NODE_ID: &str = "cluster-node-1";
/// The node's connection name (`toolmesh-<node id>`), as the servers' `/connz` list it.
const CONNECTION: &str = "toolmesh-cluster-node-1";
const ACCOUNTS: [&str; 2] = ["acme", "globex"];
const STREAMS: [&str; 2] = ["TOOLMESH_EVENTS", "TOOLMESH_AUDIT"];
/// How long a call of the load waits for its answer: an election of a stream's leader (about
/// 10 s) and the writer's budget around it fit in.
const CALL_WAIT: Duration = Duration::from_secs(45);
/// The callers must be back within this of losing their server.
const RECONNECT_BOUND: Duration = Duration::from_secs(5);
/// A call sent this long before a server died may still have been on its way (a stream's
/// leader moving before the kill holds calls for a moment).
const IN_FLIGHT_AT_KILL: Duration = Duration::from_secs(2);

/// One call of the load.
#[derive(Debug, Clone)]
struct Call {
    account: &'static str,
    invocation: String,
    tool: &'static str,
    sent: Instant,
}

/// What became of the calls: every answer each received, in order, and the calls that
/// received none within [`CALL_WAIT`].
#[derive(Debug, Default)]
struct Ledger {
    calls: Vec<Call>,
    answers: HashMap<String, Vec<(Instant, Value)>>,
}

/// The load: per account a writer, a reader and a status poller, each one call at a time,
/// paced. Every call has a reply subject of its own under one inbox, so a second answer to a
/// call would be seen.
struct Load {
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
    _demux: tokio::task::JoinHandle<()>,
}

type Waiters = Arc<Mutex<HashMap<String, tokio::sync::mpsc::UnboundedSender<Value>>>>;

impl Load {
    async fn start(client: &async_nats::Client) -> Load {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let waiters: Waiters = Arc::default();
        let inbox = client.new_inbox();
        let mut replies = client.subscribe(format!("{inbox}.*")).await.unwrap();
        client.flush().await.unwrap();
        let demux = tokio::spawn({
            let (ledger, waiters, prefix) = (ledger.clone(), waiters.clone(), format!("{inbox}."));
            async move {
                while let Some(msg) = replies.next().await {
                    let Some(token) = msg.subject.strip_prefix(prefix.as_str()) else {
                        continue;
                    };
                    // No responders (the call reached no gateway: the node's subscriptions
                    // were moving to another server) is NATS's `unavailable`.
                    let body: Value = if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                        json!({"ok": false, "error": "unavailable", "no_responders": true})
                    } else {
                        serde_json::from_slice(&msg.payload).unwrap_or_else(
                            |_| json!({"unparsed": String::from_utf8_lossy(&msg.payload)}),
                        )
                    };
                    ledger
                        .lock()
                        .unwrap()
                        .answers
                        .entry(token.to_owned())
                        .or_default()
                        .push((Instant::now(), body.clone()));
                    if let Some(tx) = waiters.lock().unwrap().get(token) {
                        let _ = tx.send(body);
                    }
                }
            }
        });
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for account in ACCOUNTS {
            for tool in [
                "write_workspace_file",
                "read_workspace_file",
                "component_status",
            ] {
                workers.push(tokio::spawn(worker(
                    client.clone(),
                    inbox.clone(),
                    account,
                    tool,
                    ledger.clone(),
                    waiters.clone(),
                    stop.clone(),
                )));
            }
        }
        Load {
            ledger,
            stop,
            workers,
            _demux: demux,
        }
    }

    /// Calls answered ok that were sent after `since`.
    fn ok_since(&self, since: Instant) -> usize {
        let ledger = self.ledger.lock().unwrap();
        ledger
            .calls
            .iter()
            .filter(|c| c.sent >= since && answered_ok(&ledger, c).is_some())
            .count()
    }

    /// What became of the calls sent after `since`, for a failure message: per outcome, a
    /// count and the last answer.
    fn since(&self, since: Instant) -> String {
        let ledger = self.ledger.lock().unwrap();
        let mut outcomes: HashMap<String, (usize, Value)> = HashMap::new();
        for call in ledger.calls.iter().filter(|c| c.sent >= since) {
            let (key, body) = match ledger.answers.get(&call.invocation).and_then(|a| a.first()) {
                None => ("no answer yet".to_owned(), Value::Null),
                Some((_, body)) if body["ok"] == true => ("ok".to_owned(), Value::Null),
                Some((_, body)) => (body["error"].to_string(), body.clone()),
            };
            let entry = outcomes.entry(key).or_insert((0, Value::Null));
            entry.0 += 1;
            entry.1 = body;
        }
        format!("{outcomes:?}")
    }

    /// How long after `since` the first call sent after it was answered ok.
    fn first_ok_after(&self, since: Instant) -> Option<Duration> {
        let ledger = self.ledger.lock().unwrap();
        ledger
            .calls
            .iter()
            .filter(|c| c.sent >= since)
            .filter_map(|c| answered_ok(&ledger, c))
            .min()
            .map(|at| at - since)
    }

    /// Stops the load and waits until every call sent has its answer or waited it out.
    async fn finish(self) -> Ledger {
        self.stop.cancel();
        for worker in self.workers {
            worker.await.unwrap();
        }
        Arc::try_unwrap(self.ledger)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|shared| std::mem::take(&mut *shared.lock().unwrap()))
    }
}

/// When `call` was first answered, if that answer was ok.
fn answered_ok(ledger: &Ledger, call: &Call) -> Option<Instant> {
    let (at, body) = ledger.answers.get(&call.invocation)?.first()?;
    (body["ok"] == true).then_some(*at)
}

/// Calls one worker of the load keeps waiting at most: past it, a tick sends nothing.
const MAX_IN_FLIGHT: usize = 4;

/// One worker of the load: calls `tool` for `account` every 40 ms until stopped, each call
/// waiting for its answer in a task of its own (a call whose answer was lost with its server
/// does not hold up the next), at most [`MAX_IN_FLIGHT`] at once.
async fn worker(
    client: async_nats::Client,
    inbox: String,
    account: &'static str,
    tool: &'static str,
    ledger: Arc<Mutex<Ledger>>,
    waiters: Waiters,
    stop: CancellationToken,
) {
    let session = format!("s-{account}");
    let mut pace = tokio::time::interval(Duration::from_millis(40));
    let mut calls = tokio::task::JoinSet::new();
    for n in 0u64.. {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = pace.tick() => {}
        }
        while calls.try_join_next().is_some() {}
        if calls.len() >= MAX_IN_FLIGHT {
            continue;
        }
        let invocation = format!("inv-{account}-{tool}-{n}");
        let arguments = match tool {
            "write_workspace_file" => {
                json!({"path": format!("f-{}.txt", n % 10), "content": format!("call {n}\n")})
            }
            "read_workspace_file" => json!({"path": "base.txt"}),
            _ => json!({}),
        };
        let body = json!({"tool": tool, "session_id": session, "invocation_id": invocation,
                          "arguments": arguments});
        let (tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
        waiters.lock().unwrap().insert(invocation.clone(), tx);
        let call = Call {
            account,
            invocation: invocation.clone(),
            tool,
            sent: Instant::now(),
        };
        ledger.lock().unwrap().calls.push(call);
        // Published while the client reconnects too: async-nats sends it once it is back.
        client
            .publish_with_reply(
                format!("toolmesh.v1.call.{account}"),
                format!("{inbox}.{invocation}"),
                serde_json::to_vec(&body).unwrap().into(),
            )
            .await
            .unwrap();
        let waiters = waiters.clone();
        calls.spawn(async move {
            let _ = tokio::time::timeout(CALL_WAIT, answers.recv()).await;
            waiters.lock().unwrap().remove(&invocation);
        });
    }
    // Every call sent gets its answer or waits it out.
    while calls.join_next().await.is_some() {}
}

/// The leader of `stream` as JetStream names it now (`None` while it has none).
async fn leader(js: &jetstream::Context, stream: &str) -> Option<String> {
    let mut found = js.get_stream(stream).await.ok()?;
    found.info().await.ok()?.cluster.clone()?.leader
}

/// Moves the leader of `stream` off the server named `server` (a stepdown), waiting until
/// another server leads it.
async fn lead_elsewhere(client: &async_nats::Client, stream: &str, server: &str) {
    let js = jetstream::new(client.clone());
    let moved = wait_until(Duration::from_secs(30), || async {
        match leader(&js, stream).await {
            Some(now) if now != server => true,
            Some(_) => {
                let _ = client
                    .request(
                        format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                        "".into(),
                    )
                    .await;
                false
            }
            None => false,
        }
    })
    .await;
    assert!(moved, "{stream} is still led by {server}");
}

/// Waits until `stream` has a leader and every replica of it is current (a restarted server
/// has caught up).
async fn stream_whole(client: &async_nats::Client, stream: &str) {
    let js = jetstream::new(client.clone());
    let whole = wait_until(Duration::from_secs(30), || async {
        let Ok(mut found) = js.get_stream(stream).await else {
            return false;
        };
        let Ok(info) = found.info().await else {
            return false;
        };
        let Some(cluster) = info.cluster.clone() else {
            return false;
        };
        cluster.leader.is_some()
            && cluster.replicas.len() == 2
            && cluster.replicas.iter().all(|r| r.current && !r.offline)
    })
    .await;
    assert!(whole, "{stream} did not get whole again");
}

/// Every `finished` RunEvent kept in `TOOLMESH_EVENTS`: the invocation ids.
async fn replayed_finished(client: &async_nats::Client) -> HashSet<String> {
    let js = jetstream::new(client.clone());
    let consumer = js
        .create_consumer_on_stream(
            pull::OrderedConfig {
                filter_subject: "toolmesh.v1.events.>".to_owned(),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            },
            "TOOLMESH_EVENTS",
        )
        .await
        .expect("an ordered consumer on TOOLMESH_EVENTS");
    let mut pending = consumer.cached_info().num_pending;
    let mut messages = consumer.messages().await.expect("messages");
    let mut finished = HashSet::new();
    while pending > 0 {
        let msg = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("the kept events arrive")
            .expect("the stream goes on")
            .expect("a message");
        pending = msg.info().expect("a JetStream message").pending;
        let event: Value = serde_json::from_slice(&msg.payload).expect("json");
        if event["kind"] == "finished" {
            finished.insert(event["invocation_id"].as_str().unwrap().to_owned());
        }
    }
    finished
}

/// `toolmesh <args>` with every server's URL: exit code, stdout, stderr.
fn cli(urls: &str, args: &[&str]) -> (i32, String, String) {
    let output = std::process::Command::new(BIN)
        .args(args)
        .env("TOOLMESH_NATS_URL", urls)
        .output()
        .expect("the cli runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_rides_out_a_dead_server_and_a_new_audit_leader_under_load() {
    let mut nats = NatsCluster::start().await;
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    // The test's own caller, connected as a client command is (every URL, the same reconnects).
    let client = toolmesh_kernel::host::connect_client(&nats.urls(), "nats-cluster-test")
        .await
        .expect("the test connects to the cluster");
    let _node = NodeSpec::new(BIN, "gateway,approval,workspace", NODE_ID)
        .env("TOOLMESH_NATS_URL", nats.urls())
        .env("TOOLMESH_STREAM_REPLICAS", "3")
        .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
        .env("TOOLMESH_REDIS_URL", redis.url())
        .env("TOOLMESH_DATA_DIR", data.path().display().to_string())
        .start(&client)
        .await;
    let js = jetstream::new(client.clone());
    for stream in STREAMS {
        let info = js.get_stream(stream).await.unwrap().cached_info().clone();
        assert_eq!(info.config.num_replicas, 3, "{stream}: {:?}", info.config);
        assert_eq!(info.cluster.unwrap().replicas.len(), 2, "{stream}");
    }
    for account in ACCOUNTS {
        let wrote = toolmesh_testkit::request_json(
            &client,
            format!("toolmesh.v1.call.{account}"),
            json!({"tool": "write_workspace_file", "session_id": format!("s-{account}"),
                   "arguments": {"path": "base.txt", "content": "base\n"}}),
        )
        .await;
        assert_eq!(wrote["ok"], true, "{wrote}");
    }

    let load = Load::start(&client).await;
    let began = Instant::now();
    assert!(
        wait_until(Duration::from_secs(20), || async {
            load.ok_since(began) >= 30
        })
        .await,
        "the load does not get through: {}",
        load.since(began)
    );

    // 1. The server the node is connected to dies. The streams are led elsewhere first: this
    // measures the node's move, not an election (2. is one).
    let own = nats
        .serving(CONNECTION)
        .await
        .expect("the node is connected");
    for stream in STREAMS {
        lead_elsewhere(&client, stream, nats.server_name(own)).await;
    }
    nats.kill(own);
    let killed = Instant::now();
    let mut kills = vec![killed];
    let moved_to = loop {
        if let Some(server) = nats.serving(CONNECTION).await {
            break server;
        }
        assert!(
            killed.elapsed() < RECONNECT_BOUND * 2,
            "the node did not reconnect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let reconnected = killed.elapsed();
    assert_ne!(moved_to, own);
    assert!(
        wait_until(Duration::from_secs(30), || async {
            load.ok_since(killed) >= 100
        })
        .await,
        "the load does not get through after the kill: {}",
        load.since(killed)
    );
    let first_ok = load.first_ok_after(killed).expect("a call answered ok");
    eprintln!(
        "server {own} killed: the node was connected to server {moved_to} after {reconnected:?}, \
         the first call sent after the kill was answered ok {first_ok:?} after it"
    );
    assert!(
        first_ok < RECONNECT_BOUND,
        "first ok call {first_ok:?} after the kill"
    );
    nats.restart(own);
    nats.wait_for_jetstream().await;
    for stream in STREAMS {
        stream_whole(&client, stream).await;
    }

    // 2. The audit stream's leader dies: a new one is elected while the calls wait, and the
    // chains stay one line each.
    let audit_leader = leader(&js, "TOOLMESH_AUDIT").await.expect("a leader");
    let at = nats.index_of(&audit_leader).unwrap();
    nats.kill(at);
    let killed = Instant::now();
    kills.push(killed);
    assert!(
        wait_until(Duration::from_secs(40), || async {
            load.ok_since(killed) >= 100
        })
        .await,
        "the load does not get through after the audit leader died: {}",
        load.since(killed)
    );
    let first_ok = load.first_ok_after(killed).expect("a call answered ok");
    let new_leader = leader(&js, "TOOLMESH_AUDIT").await;
    eprintln!(
        "audit leader {audit_leader} killed: new leader {new_leader:?}, the first call sent \
         after the kill was answered ok {first_ok:?} after it"
    );
    assert_ne!(new_leader.as_deref(), Some(audit_leader.as_str()));
    nats.restart(at);
    nats.wait_for_jetstream().await;
    for stream in STREAMS {
        stream_whole(&client, stream).await;
    }

    let ledger = load.finish().await;

    // Every call: exactly one answer (the tool's, `unavailable` or `timeout`), or none within
    // CALL_WAIT: a call in flight when a server died whose request or reply died with it (the
    // caller's `timeout`). A call sent once the kill was over is answered.
    let mut tally: HashMap<String, usize> = HashMap::new();
    for call in &ledger.calls {
        let answers = ledger
            .answers
            .get(&call.invocation)
            .map_or(&[][..], Vec::as_slice);
        assert!(
            answers.len() <= 1,
            "{} answered twice: {answers:?}",
            call.invocation
        );
        let outcome = match answers.first() {
            None => {
                let in_flight = kills
                    .iter()
                    .any(|&kill| call.sent <= kill && kill - call.sent < IN_FLIGHT_AT_KILL);
                assert!(
                    in_flight,
                    "{} was sent {:?} after the load began, when no server died, and got no answer",
                    call.invocation,
                    call.sent - began
                );
                "no answer".to_owned()
            }
            Some((_, body)) if body["ok"] == true => "ok".to_owned(),
            Some((_, body)) => {
                let code = body["error"].as_str().unwrap_or("?").to_owned();
                assert!(
                    ["unavailable", "timeout"].contains(&code.as_str()),
                    "{} ({}): {body}",
                    call.invocation,
                    call.tool
                );
                code
            }
        };
        *tally.entry(outcome).or_default() += 1;
    }
    eprintln!("{} calls: {tally:?}", ledger.calls.len());
    let ok: Vec<&Call> = ledger
        .calls
        .iter()
        .filter(|c| answered_ok(&ledger, c).is_some())
        .collect();

    // The replay holds `finished` for every call answered ok.
    let finished = replayed_finished(&client).await;
    let missing: Vec<&str> = ok
        .iter()
        .filter(|c| !finished.contains(&c.invocation))
        .map(|c| c.invocation.as_str())
        .collect();
    assert!(missing.is_empty(), "no finished event for {missing:?}");

    // Each account's chain verifies whole, and holds each entry of a call once.
    let urls = nats.urls();
    for account in ACCOUNTS {
        let (code, report, stderr) = cli(&urls, &["audit", "verify", "--account", account]);
        assert_eq!(code, 0, "{account}: {report} {stderr}");
        let report: Value = serde_json::from_str(&report).unwrap();
        assert_eq!(report["genesis"], true, "{report}");
        let (code, list, stderr) = cli(&urls, &["audit", "list", "--account", account]);
        assert_eq!(code, 0, "{stderr}");
        let mut seen: HashMap<(String, String), u64> = HashMap::new();
        for line in list.lines() {
            let entry: Value = serde_json::from_str(line).unwrap();
            if entry["kind"] != "call" {
                continue;
            }
            let key = (
                entry["invocation_id"].as_str().unwrap().to_owned(),
                entry["status"].as_str().unwrap().to_owned(),
            );
            if let Some(before) = seen.insert(key.clone(), entry["seq"].as_u64().unwrap()) {
                panic!(
                    "{key:?} is on the chain twice: seq {before} and {}",
                    entry["seq"]
                );
            }
        }
        for call in ok.iter().filter(|c| c.account == account) {
            let has = |status: &str| seen.contains_key(&(call.invocation.clone(), status.into()));
            assert!(has("finished"), "{} has no finished entry", call.invocation);
            if call.tool == "write_workspace_file" {
                assert!(has("started"), "{} has no started entry", call.invocation);
            }
        }
        eprintln!(
            "{account}: {} entries, {} open calls",
            report["entries"],
            report["open_calls"].as_array().map_or(0, Vec::len)
        );
    }
}

/// A bad server list stops a node and a client command before they connect, naming the
/// setting and the server at fault, never the password.
#[test]
fn a_bad_server_list_is_refused_naming_the_setting_and_the_server() {
    let list = "nats://toolmesh:s3cret@127.0.0.1:4222,,nats://127.0.0.1:4223";
    for args in [&["node", "--roles", "gateway"][..], &["status"]] {
        let output = std::process::Command::new(BIN)
            .args(args)
            .env("TOOLMESH_NATS_URL", list)
            .env("RUST_LOG", "warn")
            .output()
            .expect("toolmesh runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains("TOOLMESH_NATS_URL"), "{args:?}: {stderr}");
        assert!(
            stderr.contains("server 2 of the list is empty"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("s3cret"), "{args:?}: {stderr}");
    }
    let (code, _, stderr) = cli(
        "nats://a:s3cret@127.0.0.1:4222,nats://b:other@127.0.0.1:4223",
        &["status"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("name different users"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// A node given a list whose first server is down comes up on the next; a client command
/// with the same list reaches it.
#[tokio::test]
async fn a_node_comes_up_on_the_server_of_its_list_that_answers() {
    let nats = toolmesh_testkit::NatsServer::start();
    let down = toolmesh_testkit::ClosedPort::new();
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let list = format!("nats://127.0.0.1:{},{}", down.port(), nats.url());
    let node = NodeSpec::new(BIN, "gateway,approval", "list-node-1")
        .env("TOOLMESH_NATS_URL", &list)
        .env("TOOLMESH_REDIS_URL", redis.url())
        .env("TOOLMESH_DATA_DIR", data.path().display().to_string())
        .start(&nats.client().await)
        .await;
    let (code, status, stderr) = cli(&list, &["status"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(status.contains(&node.node_id), "{status}");
}
