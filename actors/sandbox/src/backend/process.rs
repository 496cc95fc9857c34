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
//! Killing: the spawner kills a command's whole tree by lineage (child subreapers, see
//! [`super::spawner`]) when it is killed and when its first process exits, also what left its
//! process group, session or `TOOLMESH_EXEC_ID`. Destroying a sandbox
//! kills bwrap, which runs with `--unshare-pid --die-with-parent`: the namespace's init dies
//! and with it every process inside. bwrap dies with the worker *thread* that started it
//! (PR_SET_PDEATHSIG), so sandboxes are started from the async task, never from a blocking
//! pool thread, which exits when idle.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::OnceCell;

use super::docker::{prepare_workspace, SANDBOX_GID, SANDBOX_UID};
use super::link::{lock, CommandBase, Link, LinkError};
use super::spawner::{Spawner, SPAWNER_MOUNT};
use super::{
    make_private, skills_dir_of, Backend, BackendError, ExecSpec, Execution, SandboxLimits,
    SandboxRef, SandboxSpec, StartGate, SKILLS_MOUNT,
};

/// Where Debian's `bubblewrap` package installs bwrap.
pub const DEFAULT_BWRAP: &str = "/usr/bin/bwrap";
const PRLIMIT: &str = "/usr/bin/prlimit";
const SETPRIV: &str = "/usr/bin/setpriv";
const WORKSPACE: &str = "/workspace";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const INSTALL_HINT: &str = "apt-get install bubblewrap (and allow unprivileged user namespaces: \
                            sysctl kernel.unprivileged_userns_clone=1)";
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
        args.extend(namespace_args(network));
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
        args.extend(namespace_args(false));
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

    fn sandbox_group(&self) -> Option<u32> {
        // bwrap runs as the sandbox user (setpriv) and must enter the folders it binds from.
        self.as_root.then_some(SANDBOX_GID)
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxRef, BackendError> {
        let dir = spec.workspace_dir.clone();
        let as_root = self.as_root;
        let group = self.sandbox_group();
        let workspace = tokio::task::spawn_blocking(move || {
            if let Some(folder) = dir.parent() {
                make_private(folder, group).map_err(|e| {
                    BackendError::Failed(format!("preparing {}: {e}", folder.display()))
                })?;
            }
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
                // Nothing a retry changes (bwrap cannot set the sandbox up here): say why now.
                LinkError::NotReady(why) => {
                    let hint = if why.contains("Permission denied") {
                        format!(
                            " (the sandbox user, uid {SANDBOX_UID}, must reach \
                             TOOLMESH_SANDBOX_DIR and the spawner staged there: no folder on \
                             their way may be private to another user)"
                        )
                    } else {
                        String::new()
                    };
                    BackendError::Unavailable(format!(
                        "the process sandbox cannot start: {why}{hint}"
                    ))
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
        let base = CommandBase {
            env: vec![
                ("PATH".to_owned(), PATH.to_owned()),
                ("HOME".to_owned(), "/tmp".to_owned()),
            ],
            inherit_env: false,
            cwd: WORKSPACE,
        };
        link.exec(spec, &base).await
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

/// bubblewrap's arguments for a sandbox's namespaces, user and capabilities: all namespaces
/// new (the network's too unless `network`), uid and gid 1000, no capabilities. The root
/// benches start a raw bubblewrap with them too.
pub fn namespace_args(network: bool) -> Vec<String> {
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
