//! Sandbox overhead against raw Docker exec and raw bubblewrap, measured in one run.
//!
//! `cargo bench --bench sandbox` starts a nats-server, a redis-server and, as compose.yml
//! deploys them, a front node `toolmesh node --roles gateway,approval,workspace` and a sandbox
//! worker node `--roles sandbox` (approvals off, Docker backend, default warm pool and
//! concurrency cap; `BENCH_ONE_NODE=1`: one node with all four roles), then:
//!
//! 1. **warm session**: raw bollard exec of `true` (create_exec + attached start_exec to the end +
//!    inspect_exec) in a started container of the sandbox image, hardened as the node's are,
//!    against `run_command {"command":"true"}` through the gateway in a session whose sandbox
//!    exists — interleaved (raw, tool, raw, …), each sample after the same 25 ms pause. A third
//!    column, raw `sh -c true` as the sandbox user with the exec's env and cwd, is what the
//!    Docker backend asks Docker for: the gap between the first two that is the shell's, not
//!    toolmesh's. Besides p50(tool) - p50(raw), the median of the differences within each
//!    iteration, which the machine's drift over the run disturbs less.
//! 2. **new session**: a new session's first `run_command true` (the warm pool hands it a
//!    started container) against raw exec in a started container (the two in turns first)
//!    and the first exec in a container created as long before as the warm one: each sample
//!    after the same 1.5 s pause, in which the pool refills (a container being created beside
//!    a sample slows it down). A fourth column, the warm session of 1 after the same pause,
//!    tells what a new session costs beyond what any call pays after an idle pause.
//! 3. **saturation**: K and 2K callers (K = the worker's concurrency cap), each in its own
//!    session, running `true` back to back for a fixed window, against the same number of raw
//!    callers, each in its own container: calls/s and the ratio.
//! 4. **process backend**: the Docker worker is drained (SIGTERM: it removes its containers), a
//!    worker with `TOOLMESH_SANDBOX_BACKEND=process` takes its place, and `run_command true` in a
//!    warm session is measured against the raw `prlimit … [setpriv …] bwrap … true` run that
//!    starting a sandbox costs (once per session: its spawner then forks each command) and a
//!    bare `sh -c true` spawned on the host, the floor of any command.
//!
//! Each section starts once the machine has been quiet for 5 s (what the section before left
//! Docker doing has finished), and says how long it waited. Every container the run made is
//! removed at the end, also when it panics.
//!
//! The Docker worker runs commands as deployed by default, through the spawner in each
//! container (`TOOLMESH_SANDBOX_DOCKER_COMMANDS=spawner`: a fork and exec, no Docker API call);
//! `BENCH_DOCKER_COMMANDS=exec` measures the `docker exec` way instead, whose cost is raw
//! exec's plus toolmesh's.
//!
//! Knobs: `BENCH_SAMPLES` (default 150, per column in 1 and 4), `BENCH_NEW_SESSIONS` (24),
//! `BENCH_WINDOW_S` (3, per throughput round; two rounds each), `BENCH_ONE_NODE`,
//! `BENCH_DOCKER_COMMANDS` (spawner), `TOOLMESH_SANDBOX_IMAGE`.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bytes::Bytes;
use toolmesh_kernel::sync::{ManifestLimits, WorkspaceSync};
use toolmesh_kernel::{Account, SessionId};
use toolmesh_sandbox::backend::docker::DockerBackend;
use toolmesh_sandbox::backend::process::namespace_args;
use toolmesh_sandbox::backend::{Backend, SandboxLimits, SandboxRef, SandboxSpec};
use toolmesh_sandbox::config::{
    DEFAULT_SYNC_MAX_FILES, DEFAULT_SYNC_MAX_FILE_BYTES, DEFAULT_SYNC_MAX_TOTAL_BYTES,
};
use toolmesh_testkit::{NatsServer, Node, NodeSpec, RedisServer};

mod support;
use support::raw_exec::raw_exec;
use support::{
    containers, load_average, ms, node_on, percentile, remove_containers, run_command_ok,
    wait_until_quiet, TOOLMESH,
};

const ACCOUNT: &str = "bench";
const CALL: &str = "toolmesh.v1.call.bench";
const DEFAULT_IMAGE: &str = "toolmesh/sandbox:latest";
const WARMUP: usize = 10;
const FRONT_ROLES: &str = "gateway,approval,workspace";
const POOL_REFILL: Duration = Duration::from_millis(1500);
const SETTLE: Duration = Duration::from_millis(25);
const THROUGHPUT_ROUNDS: usize = 2;

/// Before each section: wait until the cores were under 10 % busy for 5 s in a row (at most
/// two minutes); the section before leaves Docker removing or creating containers.
async fn quiet() -> String {
    wait_until_quiet(0.10, 5, Duration::from_secs(120)).await
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Removes, on drop, every container labelled by the run's node ids or its raw sandboxes.
struct Cleanup {
    node_ids: Vec<String>,
    raw_scope: String,
}

impl Cleanup {
    fn leftovers(&self) -> Vec<String> {
        let mut filters: Vec<String> = self
            .node_ids
            .iter()
            .map(|n| format!("label=io.toolmesh.node={n}"))
            .collect();
        filters.push(format!("label=io.toolmesh.scope={}", self.raw_scope));
        filters.iter().flat_map(|f| containers(f)).collect()
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        remove_containers(&self.leftovers());
    }
}

/// A pause before each sample of sections 1 and 2: Docker goes on working for a few milliseconds
/// after an exec returned (the shim reaps the process, dockerd records the exit), and whatever
/// runs in that time is slowed down on 2 cores. Without it the order of the columns decides
/// who pays for it (measured: a route-only call right after an exec took 1.5 ms, 0.5 ms on its
/// own), so every sample starts from the same quiet machine.
async fn settle() {
    tokio::time::sleep(SETTLE).await;
}

/// The median of `values` (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn run_true(session: &str) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "tool": "run_command",
            "session_id": session,
            "arguments": {"command": "true"},
        }))
        .expect("json"),
    )
}

/// One `run_command true` through the gateway; asserts it succeeded.
async fn tool_call(client: &async_nats::Client, body: &Bytes) {
    run_command_ok(client, CALL, body).await;
}

struct Figures {
    name: String,
    samples: Vec<Duration>,
}

impl Figures {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            samples: Vec::new(),
        }
    }
    fn p(&mut self, q: f64) -> Duration {
        self.samples.sort();
        percentile(&self.samples, q)
    }
    fn row(&mut self) {
        let (p50, p99) = (self.p(0.5), self.p(0.99));
        let max = *self.samples.last().expect("samples");
        println!(
            "  {:<50} {:>5} {:>9.2} {:>9.2} {:>9.2}",
            self.name,
            self.samples.len(),
            ms(p50),
            ms(p99),
            ms(max)
        );
    }
}

/// What section 2's samples go to: raw exec in `raw_box`, tool calls through `client`, `warm`
/// the warm session's call.
struct Targets<'a> {
    docker: &'a Docker,
    raw_box: &'a str,
    client: &'a async_nats::Client,
    warm: &'a Bytes,
}

/// Section 2 under one condition: raw exec, a new session's first call and a warm session's
/// call, taken in turns.
struct NewSessionFigures {
    condition: &'static str,
    raw: Figures,
    first: Figures,
    warm: Figures,
    /// first - raw of the same iteration.
    paired: Vec<f64>,
}

impl NewSessionFigures {
    fn new(condition: &'static str) -> Self {
        Self {
            condition,
            raw: Figures::new(&format!("raw exec true, {condition}")),
            first: Figures::new(&format!("run_command true, new session, {condition}")),
            warm: Figures::new(&format!("run_command true, warm session, {condition}")),
            paired: Vec::new(),
        }
    }

    /// One iteration: raw exec and the warm call, in an order that `rotation` turns, then the
    /// new session's `first` call, each after `pause`. The first call comes last because the
    /// pool creates a container after it, which would slow down what follows.
    async fn iteration(
        &mut self,
        rotation: usize,
        pause: Duration,
        on: &Targets<'_>,
        first: &Bytes,
    ) {
        let mut pair = [0.0; 2];
        for turn in 0..3 {
            tokio::time::sleep(pause).await;
            let t = Instant::now();
            match (turn, (rotation + turn) % 2) {
                (2, _) => {
                    tool_call(on.client, first).await;
                    self.first.samples.push(t.elapsed());
                    pair[1] = ms(t.elapsed());
                }
                (_, 0) => {
                    raw_exec(on.docker, on.raw_box, &["true"], false).await;
                    self.raw.samples.push(t.elapsed());
                    pair[0] = ms(t.elapsed());
                }
                _ => {
                    tool_call(on.client, on.warm).await;
                    self.warm.samples.push(t.elapsed());
                }
            }
        }
        self.paired.push(pair[1] - pair[0]);
    }

    fn rows(&mut self) {
        self.raw.row();
        self.first.row();
        self.warm.row();
    }

    fn summary(&mut self, target: &str) {
        let first = ms(self.first.p(0.5));
        println!(
            "  {}: p50(first) - p50(raw) = {:.2} ms{target}; - p50(warm) = {:.2} ms; median of paired differences = {:.2} ms",
            self.condition,
            first - ms(self.raw.p(0.5)),
            first - ms(self.warm.p(0.5)),
            median(&mut self.paired)
        );
    }
}

fn header() {
    println!(
        "  {:<50} {:>5} {:>9} {:>9} {:>9}",
        "", "n", "p50 ms", "p99 ms", "max ms"
    );
}

/// Completed calls of `callers` concurrent loops of `op(i)` during `window`, and the time taken.
async fn throughput<F, Fut>(callers: usize, window: Duration, op: F) -> (u64, Duration)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let deadline = Instant::now() + window;
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let loops = (0..callers).map(|i| {
        let done = done.clone();
        let op = &op;
        async move {
            while Instant::now() < deadline {
                op(i).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    futures::future::join_all(loops).await;
    (done.load(Ordering::Relaxed), started.elapsed())
}

/// A raw container: the node's image, hardening and default limits, labelled with the run's
/// own scope (so no node reaps it and [`Cleanup`] finds it).
fn raw_spec(run_id: u32, scope: &str, data: &Path, name: &str) -> SandboxSpec {
    SandboxSpec {
        sandbox_id: format!("bench-raw-{run_id}-{name}"),
        node_id: format!("bench-raw-{run_id}"),
        scope: scope.to_owned(),
        workspace_dir: data.join(format!("raw/{name}/workspace")),
        limits: SandboxLimits {
            memory_mb: 1024,
            pids: 256,
            cpus: 1.0,
            network: "none".into(),
            tmpfs_mb: 256,
            runtime: None,
        },
        image: None,
        env: Vec::new(),
    }
}

fn node_spec(
    id: &str,
    roles: &str,
    nats: &NatsServer,
    redis: &RedisServer,
    data: &Path,
) -> NodeSpec {
    node_on(TOOLMESH, roles, id, nats, redis, data).env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
}

async fn stop(mut node: Node) {
    node.terminate();
    if node.wait_exit(Duration::from_secs(60)).await.is_none() {
        println!(
            "  (node {} did not drain within 60 s; killed)",
            node.node_id
        );
        node.kill();
    }
}

/// The raw bubblewrap run that starts a process sandbox, with `true` for its spawner (see
/// `actors/sandbox/src/backend/process.rs`), minus the generated /etc files.
fn raw_bwrap(workspace: &Path) -> tokio::process::Command {
    let root = nix_is_root();
    let mut args: Vec<String> = vec![
        format!("--as={}", 1024u64 * 1024 * 1024),
        "--nproc=256".into(),
        "--".into(),
    ];
    if root {
        args.extend(
            [
                "/usr/bin/setpriv",
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "--",
            ]
            .map(str::to_owned),
        );
    }
    args.push("/usr/bin/bwrap".into());
    args.extend(namespace_args(false));
    args.extend(["--ro-bind", "/usr", "/usr"].map(str::to_owned));
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let path = Path::new("/").join(name);
        match std::fs::read_link(&path) {
            Ok(target) => args.extend([
                "--symlink".to_owned(),
                target.display().to_string(),
                path.display().to_string(),
            ]),
            Err(_) if path.is_dir() => {
                let p = path.display().to_string();
                args.extend(["--ro-bind".to_owned(), p.clone(), p]);
            }
            Err(_) => {}
        }
    }
    for path in ["/etc/alternatives", "/etc/ld.so.cache", "/etc/ssl"] {
        args.extend(["--ro-bind-try", path, path].map(str::to_owned));
    }
    args.extend(
        [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            "268435456",
            "--tmpfs",
            "/tmp",
        ]
        .map(str::to_owned),
    );
    args.extend([
        "--bind".to_owned(),
        workspace.display().to_string(),
        "/workspace".to_owned(),
    ]);
    args.extend(
        [
            "--remount-ro",
            "/",
            "--chdir",
            "/workspace",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--",
            "true",
        ]
        .map(str::to_owned),
    );
    let mut cmd = tokio::process::Command::new("/usr/bin/prlimit");
    cmd.args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

async fn raw_bwrap_true(workspace: &Path) {
    let out = raw_bwrap(workspace).output().await.expect("spawn bwrap");
    assert!(
        out.status.success(),
        "raw bwrap true: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    support::block_on(run());
}

async fn run() {
    let image = std::env::var("TOOLMESH_SANDBOX_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.into());
    let samples = env_usize("BENCH_SAMPLES", 150);
    let new_sessions = env_usize("BENCH_NEW_SESSIONS", 24);
    let window = Duration::from_secs(env_usize("BENCH_WINDOW_S", 3) as u64);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let k = 2 * cores;
    let run_id = std::process::id();
    let docker_node = format!("bench-sbx-docker-{run_id}");
    let process_node = format!("bench-sbx-process-{run_id}");
    let front_node = format!("bench-sbx-front-{run_id}");
    let raw_scope = format!("bench-sbx-raw-{run_id}");
    let _cleanup = Cleanup {
        node_ids: vec![docker_node.clone(), process_node.clone()],
        raw_scope: raw_scope.clone(),
    };

    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let client = nats.client().await;

    // Raw containers: the same image and hardening as the node's sandboxes (one per raw caller).
    let backend = DockerBackend::new(image.clone(), vec![image.clone()]).expect("docker backend");
    backend
        .check()
        .await
        .expect("docker and the sandbox image (run scripts/build-images)");
    let docker = Docker::connect_with_local_defaults()
        .expect("docker")
        .negotiate_version()
        .await
        .expect("docker version");
    let mut raw_boxes: Vec<SandboxRef> = Vec::new();
    for i in 0..2 * k {
        let spec = raw_spec(run_id, &raw_scope, data.path(), &i.to_string());
        raw_boxes.push(backend.create(&spec).await.expect("raw container"));
    }
    let raw_ids: Vec<String> = raw_boxes.iter().map(|b| b.container_id.clone()).collect();

    // As deployed (compose.yml), the sandbox worker is a node of its own beside the front
    // node (gateway, approval, workspace); BENCH_ONE_NODE=1 runs all four roles in one node.
    let one_node = std::env::var("BENCH_ONE_NODE").is_ok_and(|v| v == "1");
    let front = if one_node {
        None
    } else {
        Some(
            node_spec(&front_node, FRONT_ROLES, &nats, &redis, data.path())
                .start(&client)
                .await,
        )
    };
    let worker_roles = if one_node {
        format!("{FRONT_ROLES},sandbox")
    } else {
        "sandbox".to_owned()
    };
    // Room for every session the run opens: section 2 measures a new session, not one that
    // also evicts an idle one (which removes its container in the background, beside it).
    let max_sessions = new_sessions + 64;
    let commands = std::env::var("BENCH_DOCKER_COMMANDS").unwrap_or_else(|_| "spawner".to_owned());
    let node = node_spec(&docker_node, &worker_roles, &nats, &redis, data.path())
        .env("TOOLMESH_SANDBOX_MAX_SESSIONS", max_sessions.to_string())
        .env("TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT", "4096")
        .env("TOOLMESH_SANDBOX_DOCKER_COMMANDS", &commands)
        .start(&client)
        .await;
    println!(
        "toolmesh sandbox bench: image {image}, {cores} cores, concurrency cap K = {k}, {}, Docker commands by {commands}, load {}",
        if one_node { "one node" } else { "front node + sandbox worker node" },
        load_average()
    );

    // 1. Warm session.
    let quiet1 = quiet().await;
    let warm_body = run_true("warm");
    for _ in 0..WARMUP {
        raw_exec(&docker, &raw_ids[0], &["true"], false).await;
        tool_call(&client, &warm_body).await;
    }
    let mut raw = Figures::new("raw bollard exec true");
    let mut raw_sh = Figures::new("raw bollard exec sh -c true (uid 1000, env)");
    let mut tool = Figures::new("run_command true, warm session");
    // What the call does besides the exec: the route alone (sandbox_status goes gateway →
    // sandbox worker → gateway, no exec, no sync) and the mirror pull's manifest round trip.
    let mut routed = Figures::new("sandbox_status, warm session (route only)");
    let mut manifest = Figures::new("workspace manifest round trip (pull)");
    // tool - raw of the same iteration: the machine drifts between iterations but hardly
    // within one, so these differences scatter less than the two columns do.
    let mut paired: Vec<f64> = Vec::with_capacity(samples);
    let status_body = Bytes::from_static(br#"{"tool":"sandbox_status","session_id":"warm"}"#);
    let sync = WorkspaceSync::new(client.clone());
    let (account, session) = (
        Account::parse(ACCOUNT).expect("account"),
        SessionId::parse("warm").expect("session"),
    );
    let limits = ManifestLimits {
        max_files: DEFAULT_SYNC_MAX_FILES as u64,
        max_file_bytes: DEFAULT_SYNC_MAX_FILE_BYTES,
        max_total_bytes: DEFAULT_SYNC_MAX_TOTAL_BYTES,
    };
    for _ in 0..samples {
        settle().await;
        let t = Instant::now();
        raw_exec(&docker, &raw_ids[0], &["true"], false).await;
        let raw_sample = t.elapsed();
        raw.samples.push(raw_sample);
        settle().await;
        let t = Instant::now();
        tool_call(&client, &warm_body).await;
        let tool_sample = t.elapsed();
        tool.samples.push(tool_sample);
        paired.push(ms(tool_sample) - ms(raw_sample));
        settle().await;
        let t = Instant::now();
        raw_exec(&docker, &raw_ids[0], &["sh", "-c", "true"], true).await;
        raw_sh.samples.push(t.elapsed());
        settle().await;
        let t = Instant::now();
        let reply = client
            .request(CALL, status_body.clone())
            .await
            .expect("status");
        routed.samples.push(t.elapsed());
        assert!(!reply.payload.is_empty());
        let t = Instant::now();
        sync.manifest(&account, &session, limits)
            .await
            .expect("manifest");
        manifest.samples.push(t.elapsed());
    }
    println!(
        "\n1. warm session, interleaved (raw, tool, raw sh), started {quiet1}, load now {}",
        load_average()
    );
    header();
    raw.row();
    raw_sh.row();
    tool.row();
    routed.row();
    manifest.row();
    let warm_delta = ms(tool.p(0.5)) - ms(raw.p(0.5));
    println!(
        "  p50(tool) - p50(raw) = {warm_delta:.2} ms (target <= 2); - p50(raw sh) = {:.2} ms",
        ms(tool.p(0.5)) - ms(raw_sh.p(0.5))
    );
    println!(
        "  median of paired differences (tool - raw, same iteration) = {:.2} ms",
        median(&mut paired)
    );

    // 2. A new session's first command against raw exec. Before each, a pause in which the
    // warm pool refills (a container being created beside a sample slows it down). Then, in
    // turns, either each sample comes after such a pause, or (as in section 1) amid calls: one
    // raw exec and one warm call first, unmeasured, then each sample after `settle`. After
    // an idle pause every call pays for waking the processes on its path, more for a tool
    // call (NATS, gateway, worker, workspace) than for raw exec; the warm session's column
    // under the same conditions tells that apart from what a new session costs.
    // Raw exec goes to a container section 1 did not use: one with thousands of finished execs
    // behind it execs more slowly than the session's new one. Also raw, after the pause: the
    // first exec in a container created as long before as a warm one.
    let mut idle = NewSessionFigures::new("after the pause");
    let mut busy = NewSessionFigures::new("amid calls");
    let mut raw_fresh = Figures::new("raw exec true, fresh container, after the pause");
    let targets = Targets {
        docker: &docker,
        raw_box: &raw_ids[1],
        client: &client,
        warm: &warm_body,
    };
    let quiet2 = quiet().await;
    for i in 0..new_sessions {
        let body = run_true(&format!("new-{i}"));
        let rotation = i / 2;
        if i % 2 == 0 {
            let fresh = backend
                .create(&raw_spec(
                    run_id,
                    &raw_scope,
                    data.path(),
                    &format!("fresh-{i}"),
                ))
                .await
                .expect("fresh raw container");
            idle.iteration(rotation, POOL_REFILL, &targets, &body).await;
            tokio::time::sleep(POOL_REFILL).await;
            let t = Instant::now();
            raw_exec(&docker, &fresh.container_id, &["true"], false).await;
            raw_fresh.samples.push(t.elapsed());
            let _ = backend.destroy(&fresh).await;
        } else {
            tokio::time::sleep(POOL_REFILL).await;
            raw_exec(&docker, targets.raw_box, &["true"], false).await;
            tool_call(&client, targets.warm).await;
            busy.iteration(rotation, SETTLE, &targets, &body).await;
        }
    }
    println!(
        "\n2. new session's first command, each after a {} ms pause, started {quiet2}, load now {}",
        POOL_REFILL.as_millis(),
        load_average()
    );
    header();
    idle.rows();
    raw_fresh.row();
    busy.rows();
    idle.summary("");
    busy.summary(" (target <= 5)");

    // 3. Saturation.
    let quiet3 = quiet().await;
    println!(
        "\n3. throughput, {THROUGHPUT_ROUNDS} x {} s per figure, alternating, started {quiet3}, load {}",
        window.as_secs(),
        load_average()
    );
    println!(
        "  {:<10} {:>14} {:>14} {:>8}",
        "callers", "raw calls/s", "tool calls/s", "ratio"
    );
    let bodies: Vec<Bytes> = (0..2 * k).map(|i| run_true(&format!("tp-{i}"))).collect();
    for body in &bodies {
        tool_call(&client, body).await;
    }
    for callers in [k, 2 * k] {
        let (mut rn, mut rt, mut tn, mut tt) = (0, Duration::ZERO, 0, Duration::ZERO);
        for _ in 0..THROUGHPUT_ROUNDS {
            let (n, t) = throughput(callers, window, |i| {
                raw_exec(&docker, &raw_ids[i], &["true"], false)
            })
            .await;
            rn += n;
            rt += t;
            let (n, t) = throughput(callers, window, |i| tool_call(&client, &bodies[i])).await;
            tn += n;
            tt += t;
        }
        let (r, t) = (rn as f64 / rt.as_secs_f64(), tn as f64 / tt.as_secs_f64());
        println!(
            "  {:<10} {:>14.1} {:>14.1} {:>7.0}%",
            callers,
            r,
            t,
            100.0 * t / r
        );
    }
    println!("  (target >= 90%); load {}", load_average());

    stop(node).await;
    for b in &raw_boxes {
        let _ = backend.destroy(b).await;
    }

    // 4. The process backend.
    let node = node_spec(&process_node, &worker_roles, &nats, &redis, data.path())
        .env("TOOLMESH_SANDBOX_BACKEND", "process")
        .start(&client)
        .await;
    let ws: PathBuf = data.path().join("raw-bwrap/workspace");
    std::fs::create_dir_all(&ws).expect("raw bwrap workspace");
    let _ = Command::new("chown").args(["1000:1000"]).arg(&ws).status();
    let body = run_true("proc");
    for _ in 0..WARMUP {
        raw_bwrap_true(&ws).await;
        tool_call(&client, &body).await;
    }
    let mut raw4 = Figures::new("raw prlimit+setpriv+bwrap true");
    let mut tool4 = Figures::new("run_command true, process backend");
    let mut sh4 = Figures::new("raw sh -c true on the host");
    let quiet4 = quiet().await;
    for _ in 0..samples {
        let t = Instant::now();
        raw_bwrap_true(&ws).await;
        raw4.samples.push(t.elapsed());
        let t = Instant::now();
        tool_call(&client, &body).await;
        tool4.samples.push(t.elapsed());
        let t = Instant::now();
        let out = Command::new("sh")
            .args(["-c", "true"])
            .output()
            .expect("spawn sh");
        assert!(out.status.success());
        sh4.samples.push(t.elapsed());
    }
    println!(
        "\n4. process backend (bubblewrap), interleaved, started {quiet4}, load now {}",
        load_average()
    );
    header();
    raw4.row();
    tool4.row();
    sh4.row();
    println!(
        "  p50(tool) = {:.2} ms (target <= 5); p50(tool) - p50(raw bwrap) = {:.2} ms; p50(tool) - p50(raw sh) = {:.2} ms",
        ms(tool4.p(0.5)),
        ms(tool4.p(0.5)) - ms(raw4.p(0.5)),
        ms(tool4.p(0.5)) - ms(sh4.p(0.5))
    );
    stop(node).await;
    if let Some(front) = front {
        stop(front).await;
    }
}
