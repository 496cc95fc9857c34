//! The process backend (bubblewrap): a sandbox is a set of namespaces that see the host's
//! `/usr` read-only, a private `/tmp`, and the sandbox's workspace at `/workspace`, held open
//! for the session by one long-lived *spawner* process inside them ([`super::spawner`]).
//!
//! Creating a sandbox runs `prlimit --as=… --nproc=… -- [setpriv --reuid=1000 …] bwrap … --
//! <spawner>` once. When this worker runs as root, `setpriv` first drops to uid/gid 1000 so the
//! sandboxed processes are an unprivileged user on the host too (as root, RLIMIT_NPROC would
//! not be enforced); bwrap then maps that uid to 1000 inside its user namespace. Without root,
//! the caller's uid is mapped to 1000 inside. Each command is then a fork and exec by the
//! spawner, with pipes this worker made: about a millisecond instead of a bwrap run's nine.
//!
//! Killing: a command's process group and every process carrying its `TOOLMESH_EXEC_ID` are
//! killed by the spawner, also when the command's first process exits. Destroying a sandbox
//! kills bwrap, which runs with `--unshare-pid --die-with-parent`: the namespace's init dies
//! and with it every process inside. bwrap dies with the worker *thread* that started it
//! (PR_SET_PDEATHSIG), so sandboxes are started from the async task, never from a blocking
//! pool thread, which exits when idle.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWrite, BufReader};
use tokio::net::unix::{pipe, OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch, OnceCell};

use super::docker::{prepare_workspace, EXEC_ID_VAR, OUTPUT_CHANNEL, SANDBOX_GID, SANDBOX_UID};
use super::spawner::{self, Event, Request, SpawnRequest, KILLED};
use super::{
    skills_dir_of, Backend, BackendError, ExecSpec, Execution, ExitStatus, KillSwitch, Output,
    SandboxLimits, SandboxRef, SandboxSpec, StartGate, StdinWriter, SKILLS_MOUNT,
};

/// Where Debian's `bubblewrap` package installs bwrap.
pub const DEFAULT_BWRAP: &str = "/usr/bin/bwrap";
const PRLIMIT: &str = "/usr/bin/prlimit";
const SETPRIV: &str = "/usr/bin/setpriv";
const WORKSPACE: &str = "/workspace";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const INSTALL_HINT: &str = "apt-get install bubblewrap (and allow unprivileged user namespaces: \
                            sysctl kernel.unprivileged_userns_clone=1)";
/// How long a kill waits for the process tree to be gone.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long a new sandbox's spawner may take to say it is ready.
const SPAWNER_START: Duration = Duration::from_secs(10);
/// How long output is still read after the command exited (and its leftovers were killed).
const OUTPUT_GRACE: Duration = Duration::from_millis(200);
/// Host `/etc` entries shown read-only inside (when present).
const HOST_ETC: &[&str] = &[
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/localtime",
];
/// Also shown when the sandbox has a network.
const HOST_ETC_NET: &[&str] = &[
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
];

/// The program a sandbox's spawner runs: a path on this host (bound read-only into the
/// sandbox at [`SPAWNER_MOUNT`]) and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Spawner {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Spawner {
    /// `toolmesh sandbox-spawner`: the running binary, when it is `toolmesh`.
    pub fn this_binary() -> Self {
        Self {
            program: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("toolmesh")),
            args: vec!["sandbox-spawner".to_owned()],
        }
    }

    /// A program that is the spawner by itself (the crate's `toolmesh-sandbox-spawner`).
    pub fn program(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
        }
    }
}

/// Where the sandbox sees its spawner's program.
pub const SPAWNER_MOUNT: &str = "/run/toolmesh-spawner";

/// Runs each sandbox as bubblewrap namespaces held by a spawner.
pub struct ProcessBackend {
    bwrap: PathBuf,
    spawner: Spawner,
    /// Drop to uid 1000 with setpriv before bwrap (this worker runs as root).
    as_root: bool,
    /// Generated `/etc/passwd`, `/etc/group`, `/etc/hosts` for the sandbox (made on first use).
    etc: OnceCell<EtcDir>,
    /// `--symlink`/`--ro-bind` arguments for `/bin`, `/lib`… (merged `/usr` or not).
    root_args: Vec<String>,
    sandboxes: Mutex<HashMap<String, Arc<Link>>>,
    next_exec: AtomicU64,
}

impl std::fmt::Debug for ProcessBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessBackend")
            .field("bwrap", &self.bwrap)
            .field("spawner", &self.spawner)
            .finish()
    }
}

impl Default for ProcessBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessBackend {
    /// A backend using [`DEFAULT_BWRAP`] and [`Spawner::this_binary`]. Nothing is checked
    /// here: see [`Backend::check`].
    pub fn new() -> Self {
        Self::with_bwrap(PathBuf::from(DEFAULT_BWRAP))
    }

    /// A backend using the given bwrap binary.
    pub fn with_bwrap(bwrap: PathBuf) -> Self {
        let mut root_args = Vec::new();
        for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            let path = Path::new("/").join(name);
            match std::fs::read_link(&path) {
                Ok(target) => {
                    root_args.extend(["--symlink".to_owned(), target.display().to_string()]);
                    root_args.push(path.display().to_string());
                }
                Err(_) if path.is_dir() => {
                    let path = path.display().to_string();
                    root_args.extend(["--ro-bind".to_owned(), path.clone(), path]);
                }
                Err(_) => {}
            }
        }
        Self {
            bwrap,
            spawner: Spawner::this_binary(),
            as_root: rustix::process::geteuid().is_root(),
            etc: OnceCell::new(),
            root_args,
            sandboxes: Mutex::new(HashMap::new()),
            next_exec: AtomicU64::new(0),
        }
    }

    /// The same backend with another spawner program.
    pub fn with_spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = spawner;
        self
    }

    async fn etc(&self) -> Result<&Path, BackendError> {
        let etc = self
            .etc
            .get_or_try_init(|| async { EtcDir::create() })
            .await?;
        Ok(&etc.path)
    }

    /// What follows prlimit's own options: setpriv down to uid 1000 when the worker is root
    /// (see the module docs), then bwrap itself.
    fn launcher_args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(7);
        if self.as_root {
            args.extend(
                [
                    SETPRIV,
                    "--reuid=1000",
                    "--regid=1000",
                    "--clear-groups",
                    "--",
                ]
                .map(str::to_owned),
            );
        }
        args.push(self.bwrap.display().to_string());
        args
    }

    /// The command that starts a sandbox: prlimit, setpriv (as root), bwrap and its arguments,
    /// then the spawner.
    fn command(&self, etc_dir: &Path, workspace: &Path, limits: &SandboxLimits) -> Command {
        let network = !matches!(limits.network.as_str(), "" | "none");
        let mut args: Vec<String> = vec![
            format!("--as={}", limits.memory_mb.saturating_mul(1024 * 1024)),
            format!("--nproc={}", limits.pids),
            "--".into(),
        ];
        args.extend(self.launcher_args());
        args.extend(self.namespace_args(network));
        args.extend(["--ro-bind", "/usr", "/usr"].map(str::to_owned));
        args.extend(self.root_args.iter().cloned());
        let etc: &[&str] = if network {
            &[HOST_ETC, HOST_ETC_NET].concat()
        } else {
            HOST_ETC
        };
        for path in etc {
            args.extend(["--ro-bind-try", path, path].map(str::to_owned));
        }
        for name in ["passwd", "group"]
            .iter()
            .chain(if network { &[][..] } else { &["hosts"][..] })
        {
            let host = etc_dir.join(name).display().to_string();
            args.extend(["--ro-bind".to_owned(), host, format!("/etc/{name}")]);
        }
        args.extend(["--proc", "/proc", "--dev", "/dev"].map(str::to_owned));
        args.extend([
            "--size".to_owned(),
            limits
                .tmpfs_mb
                .max(1)
                .saturating_mul(1024 * 1024)
                .to_string(),
            "--tmpfs".to_owned(),
            "/tmp".to_owned(),
        ]);
        args.extend([
            "--bind".to_owned(),
            workspace.display().to_string(),
            WORKSPACE.to_owned(),
            "--ro-bind-try".to_owned(),
            skills_dir_of(workspace).display().to_string(),
            SKILLS_MOUNT.to_owned(),
            "--ro-bind".to_owned(),
            self.spawner.program.display().to_string(),
            SPAWNER_MOUNT.to_owned(),
        ]);
        args.extend(["--remount-ro", "/"].map(str::to_owned));
        args.extend(["--chdir", WORKSPACE, "--clearenv"].map(str::to_owned));
        args.extend(["--setenv", "PATH", PATH, "--setenv", "HOME", "/tmp"].map(str::to_owned));
        args.extend(["--".to_owned(), SPAWNER_MOUNT.to_owned()]);
        args.extend(self.spawner.args.iter().cloned());

        let mut command = Command::new(PRLIMIT);
        command
            .args(args)
            .env_clear()
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Dropping the backend (or a sandbox) kills bwrap, and with it the sandbox.
            .kill_on_drop(true);
        command
    }

    /// Namespaces, user and capabilities.
    fn namespace_args(&self, network: bool) -> Vec<String> {
        let mut args: Vec<&str> = vec!["--die-with-parent", "--new-session", "--unshare-all"];
        if network {
            args.push("--share-net");
        }
        args.extend([
            "--unshare-user",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--cap-drop",
            "ALL",
        ]);
        args.into_iter().map(str::to_owned).collect()
    }

    fn unavailable(&self, why: &str) -> BackendError {
        BackendError::Unavailable(format!(
            "bubblewrap ({}) cannot run sandboxes here: {why}: {INSTALL_HINT}",
            self.bwrap.display()
        ))
    }

    fn link(&self, sandbox_id: &str) -> Result<Arc<Link>, BackendError> {
        lock(&self.sandboxes)
            .get(sandbox_id)
            .cloned()
            .ok_or_else(|| BackendError::Gone(sandbox_id.to_owned()))
    }
}

#[async_trait::async_trait]
impl Backend for ProcessBackend {
    fn wire_name(&self) -> &'static str {
        "sandbox/process"
    }

    fn boundary(&self) -> &'static str {
        "executes only through the sandbox backend (bubblewrap: fresh user, pid, mount, ipc, uts and \
         network namespaces per session, no network, uid 1000 without capabilities, read-only \
         system, only /workspace and /tmp writable); shares the host kernel; limits are rlimits \
         (address space, processes of uid 1000 on the worker), not cgroups: no CPU limit"
    }

    async fn check(&self) -> Result<(), BackendError> {
        if !self.bwrap.is_file() {
            return Err(self.unavailable("not installed"));
        }
        if !self.spawner.program.is_file() {
            return Err(BackendError::Unavailable(format!(
                "the sandbox spawner {} is missing (it is the toolmesh binary itself: run the node from an installed toolmesh)",
                self.spawner.program.display()
            )));
        }
        let mut args: Vec<String> = vec!["--nproc=4096".into(), "--".into()];
        args.extend(self.launcher_args());
        args.extend(self.namespace_args(false));
        args.extend(["--ro-bind", "/", "/", "true"].map(str::to_owned));
        let run = Command::new(PRLIMIT)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(Duration::from_secs(10), run).await {
            Ok(Ok(out)) if out.status.success() => Ok(()),
            Ok(Ok(out)) => Err(self.unavailable(String::from_utf8_lossy(&out.stderr).trim())),
            Ok(Err(e)) => Err(self.unavailable(&e.to_string())),
            Err(_) => Err(self.unavailable("a test run did not finish within 10 s")),
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxRef, BackendError> {
        let dir = spec.workspace_dir.clone();
        let as_root = self.as_root;
        let workspace = tokio::task::spawn_blocking(move || {
            if as_root {
                // setpriv makes the sandbox uid 1000 on the host: it must own the workspace.
                prepare_workspace(&dir)
            } else {
                // The caller's uid is the sandbox's uid 1000: its own directory is writable.
                std::fs::create_dir_all(&dir)
                    .and_then(|()| dir.canonicalize())
                    .map_err(|e| {
                        BackendError::Failed(format!("creating workspace {}: {e}", dir.display()))
                    })
            }
        })
        .await
        .map_err(|e| BackendError::Failed(format!("preparing workspace: {e}")))??;
        std::fs::create_dir_all(skills_dir_of(&workspace))
            .map_err(|e| BackendError::Failed(format!("creating the skills directory: {e}")))?;
        let etc_dir = self.etc().await?;
        // Here, on the task's own thread (see the module docs on PR_SET_PDEATHSIG).
        let command = self.command(etc_dir, &workspace, &spec.limits);
        let link = Link::start(command, &spec.sandbox_id)
            .await
            .map_err(|why| match why {
                LinkError::Spawn(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.unavailable(&format!("{PRLIMIT}: {e}"))
                }
                LinkError::Spawn(e) => BackendError::Failed(format!("starting bwrap: {e}")),
                LinkError::NotReady(why) => {
                    BackendError::Failed(format!("the sandbox did not start: {why}"))
                }
            })?;
        lock(&self.sandboxes).insert(spec.sandbox_id.clone(), Arc::new(link));
        Ok(SandboxRef {
            sandbox_id: spec.sandbox_id.clone(),
            container_id: String::new(),
            workspace_dir: workspace,
        })
    }

    async fn destroy(&self, sandbox: &SandboxRef) -> Result<(), BackendError> {
        let link = lock(&self.sandboxes).remove(&sandbox.sandbox_id);
        if let Some(link) = link {
            link.shut().await;
        }
        Ok(())
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
        // Nothing to do before: a spawn is all of it.
        gate.pass().await?;
        let link = self.link(&sandbox.sandbox_id)?;
        let failed = |what: &str, e: io::Error| BackendError::Failed(format!("{what}: {e}"));
        let pipe = || {
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| failed("making a pipe", e.into()))
        };
        let (stdout, stdout_w) = pipe()?;
        let (stderr, stderr_w) = pipe()?;
        let (stdin_r, stdin_w): (OwnedFd, Option<OwnedFd>) = if spec.stdin {
            let (r, w) = pipe()?;
            (r, Some(w))
        } else {
            let null = std::fs::File::open("/dev/null").map_err(|e| failed("/dev/null", e))?;
            (null.into(), None)
        };
        let mut env: Vec<(String, String)> = vec![
            ("PATH".to_owned(), PATH.to_owned()),
            ("HOME".to_owned(), "/tmp".to_owned()),
        ];
        env.extend(
            spec.env
                .into_iter()
                .filter(|(k, _)| k.as_str() != EXEC_ID_VAR),
        );
        let id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let request = SpawnRequest {
            id,
            argv: spec.argv,
            env,
            cwd: if spec.cwd.is_empty() {
                WORKSPACE.to_owned()
            } else {
                spec.cwd
            },
            marker: spec.exec_id,
        };
        let exited = link
            .spawn(
                request,
                [stdin_r.as_fd(), stdout_w.as_fd(), stderr_w.as_fd()],
            )
            .await?;
        // The spawner holds its own copies now: ours would keep the pipes open.
        drop((stdin_r, stdout_w, stderr_w));
        let receiver =
            |r: OwnedFd| pipe::Receiver::from_owned_fd(r).map_err(|e| failed("reading a pipe", e));
        let (stdout, stderr) = (receiver(stdout)?, receiver(stderr)?);
        let stdin = match stdin_w {
            Some(w) => Some(Box::pin(PipeStdin(Some(
                pipe::Sender::from_owned_fd(w).map_err(|e| failed("writing a pipe", e))?,
            ))) as StdinWriter),
            None => None,
        };

        let (out_tx, out_rx) = mpsc::channel(OUTPUT_CHANNEL);
        let (exit_tx, exit_rx) = oneshot::channel();
        let (done_tx, done_rx) = watch::channel(false);
        let killer = Arc::clone(&link);
        let kill = KillSwitch(Arc::new(move || {
            let killer = Arc::clone(&killer);
            let mut done_rx = done_rx.clone();
            Box::pin(async move {
                if !*done_rx.borrow() {
                    killer.kill(id).await;
                }
                let _ = tokio::time::timeout(KILL_WAIT, done_rx.wait_for(|done| *done)).await;
            })
        }));
        tokio::spawn(async move {
            let code = supervise(stdout, stderr, out_tx, exited).await;
            let _ = exit_tx.send(Ok(ExitStatus { code }));
            done_tx.send_replace(true);
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
        _scope: &str,
        _this_node: &str,
        _live_nodes: Option<&[String]>,
    ) -> Result<usize, BackendError> {
        // Nothing outlives its worker: bwrap runs with --die-with-parent.
        Ok(0)
    }
}

/// Commands sent and not yet exited, by id, each with where its exit code goes; `None` once
/// the spawner is gone.
type Waiting = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<i64>>>>>;

/// Why a sandbox's spawner did not start.
enum LinkError {
    Spawn(io::Error),
    NotReady(String),
}

/// This worker's end of one sandbox: the spawner's socket and bwrap's process.
struct Link {
    sandbox_id: String,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Waiting,
    process: tokio::sync::Mutex<Option<Child>>,
}

impl Link {
    /// Starts bwrap with the spawner and waits for the spawner's `ready`.
    async fn start(mut command: Command, sandbox_id: &str) -> Result<Self, LinkError> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(LinkError::Spawn)?;
        command.stdin(Stdio::from(OwnedFd::from(theirs)));
        let mut child = command.spawn().map_err(LinkError::Spawn)?;
        let said = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(stderr, sandbox_id.to_owned(), Arc::clone(&said)));
        }
        ours.set_nonblocking(true).map_err(LinkError::Spawn)?;
        let (mut reader, writer) = tokio::net::UnixStream::from_std(ours)
            .map_err(LinkError::Spawn)?
            .into_split();
        let waiting = Arc::new(Mutex::new(Some(HashMap::new())));
        let ready = tokio::time::timeout(SPAWNER_START, spawner::next_event(&mut reader)).await;
        match ready {
            Ok(Ok(Some(Event::Ready))) => {}
            other => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(KILL_WAIT, child.wait()).await;
                // Give the stderr logger a moment to take bwrap's last words.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let said = lock(&said).trim().to_owned();
                let why = match other {
                    Err(_) => format!("no answer within {} s", SPAWNER_START.as_secs()),
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(_)) => "it ended at once".to_owned(),
                };
                return Err(LinkError::NotReady(if said.is_empty() {
                    why
                } else {
                    format!("{why}: {said}")
                }));
            }
        }
        tokio::spawn(read_events(reader, Arc::clone(&waiting)));
        Ok(Self {
            sandbox_id: sandbox_id.to_owned(),
            writer: tokio::sync::Mutex::new(writer),
            waiting,
            process: tokio::sync::Mutex::new(Some(child)),
        })
    }

    /// Sends a spawn request; the receiver resolves with the command's exit code.
    async fn spawn(
        &self,
        request: SpawnRequest,
        fds: [BorrowedFd<'_>; 3],
    ) -> Result<oneshot::Receiver<i64>, BackendError> {
        let id = request.id;
        let (tx, rx) = oneshot::channel();
        match lock(&self.waiting).as_mut() {
            Some(waiting) => waiting.insert(id, tx),
            None => return Err(BackendError::Gone(self.sandbox_id.clone())),
        };
        let request = Request::Spawn(request);
        let sent = spawner::send(&mut *self.writer.lock().await, &request, &fds).await;
        if let Err(e) = sent {
            if let Some(waiting) = lock(&self.waiting).as_mut() {
                waiting.remove(&id);
            }
            return Err(match e.kind() {
                io::ErrorKind::InvalidInput => BackendError::Failed(e.to_string()),
                _ => BackendError::Gone(self.sandbox_id.clone()),
            });
        }
        Ok(rx)
    }

    async fn kill(&self, id: u64) {
        let _ = spawner::send(&mut *self.writer.lock().await, &Request::Kill { id }, &[]).await;
    }

    /// Kills bwrap (the sandbox ends with it) and waits until it is gone.
    async fn shut(&self) {
        if let Some(mut child) = self.process.lock().await.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(KILL_WAIT, child.wait()).await;
        }
    }
}

/// Resolves each command's exit as the spawner reports it; when the spawner is gone, every
/// command still waiting ends as killed (137).
async fn read_events(mut reader: OwnedReadHalf, waiting: Waiting) {
    loop {
        match spawner::next_event(&mut reader).await {
            Ok(Some(Event::Exited { id, code })) => {
                let tx = lock(&waiting).as_mut().and_then(|w| w.remove(&id));
                if let Some(tx) = tx {
                    let _ = tx.send(code);
                }
            }
            Ok(Some(Event::Ready)) => {}
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "lost the sandbox spawner's socket");
                break;
            }
        }
    }
    let left = lock(&waiting).take().unwrap_or_default();
    for tx in left.into_values() {
        let _ = tx.send(KILLED);
    }
}

/// Logs what bwrap or the spawner write to stderr, keeping the latest for error messages.
async fn log_stderr(
    stderr: tokio::process::ChildStderr,
    sandbox_id: String,
    said: Arc<Mutex<String>>,
) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::warn!(sandbox_id = %sandbox_id, "sandbox: {line}");
        *lock(&said) = line;
    }
}

/// Forwards both output pipes in arrival order until both end, or until a moment after the
/// command exited (a process that escaped its kill may hold them open), and returns the
/// exit code.
async fn supervise(
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    out_tx: mpsc::Sender<Output>,
    mut exited: oneshot::Receiver<i64>,
) -> i64 {
    let mut tx = Some(out_tx);
    let (mut stdout, mut stderr) = (Some(stdout), Some(stderr));
    let (mut out_buf, mut err_buf) = (vec![0u8; 8192], vec![0u8; 8192]);
    let mut code: Option<i64> = None;
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    while stdout.is_some() || stderr.is_some() {
        let chunk = tokio::select! {
            read = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => match read {
                Some(n) => Output::Stdout(Bytes::copy_from_slice(&out_buf[..n])),
                None => { stdout = None; continue }
            },
            read = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => match read {
                Some(n) => Output::Stderr(Bytes::copy_from_slice(&err_buf[..n])),
                None => { stderr = None; continue }
            },
            exit = &mut exited, if code.is_none() => {
                code = Some(exit.unwrap_or(KILLED));
                grace.as_mut().reset(tokio::time::Instant::now() + OUTPUT_GRACE);
                continue
            }
            () = &mut grace, if code.is_some() => break,
        };
        // A dropped receiver: keep draining so the process never blocks on a full pipe.
        if let Some(sender) = &tx {
            if sender.send(chunk).await.is_err() {
                tx = None;
            }
        }
    }
    match code {
        Some(code) => code,
        None => exited.await.unwrap_or(KILLED),
    }
}

/// Reads a chunk; `None` at EOF or on an error.
async fn read_some(reader: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> Option<usize> {
    match reader.as_mut()?.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// The command's stdin pipe; `shutdown` closes it, so the process reads EOF.
struct PipeStdin(Option<pipe::Sender>);

impl AsyncWrite for PipeStdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.0.as_mut() {
            Some(pipe) => Pin::new(pipe).poll_write(cx, buf),
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0.as_mut() {
            Some(pipe) => Pin::new(pipe).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = std::task::ready!(self.as_mut().poll_flush(cx));
        self.0 = None;
        Poll::Ready(flushed)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A directory of generated `/etc` files, removed when the backend is dropped.
struct EtcDir {
    path: PathBuf,
}

impl EtcDir {
    fn create() -> Result<Self, BackendError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let fail = |e: io::Error| BackendError::Failed(format!("writing the sandbox /etc: {e}"));
        // `create_dir` fails on an existing path (never follows a planted symlink).
        let path = loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("toolmesh-sandbox-etc-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => break path,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(fail(e)),
            }
        };
        let (uid, gid) = (SANDBOX_UID, SANDBOX_GID);
        let files = [
            (
                "passwd",
                format!(
                    "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}:sandbox:/tmp:/bin/sh\n\
                     nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                ),
            ),
            ("group", format!("root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n")),
            ("hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost\n".to_owned()),
        ];
        for (name, content) in files {
            std::fs::write(path.join(name), content).map_err(fail)?;
        }
        Ok(Self { path })
    }
}

impl Drop for EtcDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
