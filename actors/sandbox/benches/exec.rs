//! Exec overhead of the Docker backend: raw bollard `true` (create_exec + start_exec +
//! inspect_exec) against `DockerBackend::exec` of `true`, in one started sandbox container,
//! interleaved in the same run. `cargo bench -p toolmesh-sandbox --bench exec`; the image is
//! `TOOLMESH_SANDBOX_IMAGE` (default `toolmesh/sandbox:latest`), `BENCH_ITERATIONS` (default 200).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use toolmesh_sandbox::backend::docker::DockerBackend;
use toolmesh_sandbox::backend::{Backend, ExecSpec, SandboxLimits, SandboxSpec, StartGate};

#[path = "../tests/support/mod.rs"]
mod support;
use support::raw_exec::raw_exec;
use support::{image, limits};

#[tokio::main]
async fn main() {
    let image = image();
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let backend = DockerBackend::new(image.clone(), vec![image]).expect("docker backend");
    backend
        .check()
        .await
        .expect("docker and the sandbox image (run scripts/build-images)");
    // A folder of its own below the temporary directory: the backend makes the workspace's
    // parent private, which must never be `/tmp` itself.
    let workspace = std::env::temp_dir()
        .join(format!("toolmesh-bench-{}", std::process::id()))
        .join("workspace");
    let spec = SandboxSpec {
        sandbox_id: format!("sbx-bench-{}", std::process::id()),
        node_id: "bench".into(),
        scope: format!("bench-{}", std::process::id()),
        workspace_dir: workspace.clone(),
        limits: SandboxLimits {
            pids: 256,
            ..limits()
        },
        image: None,
        env: Vec::new(),
    };
    let sandbox = backend.create(&spec).await.expect("create sandbox");
    let docker = Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();

    let (mut raw, mut via_backend) = (Vec::new(), Vec::new());
    for i in 0..iterations + 10 {
        let began = Instant::now();
        raw_exec(&docker, &sandbox.container_id, &["true"], false).await;
        let raw_time = began.elapsed();

        let began = Instant::now();
        let exec = backend
            .exec(
                &sandbox,
                ExecSpec {
                    argv: vec!["true".into()],
                    cwd: "/workspace".into(),
                    env: BTreeMap::new(),
                    stdin: false,
                    exec_id: format!("bench-{i}"),
                },
                StartGate::open(),
            )
            .await
            .expect("exec");
        let mut output = exec.output;
        while output.recv().await.is_some() {}
        let status = exec.exit.await.expect("exit").expect("status");
        assert_eq!(status.code, 0);
        let backend_time = began.elapsed();
        if i >= 10 {
            // The first runs warm connections up.
            raw.push(raw_time);
            via_backend.push(backend_time);
        }
    }
    backend.destroy(&sandbox).await.expect("destroy");
    let _ = std::fs::remove_dir_all(workspace.parent().unwrap_or(&workspace));

    report("raw bollard exec true", &mut raw);
    report("DockerBackend::exec true", &mut via_backend);
}

fn report(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "{name:<28} n={:<5} p50={:>8.2?} p99={:>8.2?} max={:>8.2?}",
        samples.len(),
        at(0.50),
        at(0.99),
        samples[samples.len() - 1]
    );
}
