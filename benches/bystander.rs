//! A bystander's latency while one session's sandbox is hostile (issue 16, items 1 and 2).
//!
//! `cargo bench --bench bystander` starts a nats-server, a redis-server and one node with the
//! roles `gateway,approval,workspace,sandbox` (Docker backend, approvals off, the default
//! runtime threads), as the issue found it. Another account calls `component_status` back to
//! back (10 ms apart) the whole time, and each section prints that bystander's p50/p99/max:
//!
//! 1. **idle**: nothing else runs, for `BENCH_WINDOW_S` seconds (the floor).
//! 2. **deep sync**: one session's command makes a 20,000-deep chain of 200-character folders
//!    (Python in the sandbox), then `BENCH_SYNCS` commands `true` each sync it back again.
//! 3. **removal**: in a new node (the deep tree's node is killed, and its tree removed by the
//!    bench), a session makes 100,000 folders (100 × 1000; "wide make"), goes idle, and the
//!    "removal" window runs from the command's reply until the worker has removed its sandbox
//!    folder from the host (idle TTL 3 s first).
//!
//! `BENCH_NODE_BIN` runs another build of the node (e.g. one before a fix) with the same load
//! generator. Every container the run made is removed at the end.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use toolmesh_testkit::{request_json_within, NatsServer, Node, NodeSpec, RedisServer};

mod support;
use support::{load_average, ms, node_on, percentile, wait_until_quiet, NodeContainers};

const ROLES: &str = "gateway,approval,workspace,sandbox";
const LONG: Duration = Duration::from_secs(300);

/// The bystander: `component_status` as another account until `stop`; its latencies.
async fn bystander(
    client: async_nats::Client,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Duration> {
    let mut out = Vec::new();
    while !*stop.borrow() {
        let t = Instant::now();
        let r = request_json_within(
            &client,
            "toolmesh.v1.call.bystander",
            json!({"tool": "component_status", "session_id": "b1"}),
            LONG,
        )
        .await;
        out.push(t.elapsed());
        assert_eq!(r["ok"], true, "{r}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    out
}

/// Runs `work` while the bystander calls; prints and returns its figures.
async fn with_bystander<F: std::future::Future<Output = String>>(
    client: &async_nats::Client,
    label: &str,
    work: F,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(bystander(client.clone(), stopped));
    let started = Instant::now();
    let note = work.await;
    let took = started.elapsed();
    stop.send(true).expect("bystander listens");
    let mut lat = watcher.await.expect("bystander");
    lat.sort();
    if lat.is_empty() {
        println!("{label:<12} no calls ({:.1} s; {note})", took.as_secs_f64());
        return;
    }
    println!(
        "{label:<12} {:>6} calls  p50 {:>9.2} ms  p99 {:>9.2} ms  max {:>9.2} ms   ({:.1} s; {note})",
        lat.len(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().expect("one call at least")),
        took.as_secs_f64(),
    );
}

async fn run_command(client: &async_nats::Client, session: &str, command: &str) -> Value {
    request_json_within(
        client,
        "toolmesh.v1.call.bench",
        json!({"tool": "run_command", "session_id": session,
            "arguments": {"command": command, "timeout": 300}}),
        LONG,
    )
    .await
}

/// What a reply says, shortly: its error, or its sync's `truncated`.
fn brief(r: &Value) -> String {
    match r["error"].as_str() {
        Some(e) => format!("error {e}"),
        None => format!("sync truncated {}", r["workspace_sync"]["truncated"]),
    }
}

fn node_spec(bin: &str, id: &str, nats: &NatsServer, redis: &RedisServer, data: &Path) -> NodeSpec {
    node_on(bin, ROLES, id, nats, redis, data)
        .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
        .env("TOOLMESH_SANDBOX_IDLE_TTL_S", "3")
}

fn sandbox_folder(data: &Path, node: &str, reply: &Value) -> PathBuf {
    let id = reply["sandbox_id"].as_str().unwrap_or("none");
    data.join("sandboxes").join(node).join(id)
}

fn main() {
    support::block_on(run());
}

async fn run() {
    let bin = std::env::var("BENCH_NODE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_toolmesh").to_owned());
    let window = Duration::from_secs(
        std::env::var("BENCH_WINDOW_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    );
    let syncs: usize = std::env::var("BENCH_SYNCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let run_id = std::process::id();
    let (first, second) = (
        format!("bench-bys-a-{run_id}"),
        format!("bench-bys-b-{run_id}"),
    );
    let _cleanup = NodeContainers(vec![first.clone(), second.clone()]);
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let client = nats.client().await;
    println!(
        "toolmesh bystander bench: node {bin}, one node ({ROLES}), load {}",
        load_average()
    );

    // 1 and 2 on the first node.
    let mut node: Node = node_spec(&bin, &first, &nats, &redis, data.path())
        .start(&client)
        .await;
    let warm = run_command(&client, "deep", "true").await;
    assert_eq!(warm["ok"], true, "{warm}");
    println!(
        "idle: {}",
        wait_until_quiet(0.10, 5, Duration::from_secs(120)).await
    );
    with_bystander(&client, "idle", async {
        tokio::time::sleep(window).await;
        "nothing else".to_owned()
    })
    .await;
    println!(
        "deep sync: {}",
        wait_until_quiet(0.10, 5, Duration::from_secs(120)).await
    );
    let deep = "python3 -c \"import os\nfor _ in range(20000):\n    os.mkdir('d' * 200)\n    os.chdir('d' * 200)\"";
    let mut folder = PathBuf::new();
    with_bystander(&client, "deep sync", async {
        let made = run_command(&client, "deep", deep).await;
        folder = sandbox_folder(data.path(), &first, &made);
        let mut notes = vec![format!("make: {}", brief(&made))];
        for _ in 0..syncs {
            let r = run_command(&client, "deep", "true").await;
            notes.push(brief(&r));
        }
        notes.join(", ")
    })
    .await;
    node.kill();
    // The deep tree goes with coreutils (fts, no recursion), not timed.
    let _ = Command::new("rm").arg("-rf").arg(&folder).status();
    drop(NodeContainers(vec![first.clone()]));

    // 3 on a new node.
    let node = node_spec(&bin, &second, &nats, &redis, data.path())
        .start(&client)
        .await;
    let wide = "python3 -c \"import os\nfor i in range(100):\n    for j in range(1000):\n        os.makedirs(f'w/{i}/{j}')\"";
    let warm = run_command(&client, "wide", "true").await;
    assert_eq!(warm["ok"], true, "{warm}");
    println!(
        "removal: {}",
        wait_until_quiet(0.10, 5, Duration::from_secs(120)).await
    );
    // The idle TTL runs from the command's end: the removal window follows at once.
    let mut folder = PathBuf::new();
    with_bystander(&client, "wide make", async {
        let made = run_command(&client, "wide", wide).await;
        assert_eq!(made["ok"], true, "{made}");
        folder = sandbox_folder(data.path(), &second, &made);
        format!("make: {}", brief(&made))
    })
    .await;
    assert!(
        folder.join("workspace/w/99/999").is_dir(),
        "the folders are there"
    );
    with_bystander(&client, "removal", async {
        let started = Instant::now();
        while folder.exists() && started.elapsed() < LONG {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if folder.exists() {
            format!(
                "{} still there after {} s",
                folder.display(),
                LONG.as_secs()
            )
        } else {
            "until the folder of 100,000 folders was gone (idle TTL 3 s first)".to_owned()
        }
    })
    .await;
    drop(node);
}
