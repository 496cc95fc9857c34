//! What the spawner's sweep costs a command (see `backend::spawner`): `true`, back to back,
//! in a sandbox that holds N idle processes (a background command's `sleep`s: 0, 100, 1000),
//! through the Docker backend's spawner and the process backend's. Each sample is one exec
//! to its reported end; per N, p50 / p99, commands per second, and the ratio of p50 to the
//! same sandbox with no idle process (the raw operation: the same spawn, nothing to scan).
//! A bare `true` spawned on the host is printed as the floor of any command.
//!
//! `cargo bench -p toolmesh-sandbox --bench spawner`; `BENCH_ITERATIONS` (default 300),
//! `BENCH_IDLE` (default `0,100,1000`), `BENCH_BACKENDS` (default `docker,process`), the image
//! `TOOLMESH_SANDBOX_IMAGE` (default `toolmesh/sandbox:latest`), `BENCH_SPAWNER` (the spawner
//! program; default this build's `toolmesh-sandbox-spawner`, so that builds can be compared).
#![allow(clippy::print_stderr)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use toolmesh_sandbox::backend::docker::{container_name, DockerBackend};
use toolmesh_sandbox::backend::process::ProcessBackend;
use toolmesh_sandbox::backend::spawner::Spawner;
use toolmesh_sandbox::backend::{
    Backend, ExecSpec, Execution, Output, SandboxLimits, SandboxSpec, StartGate,
};

#[path = "../tests/support/mod.rs"]
mod support;
use support::{limits, ContainerGuard};

const WARMUP: usize = 10;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn spec(script: &str, exec_id: String) -> ExecSpec {
    ExecSpec {
        argv: ["sh", "-c", script].map(str::to_owned).to_vec(),
        cwd: "/workspace".into(),
        env: BTreeMap::new(),
        stdin: false,
        exec_id,
    }
}

/// Runs to the reported end; the exit code.
async fn finish(exec: Execution) -> i64 {
    let mut output = exec.output;
    while output.recv().await.is_some() {}
    exec.exit.await.expect("exit").expect("status").code
}

#[tokio::main]
async fn main() {
    let iterations: usize = env_or("BENCH_ITERATIONS", "300").parse().unwrap_or(300);
    let idle: Vec<usize> = env_or("BENCH_IDLE", "0,100,1000")
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let image = env_or("TOOLMESH_SANDBOX_IMAGE", "toolmesh/sandbox:latest");
    let program = Spawner::program(env_or(
        "BENCH_SPAWNER",
        env!("CARGO_BIN_EXE_toolmesh-sandbox-spawner"),
    ));

    let mut floor = Vec::new();
    for _ in 0..iterations {
        let began = Instant::now();
        let status = std::process::Command::new("true").status().expect("true");
        assert!(status.success());
        floor.push(began.elapsed());
    }
    let (p50, p99) = quantiles(&mut floor);
    eprintln!("bare `true` on the host: p50 {p50:.2?} p99 {p99:.2?}");

    for name in env_or("BENCH_BACKENDS", "docker,process").split(',') {
        let backend: Box<dyn Backend> = match name.trim() {
            "docker" => Box::new(
                DockerBackend::new(image.clone(), vec![image.clone()])
                    .expect("docker backend")
                    .with_spawner(program.clone()),
            ),
            "process" => Box::new(ProcessBackend::new().with_spawner(program.clone())),
            other => panic!("unknown backend {other}: docker or process"),
        };
        backend
            .check()
            .await
            .expect("a usable backend (scripts/build-images; apt-get install bubblewrap)");
        bench_backend(name.trim(), backend.as_ref(), &idle, iterations).await;
    }
}

async fn bench_backend(name: &str, backend: &dyn Backend, idle: &[usize], iterations: usize) {
    let folder = tempfile::tempdir().expect("tempdir");
    let sandbox_id = format!("sbx-bench-spawner-{}-{name}", std::process::id());
    let _guard = ContainerGuard(container_name(&sandbox_id));
    let spec_ = SandboxSpec {
        sandbox_id,
        node_id: "bench".into(),
        scope: format!("bench-spawner-{}", std::process::id()),
        workspace_dir: folder.path().join("sandbox").join("workspace"),
        limits: SandboxLimits {
            memory_mb: 2048,
            pids: 4096,
            ..limits()
        },
        image: None,
        env: Vec::new(),
    };
    let sandbox = backend.create(&spec_).await.expect("create sandbox");
    eprintln!("{name} backend, {iterations} commands per row:");
    eprintln!(
        "  {:>6} {:>10} {:>10} {:>12} {:>10}",
        "idle", "p50", "p99", "commands/s", "p50 / idle 0"
    );
    let mut base = None;
    for &n in idle {
        // N idle processes under one background command (and its shell and its `sleep`).
        let script = format!(
            "i=0; while [ $i -lt {n} ]; do sleep 100000 & i=$((i+1)); done; echo ready; sleep 100000"
        );
        let mut background = backend
            .exec(
                &sandbox,
                spec(&script, format!("idle-{n}")),
                StartGate::open(),
            )
            .await
            .expect("background exec");
        let mut seen = String::new();
        while !seen.contains("ready") {
            match tokio::time::timeout(Duration::from_secs(120), background.output.recv()).await {
                Ok(Some(Output::Stdout(b) | Output::Stderr(b))) => {
                    seen.push_str(&String::from_utf8_lossy(&b))
                }
                Ok(None) => panic!("the background command ended: {seen}"),
                Err(_) => panic!("{n} idle processes did not start in time: {seen}"),
            }
        }
        let mut samples = Vec::with_capacity(iterations);
        let mut total = Duration::ZERO;
        for i in 0..WARMUP + iterations {
            let began = Instant::now();
            let exec = backend
                .exec(
                    &sandbox,
                    spec("true", format!("true-{n}-{i}")),
                    StartGate::open(),
                )
                .await
                .expect("exec");
            assert_eq!(finish(exec).await, 0);
            let took = began.elapsed();
            if i >= WARMUP {
                samples.push(took);
                total += took;
            }
        }
        background.kill.kill().await;
        let code = finish(background).await;
        assert_eq!(code, 137, "the background command was killed");
        let (p50, p99) = quantiles(&mut samples);
        let base_p50 = *base.get_or_insert(p50);
        eprintln!(
            "  {n:>6} {:>10.2?} {:>10.2?} {:>12.0} {:>10.2}",
            p50,
            p99,
            iterations as f64 / total.as_secs_f64(),
            p50.as_secs_f64() / base_p50.as_secs_f64()
        );
    }
    backend.destroy(&sandbox).await.expect("destroy");
}

fn quantiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}
