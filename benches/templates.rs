//! Sandbox templates under runc and under gVisor (`runtime = "runsc"`), measured in one run.
//!
//! `cargo bench --bench templates` runs `scripts/gvisor` (registers runsc with the engine when
//! missing), starts a nats-server, a redis-server and one node with the roles gateway,
//! approval, workspace and sandbox (approvals off, Docker backend, spawner mode), whose
//! templates file holds `default` (runc) and `gvisor` (runsc), one warm sandbox each. Then:
//!
//! 1. **warm session**: `run_command {"command":"true"}` in a session whose sandbox exists, for
//!    each template, against a raw `docker exec` of `true` (create_exec, attached start_exec
//!    to the end, inspect_exec) in the same container: interleaved (runc tool, runc raw, runsc
//!    tool, runsc raw, …), each sample after the same 25 ms pause. Under runc the tool runs
//!    through the sandbox's spawner; under runsc by `docker exec` (gVisor has no child
//!    subreaper for the spawner), so its raw column is most of its cost.
//! 2. **new session**: a new session's first `run_command true` for each template, the warm
//!    pool handing it a started sandbox, each sample after a pause in which the pool refills
//!    (`BENCH_REFILL_MS`, default 4000: a runsc sandbox takes longer to start).
//!
//! Knobs: `BENCH_SAMPLES` (default 100, per column in 1), `BENCH_NEW_SESSIONS` (12, per
//! template in 2), `BENCH_REFILL_MS`, `TOOLMESH_SANDBOX_IMAGE`.
#![allow(clippy::print_stdout)]

use std::process::Command;
use std::time::{Duration, Instant};

use bollard::Docker;
use bytes::Bytes;
use toolmesh_testkit::{NatsServer, RedisServer};

mod support;
use support::raw_exec::raw_exec;
use support::{
    load_average, ms, node_on, percentile, run_command_ok, wait_until_quiet, NodeContainers,
    TOOLMESH,
};

const CALL: &str = "toolmesh.v1.call.bench";
const WARMUP: usize = 10;
const SETTLE: Duration = Duration::from_millis(25);
const TEMPLATES: &str =
    "[templates.default]\nwarm = 1\n\n[templates.gvisor]\nruntime = \"runsc\"\nwarm = 1\n";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run_true(session: &str, template: &str) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "tool": "run_command",
            "session_id": session,
            "arguments": {"command": "true", "template": template},
        }))
        .expect("json"),
    )
}

/// One `run_command true` through the gateway; its sandbox id.
async fn tool_call(client: &async_nats::Client, body: &Bytes) -> String {
    let v = run_command_ok(client, CALL, body).await;
    v["sandbox_id"].as_str().unwrap_or_default().to_owned()
}

async fn timed<F: std::future::Future>(f: F) -> Duration {
    let t = Instant::now();
    f.await;
    t.elapsed()
}

fn row(name: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
    println!(
        "  {:<44} {:>5} {:>9.2} {:>9.2} {:>9.2}",
        name,
        samples.len(),
        ms(p50),
        ms(p99),
        ms(*samples.last().expect("samples"))
    );
    p50
}

/// `runc a/b, runsc a/b; runsc/runc <what> a/a` for the medians `(a, b)` of each runtime: how
/// two measures compare on each, and how runsc's first compares to runc's.
fn ratios(runc: (Duration, Duration), runsc: (Duration, Duration), what: &str) -> String {
    format!(
        "runc {:.2}, runsc {:.2}; runsc/runc {what} {:.2}",
        ms(runc.0) / ms(runc.1),
        ms(runsc.0) / ms(runsc.1),
        ms(runsc.0) / ms(runc.0),
    )
}

fn header() {
    println!(
        "  {:<44} {:>5} {:>9} {:>9} {:>9}",
        "", "n", "p50 ms", "p99 ms", "max ms"
    );
}

fn main() {
    support::block_on(run());
}

async fn run() {
    let gvisor = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gvisor"))
        .status()
        .expect("scripts/gvisor runs");
    assert!(gvisor.success(), "scripts/gvisor failed");
    let samples = env_usize("BENCH_SAMPLES", 100);
    let new_sessions = env_usize("BENCH_NEW_SESSIONS", 12);
    let refill = Duration::from_millis(env_usize("BENCH_REFILL_MS", 4000) as u64);
    let node_id = format!("bench-tpl-{}", std::process::id());
    let _cleanup = NodeContainers(vec![node_id.clone()]);
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let file = data.path().join("templates.toml");
    std::fs::write(&file, TEMPLATES).expect("templates file");
    let client = nats.client().await;
    let roles = "gateway,approval,workspace,sandbox";
    let node = node_on(TOOLMESH, roles, &node_id, &nats, &redis, data.path())
        .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
        .env("TOOLMESH_SANDBOX_TEMPLATES", file.display().to_string())
        .env("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "4096")
        .env(
            "TOOLMESH_SANDBOX_MAX_SESSIONS",
            (2 * new_sessions + 8).to_string(),
        )
        .start(&client)
        .await;
    let docker = Docker::connect_with_local_defaults()
        .expect("docker")
        .negotiate_version()
        .await
        .expect("docker version");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "toolmesh templates bench: runc (spawner) vs runsc (gVisor, docker exec), {cores} cores, one node, load {}",
        load_average()
    );

    // 1. Warm session.
    let quiet1 = wait_until_quiet(0.10, 5, Duration::from_secs(120)).await;
    let runc = run_true("warm-runc", "default");
    let runsc = run_true("warm-runsc", "gvisor");
    let runc_box = format!("toolmesh-{}", tool_call(&client, &runc).await);
    let runsc_box = format!("toolmesh-{}", tool_call(&client, &runsc).await);
    for _ in 0..WARMUP {
        tool_call(&client, &runc).await;
        raw_exec(&docker, &runc_box, &["true"], true).await;
        tool_call(&client, &runsc).await;
        raw_exec(&docker, &runsc_box, &["true"], true).await;
    }
    let mut columns: [Vec<Duration>; 4] = Default::default();
    for _ in 0..samples {
        tokio::time::sleep(SETTLE).await;
        columns[0].push(timed(tool_call(&client, &runc)).await);
        tokio::time::sleep(SETTLE).await;
        columns[1].push(timed(raw_exec(&docker, &runc_box, &["true"], true)).await);
        tokio::time::sleep(SETTLE).await;
        columns[2].push(timed(tool_call(&client, &runsc)).await);
        tokio::time::sleep(SETTLE).await;
        columns[3].push(timed(raw_exec(&docker, &runsc_box, &["true"], true)).await);
    }
    println!("\n1. warm session, run_command true ({quiet1})");
    header();
    let [tool_runc, raw_runc, tool_runsc, raw_runsc] = &mut columns;
    let t_runc = row("run_command true, runc (spawner)", tool_runc);
    let r_runc = row("raw docker exec true, runc", raw_runc);
    let t_runsc = row("run_command true, runsc (docker exec)", tool_runsc);
    let r_runsc = row("raw docker exec true, runsc", raw_runsc);
    println!(
        "  ratio tool/raw: {}; throughput (1/p50): runc {:.0}/s, runsc {:.0}/s",
        ratios((t_runc, r_runc), (t_runsc, r_runsc), "tool"),
        1.0 / t_runc.as_secs_f64(),
        1.0 / t_runsc.as_secs_f64(),
    );

    // 2. New session.
    let quiet2 = wait_until_quiet(0.10, 5, Duration::from_secs(120)).await;
    let mut fresh: [Vec<Duration>; 2] = Default::default();
    for i in 0..new_sessions {
        for (column, template) in [(0, "default"), (1, "gvisor")] {
            tokio::time::sleep(refill).await;
            let body = run_true(&format!("new-{template}-{i}"), template);
            fresh[column].push(timed(tool_call(&client, &body)).await);
        }
    }
    println!(
        "\n2. new session's first run_command true, warm pool, {} ms pause ({quiet2})",
        refill.as_millis()
    );
    header();
    let [new_runc, new_runsc] = &mut fresh;
    let n_runc = row("new session, runc", new_runc);
    let n_runsc = row("new session, runsc", new_runsc);
    println!(
        "  ratio new/warm: {}",
        ratios((n_runc, t_runc), (n_runsc, t_runsc), "new")
    );
    node.terminate();
    let mut node = node;
    if node.wait_exit(Duration::from_secs(60)).await.is_none() {
        node.kill();
    }
}
