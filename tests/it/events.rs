//! Durable RunEvents: `TOOLMESH_EVENTS` on a JetStream server, replay by a late observer
//! (a plain JetStream consumer and `toolmesh events`), a NATS restart, and a server without
//! JetStream.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::wait_until;

use crate::support::{node_refusal, ok, Cluster, BIN};

async fn finished_call(c: &Cluster, invocation: &str) {
    ok(c.call(
        "acme",
        json!({"tool": "component_status", "invocation_id": invocation, "session_id": "s1"}),
    )
    .await);
}

/// Every kept event of `subject`, through an ordered consumer that delivers all.
async fn replay(client: &async_nats::Client, subject: &str, n: usize) -> Vec<Value> {
    let js = async_nats::jetstream::new(client.clone());
    let consumer = js
        .create_consumer_on_stream(
            pull::OrderedConfig {
                filter_subject: subject.to_owned(),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            },
            "TOOLMESH_EVENTS",
        )
        .await
        .expect("an ordered consumer on TOOLMESH_EVENTS");
    let mut messages = consumer.messages().await.expect("messages");
    let mut got = Vec::new();
    while got.len() < n {
        let msg = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .expect("the kept events arrive")
            .expect("the stream goes on")
            .expect("a message");
        got.push(serde_json::from_slice(&msg.payload).expect("json"));
    }
    got
}

fn assert_one_call(events: &[Value], invocation: &str) {
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["started", "finished"], "{events:?}");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"], i as u64, "{e}");
        assert_eq!(e["invocation_id"], invocation, "{e}");
    }
}

/// `toolmesh events` as a child process, its stdout lines on a channel.
struct EventsCli {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl EventsCli {
    fn start(nats_url: &str, args: &[&str]) -> EventsCli {
        let mut child = Command::new(BIN)
            .arg("events")
            .args(args)
            .env("TOOLMESH_NATS_URL", nats_url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("toolmesh events runs");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        EventsCli { child, lines }
    }

    /// The next `n` event bodies it printed.
    fn next(&self, n: usize) -> Vec<Value> {
        (0..n)
            .map(|_| {
                let line = self
                    .lines
                    .recv_timeout(Duration::from_secs(30))
                    .expect("toolmesh events prints the event");
                let v: Value = serde_json::from_str(&line).expect("a json line");
                v["body"].clone()
            })
            .collect()
    }

    /// What it printed within `wait` more.
    fn nothing_more(&self, wait: Duration) {
        if let Ok(line) = self.lines.recv_timeout(wait) {
            panic!("unexpected event {line}");
        }
    }

    fn stderr(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut text = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
        }
        text
    }
}

impl Drop for EventsCli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_late_observer_replays_a_finished_call_in_order() {
    let mut c = Cluster::servers_with_jetstream().await;
    c.start_node("gateway,approval", &[]).await;
    let status = c.call("acme", json!({"tool": "component_status"})).await;
    assert_eq!(
        status["events"],
        json!({"durable": true, "stream": "TOOLMESH_EVENTS"}),
        "{status}"
    );
    finished_call(&c, "inv-late1").await;
    // Joined after the call finished: a plain JetStream consumer.
    let kept = replay(&c.client, "toolmesh.v1.events.acme.inv-late1", 2).await;
    assert_one_call(&kept, "inv-late1");
    assert_eq!(kept[1]["ok"], true);
    // And the CLI, which then follows.
    let cli = EventsCli::start(
        &c.nats.url(),
        &["--account", "acme", "--invocation", "inv-late1"],
    );
    assert_one_call(&cli.next(2), "inv-late1");
    cli.nothing_more(Duration::from_millis(500));
}

#[tokio::test]
async fn the_cli_follows_across_a_nats_restart_without_gaps_or_duplicates() {
    let mut c = Cluster::servers_with_jetstream().await;
    c.start_node("gateway,approval", &[]).await;
    finished_call(&c, "inv-before").await;
    let cli = EventsCli::start(&c.nats.url(), &["--account", "acme"]);
    assert_one_call(&cli.next(2), "inv-before");
    c.nats.restart();
    // The node and the test client reconnect; the next call is kept and followed.
    let answered = wait_until(Duration::from_secs(20), || async {
        let body = br#"{"tool":"component_status","invocation_id":"inv-probe"}"#;
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            c.client
                .request("toolmesh.v1.call.acme", body.as_slice().into()),
        )
        .await;
        let Ok(Ok(msg)) = answer else { return false };
        let reply: Value = serde_json::from_slice(&msg.payload).expect("json");
        reply["ok"] == true
    })
    .await;
    assert!(answered, "no answer after the restart");
    finished_call(&c, "inv-after").await;
    let mut seen = cli.next(2);
    // The probe may have needed tries; each answered try is one call of its own.
    while seen.iter().any(|e| e["invocation_id"] == "inv-probe") || seen.len() < 2 {
        seen.retain(|e| e["invocation_id"] != "inv-probe");
        seen.extend(cli.next(1));
    }
    assert_one_call(&seen, "inv-after");
    cli.nothing_more(Duration::from_millis(500));
}

#[tokio::test]
async fn without_jetstream_status_says_so_and_calls_answer() {
    let c = Cluster::start().await;
    let status = ok(c.call("acme", json!({"tool": "component_status"})).await);
    assert_eq!(status["events"]["durable"], false, "{status}");
    assert!(status["events"]["reason"]
        .as_str()
        .is_some_and(|r| !r.is_empty()));
    // The CLI falls back to live events and says so.
    let cli = EventsCli::start(
        &c.nats.url(),
        &["--account", "acme", "--invocation", "inv-live1"],
    );
    let wait = std::time::Instant::now() + Duration::from_secs(10);
    let subject = "toolmesh.v1.events.acme.inv-live1";
    let mut events = c.watch(subject).await;
    // The CLI prints only what comes after its subscription: wait until the server has it
    // (the test's own and the CLI's).
    assert!(
        wait_until(Duration::from_secs(10), || async {
            c.nats.interest(subject).await >= 2
        })
        .await,
        "the CLI did not subscribe"
    );
    finished_call(&c, "inv-live1").await;
    let _ = crate::support::collect(&mut events, 2, Duration::from_secs(5)).await;
    assert_one_call(&cli.next(2), "inv-live1");
    assert!(std::time::Instant::now() < wait);
    let stderr = cli.stderr();
    assert!(stderr.contains("live events only"), "{stderr}");
}

#[test]
fn bad_event_limits_stop_the_node_naming_the_variable() {
    for (key, value) in [
        ("TOOLMESH_EVENTS_MAX_AGE_S", "0"),
        ("TOOLMESH_EVENTS_MAX_AGE_S", "day"),
        ("TOOLMESH_EVENTS_MAX_BYTES", "-1"),
    ] {
        let stderr = node_refusal("gateway", &[(key, value)]);
        assert!(stderr.contains(key), "{key}={value}: {stderr}");
    }
}

#[tokio::test]
async fn an_account_user_replays_its_own_events_and_not_another_accounts() {
    let nats = toolmesh_testkit::AuthNats::start();
    let node_client = nats.client("node").await;
    let redis = toolmesh_testkit::RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let _node = toolmesh_testkit::NodeSpec::new(BIN, "gateway,approval", "events-auth-1")
        .env(
            "TOOLMESH_NATS_URL",
            format!("nats://toolmesh:node-pw@127.0.0.1:{}", nats.port()),
        )
        .env("TOOLMESH_REDIS_URL", redis.url())
        .env("TOOLMESH_DATA_DIR", data.path().display().to_string())
        .start(&node_client)
        .await;
    for account in ["acme", "globex"] {
        let client = nats.client(account).await;
        let body = format!(r#"{{"tool":"component_status","invocation_id":"inv-{account}"}}"#);
        let msg = tokio::time::timeout(
            Duration::from_secs(10),
            client.request(format!("toolmesh.v1.call.{account}"), body.into()),
        )
        .await
        .expect("an answer in time")
        .expect("an answer");
        let reply: Value = serde_json::from_slice(&msg.payload).expect("json");
        assert_eq!(reply["events"]["durable"], true, "{reply}");
    }
    let as_acme = |args: &[&str]| {
        let mut all = vec!["--inbox-prefix", "_INBOX.acme"];
        all.extend_from_slice(args);
        EventsCli::start(&nats.url("acme"), &all)
    };
    // Its own: replayed.
    let own = as_acme(&["--account", "acme", "--invocation", "inv-acme"]);
    assert_one_call(&own.next(2), "inv-acme");
    // Another account's (kept: globex's call above ran): the broker refuses the consumer
    // create; nothing of globex is printed.
    let other = as_acme(&["--account", "globex", "--invocation", "inv-globex"]);
    other.nothing_more(Duration::from_secs(8));
    let stderr = other.stderr();
    assert!(!stderr.contains("\"kind\""), "{stderr}");
    // It says why instead of waiting on live events it may not read either.
    assert!(
        stderr.contains("no replay of toolmesh.v1.events.globex.inv-globex"),
        "{stderr}"
    );
}
