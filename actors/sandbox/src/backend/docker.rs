//! The Docker backend (bollard): one hardened, long-lived container per sandbox.
//!
//! A sandbox container runs under `docker-init` as uid 1000, with no network (unless the
//! operator named one), no capabilities, `no-new-privileges`, a read-only root, tmpfs `/tmp`
//! and `/home/sandbox`, memory/CPU/pids limits and the session's mirror directory bound at
//! `/workspace`. Its commands run in one of two ways:
//!
//! - **spawner** (the default, [`DockerBackend::with_spawner`]): the container's command is the
//!   worker's own binary as the sandbox spawner ([`super::spawner`], as in the process
//!   backend), bound read-only at [`SPAWNER_MOUNT`] and listening on a socket in the sandbox's
//!   `run` directory (bound at `/run/toolmesh`). Once the container started, the worker
//!   connects to it — the only connection it accepts, made before anything else runs there —
//!   and each command is a fork and exec by the spawner with pipes the worker made: about a
//!   millisecond instead of two Docker API calls and the daemon's exec setup (tens of ms).
//!   Commands run in the container's namespaces, cgroup and user, as with `docker exec`.
//! - **exec**: the container runs `sleep infinity` and each command is a `docker exec`
//!   (create_exec and start_exec, attached); its exit code comes from the daemon's
//!   `exec_die` event ([`ExecExits`]), or from inspect_exec when the event does not come. For
//!   images that cannot run the worker's binary (not glibc-based).
//!
//! A sandbox whose runtime cannot run the spawner ([`NO_SPAWNER_RUNTIMES`]: gVisor) runs its
//! commands in exec mode although the worker is in spawner mode.
//!
//! Ending an execution's processes in exec mode (the spawner kills by lineage itself, see
//! [`super::spawner`]): a `docker exec` process is its own session and process-group leader
//! and its children may start their own, so what ends them is a sweep of the container's
//! `/proc` (`SWEEP`, a POSIX shell function). It SIGKILLs every process whose environment
//! holds `TOOLMESH_EXEC_ID=<exec_id>`, and every *orphan* (a process re-parented to the
//! container's init, so escaped from the tree of the exec that started it) that carries no
//! marker of a command still running there, round after round until none is left (bounded),
//! which also catches forks racing the kill. A command still running is an exec's own process
//! (its parent is outside the container, so its parent pid reads 0) and the marker in its
//! environment. The sweep runs in one of two places:
//!
//! - **in the command's own exec**, when it ends by itself: every command runs under a
//!   wrapper shell (`WRAPPER`), the exec's process. It reads a nonce from the first line of its
//!   stdin (so the nonce is in no argument or environment a command can read), runs the
//!   command as its child, sweeps, and when the sweep left nothing ends its stderr with
//!   `\0toolmesh-swept:<nonce>\n`, which the backend takes off the output (`EndLine`). A
//!   command that left nothing pays one pass over `/proc/*/stat` with shell builtins; the
//!   markers of orphans and running commands are read only when there are orphans.
//! - **in a kill exec**, a second `docker exec` of the same sweep: when the kill switch is
//!   used (a timeout, a cancel, `kill_task`), and when an exec ends without its end line (its
//!   wrapper was killed, or the sweep gave up), before its end is reported. A kill exec that
//!   cannot run or does not finish within `KILL_WAIT` restarts the container instead.
//!
//! The limits of exec mode: with no subreaper of its own (the image may not run the worker's
//! binary) and every helper running as the sandbox user, dumpable,
//! - a background command's process that double forks *and* clears or changes its marker is
//!   taken for an orphan of an ended command, and killed when any other command of the
//!   sandbox ends; one that keeps its marker lives as long as its command;
//! - a leftover of an ended command that takes the marker of a command still running (execs
//!   itself with it) lives until that command ends;
//! - a command that reads its wrapper's memory or traces it (the same uid) can forge the end
//!   line without the sweep, and a leftover can stop or trace a kill exec; what it left then
//!   lives until a sweep it did not subvert: any other command's end, or a kill.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, RestartPolicy, RestartPolicyNameEnum};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    RestartContainerOptions, StartContainerOptions,
};
use bollard::Docker;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, OnceCell};

use super::exits::{ExecExits, EVENT_WAIT};
use super::link::{lock, CommandBase, Link, SPAWNER_START};
use super::spawner::{Spawner, SPAWNER_MOUNT};

use super::{
    make_private, skills_dir_of, Backend, BackendError, ExecSpec, Execution, ExitStatus,
    KillSwitch, Output, SandboxRef, SandboxSpec, StartGate, StdinWriter, LABEL_MANAGED, LABEL_NODE,
    LABEL_PROJECT, LABEL_SANDBOX, LABEL_SCOPE, SKILLS_MOUNT,
};

/// The uid and gid every sandboxed command runs as (both backends).
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
/// The environment variable that tags an execution's process tree.
pub const EXEC_ID_VAR: &str = "TOOLMESH_EXEC_ID";
/// Output chunks buffered between the backend and its reader.
pub const OUTPUT_CHANNEL: usize = 64;

const SANDBOX_USER: &str = "1000:1000";
const WORKSPACE: &str = "/workspace";
const HOME: &str = "/home/sandbox";
/// Where the container sees its sandbox's `run` directory, and the spawner's socket in it.
const RUN_MOUNT: &str = "/run/toolmesh";
const CONTROL_SOCKET: &str = "control.sock";
/// How commands start through a container's spawner: its environment (the image's `ENV`,
/// `HOME`), in `/workspace` unless told otherwise.
const SPAWNED: CommandBase = CommandBase {
    env: Vec::new(),
    inherit_env: true,
    cwd: WORKSPACE,
};
/// Rounds of "find and SIGKILL" before a sweep gives up (forks racing the kill).
const KILL_ROUNDS: u32 = 50;
/// Runs of the kill exec before the container is restarted instead.
const KILL_ATTEMPTS: u32 = 3;
/// How long one kill exec may take before the container is restarted instead (a leftover
/// may have stopped it: it is the sandbox user too).
const KILL_WAIT: Duration = Duration::from_secs(10);
/// What the wrapper writes last on its stderr once its sweep left nothing, before its nonce.
const END_LINE: &[u8] = b"\0toolmesh-swept:";

/// `toolmesh_sweep ID ROUNDS MARKED`: SIGKILLs every process whose environment holds
/// `TOOLMESH_EXEC_ID=ID`, and every orphan (a process whose parent is the container's init,
/// other than the container's own command, the oldest such) whose `TOOLMESH_EXEC_ID` is not
/// that of a command still running (a process whose parent pid reads 0, other than init,
/// `ID` excluded), until none is found (at most `ROUNDS` rounds; returns 1 if some remain).
/// The shell itself (`$$`) is spared. With `MARKED` 0 (the command `ID` has ended, so all that
/// is left of it is below orphans) the environments are read only when orphans exist. An
/// orphan's children become orphans when it dies, so the rounds take a whole escaped tree.
/// Each round stops the whole set before killing it, so no parent sees a child die and exits
/// on its own first, and no fork slips through. POSIX sh, GNU grep (`-z`: NUL-separated
/// records) and shell builtins only; a `stat` line is read after its last `) `, as the name
/// before it may hold anything. Whoever runs it must not carry `TOOLMESH_EXEC_ID` into the
/// programs it starts.
const SWEEP: &str = r#"toolmesh_sweep() {
  id=$1; rounds=$2; marked=$3; n=0; main=; oldest=
  while [ "$n" -lt "$rounds" ]; do
    heads=; orphans=; cand=; pids=
    for s in /proc/[0-9]*/stat; do
      { read -r line < "$s"; } 2>/dev/null || continue
      p=${s#/proc/}; p=${p%/stat}
      set -- ${line##*") "}
      case $2 in
        0) [ "$p" = 1 ] || [ "$p" = "$$" ] || heads="$heads $p" ;;
        1) [ "$1" = Z ] || orphans="$orphans $p"
           if [ "$n" = 0 ] && { [ -z "$oldest" ] || [ "${20}" -lt "$oldest" ] || { [ "${20}" = "$oldest" ] && [ "$p" -lt "$main" ]; }; }; then
             oldest=${20}; main=$p
           fi ;;
      esac
    done
    for p in $orphans; do [ "$p" = "$main" ] || cand="$cand $p"; done
    if [ -n "$cand" ]; then
      live=" "
      for p in $heads; do
        mark=$(grep -azm1 '^TOOLMESH_EXEC_ID=' "/proc/$p/environ" 2>/dev/null | tr -d '\0')
        mark=${mark#TOOLMESH_EXEC_ID=}
        [ -z "$mark" ] || [ "$mark" = "$id" ] || live="$live$mark "
      done
      for p in $cand; do
        mark=$(grep -azm1 '^TOOLMESH_EXEC_ID=' "/proc/$p/environ" 2>/dev/null | tr -d '\0')
        mark=${mark#TOOLMESH_EXEC_ID=}
        if [ -n "$mark" ]; then case "$live" in *" $mark "*) continue ;; esac; fi
        pids="$pids $p"
      done
    fi
    if [ -n "$cand" ] || [ "$marked" = 1 ]; then
      for f in $(grep -lzxF -e "TOOLMESH_EXEC_ID=$id" /proc/[0-9]*/environ 2>/dev/null); do
        p=${f#/proc/}; p=${p%/environ}
        [ "$p" = "$$" ] || pids="$pids $p"
      done
    fi
    [ -n "$pids" ] || return 0
    kill -STOP $pids 2>/dev/null
    kill -KILL $pids 2>/dev/null
    n=$((n+1))
  done
  return 1
}"#;

/// The kill exec: `sh -c KILLER toolmesh-kill ID ROUNDS`, exit 0 when nothing of `ID` is left.
static KILLER: LazyLock<String> =
    LazyLock::new(|| format!("{SWEEP}\ntoolmesh_sweep \"$1\" \"$2\" 1"));

/// Every command's exec: `sh -c WRAPPER toolmesh-exec ID ROUNDS ARGV…`. Reads the nonce line,
/// runs `ARGV` (`exec` in a subshell: a program, never a shell builtin), drops the marker from
/// what it starts next, sweeps, writes the end line if the sweep left nothing, and exits with
/// the command's code (128 + the signal that killed it).
static WRAPPER: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"{SWEEP}
toolmesh_id=$1; toolmesh_rounds=$2; shift 2
IFS= read -r toolmesh_nonce || toolmesh_nonce=
( exec "$@" )
toolmesh_code=$?
unset TOOLMESH_EXEC_ID
if toolmesh_sweep "$toolmesh_id" "$toolmesh_rounds" 0 && [ -n "$toolmesh_nonce" ]; then
  printf '\0toolmesh-swept:%s\n' "$toolmesh_nonce" >&2
fi
exit "$toolmesh_code""#
    )
});

/// Takes the wrapper's end line (`END_LINE`, its nonce, a newline) off an exec's stderr. Output
/// passes on as it comes, but for a tail of stderr that may be the start of the end line: held
/// until more output shows it is not (then passed on, before that output), or until the
/// stream ends (then it is the end line if it is all of it, else output). A whole end line is
/// held across stdout that follows it: Docker copies an exec's stdout and stderr by separate
/// pipes, so stdout written before the end line may arrive after it. Only more stderr shows
/// that it was output.
struct EndLine {
    expected: Vec<u8>,
    /// Stderr not passed on yet: a beginning of `expected`.
    held: Vec<u8>,
}

impl EndLine {
    fn new(nonce: &str) -> Self {
        let mut expected = END_LINE.to_vec();
        expected.extend_from_slice(nonce.as_bytes());
        expected.push(b'\n');
        Self {
            expected,
            held: Vec::new(),
        }
    }

    /// What to pass on for a chunk of stdout.
    fn stdout(&mut self, message: Bytes) -> [Option<Output>; 2] {
        let held = if self.held == self.expected {
            None
        } else {
            self.release()
        };
        [held, Some(Output::Stdout(message))]
    }

    /// What to pass on for a chunk of stderr.
    fn stderr(&mut self, message: Bytes) -> [Option<Output>; 2] {
        let data = match self.release() {
            None => message,
            Some(Output::Stderr(held) | Output::Stdout(held)) => {
                let mut data = Vec::with_capacity(held.len() + message.len());
                data.extend_from_slice(&held);
                data.extend_from_slice(&message);
                Bytes::from(data)
            }
        };
        let keep = (1..=data.len().min(self.expected.len()))
            .rev()
            .find(|k| data.ends_with(&self.expected[..*k]))
            .unwrap_or(0);
        let pass = data.len() - keep;
        self.held = data[pass..].to_vec();
        [(pass > 0).then(|| Output::Stderr(data.slice(..pass))), None]
    }

    /// At the end of the stream: what is left to pass on, and whether the end line came.
    fn finish(mut self) -> (Option<Output>, bool) {
        if self.held == self.expected {
            return (None, true);
        }
        (self.release(), false)
    }

    fn release(&mut self) -> Option<Output> {
        (!self.held.is_empty()).then(|| Output::Stderr(std::mem::take(&mut self.held).into()))
    }
}

/// Runs sandboxes as Docker containers of one image, or of the image a sandbox's template
/// names.
pub struct DockerBackend {
    docker: Docker,
    image: String,
    /// Every image and runtime the worker's templates name, checked by [`Backend::check`].
    needs: Vec<(String, Option<String>)>,
    /// The API version is negotiated once (the daemon may be older than bollard's default).
    negotiated: OnceCell<()>,
    /// Exit codes announced by the daemon; watched from the first exec on.
    exits: std::sync::OnceLock<Arc<ExecExits>>,
    /// Run commands through a spawner in each container (see the module docs): its program,
    /// a path the Docker daemon can bind.
    spawner: Option<Spawner>,
    /// The spawner links of the containers this backend created, by sandbox id.
    links: std::sync::Mutex<HashMap<String, Arc<Link>>>,
    /// Sandboxes whose commands are `docker exec`s although a spawner is configured: their
    /// runtime cannot run it ([`runs_spawner`]).
    by_exec: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The compose project every container is labelled with ([`LABEL_PROJECT`]).
    project: Option<String>,
}

/// Runtimes that cannot run the sandbox spawner: gVisor (`runsc`, as Debian 12 ships it) has
/// no `PR_SET_CHILD_SUBREAPER`, which the spawner needs to end what a command leaves behind.
/// Their sandboxes run commands by `docker exec` (exec mode, see the module docs).
pub const NO_SPAWNER_RUNTIMES: &[&str] = &["runsc"];

/// Whether a sandbox of `runtime` can run its commands through the spawner.
pub fn runs_spawner(runtime: Option<&str>) -> bool {
    !runtime.is_some_and(|r| NO_SPAWNER_RUNTIMES.contains(&r))
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("image", &self.image)
            .finish()
    }
}

impl DockerBackend {
    /// Connects (lazily) to the local Docker daemon; `image` must be in `allowed_images`.
    pub fn new(image: String, allowed_images: Vec<String>) -> Result<Self, BackendError> {
        if !allowed_images.iter().any(|allowed| allowed == &image) {
            return Err(BackendError::Unavailable(format!(
                "the sandbox image {image} is not in the allowed images ({}): set \
                 TOOLMESH_SANDBOX_IMAGE to one of them",
                if allowed_images.is_empty() {
                    "none".to_owned()
                } else {
                    allowed_images.join(", ")
                }
            )));
        }
        let docker = Docker::connect_with_local_defaults().map_err(|e| {
            BackendError::Unavailable(format!("cannot connect to Docker: {e}: {NO_DOCKER_HINT}"))
        })?;
        Ok(Self {
            docker,
            needs: vec![(image.clone(), None)],
            image,
            negotiated: OnceCell::new(),
            exits: std::sync::OnceLock::new(),
            spawner: None,
            links: std::sync::Mutex::new(HashMap::new()),
            by_exec: std::sync::Mutex::new(Default::default()),
            project: None,
        })
    }

    /// Labels every container with the worker's compose project ([`LABEL_PROJECT`]).
    pub fn with_project(mut self, project: Option<String>) -> Self {
        self.project = project;
        self
    }

    /// The same backend running commands through `spawner` in each container (see the module
    /// docs); its program must be a path on the Docker daemon's host.
    pub fn with_spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = Some(spawner);
        self
    }

    /// The images and runtimes (besides the default image) the worker's templates name:
    /// [`Backend::check`] finds each present, or says which is missing.
    pub fn with_needs(mut self, needs: impl IntoIterator<Item = (String, Option<String>)>) -> Self {
        for need in needs {
            if !self.needs.contains(&need) {
                self.needs.push(need);
            }
        }
        self
    }

    /// The image sandboxes are created from.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The Docker client, after the one-time version negotiation.
    async fn client(&self) -> Result<&Docker, BackendError> {
        self.negotiated
            .get_or_try_init(|| async {
                // `negotiate_version` stores the version in state shared with `self.docker`.
                self.docker
                    .clone()
                    .negotiate_version()
                    .await
                    .map(drop)
                    .map_err(|e| {
                        BackendError::Unavailable(format!(
                            "Docker is not reachable: {e}: {NO_DOCKER_HINT}"
                        ))
                    })
            })
            .await?;
        Ok(&self.docker)
    }

    fn missing_image(image: &str) -> BackendError {
        BackendError::Unavailable(format!(
            "the sandbox image {image} is missing on this worker: run scripts/build-images (or \
             docker build -f docker/sandbox.Dockerfile -t {image} docker/)"
        ))
    }

    /// Whether the engine has the runtime `name` (it learns runtimes from its daemon.json).
    async fn check_runtime(docker: &Docker, name: &str) -> Result<(), BackendError> {
        let info = docker.info().await.map_err(|e| {
            BackendError::Unavailable(format!("cannot ask Docker for its runtimes: {e}"))
        })?;
        let known = info.runtimes.unwrap_or_default();
        if known.contains_key(name) {
            return Ok(());
        }
        let mut names: Vec<&String> = known.keys().collect();
        names.sort();
        Err(BackendError::Unavailable(format!(
            "a sandbox template names the runtime {name:?}, which the Docker engine does not have \
             (it has {names:?}): run scripts/gvisor to register gVisor's runsc (it reloads the \
             engine with SIGHUP)"
        )))
    }

    fn container_body(
        &self,
        spec: &SandboxSpec,
        workspace: &Path,
        run_dir: Option<&Path>,
    ) -> ContainerCreateBody {
        let limits = &spec.limits;
        let network = match limits.network.as_str() {
            "" | "none" => "none".to_owned(),
            other => other.to_owned(),
        };
        let memory =
            i64::try_from(limits.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
        let tmpfs_opts = |extra: &str| {
            format!(
                "rw,exec,nosuid,nodev,size={}m{extra}",
                limits.tmpfs_mb.max(1)
            )
        };
        let mut labels = HashMap::from([
            (LABEL_MANAGED.to_owned(), "1".to_owned()),
            (LABEL_NODE.to_owned(), spec.node_id.clone()),
            (LABEL_SANDBOX.to_owned(), spec.sandbox_id.clone()),
            (LABEL_SCOPE.to_owned(), spec.scope.clone()),
        ]);
        if let Some(project) = &self.project {
            labels.insert(LABEL_PROJECT.to_owned(), project.clone());
        }
        let mut binds = vec![
            format!("{}:{WORKSPACE}:rw", workspace.display()),
            format!("{}:{SKILLS_MOUNT}:ro", skills_dir_of(workspace).display()),
        ];
        let cmd = match (&self.spawner, run_dir) {
            (Some(spawner), Some(run_dir)) => {
                binds.push(format!("{}:{SPAWNER_MOUNT}:ro", spawner.program.display()));
                binds.push(format!("{}:{RUN_MOUNT}:rw", run_dir.display()));
                let mut cmd = vec![SPAWNER_MOUNT.to_owned()];
                cmd.extend(spawner.args.iter().cloned());
                cmd.extend([
                    "--listen".to_owned(),
                    format!("{RUN_MOUNT}/{CONTROL_SOCKET}"),
                ]);
                cmd
            }
            _ => vec!["sleep".to_owned(), "infinity".to_owned()],
        };
        let mut env = vec![format!("HOME={HOME}")];
        env.extend(
            spec.env
                .iter()
                .map(|(name, value)| format!("{name}={value}")),
        );
        ContainerCreateBody {
            image: Some(spec.image.clone().unwrap_or_else(|| self.image.clone())),
            user: Some(SANDBOX_USER.to_owned()),
            cmd: Some(cmd),
            env: Some(env),
            working_dir: Some(WORKSPACE.to_owned()),
            hostname: Some("sandbox".to_owned()),
            labels: Some(labels),
            attach_stdin: Some(false),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            open_stdin: Some(false),
            tty: Some(false),
            host_config: Some(HostConfig {
                binds: Some(binds),
                network_mode: Some(network),
                cap_drop: Some(vec!["ALL".to_owned()]),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                readonly_rootfs: Some(true),
                tmpfs: Some(HashMap::from([
                    ("/tmp".to_owned(), tmpfs_opts(",mode=1777")),
                    (HOME.to_owned(), tmpfs_opts(",mode=0700,uid=1000,gid=1000")),
                ])),
                memory: Some(memory),
                memory_swap: Some(memory),
                nano_cpus: Some((limits.cpus * 1e9).round() as i64),
                pids_limit: Some(i64::try_from(limits.pids).unwrap_or(i64::MAX)),
                init: Some(true),
                runtime: limits.runtime.clone(),
                ipc_mode: Some("private".to_owned()),
                auto_remove: Some(false),
                restart_policy: Some(RestartPolicy {
                    name: Some(RestartPolicyNameEnum::NO),
                    maximum_retry_count: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    async fn remove(&self, container: &str) -> Result<bool, BackendError> {
        let docker = self.client().await?;
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match docker.remove_container(container, Some(options)).await {
            Ok(()) => Ok(true),
            Err(e) if matches!(status(&e), Some(404)) => Ok(false),
            // "removal of container … is already in progress"
            Err(e) if matches!(status(&e), Some(409)) => Ok(false),
            Err(e) => Err(BackendError::Failed(format!(
                "removing container {container}: {e}"
            ))),
        }
    }
}

const NO_DOCKER_HINT: &str =
    "start the Docker daemon (and give this worker its socket), or set TOOLMESH_SANDBOX_BACKEND=process";

/// The Docker name of a sandbox's container.
pub fn container_name(sandbox_id: &str) -> String {
    format!("toolmesh-{sandbox_id}")
}

fn container_ref(sandbox: &SandboxRef) -> String {
    if sandbox.container_id.is_empty() {
        container_name(&sandbox.sandbox_id)
    } else {
        sandbox.container_id.clone()
    }
}

fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// 404 (no such container) or 409 (not running, paused) mean the sandbox is gone.
fn exec_error(e: DockerError, sandbox_id: &str) -> BackendError {
    match status(&e) {
        Some(404 | 409) => BackendError::Gone(sandbox_id.to_owned()),
        _ => BackendError::Failed(format!("docker exec: {e}")),
    }
}

/// Creates `dir` if missing and makes it writable by the sandbox user (uid 1000): as root,
/// `dir` and everything in it is chowned to 1000:1000 (symlinks themselves, never followed);
/// otherwise `dir` is made mode 0777. Returns the canonical path.
pub fn prepare_workspace(dir: &Path) -> Result<PathBuf, BackendError> {
    let fail = |what: &str, path: &Path, e: io::Error| {
        BackendError::Failed(format!("{what} {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| fail("creating workspace", dir, e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| fail("resolving workspace", dir, e))?;
    if rustix::process::geteuid().is_root() {
        let mut stack = vec![dir.clone()];
        while let Some(path) = stack.pop() {
            std::os::unix::fs::lchown(&path, Some(SANDBOX_UID), Some(SANDBOX_GID))
                .map_err(|e| fail("chowning", &path, e))?;
            let meta = std::fs::symlink_metadata(&path).map_err(|e| fail("reading", &path, e))?;
            if meta.is_dir() {
                for entry in std::fs::read_dir(&path).map_err(|e| fail("listing", &path, e))? {
                    stack.push(entry.map_err(|e| fail("listing", &path, e))?.path());
                }
            }
        }
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| fail("chmod 0777", &dir, e))?;
    }
    Ok(dir)
}

#[async_trait::async_trait]
impl Backend for DockerBackend {
    fn wire_name(&self) -> &'static str {
        "sandbox/docker"
    }

    fn boundary(&self) -> &'static str {
        "executes only through the sandbox backend (a Docker container per session: uid 1000, no \
         network, no capabilities, no-new-privileges, read-only system, only /workspace, /tmp and \
         the home directory writable, memory, CPU and process limits); never exposes the host \
         shell; shares the host kernel"
    }

    fn commands(&self, runtime: Option<&str>) -> &'static str {
        if self.spawner.is_some() && runs_spawner(runtime) {
            "spawner"
        } else {
            "exec"
        }
    }

    async fn check(&self) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let mut runtimes_checked: Vec<&str> = Vec::new();
        for (image, runtime) in &self.needs {
            match docker.inspect_image(image).await {
                Ok(_) => {}
                Err(e) if matches!(status(&e), Some(404)) => {
                    return Err(Self::missing_image(image))
                }
                Err(e) => {
                    return Err(BackendError::Unavailable(format!(
                        "cannot inspect the sandbox image {image}: {e}: {NO_DOCKER_HINT}"
                    )))
                }
            }
            if let Some(runtime) = runtime.as_deref() {
                if !runtimes_checked.contains(&runtime) {
                    Self::check_runtime(docker, runtime).await?;
                    runtimes_checked.push(runtime);
                }
            }
        }
        Ok(())
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxRef, BackendError> {
        let dir = spec.workspace_dir.clone();
        let spawned = self.spawner.is_some() && runs_spawner(spec.limits.runtime.as_deref());
        let (workspace, run_dir) = tokio::task::spawn_blocking(move || {
            // The sandbox's folder (its workspace, skills and run directory) is the worker's
            // alone: the container reaches them through its bind mounts.
            if let Some(folder) = dir.parent() {
                make_private(folder, None).map_err(|e| {
                    BackendError::Failed(format!("preparing {}: {e}", folder.display()))
                })?;
            }
            let workspace = prepare_workspace(&dir)?;
            std::fs::create_dir_all(skills_dir_of(&workspace))
                .map_err(|e| BackendError::Failed(format!("creating the skills directory: {e}")))?;
            // The spawner's socket: beside the workspace, writable by the sandbox user until
            // the worker connected (see `connect_spawner`).
            let run_dir = match spawned {
                true => Some(open_run_dir(&run_dir_of(&workspace))?),
                false => None,
            };
            Ok::<_, BackendError>((workspace, run_dir))
        })
        .await
        .map_err(|e| BackendError::Failed(format!("preparing workspace: {e}")))??;
        let bound = [Some(workspace.as_path()), run_dir.as_deref()]
            .into_iter()
            .chain([self
                .spawner
                .as_ref()
                .filter(|_| spawned)
                .map(|s| s.program.as_path())])
            .flatten();
        for path in bound {
            if path.to_str().is_none_or(|p| p.contains([':', ','])) {
                return Err(BackendError::Failed(format!(
                    "path {} cannot be bound into a container (not UTF-8, or holds ':' or ',')",
                    path.display()
                )));
            }
        }
        let docker = self.client().await?;
        let name = container_name(&spec.sandbox_id);
        let body = self.container_body(spec, &workspace, run_dir.as_deref());
        let options = || CreateContainerOptions {
            name: Some(name.clone()),
            platform: String::new(),
        };
        let created = match docker.create_container(Some(options()), body.clone()).await {
            Err(e) if matches!(status(&e), Some(409)) => {
                // A container of that name is left over (same sandbox id): replace it.
                self.remove(&name).await?;
                docker.create_container(Some(options()), body).await
            }
            other => other,
        };
        let created = created.map_err(|e| match status(&e) {
            Some(404) => Self::missing_image(spec.image.as_deref().unwrap_or(&self.image)),
            _ => BackendError::Failed(format!("creating container {name}: {e}")),
        })?;
        if let Err(e) = docker
            .start_container(&created.id, None::<StartContainerOptions>)
            .await
        {
            let _ = self.remove(&created.id).await;
            return Err(BackendError::Failed(format!(
                "starting container {name}: {e}"
            )));
        }
        if let Some(run_dir) = &run_dir {
            match connect_spawner(docker, &created.id, run_dir, &spec.sandbox_id).await {
                Ok(link) => {
                    lock(&self.links).insert(spec.sandbox_id.clone(), link);
                }
                Err(why) => {
                    let _ = self.remove(&created.id).await;
                    return Err(BackendError::Failed(format!(
                        "the sandbox spawner in container {name} did not start: {why} (an image \
                         that cannot run the worker's binary needs TOOLMESH_SANDBOX_DOCKER_COMMANDS=exec)"
                    )));
                }
            }
        }
        if self.spawner.is_some() && !spawned {
            lock(&self.by_exec).insert(spec.sandbox_id.clone());
        }
        tracing::debug!(container = %name, id = %created.id, "sandbox container started");
        Ok(SandboxRef {
            sandbox_id: spec.sandbox_id.clone(),
            container_id: created.id,
            workspace_dir: workspace,
        })
    }

    async fn destroy(&self, sandbox: &SandboxRef) -> Result<(), BackendError> {
        // The spawner exits when its socket closes; the removal kills whatever is left.
        lock(&self.links).remove(&sandbox.sandbox_id);
        lock(&self.by_exec).remove(&sandbox.sandbox_id);
        self.remove(&container_ref(sandbox)).await.map(drop)
    }

    async fn exec(
        &self,
        sandbox: &SandboxRef,
        spec: ExecSpec,
        gate: StartGate,
    ) -> Result<Execution, BackendError> {
        if spec.argv.is_empty() {
            return Err(BackendError::Failed("empty command".to_owned()));
        }
        if self.spawner.is_some() && !lock(&self.by_exec).contains(&sandbox.sandbox_id) {
            // Nothing to prepare: a spawn is all of it.
            gate.pass().await?;
            let link = lock(&self.links).get(&sandbox.sandbox_id).cloned();
            let link = link.ok_or_else(|| BackendError::Gone(sandbox.sandbox_id.clone()))?;
            return link.exec(spec, &SPAWNED).await;
        }
        let docker = self.client().await?.clone();
        let container = container_ref(sandbox);
        let mut env: Vec<String> = spec
            .env
            .iter()
            .filter(|(k, _)| k.as_str() != EXEC_ID_VAR)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("{EXEC_ID_VAR}={}", spec.exec_id));
        let cwd = if spec.cwd.is_empty() {
            WORKSPACE.to_owned()
        } else {
            spec.cwd
        };
        let mut cmd = ["sh", "-c", WRAPPER.as_str(), "toolmesh-exec"]
            .map(str::to_owned)
            .to_vec();
        cmd.extend([spec.exec_id.clone(), KILL_ROUNDS.to_string()]);
        cmd.extend(spec.argv);
        let created = docker
            .create_exec(
                &container,
                CreateExecOptions {
                    // Always: the wrapper's nonce comes first on stdin.
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    env: Some(env),
                    cmd: Some(cmd),
                    user: Some(SANDBOX_USER.to_owned()),
                    working_dir: Some(cwd),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| exec_error(e, &sandbox.sandbox_id))?;
        // An exec created but never started is Docker's to forget (it collects those).
        gate.pass().await?;
        let options = StartExecOptions {
            detach: false,
            tty: false,
            output_capacity: None,
        };
        let exit_notice = self
            .exits
            .get_or_init(|| ExecExits::watch(docker.clone()))
            .register(&created.id);
        let (mut stream, mut input) = match docker
            .start_exec(&created.id, Some(options))
            .await
            .map_err(|e| exec_error(e, &sandbox.sandbox_id))?
        {
            StartExecResults::Attached { output, input } => (output, input),
            StartExecResults::Detached => {
                return Err(BackendError::Failed(
                    "docker started the exec detached".to_owned(),
                ))
            }
        };
        // The nonce, then the caller's stdin or its end. Should this fail, the wrapper reads
        // no nonce, writes no end line, and a kill exec sweeps after it.
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let told = async {
            input.write_all(format!("{nonce}\n").as_bytes()).await?;
            match spec.stdin {
                true => input.flush().await,
                false => input.shutdown().await,
            }
        };
        if let Err(e) = told.await {
            tracing::debug!(error = %e, "cannot send the exec wrapper its nonce");
        }

        let (out_tx, out_rx) = mpsc::channel(OUTPUT_CHANNEL);
        let (exit_tx, exit_rx) = oneshot::channel();
        let exec_id = created.id;
        let sandbox_id = sandbox.sandbox_id.clone();
        let waiter = docker.clone();
        let container_name = container.clone();
        let marker = spec.exec_id.clone();
        let swept = Swept::default();
        let kill = kill_switch(docker, container, spec.exec_id, Arc::clone(&swept));
        tokio::spawn(async move {
            let mut tx = Some(out_tx);
            let mut end_line = EndLine::new(&nonce);
            // A dropped receiver: keep draining so the process never blocks on a full pipe.
            let mut forward = async |chunk: Output| {
                if let Some(sender) = &tx {
                    if sender.send(chunk).await.is_err() {
                        tx = None;
                    }
                }
            };
            while let Some(item) = stream.next().await {
                let chunks = match item {
                    Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                        end_line.stdout(message)
                    }
                    Ok(LogOutput::StdErr { message }) => end_line.stderr(message),
                    Ok(LogOutput::StdIn { .. }) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "exec output stream ended with an error");
                        break;
                    }
                };
                for chunk in chunks.into_iter().flatten() {
                    forward(chunk).await;
                }
            }
            let (rest, clean) = end_line.finish();
            if let Some(rest) = rest {
                forward(rest).await;
            }
            drop(tx);
            // 126 may mean the container went away: inspect tells.
            let status = match exit_notice.wait(EVENT_WAIT).await {
                Some(code) if code != 126 => Ok(ExitStatus { code }),
                _ => exit_status(&waiter, &container_name, &exec_id, &sandbox_id).await,
            };
            // What it left running (and what escaped it) ends before its end is told: its
            // wrapper swept, or a kill exec does (unless the kill switch did, or does now).
            let mut done = swept.lock().await;
            if status.is_ok() && !clean && !*done {
                kill_tree(&waiter, &container_name, &marker).await;
            }
            *done = true;
            drop(done);
            let _ = exit_tx.send(status);
        });

        let stdin: Option<StdinWriter> = spec.stdin.then(|| {
            Box::pin(ExecStdin {
                inner: Some(input),
                shut: false,
            }) as StdinWriter
        });
        Ok(Execution {
            output: out_rx,
            stdin,
            exit: exit_rx,
            kill,
        })
    }

    async fn reap_orphans(
        &self,
        scope: &str,
        this_node: &str,
        live_nodes: Option<&[String]>,
    ) -> Result<usize, BackendError> {
        let docker = self.client().await?;
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![
                    format!("{LABEL_MANAGED}=1"),
                    format!("{LABEL_SCOPE}={scope}"),
                ],
            )])),
            ..Default::default()
        };
        let containers = docker
            .list_containers(Some(options))
            .await
            .map_err(|e| BackendError::Failed(format!("listing sandbox containers: {e}")))?;
        let mut removed = 0;
        for container in containers {
            let Some(id) = container.id else { continue };
            let node = container
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_NODE))
                .map(String::as_str);
            let orphan = match (node, live_nodes) {
                (Some(node), _) if node == this_node => true,
                (Some(node), Some(live)) => !live.iter().any(|l| l == node),
                (None, Some(_)) => true,
                (_, None) => false,
            };
            if orphan && self.remove(&id).await? {
                tracing::info!(container = %id, node = ?node, "removed orphaned sandbox container");
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// A sandbox's `run` directory (the spawner's socket), beside its workspace.
fn run_dir_of(workspace: &Path) -> PathBuf {
    workspace.with_file_name("run")
}

/// Creates `dir` (owned by this worker) with mode 0777, so that the spawner, the sandbox user,
/// can create its socket there; the worker closes it once connected. Its parent, the sandbox's
/// folder, is private to this worker ([`make_private`]): nobody else on the host reaches the
/// socket meanwhile.
fn open_run_dir(dir: &Path) -> Result<PathBuf, BackendError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |e: io::Error| BackendError::Failed(format!("preparing {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).map_err(fail)?;
    dir.canonicalize().map_err(fail)
}

/// Connects to the spawner of a container just started and waits for its `ready`. The socket
/// is reached through an `O_PATH` handle on `run_dir` (`/proc/self/fd/N/…`), so a long path
/// does not matter (Unix socket paths hold 107 bytes). By `ready` the spawner has removed its
/// socket; then `run_dir` becomes read-only to the sandbox (mode 0555, owned by this worker),
/// so nothing the sandbox runs can leave files there on the host. Then [`warm_up`].
async fn connect_spawner(
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

/// The exit status of a finished exec. The output can end a moment before Docker records the
/// exit code, so a still-running answer is retried briefly.
async fn exit_status(
    docker: &Docker,
    container: &str,
    exec_id: &str,
    sandbox_id: &str,
) -> Result<ExitStatus, BackendError> {
    let mut delay = Duration::from_millis(1);
    for _ in 0..40 {
        match docker.inspect_exec(exec_id).await {
            // 126: Docker could not run the process, also when the container went away
            // under it ("task … not found").
            Ok(inspect) => match (inspect.running, inspect.exit_code) {
                (Some(false), Some(126)) if !container_running(docker, container).await => {
                    return Err(BackendError::Gone(sandbox_id.to_owned()))
                }
                (Some(false), Some(code)) => return Ok(ExitStatus { code }),
                _ => {}
            },
            Err(e) if matches!(status(&e), Some(404)) => {
                return Err(BackendError::Gone(sandbox_id.to_owned()))
            }
            Err(e) => return Err(BackendError::Failed(format!("inspecting exec: {e}"))),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
    Err(BackendError::Failed(format!(
        "exec {exec_id} ended its output but did not exit"
    )))
}

async fn container_running(docker: &Docker, container: &str) -> bool {
    let inspect = docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await;
    inspect.ok().and_then(|c| c.state?.running).unwrap_or(false)
}

/// Whether an exec's processes were swept since its end or by a kill (then there is nothing
/// left to kill); held while a kill exec runs, so its end waits for a kill in flight.
type Swept = Arc<tokio::sync::Mutex<bool>>;

fn kill_switch(docker: Docker, container: String, exec_id: String, swept: Swept) -> KillSwitch {
    KillSwitch(Arc::new(move || {
        let (docker, container, exec_id) = (docker.clone(), container.clone(), exec_id.clone());
        let swept = Arc::clone(&swept);
        Box::pin(async move {
            let mut done = swept.lock().await;
            if !*done {
                kill_tree(&docker, &container, &exec_id).await;
                *done = true;
            }
        })
    }))
}

/// Runs the kill exec ([`SWEEP`] of `exec_id`) in the container as the sandbox user, a few
/// times if it cannot start or finish (a fork bomb can hold every pid the container may
/// have). As a last resort, or when one run does not end within [`KILL_WAIT`], the container
/// is restarted (`docker restart -t 0`: every process in it dies; the container id, its
/// workspace and limits stay).
async fn kill_tree(docker: &Docker, container: &str, exec_id: &str) {
    for attempt in 1..=KILL_ATTEMPTS {
        match tokio::time::timeout(KILL_WAIT, run_killer(docker, container, exec_id)).await {
            Ok(Ok(0)) => return,
            Ok(Ok(code)) => {
                tracing::debug!(attempt, code, exec_id, "kill exec did not finish the job")
            }
            Ok(Err(e)) if matches!(status(&e), Some(404 | 409)) => return, // the container is gone
            Ok(Err(e)) => tracing::debug!(attempt, error = %e, exec_id, "kill exec failed"),
            Err(_) => {
                tracing::debug!(attempt, exec_id, "kill exec did not end in time");
                break;
            }
        }
    }
    tracing::warn!(
        container,
        exec_id,
        "cannot kill the process tree from inside; restarting the sandbox"
    );
    let options = RestartContainerOptions {
        signal: Some("SIGKILL".to_owned()),
        t: Some(0),
    };
    if let Err(e) = docker.restart_container(container, Some(options)).await {
        tracing::warn!(container, error = %e, "restarting the sandbox failed");
    }
}

/// One kill exec; its exit code (0: nothing of the tree is left).
async fn run_killer(docker: &Docker, container: &str, exec_id: &str) -> Result<i64, DockerError> {
    let cmd = [
        "sh",
        "-c",
        KILLER.as_str(),
        "toolmesh-kill",
        exec_id,
        &KILL_ROUNDS.to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(cmd),
                user: Some(SANDBOX_USER.to_owned()),
                ..Default::default()
            },
        )
        .await?;
    let options = StartExecOptions {
        detach: false,
        tty: false,
        output_capacity: None,
    };
    if let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&created.id, Some(options)).await?
    {
        while output.next().await.is_some() {}
    }
    let mut delay = Duration::from_millis(1);
    for _ in 0..20 {
        let inspect = docker.inspect_exec(&created.id).await?;
        if let (Some(false), Some(code)) = (inspect.running, inspect.exit_code) {
            return Ok(code);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
    Ok(-1)
}

/// An exec's attached stdin. `shutdown` half-closes the connection, which Docker turns into
/// EOF on the process's stdin; dropping it without a shutdown does the same in the background.
struct ExecStdin {
    inner: Option<Pin<Box<dyn AsyncWrite + Send>>>,
    shut: bool,
}

impl ExecStdin {
    fn inner(&mut self) -> io::Result<&mut Pin<Box<dyn AsyncWrite + Send>>> {
        self.inner
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

impl AsyncWrite for ExecStdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.inner() {
            Ok(inner) => inner.as_mut().poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner() {
            Ok(inner) => inner.as_mut().poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = match self.inner() {
            Ok(inner) => inner.as_mut().poll_shutdown(cx),
            Err(e) => return Poll::Ready(Err(e)),
        };
        if poll.is_ready() {
            self.shut = true;
        }
        poll
    }
}

impl Drop for ExecStdin {
    fn drop(&mut self) {
        if self.shut {
            return;
        }
        if let (Some(mut inner), Ok(handle)) =
            (self.inner.take(), tokio::runtime::Handle::try_current())
        {
            handle.spawn(async move {
                let _ = inner.shutdown().await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` (`o:` stdout, `e:` stderr) through an [`EndLine`] for nonce `n1`: what
    /// passes on, in order (`o:`/`e:` again), and whether the end line came.
    fn check(chunks: &[&str], expect: &[&str], clean: bool) {
        let mut end_line = EndLine::new("n1");
        let mut passed = Vec::new();
        let mut pass = |out: Option<Output>| match out {
            Some(Output::Stdout(b)) => passed.push(format!("o:{}", String::from_utf8_lossy(&b))),
            Some(Output::Stderr(b)) => passed.push(format!("e:{}", String::from_utf8_lossy(&b))),
            None => {}
        };
        for chunk in chunks {
            let bytes = Bytes::from(chunk[2..].to_owned());
            let outs = match &chunk[..2] {
                "o:" => end_line.stdout(bytes),
                _ => end_line.stderr(bytes),
            };
            outs.into_iter().for_each(&mut pass);
        }
        let (rest, came) = end_line.finish();
        pass(rest);
        let expect: Vec<String> = expect.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!((passed, came), (expect, clean), "{chunks:?}");
    }

    #[test]
    fn the_end_line_is_taken_off_stderr_only_at_the_very_end() {
        let end = "\0toolmesh-swept:n1\n";
        check(&[], &[], false);
        check(&["o:out", "e:err"], &["o:out", "e:err"], false);
        check(&[&format!("e:err{end}")], &["e:err"], true);
        check(&["o:out", &format!("e:{end}")], &["o:out"], true);
        // In pieces, the first held back until the rest shows what it is.
        check(&["e:a\0tool", "e:mesh-swept:", "e:n1\n"], &["e:a"], true);
        // Stdout after it was written before it (Docker's two pipes reorder); stderr after
        // it shows it was output.
        check(&[&format!("e:{end}"), "o:late"], &["o:late"], true);
        check(
            &[&format!("e:{end}"), "o:late", "e:more"],
            &["o:late", &format!("e:{end}more")],
            false,
        );
        check(&[&format!("e:{end}x")], &[&format!("e:{end}x")], false);
        // A held tail is passed on before the stdout that follows it.
        check(&["e:x\0too", "o:y"], &["e:x", "e:\0too", "o:y"], false);
        // Another nonce, or a line cut short, is output.
        check(
            &["e:\0toolmesh-swept:n2\n"],
            &["e:\0toolmesh-swept:n2\n"],
            false,
        );
        check(
            &["e:\0toolmesh-swept:n1"],
            &["e:\0toolmesh-swept:n1"],
            false,
        );
    }
}
