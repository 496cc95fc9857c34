//! What the Docker backend's parts share: the sandbox user, the container's mount points,
//! container names, and the statuses of Docker's errors.

use bollard::errors::Error as DockerError;
use bollard::query_parameters::InspectContainerOptions;
use bollard::Docker;

use crate::backend::{BackendError, SandboxRef};

/// The uid and gid every sandboxed command runs as (both backends).
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
/// The environment variable that tags an execution's process tree.
pub const EXEC_ID_VAR: &str = "TOOLMESH_EXEC_ID";
/// Output chunks buffered between the backend and its reader.
pub const OUTPUT_CHANNEL: usize = 64;

pub(super) const SANDBOX_USER: &str = "1000:1000";
pub(super) const WORKSPACE: &str = "/workspace";
pub(super) const HOME: &str = "/home/sandbox";
/// Where the container sees its sandbox's `run` directory, and the spawner's socket in it.
pub(super) const RUN_MOUNT: &str = "/run/toolmesh";
pub(super) const CONTROL_SOCKET: &str = "control.sock";

pub(super) const NO_DOCKER_HINT: &str =
    "start the Docker daemon (and give this worker its socket), or set TOOLMESH_SANDBOX_BACKEND=process";

/// The Docker name of a sandbox's container.
pub fn container_name(sandbox_id: &str) -> String {
    format!("toolmesh-{sandbox_id}")
}

pub(super) fn container_ref(sandbox: &SandboxRef) -> String {
    if sandbox.container_id.is_empty() {
        container_name(&sandbox.sandbox_id)
    } else {
        sandbox.container_id.clone()
    }
}

pub(super) fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// 404 (no such container) or 409 (not running, paused) mean the sandbox is gone.
pub(super) fn exec_error(e: DockerError, sandbox_id: &str) -> BackendError {
    match status(&e) {
        Some(404 | 409) => BackendError::Gone(sandbox_id.to_owned()),
        _ => BackendError::Failed(format!("docker exec: {e}")),
    }
}

/// Runtimes that cannot run the sandbox spawner: gVisor (`runsc`, as Debian 12 ships it) has
/// no `PR_SET_CHILD_SUBREAPER`, which the spawner needs to end what a command leaves behind.
/// Their sandboxes run commands by `docker exec` (exec mode, see the module docs).
pub const NO_SPAWNER_RUNTIMES: &[&str] = &["runsc"];

/// Whether a sandbox of `runtime` can run its commands through the spawner.
pub fn runs_spawner(runtime: Option<&str>) -> bool {
    !runtime.is_some_and(|r| NO_SPAWNER_RUNTIMES.contains(&r))
}

pub(super) async fn container_running(docker: &Docker, container: &str) -> bool {
    let inspect = docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await;
    inspect.ok().and_then(|c| c.state?.running).unwrap_or(false)
}
