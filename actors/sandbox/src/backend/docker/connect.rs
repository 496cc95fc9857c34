//! Spawner mode: connects to the spawner of a container just started and runs its first
//! command before anyone gets the sandbox.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;

use crate::backend::docker::common::{container_running, CONTROL_SOCKET, WORKSPACE};
use crate::backend::link::{CommandBase, Link, SPAWNER_START};
use crate::backend::{ExecSpec, ExitStatus, Output};

/// How commands start through a container's spawner: its environment (the image's `ENV`,
/// `HOME`), in `/workspace` unless told otherwise.
pub(super) const SPAWNED: CommandBase = CommandBase {
    env: Vec::new(),
    inherit_env: true,
    cwd: WORKSPACE,
};

/// Connects to the spawner of a container just started and waits for its `ready`. The socket
/// is reached through an `O_PATH` handle on `run_dir` (`/proc/self/fd/N/…`), so a long path
/// does not matter (Unix socket paths hold 107 bytes). By `ready` the spawner has removed its
/// socket; then `run_dir` becomes read-only to the sandbox (mode 0555, owned by this worker),
/// so nothing the sandbox runs can leave files there on the host. Then [`warm_up`].
pub(super) async fn connect_spawner(
    docker: &Docker,
    container: &str,
    run_dir: &Path,
    sandbox_id: &str,
) -> Result<Arc<Link>, String> {
    use rustix::fs::{Mode, OFlags};
    use std::os::fd::AsRawFd;
    let dir = rustix::fs::open(
        run_dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("opening {}: {e}", run_dir.display()))?;
    let socket = format!("/proc/self/fd/{}/{CONTROL_SOCKET}", dir.as_raw_fd());
    let started = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(1);
    let mut next_check = Duration::from_millis(200);
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(&socket) {
            Ok(stream) => break stream,
            Err(e) if started.elapsed() >= SPAWNER_START => {
                return Err(format!(
                    "no socket within {} s ({e})",
                    SPAWNER_START.as_secs()
                ))
            }
            Err(_) => {}
        }
        // Not listening yet; a container whose spawner could not start has stopped.
        if started.elapsed() >= next_check {
            next_check += Duration::from_millis(200);
            if !container_running(docker, container).await {
                return Err("the container stopped (see docker logs)".to_owned());
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(20));
    };
    let link = Arc::new(Link::ready(stream, sandbox_id).await?);
    rustix::fs::chmod(run_dir, Mode::from_raw_mode(0o555))
        .map_err(|e| format!("closing {}: {e}", run_dir.display()))?;
    warm_up(&link).await?;
    Ok(link)
}

/// Runs `sh -c true` once through a new sandbox's spawner before anyone gets the sandbox: it
/// proves commands start there, and it pays a new container's first-command costs (its
/// overlay file system's first lookups, the first fork of the spawner) before a session's
/// first command, not in it (measured by `benches/sandbox.rs`, section 2).
async fn warm_up(link: &Arc<Link>) -> Result<(), String> {
    let spec = ExecSpec {
        argv: ["sh", "-c", "true"].map(str::to_owned).to_vec(),
        cwd: String::new(),
        env: Default::default(),
        stdin: false,
        exec_id: "toolmesh-warm-up".to_owned(),
    };
    let mut execution = link.exec(spec, &SPAWNED).await.map_err(|e| e.to_string())?;
    let mut said = Vec::new();
    let wait = async {
        while let Some(output) = execution.output.recv().await {
            if let Output::Stderr(bytes) = output {
                said.extend_from_slice(&bytes);
            }
        }
        execution.exit.await
    };
    match tokio::time::timeout(SPAWNER_START, wait).await {
        Ok(Ok(Ok(ExitStatus { code: 0 }))) => Ok(()),
        Ok(Ok(Ok(ExitStatus { code }))) => Err(format!(
            "`sh -c true` exited with {code}: {}",
            String::from_utf8_lossy(&said).trim()
        )),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(_)) => Err("`sh -c true` was lost".to_owned()),
        Err(_) => Err(format!(
            "`sh -c true` did not end within {} s",
            SPAWNER_START.as_secs()
        )),
    }
}
