//! The process backend (bubblewrap): each command runs in fresh namespaces that see the host's
//! `/usr` read-only, a private `/tmp`, and the sandbox's workspace at `/workspace`.
//!
//! A sandbox is only its workspace directory and its limits; each execution is
//! `prlimit --as=… --nproc=… -- [setpriv --reuid=1000 …] bwrap … -- argv`. When this worker
//! runs as root, `setpriv` first drops to uid/gid 1000 so the sandboxed process is an
//! unprivileged user on the host too (as root, RLIMIT_NPROC would not be enforced); bwrap then
//! maps that uid to 1000 inside its user namespace. Without root, the caller's uid is mapped to
//! 1000 inside.
//!
//! Killing: bwrap runs with `--unshare-pid --die-with-parent`, so SIGKILL to the outer bwrap
//! (our child) kills the namespace's init and with it every process inside.

use std::collections::HashMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch, OnceCell};

use super::docker::{prepare_workspace, EXEC_ID_VAR, OUTPUT_CHANNEL, SANDBOX_GID, SANDBOX_UID};
use super::{
    skills_dir_of, Backend, BackendError, ExecSpec, Execution, ExitStatus, KillSwitch, Output,
    SandboxLimits, SandboxRef, SandboxSpec, StdinWriter, SKILLS_MOUNT,
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

/// Runs each command in a bubblewrap sandbox.
pub struct ProcessBackend {
    bwrap: PathBuf,
    /// Drop to uid 1000 with setpriv before bwrap (this worker runs as root).
    as_root: bool,
    /// Generated `/etc/passwd`, `/etc/group`, `/etc/hosts` for the sandbox (made on first use).
    etc: OnceCell<EtcDir>,
    /// `--symlink`/`--ro-bind` arguments for `/bin`, `/lib`… (merged `/usr` or not).
    root_args: Vec<String>,
    sandboxes: Mutex<HashMap<String, SandboxLimits>>,
    running: Arc<Mutex<HashMap<String, HashMap<u64, KillSwitch>>>>,
    next_exec: AtomicU64,
}

impl std::fmt::Debug for ProcessBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessBackend")
            .field("bwrap", &self.bwrap)
            .finish()
    }
}

impl Default for ProcessBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessBackend {
    /// A backend using [`DEFAULT_BWRAP`]. Nothing is checked here: see [`Backend::check`].
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
            as_root: rustix::process::geteuid().is_root(),
            etc: OnceCell::new(),
            root_args,
            sandboxes: Mutex::new(HashMap::new()),
            running: Arc::new(Mutex::new(HashMap::new())),
            next_exec: AtomicU64::new(0),
        }
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

    /// The full command line: prlimit, setpriv (as root), bwrap and its arguments, then argv.
    fn command(
        &self,
        etc_dir: &Path,
        workspace: &Path,
        limits: &SandboxLimits,
        spec: &ExecSpec,
    ) -> Command {
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
        ]);
        args.extend(["--remount-ro", "/"].map(str::to_owned));
        let cwd = if spec.cwd.is_empty() {
            WORKSPACE
        } else {
            spec.cwd.as_str()
        };
        args.extend(["--chdir", cwd, "--clearenv"].map(str::to_owned));
        let mut setenv = |k: &str, v: &str| args.extend(["--setenv", k, v].map(str::to_owned));
        setenv("PATH", PATH);
        setenv("HOME", "/tmp");
        for (k, v) in spec.env.iter().filter(|(k, _)| k.as_str() != EXEC_ID_VAR) {
            setenv(k, v);
        }
        setenv(EXEC_ID_VAR, &spec.exec_id);
        args.push("--".into());
        args.extend(spec.argv.iter().cloned());

        let mut command = Command::new(PRLIMIT);
        command
            .args(args)
            .env_clear()
            .process_group(0)
            .kill_on_drop(false);
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
}

#[async_trait::async_trait]
impl Backend for ProcessBackend {
    fn wire_name(&self) -> &'static str {
        "sandbox/process"
    }

    fn boundary(&self) -> &'static str {
        "executes only through the sandbox backend (bubblewrap: fresh user, pid, mount, ipc, uts and \
         network namespaces, no network, uid 1000 without capabilities, read-only system, only \
         /workspace and /tmp writable); shares the host kernel; limits are rlimits (address space, \
         processes of uid 1000 on the worker), not cgroups: no CPU limit"
    }

    async fn check(&self) -> Result<(), BackendError> {
        if !self.bwrap.is_file() {
            return Err(self.unavailable("not installed"));
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
        lock(&self.sandboxes).insert(spec.sandbox_id.clone(), spec.limits.clone());
        Ok(SandboxRef {
            sandbox_id: spec.sandbox_id.clone(),
            container_id: String::new(),
            workspace_dir: workspace,
        })
    }

    async fn destroy(&self, sandbox: &SandboxRef) -> Result<(), BackendError> {
        lock(&self.sandboxes).remove(&sandbox.sandbox_id);
        let kills: Vec<KillSwitch> = lock(&self.running)
            .remove(&sandbox.sandbox_id)
            .map(|execs| execs.into_values().collect())
            .unwrap_or_default();
        futures::future::join_all(kills.iter().map(KillSwitch::kill)).await;
        Ok(())
    }

    async fn exec(&self, sandbox: &SandboxRef, spec: ExecSpec) -> Result<Execution, BackendError> {
        if spec.argv.is_empty() {
            return Err(BackendError::Failed("empty command".to_owned()));
        }
        let limits = lock(&self.sandboxes)
            .get(&sandbox.sandbox_id)
            .cloned()
            .ok_or_else(|| BackendError::Gone(sandbox.sandbox_id.clone()))?;
        let etc_dir = self.etc().await?;
        let mut command = self.command(etc_dir, &sandbox.workspace_dir, &limits, &spec);
        command
            .stdin(if spec.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => self.unavailable(&format!("{PRLIMIT}: {e}")),
            _ => BackendError::Failed(format!("starting bwrap: {e}")),
        })?;
        let stdin = child
            .stdin
            .take()
            .map(|w| Box::pin(PipeStdin(Some(w))) as StdinWriter);
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());

        let (out_tx, out_rx) = mpsc::channel(OUTPUT_CHANNEL);
        let (exit_tx, exit_rx) = oneshot::channel();
        let (kill_tx, kill_rx) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(false);
        let kill = KillSwitch(Arc::new(move || {
            let kill_tx = kill_tx.clone();
            let mut done_rx = done_rx.clone();
            Box::pin(async move {
                kill_tx.send_replace(true);
                let _ = tokio::time::timeout(KILL_WAIT, done_rx.wait_for(|done| *done)).await;
            })
        }));

        let key = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let sandbox_id = sandbox.sandbox_id.clone();
        lock(&self.running)
            .entry(sandbox_id.clone())
            .or_default()
            .insert(key, kill.clone());
        let running = Arc::clone(&self.running);
        tokio::spawn(async move {
            let status = supervise(child, stdout, stderr, out_tx, kill_rx).await;
            let _ = exit_tx.send(status);
            done_tx.send_replace(true);
            let mut running = lock(&running);
            if let Some(execs) = running.get_mut(&sandbox_id) {
                execs.remove(&key);
                if execs.is_empty() {
                    running.remove(&sandbox_id);
                }
            }
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
        _live_nodes: &[String],
    ) -> Result<usize, BackendError> {
        // Nothing outlives its worker: bwrap runs with --die-with-parent.
        Ok(0)
    }
}

/// Forwards both output pipes in arrival order, kills on request, and returns the exit status.
async fn supervise(
    mut child: Child,
    stdout: Option<impl AsyncRead + Unpin>,
    stderr: Option<impl AsyncRead + Unpin>,
    out_tx: mpsc::Sender<Output>,
    mut kill_rx: watch::Receiver<bool>,
) -> Result<ExitStatus, BackendError> {
    let mut tx = Some(out_tx);
    let (mut out_open, mut err_open) = (stdout.is_some(), stderr.is_some());
    let (mut stdout, mut stderr) = (stdout, stderr);
    let (mut out_buf, mut err_buf) = (vec![0u8; 8192], vec![0u8; 8192]);
    // One kill request at most; a closed channel (every switch dropped) is none.
    let mut kill_pending = true;
    let kill = |child: &mut Child, changed: Result<(), watch::error::RecvError>| {
        if changed.is_ok() {
            let _ = child.start_kill();
        }
    };
    while out_open || err_open {
        let chunk = tokio::select! {
            read = read_some(&mut stdout, &mut out_buf), if out_open => match read {
                Some(n) => Output::Stdout(Bytes::copy_from_slice(&out_buf[..n])),
                None => { out_open = false; continue }
            },
            read = read_some(&mut stderr, &mut err_buf), if err_open => match read {
                Some(n) => Output::Stderr(Bytes::copy_from_slice(&err_buf[..n])),
                None => { err_open = false; continue }
            },
            changed = kill_rx.changed(), if kill_pending => {
                kill_pending = false;
                kill(&mut child, changed);
                continue
            }
        };
        // A dropped receiver: keep draining so the process never blocks on a full pipe.
        if let Some(sender) = &tx {
            if sender.send(chunk).await.is_err() {
                tx = None;
            }
        }
    }
    drop(tx);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            changed = kill_rx.changed(), if kill_pending => {
                kill_pending = false;
                kill(&mut child, changed);
            }
        }
    };
    let status = status.map_err(|e| BackendError::Failed(format!("waiting for bwrap: {e}")))?;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => i64::from(code),
        (None, Some(signal)) => 128 + i64::from(signal),
        (None, None) => -1,
    };
    Ok(ExitStatus { code })
}

/// Reads a chunk; `None` at EOF or on an error.
async fn read_some(reader: &mut Option<impl AsyncRead + Unpin>, buf: &mut [u8]) -> Option<usize> {
    match reader.as_mut()?.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// The child's stdin pipe; `shutdown` closes it (tokio's `ChildStdin` only does on drop), so the
/// process reads EOF.
struct PipeStdin(Option<ChildStdin>);

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
