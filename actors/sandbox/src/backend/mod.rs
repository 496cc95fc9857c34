//! Sandbox backends: what starts, runs in and removes one sandbox. A backend knows nothing of
//! sessions, NATS or the tools; the pool above it does.
//!
//! Both backends show the command the same world: the session's mirror directory (a host
//! directory of the worker) at `/workspace`, writable; a private `/tmp`; the rest read-only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

pub mod docker;
pub mod exits;
mod link;
pub mod process;
pub mod spawner;

/// Labels every sandbox container carries, so a restarted worker can find its orphans.
pub const LABEL_MANAGED: &str = "io.toolmesh.managed";
pub const LABEL_NODE: &str = "io.toolmesh.node";
pub const LABEL_SANDBOX: &str = "io.toolmesh.sandbox";
/// Which deployment a sandbox belongs to (its pool's sandbox directory): workers reap only
/// their own deployment's orphans, so two clusters (or parallel tests) can share one engine.
pub const LABEL_SCOPE: &str = "io.toolmesh.scope";
/// The compose project of the worker that made a sandbox container or egress network, when it
/// runs in one: `docker ps --filter label=io.toolmesh.project=<project>` tells two clusters on
/// one host apart (a worker outside compose sets none).
pub const LABEL_PROJECT: &str = "io.toolmesh.project";

/// Where the sandbox sees the skills `execute_skills` binds (read-only).
pub const SKILLS_MOUNT: &str = "/skills";

/// The host directory shown read-only at [`SKILLS_MOUNT`]: a sibling of the workspace
/// directory, created with the sandbox, written only by the worker.
pub fn skills_dir_of(workspace_dir: &Path) -> PathBuf {
    workspace_dir.with_file_name("skills")
}

/// Makes `dir` (created if missing) reachable only by this worker and, given `group`, by that
/// group (mode 0710: enter, not list): the sandbox directory and each sandbox's folder, so
/// that no other user on the host reaches a sandbox's files or the socket its spawner listens
/// on before the worker connected. A Docker sandbox reaches its folders through its bind
/// mounts, which need no way through their parents; a process sandbox's bwrap runs as the
/// sandbox user and must enter them ([`Backend::sandbox_group`]).
pub fn make_private(dir: &Path, group: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // A shared directory (`/tmp`, world-writable or sticky) is never taken over: making
            // it private would lock every other user of the host out of it.
            use std::os::unix::fs::MetadataExt;
            if std::fs::metadata(dir)?.mode() & 0o1002 != 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is a shared directory (world-writable or sticky); sandbox folders must be below it",
                        dir.display()
                    ),
                ));
            }
        }
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    let mode = match group {
        Some(gid) => {
            std::os::unix::fs::chown(dir, None, Some(gid))?;
            0o710
        }
        None => 0o700,
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Resource limits, runtime and network of one sandbox (PROTOCOL.md's `TOOLMESH_SANDBOX_*`,
/// or a template's).
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxLimits {
    pub memory_mb: u64,
    pub pids: u64,
    pub cpus: f64,
    /// `none` (the default), or the name of a Docker network the operator opened on purpose.
    pub network: String,
    /// Size of the private `/tmp` (and home) tmpfs, MiB.
    pub tmpfs_mb: u64,
    /// The Docker runtime (`runc`, `runsc` for gVisor); `None`: the engine's default.
    pub runtime: Option<String>,
}

/// What to create.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Unique per sandbox (`sbx-…`); names the container and its labels.
    pub sandbox_id: String,
    /// The node that owns it (label [`LABEL_NODE`]).
    pub node_id: String,
    /// The deployment it belongs to (label [`LABEL_SCOPE`]).
    pub scope: String,
    /// A host directory of this worker, shown as `/workspace` (read-write).
    pub workspace_dir: PathBuf,
    pub limits: SandboxLimits,
    /// The image (Docker); `None`: the backend's own.
    pub image: Option<String>,
    /// Variables every command of the sandbox sees (a template's proxy settings).
    pub env: Vec<(String, String)>,
}

/// A created, started sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRef {
    pub sandbox_id: String,
    /// Docker container id, or empty for the process backend.
    pub container_id: String,
    pub workspace_dir: PathBuf,
}

/// One process to run in a sandbox.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    /// argv; `argv[0]` is looked up in the sandbox's PATH.
    pub argv: Vec<String>,
    /// Absolute path inside the sandbox.
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    /// Keep stdin open for [`Execution::stdin`]; otherwise stdin is empty.
    pub stdin: bool,
    /// Unique per execution; the backend tags the process tree with it
    /// (`TOOLMESH_EXEC_ID`) so that [`KillSwitch::kill`] finds every descendant.
    pub exec_id: String,
}

/// When a process may start. [`Backend::exec`] does what it can before (Docker creates the
/// exec), then waits for the gate, so that this overlaps with what the caller does first (the
/// workspace pull, the wait for a slot). A gate dropped unopened means "do not start".
#[derive(Debug)]
pub struct StartGate(Option<oneshot::Receiver<()>>);

/// Opens a [`StartGate`].
#[derive(Debug)]
pub struct GateOpener(oneshot::Sender<()>);

impl StartGate {
    /// A gate that is open already.
    pub fn open() -> Self {
        Self(None)
    }

    /// A closed gate and what opens it.
    pub fn closed() -> (GateOpener, Self) {
        let (tx, rx) = oneshot::channel();
        (GateOpener(tx), Self(Some(rx)))
    }

    /// Waits until the gate opens; an error when its opener was dropped instead.
    pub async fn pass(self) -> Result<(), BackendError> {
        match self.0 {
            None => Ok(()),
            Some(rx) => rx
                .await
                .map_err(|_| BackendError::Failed("the process was not started".to_owned())),
        }
    }
}

impl GateOpener {
    pub fn open(self) {
        let _ = self.0.send(());
    }
}

/// A piece of output, in the order the backend received it.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// The exit code; 128+N when killed by signal N (as a shell reports it).
    pub code: i64,
}

pub type StdinWriter = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// A running process. `output` closes when the process's output ends; `exit` resolves after
/// that, with the exit status.
pub struct Execution {
    pub output: mpsc::Receiver<Output>,
    pub stdin: Option<StdinWriter>,
    pub exit: oneshot::Receiver<Result<ExitStatus, BackendError>>,
    pub kill: KillSwitch,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution")
            .field("kill", &self.kill)
            .finish()
    }
}

/// Kills an execution's whole process tree (cheap to clone, idempotent).
#[derive(Clone)]
pub struct KillSwitch(
    pub std::sync::Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>,
);

impl KillSwitch {
    pub async fn kill(&self) {
        (self.0)().await
    }
}

impl std::fmt::Debug for KillSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KillSwitch")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend cannot work here at all (image missing, bwrap missing, Docker down); the
    /// message names the command that fixes it. Maps to `unavailable`.
    #[error("{0}")]
    Unavailable(String),
    /// The interpreter or program asked for is not in the sandbox. Maps to `not_found`… or a
    /// clear tool error.
    #[error("{0}")]
    MissingProgram(String),
    /// The sandbox is gone (container removed or dead). The pool re-creates it.
    #[error("sandbox {0} is gone")]
    Gone(String),
    #[error("sandbox backend failed: {0}")]
    Failed(String),
}

/// A sandbox backend.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// `sandbox/docker` or `sandbox/process`.
    fn wire_name(&self) -> &'static str;
    /// PROTOCOL.md/seed `boundary`: an honest sentence on what the sandbox isolates.
    fn boundary(&self) -> &'static str;
    /// The group that must enter the sandbox directory and a sandbox's folder besides this
    /// worker ([`make_private`]): none for Docker (the daemon binds as root).
    fn sandbox_group(&self) -> Option<u32> {
        None
    }
    /// How a sandbox of `runtime` runs its commands: `spawner` (a fork by the spawner inside
    /// it) or `exec` (a `docker exec` each), as `sandbox_status` says.
    fn commands(&self, runtime: Option<&str>) -> &'static str {
        let _ = runtime;
        "spawner"
    }
    /// Can this backend run here (image present, Docker reachable, bwrap installed)?
    async fn check(&self) -> Result<(), BackendError>;
    /// Creates and starts a sandbox; returns once a command can run in it.
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxRef, BackendError>;
    /// Removes a sandbox and everything running in it. Idempotent.
    async fn destroy(&self, sandbox: &SandboxRef) -> Result<(), BackendError>;
    /// Starts a process in the sandbox once `gate` opens.
    async fn exec(
        &self,
        sandbox: &SandboxRef,
        spec: ExecSpec,
        gate: StartGate,
    ) -> Result<Execution, BackendError>;
    /// Removes sandboxes of `scope` that a previous run of `this_node` left (call it before
    /// this run creates any) and, given `live_nodes`, those of every node not in it (dead
    /// workers on this host) and those that name no node. Returns how many.
    async fn reap_orphans(
        &self,
        scope: &str,
        this_node: &str,
        live_nodes: Option<&[String]>,
    ) -> Result<usize, BackendError>;
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::make_private;

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn a_shared_directory_is_never_made_private() {
        let shared = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        let refused = make_private(shared.path(), None).expect_err("a sticky world-writable dir");
        assert_eq!(
            refused.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{refused}"
        );
        assert_eq!(mode(shared.path()), 0o1777, "left as it was");

        let own = shared.path().join("sandboxes");
        make_private(&own, None).expect("a folder of its own");
        assert_eq!(mode(&own), 0o700);
        make_private(&own, None).expect("again, now that it exists");
        assert_eq!(mode(&own), 0o700);
    }
}
