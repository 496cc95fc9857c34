//! The sandbox backends against the real thing: Docker (image `TOOLMESH_SANDBOX_IMAGE`, default
//! `toolmesh/sandbox:latest`, built by `scripts/build-images`) and bubblewrap. These fail, not
//! skip, when the environment lacks either.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use toolmesh_sandbox::backend::docker::{container_name, DockerBackend};
use toolmesh_sandbox::backend::exits::ExecExits;
use toolmesh_sandbox::backend::process::ProcessBackend;
use toolmesh_sandbox::backend::spawner::Spawner;
use toolmesh_sandbox::backend::{
    Backend, BackendError, ExecSpec, Execution, Output, SandboxLimits, SandboxRef, SandboxSpec,
    StartGate, LABEL_MANAGED, LABEL_NODE, LABEL_SANDBOX,
};

mod support;
use support::{image, limits, unique, ContainerGuard};

const TIMEOUT: Duration = Duration::from_secs(30);

fn spec(argv: &[&str]) -> ExecSpec {
    ExecSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: "/workspace".into(),
        env: BTreeMap::new(),
        stdin: false,
        exec_id: unique("exec"),
    }
}

fn sh(script: &str) -> ExecSpec {
    spec(&["sh", "-c", script])
}

/// Prints the pids controller's `file` (cgroup v1 or v2).
fn cat_pids(file: &str) -> ExecSpec {
    sh(&format!(
        "cat /sys/fs/cgroup/pids/{file} 2>/dev/null || cat /sys/fs/cgroup/{file}"
    ))
}

/// How a Docker sandbox runs its commands.
#[derive(Clone, Copy)]
enum Commands {
    Spawner,
    Exec,
}

/// A started sandbox of either backend, its workspace and (Docker) its removal guard.
struct Sandbox {
    backend: Box<dyn Backend>,
    sandbox: SandboxRef,
    _workspace: tempfile::TempDir,
    _guard: Option<ContainerGuard>,
}

impl Sandbox {
    async fn docker() -> Self {
        Self::docker_with(limits(), "node-a").await
    }

    async fn docker_with(limits: SandboxLimits, node: &str) -> Self {
        Self::docker_scoped(limits, node, &unique("scope")).await
    }

    async fn docker_scoped(limits: SandboxLimits, node: &str, scope: &str) -> Self {
        Self::docker_in(Commands::Spawner, limits, node, scope).await
    }

    /// A sandbox whose commands are `docker exec`s.
    async fn docker_exec() -> Self {
        Self::docker_in(Commands::Exec, limits(), "node-a", &unique("scope")).await
    }

    async fn docker_in(commands: Commands, limits: SandboxLimits, node: &str, scope: &str) -> Self {
        let backend = DockerBackend::new(image(), vec![image()]).expect("docker backend");
        let backend = match commands {
            Commands::Spawner => backend.with_spawner(spawner()),
            Commands::Exec => backend,
        };
        backend
            .check()
            .await
            .expect("docker backend usable (run scripts/build-images)");
        Self::start(Box::new(backend), limits, node, scope, true).await
    }

    async fn process() -> Self {
        let backend = process_backend();
        backend
            .check()
            .await
            .expect("bubblewrap usable (apt-get install bubblewrap)");
        // RLIMIT_NPROC counts every process of uid 1000 on this machine, the Docker tests'
        // (fork bomb included) too: leave room for them.
        let limits = SandboxLimits {
            pids: 1024,
            ..limits()
        };
        Self::start(Box::new(backend), limits, "node-a", "process", false).await
    }

    async fn start(
        backend: Box<dyn Backend>,
        limits: SandboxLimits,
        node: &str,
        scope: &str,
        docker: bool,
    ) -> Self {
        let workspace = tempfile::tempdir().expect("tempdir");
        let sandbox_id = unique("sbx-test");
        let guard = docker.then(|| ContainerGuard(container_name(&sandbox_id)));
        let spec = SandboxSpec {
            sandbox_id,
            node_id: node.into(),
            scope: scope.into(),
            workspace_dir: workspace.path().join("ws"),
            limits,
            image: None,
            env: Vec::new(),
        };
        let sandbox = backend.create(&spec).await.expect("create sandbox");
        Self {
            backend,
            sandbox,
            _workspace: workspace,
            _guard: guard,
        }
    }

    /// `docker inspect` of the sandbox's container.
    async fn inspect(&self) -> bollard::models::ContainerInspectResponse {
        docker_client()
            .await
            .inspect_container(
                &self.sandbox.container_id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .unwrap()
    }

    async fn exec(&self, spec: ExecSpec) -> Execution {
        self.backend
            .exec(&self.sandbox, spec, StartGate::open())
            .await
            .expect("exec")
    }

    async fn run(&self, spec: ExecSpec) -> Ran {
        collect(self.exec(spec).await).await
    }

    /// Once destroyed: destroying it again is fine, and an exec is refused as gone, naming it.
    async fn check_gone(&self) {
        self.backend
            .destroy(&self.sandbox)
            .await
            .expect("destroy is idempotent");
        let err = self
            .backend
            .exec(&self.sandbox, spec(&["true"]), StartGate::open())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::Gone(id) if *id == self.sandbox.sandbox_id),
            "{err:?}"
        );
    }

    /// Runs `spec` and asserts what it printed on stdout.
    async fn prints(&self, spec: ExecSpec, stdout: &str) {
        let ran = self.run(spec).await;
        assert_eq!(ran.stdout, stdout, "{ran:?}");
    }

    fn host_workspace(&self) -> &Path {
        &self.sandbox.workspace_dir
    }
}

#[derive(Debug, Default)]
struct Ran {
    stdout: String,
    stderr: String,
    code: i64,
    /// Both streams interleaved, in arrival order, tagged `o:`/`e:`.
    order: Vec<String>,
}

async fn collect(mut exec: Execution) -> Ran {
    let mut ran = Ran::default();
    let read = async {
        while let Some(chunk) = exec.output.recv().await {
            match chunk {
                Output::Stdout(b) => {
                    let s = String::from_utf8_lossy(&b).into_owned();
                    ran.order.push(format!("o:{s}"));
                    ran.stdout.push_str(&s);
                }
                Output::Stderr(b) => {
                    let s = String::from_utf8_lossy(&b).into_owned();
                    ran.order.push(format!("e:{s}"));
                    ran.stderr.push_str(&s);
                }
            }
        }
    };
    tokio::time::timeout(TIMEOUT, read)
        .await
        .expect("output ended in time");
    let status = tokio::time::timeout(TIMEOUT, exec.exit)
        .await
        .expect("exit in time");
    ran.code = status.expect("exit sent").expect("exit status").code;
    ran
}

/// Reads output until `needle` shows on stdout or stderr.
async fn wait_for_output(exec: &mut Execution, needle: &str) -> String {
    let mut seen = String::new();
    let read = async {
        while let Some(chunk) = exec.output.recv().await {
            let (Output::Stdout(b) | Output::Stderr(b)) = chunk;
            seen.push_str(&String::from_utf8_lossy(&b));
            if seen.contains(needle) {
                return;
            }
        }
        panic!("output ended without {needle:?}: {seen:?}");
    };
    tokio::time::timeout(TIMEOUT, read)
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in {seen:?}"));
    seen
}

// ---- checks both backends pass -------------------------------------------------------------

async fn check_output_exit_cwd_env(sbx: &Sandbox) {
    let ran = sbx.run(sh("echo out; echo err >&2; exit 3")).await;
    assert_eq!(
        (ran.stdout.as_str(), ran.stderr.as_str(), ran.code),
        ("out\n", "err\n", 3)
    );

    let mut spec = sh("pwd; echo \"$GREETING\"; echo \"$TOOLMESH_EXEC_ID\"");
    spec.cwd = "/tmp".into();
    spec.env.insert("GREETING".into(), "hello there".into());
    let exec_id = spec.exec_id.clone();
    let ran = sbx.run(spec).await;
    assert_eq!(ran.stdout, format!("/tmp\nhello there\n{exec_id}\n"));
    assert_eq!(ran.code, 0);

    // Arrival order across both streams.
    let ran = sbx
        .run(sh("echo 1; sleep 0.2; echo 2 >&2; sleep 0.2; echo 3"))
        .await;
    assert_eq!(ran.order, ["o:1\n", "e:2\n", "o:3\n"]);
}

/// A command waits for its gate, and does not run at all when the gate is dropped unopened.
async fn check_start_gate(sbx: &Sandbox) {
    let marker = sbx.host_workspace().join("ran");
    let (opener, gate) = StartGate::closed();
    let exec = sbx
        .backend
        .exec(&sbx.sandbox, sh("touch /workspace/ran"), gate);
    let open_later = async {
        // The test's subject: nothing runs within 300 ms while the gate is closed.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!marker.exists(), "ran before its gate opened");
        opener.open();
    };
    let (exec, ()) = tokio::join!(exec, open_later);
    let exit = exec.expect("exec").exit.await.unwrap().unwrap();
    assert_eq!(exit.code, 0);
    assert!(marker.exists(), "ran once its gate opened");

    std::fs::remove_file(&marker).unwrap();
    let (opener, gate) = StartGate::closed();
    drop(opener);
    let refused = sbx
        .backend
        .exec(&sbx.sandbox, sh("touch /workspace/ran"), gate)
        .await;
    assert!(refused.is_err(), "a dropped gate starts nothing");
    // The test's subject: nothing runs within 300 ms after the gate was dropped.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "ran although its gate was dropped");
}

async fn check_stdin_eof(sbx: &Sandbox) {
    let mut spec = spec(&["cat"]);
    spec.stdin = true;
    let mut exec = sbx.exec(spec).await;
    let mut stdin = exec.stdin.take().expect("stdin");
    stdin.write_all(b"line one\nline two\n").await.unwrap();
    stdin.shutdown().await.unwrap();
    let ran = collect(exec).await;
    assert_eq!((ran.stdout.as_str(), ran.code), ("line one\nline two\n", 0));

    // Dropping the writer closes stdin too.
    let mut spec = self::spec(&["cat"]);
    spec.stdin = true;
    let mut exec = sbx.exec(spec).await;
    let mut stdin = exec.stdin.take().expect("stdin");
    stdin.write_all(b"dropped\n").await.unwrap();
    stdin.flush().await.unwrap();
    drop(stdin);
    let ran = collect(exec).await;
    assert_eq!((ran.stdout.as_str(), ran.code), ("dropped\n", 0));

    // Without stdin, a reader sees EOF at once.
    let ran = sbx.run(spec_no_stdin_cat()).await;
    assert_eq!((ran.stdout.as_str(), ran.code), ("", 0));
}

fn spec_no_stdin_cat() -> ExecSpec {
    spec(&["cat"])
}

async fn check_kill_tree(sbx: &Sandbox) {
    let mut exec = sbx
        .exec(sh("echo started; sleep 100 & sleep 100; wait"))
        .await;
    wait_for_output(&mut exec, "started").await;
    let kill = exec.kill.clone();
    let began = std::time::Instant::now();
    kill.kill().await;
    let ran = collect(exec).await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "kill took {:?}",
        began.elapsed()
    );
    assert_eq!(ran.code, 137, "{ran:?}");
    kill.kill().await; // idempotent
                       // Nothing of the tree is left.
    let ran = sbx
        .run(sh("ps -eo args | grep '[s]leep 100' || echo none"))
        .await;
    assert_eq!(ran.stdout, "none\n");
}

/// Bytes in a file of the sandbox's workspace (0 when missing).
fn workspace_len(sbx: &Sandbox, name: &str) -> u64 {
    std::fs::metadata(sbx.host_workspace().join(name)).map_or(0, |m| m.len())
}

/// Waits until a file of the workspace has grown past `len`.
async fn wait_for_growth(sbx: &Sandbox, name: &str, len: u64) {
    let began = std::time::Instant::now();
    while workspace_len(sbx, name) <= len {
        assert!(began.elapsed() < TIMEOUT, "{name} does not grow");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A file of the workspace stops growing (checked twice, a second apart) and no process of
/// the loop writing it is left in the sandbox.
async fn assert_stopped(sbx: &Sandbox, name: &str) {
    let before = workspace_len(sbx, name);
    // The check itself: no growth within a second (the loop writes 5 times a second).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = workspace_len(sbx, name);
    assert_eq!(before, after, "{name} still grows");
    let ran = sbx
        .run(sh(&format!(
            "ps -eo args | grep '^sh -c [w]hile :; do date >> /workspace/{name};' || echo none"
        )))
        .await;
    assert_eq!(ran.stdout, "none\n", "{ran:?}");
}

/// A loop that leaves its process group and session and starts without `TOOLMESH_EXEC_ID`
/// (in its `/proc/<pid>/environ` too), double forked so that it is nobody's child, appending to `/workspace/<name>` 5 times a second.
fn escapee(name: &str) -> String {
    format!(
        "(unset TOOLMESH_EXEC_ID; setsid sh -c 'while :; do date >> /workspace/{name}; sleep 0.2; done' \
         </dev/null >/dev/null 2>&1 &)"
    )
}

/// What a command starts ends with it, even a process that escaped its group, session and
/// marker: when it is killed (a timeout, a cancel, `kill_task`), not before (a background
/// command's children live while it runs), and when it ends by itself.
async fn check_escapees_end_with_their_command(sbx: &Sandbox) {
    let mut exec = sbx
        .exec(sh(&format!(
            "{}; echo started; sleep 100",
            escapee("killed")
        )))
        .await;
    wait_for_output(&mut exec, "started").await;
    wait_for_growth(sbx, "killed", 0).await;
    // While the command runs, so does what it started: given half a second in which a
    // wrong sweep would kill it (the test's subject, not a wait), it still grows.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let len = workspace_len(sbx, "killed");
    wait_for_growth(sbx, "killed", len).await;
    exec.kill.kill().await;
    let ran = collect(exec).await;
    assert_eq!(ran.code, 137, "{ran:?}");
    assert_stopped(sbx, "killed").await;

    let ran = sbx
        .run(sh(&format!(
            "{}; until [ -s /workspace/ended ]; do sleep 0.05; done; echo started",
            escapee("ended")
        )))
        .await;
    assert_eq!((ran.stdout.as_str(), ran.code), ("started\n", 0), "{ran:?}");
    assert_stopped(sbx, "ended").await;
}

/// A command that kills its own supervisor (its parent), so that it can tell the spawner
/// nothing, still leaves nothing behind: the spawner sweeps after a supervisor killed by a
/// signal as after one that told of leftovers.
async fn check_leftovers_of_a_killed_supervisor_end(sbx: &Sandbox) {
    let ran = sbx
        .run(sh(&format!(
            "{}; until [ -s /workspace/orphaned ]; do sleep 0.05; done; kill -9 $PPID; sleep 100",
            escapee("orphaned")
        )))
        .await;
    assert_eq!(ran.code, 137, "{ran:?}");
    assert_stopped(sbx, "orphaned").await;
}

/// Neither the spawner nor a command's supervisor (its parent) can be traced or have its
/// environment read by a command (the same uid).
async fn check_spawner_cannot_be_traced(sbx: &Sandbox) {
    let seize = "import ctypes, sys\n\
                 libc = ctypes.CDLL(None, use_errno=True)\n\
                 for pid in sys.argv[1:]:\n\
                 \x20   r = libc.ptrace(0x4206, int(pid), 0, 0)\n\
                 \x20   print(r, ctypes.get_errno())";
    let script = format!(
        "spawner=$(pgrep -o -f '^/run/toolmesh-spawner'); echo \"$spawner\" >&2; \
         for p in $spawner $PPID; do cat /proc/$p/environ >/dev/null 2>&1 && echo readable $p; done; \
         python3 -c '{seize}' $spawner $PPID"
    );
    let ran = sbx.run(sh(&script)).await;
    assert!(!ran.stderr.trim().is_empty(), "no spawner found: {ran:?}");
    // PTRACE_SEIZE fails with EPERM for both.
    assert_eq!(ran.stdout, "-1 1\n-1 1\n", "{ran:?}");
}

async fn check_confinement(sbx: &Sandbox) {
    sbx.prints(spec(&["id", "-u"]), "1000\n").await;

    // The workspace is writable and shared with the host, both ways.
    std::fs::write(sbx.host_workspace().join("from-host.txt"), "host\n").unwrap();
    let ran = sbx
        .run(sh(
            "cat /workspace/from-host.txt; echo sandbox > /workspace/from-sandbox.txt",
        ))
        .await;
    assert_eq!((ran.stdout.as_str(), ran.code), ("host\n", 0), "{ran:?}");
    let written = std::fs::read_to_string(sbx.host_workspace().join("from-sandbox.txt")).unwrap();
    assert_eq!(written, "sandbox\n");

    // The system is read-only; /tmp is writable and may hold programs.
    for path in ["/etc/x", "/usr/x", "/x"] {
        let ran = sbx.run(spec(&["touch", path])).await;
        assert_ne!(ran.code, 0, "{path} is writable");
        assert!(
            ran.stderr.contains("Read-only file system"),
            "{path}: {ran:?}"
        );
    }
    sbx.prints(
        sh("printf '#!/bin/sh\\necho ran\\n' > /tmp/p.sh && chmod +x /tmp/p.sh && /tmp/p.sh"),
        "ran\n",
    )
    .await;

    // No network: only the loopback interface.
    sbx.prints(
        sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"),
        "lo\n",
    )
    .await;
    let connect = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)";
    let ran = sbx.run(spec(&["python3", "-c", connect])).await;
    assert_ne!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.contains("Network is unreachable"), "{ran:?}");
}

async fn check_dropped_receiver_does_not_block(sbx: &Sandbox) {
    let exec = sbx
        .exec(sh("head -c 20000000 /dev/zero; echo done >&2"))
        .await;
    let Execution { output, exit, .. } = exec;
    drop(output);
    let status = tokio::time::timeout(TIMEOUT, exit)
        .await
        .expect("exit in time")
        .unwrap()
        .unwrap();
    assert_eq!(status.code, 0);
}

// ---- Docker --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn docker_output_exit_cwd_env() {
    check_output_exit_cwd_env(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_stdin_reaches_cat_and_closes() {
    check_stdin_eof(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_waits_for_its_start_gate() {
    check_start_gate(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_kill_ends_the_process_tree() {
    check_kill_tree(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_sandbox_is_confined() {
    check_confinement(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_dropped_receiver_does_not_block() {
    check_dropped_receiver_does_not_block(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_escapees_end_with_their_command() {
    check_escapees_end_with_their_command(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_leftovers_of_a_killed_supervisor_end_too() {
    check_leftovers_of_a_killed_supervisor_end(&Sandbox::docker().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_spawner_cannot_be_traced() {
    check_spawner_cannot_be_traced(&Sandbox::docker().await).await;
}

// The same with `docker exec` for each command (TOOLMESH_SANDBOX_DOCKER_COMMANDS=exec).

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_output_exit_cwd_env() {
    check_output_exit_cwd_env(&Sandbox::docker_exec().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_stdin_reaches_cat_and_closes() {
    check_stdin_eof(&Sandbox::docker_exec().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_waits_for_its_start_gate_too() {
    check_start_gate(&Sandbox::docker_exec().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_kill_ends_the_process_tree() {
    check_kill_tree(&Sandbox::docker_exec().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_sandbox_is_confined() {
    check_confinement(&Sandbox::docker_exec().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_dropped_receiver_does_not_block() {
    check_dropped_receiver_does_not_block(&Sandbox::docker_exec().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_escapees_end_with_their_command() {
    check_escapees_end_with_their_command(&Sandbox::docker_exec().await).await;
}

/// `since`/`until` of the Docker events API: Unix seconds with nanoseconds.
fn event_time(at: std::time::SystemTime) -> String {
    let at = at.duration_since(std::time::UNIX_EPOCH).unwrap();
    format!("{}.{:09}", at.as_secs(), at.subsec_nanos())
}

/// The execs that ended in `container` between `since` and `until`, once at least `least`
/// did (the daemon logs an exec's end about when it reports it: asked again until then).
async fn execs_ended(
    container: &str,
    since: std::time::SystemTime,
    until: std::time::SystemTime,
    least: usize,
) -> usize {
    let docker = docker_client().await;
    let began = std::time::Instant::now();
    loop {
        let options = bollard::query_parameters::EventsOptions {
            since: Some(event_time(since)),
            until: Some(event_time(until)),
            filters: Some(std::collections::HashMap::from([
                ("container".to_owned(), vec![container.to_owned()]),
                ("event".to_owned(), vec!["exec_die".to_owned()]),
            ])),
        };
        let events: Vec<_> = docker.events(Some(options)).collect().await;
        let ended = events.len();
        for event in events {
            event.expect("an event");
        }
        if ended >= least || began.elapsed() > TIMEOUT {
            return ended;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// In exec mode a command that left nothing ends with its own exec (its wrapper swept and
/// said so): no kill exec after it. One that killed its wrapper, leaving a process behind,
/// gets a kill exec, and the process ends before the command's end is told.
#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_kill_execs_run_only_when_the_wrapper_did_not_sweep() {
    let sbx = Sandbox::docker_exec().await;
    let container = sbx.sandbox.container_id.clone();
    let since = std::time::SystemTime::now();
    let ran = sbx.run(sh("echo out; echo err >&2")).await;
    assert_eq!(
        (ran.stdout.as_str(), ran.stderr.as_str(), ran.code),
        ("out\n", "err\n", 0),
        "the end line is not output: {ran:?}"
    );
    let between = std::time::SystemTime::now();
    assert_eq!(execs_ended(&container, since, between, 1).await, 1);

    let ran = sbx
        .run(sh(&format!(
            "{}; until [ -s /workspace/wrapper ]; do sleep 0.05; done; kill -9 $PPID",
            escapee("wrapper")
        )))
        .await;
    assert_eq!(ran.code, 137, "{ran:?}");
    let until = std::time::SystemTime::now();
    assert_eq!(
        execs_ended(&container, between, until, 2).await,
        2,
        "the command's exec and a kill exec"
    );
    assert_stopped(&sbx, "wrapper").await;
}

async fn docker_client() -> Docker {
    Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_container_is_hardened() {
    let limits = SandboxLimits {
        memory_mb: 256,
        pids: 50,
        cpus: 0.5,
        network: "none".into(),
        tmpfs_mb: 32,
        runtime: None,
    };
    let sbx = Sandbox::docker_with(limits, "node-hard").await;
    let inspect = sbx.inspect().await;
    let name = inspect.name.clone().unwrap();
    assert_eq!(
        name,
        format!("/{}", container_name(&sbx.sandbox.sandbox_id))
    );
    let config = inspect.config.unwrap();
    assert_eq!(config.user.as_deref(), Some("1000:1000"));
    // The spawner (this crate's program of it) is the container's command.
    assert_eq!(
        config.cmd,
        Some(
            [
                "/run/toolmesh-spawner",
                "--listen",
                "/run/toolmesh/control.sock"
            ]
            .map(str::to_owned)
            .to_vec()
        )
    );
    let labels = config.labels.unwrap();
    assert_eq!(labels[LABEL_MANAGED], "1");
    assert_eq!(labels[LABEL_NODE], "node-hard");
    assert_eq!(labels[LABEL_SANDBOX], sbx.sandbox.sandbox_id);
    let host = inspect.host_config.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(host.cap_add.unwrap_or_default(), Vec::<String>::new());
    assert_eq!(host.privileged, Some(false));
    assert_eq!(
        host.security_opt,
        Some(vec!["no-new-privileges".to_owned()])
    );
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.memory, Some(256 * 1024 * 1024));
    assert_eq!(host.memory_swap, Some(256 * 1024 * 1024));
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.pids_limit, Some(50));
    assert_eq!(host.init, Some(true));
    assert_eq!(host.auto_remove, Some(false));
    assert_eq!(
        host.restart_policy
            .unwrap()
            .name
            .map(|n| n.to_string())
            .as_deref(),
        Some("no")
    );
    let tmpfs = host.tmpfs.unwrap();
    for dir in ["/tmp", "/home/sandbox"] {
        let opts = &tmpfs[dir];
        for opt in ["rw", "exec", "nosuid", "nodev", "size=32m"] {
            assert!(opts.split(',').any(|o| o == opt), "{dir}: {opts}");
        }
    }
    let binds = host.binds.unwrap();
    let beside = |name: &str| sbx.sandbox.workspace_dir.with_file_name(name);
    assert_eq!(
        binds,
        vec![
            format!("{}:/workspace:rw", sbx.sandbox.workspace_dir.display()),
            format!(
                "{}:/skills:ro",
                toolmesh_sandbox::backend::skills_dir_of(&sbx.sandbox.workspace_dir).display()
            ),
            format!("{}:/run/toolmesh-spawner:ro", spawner().program.display()),
            format!("{}:/run/toolmesh:rw", beside("run").display()),
        ]
    );
    let mounts = inspect.mounts.unwrap_or_default();
    assert!(
        mounts
            .iter()
            .all(|m| !m.source.as_deref().unwrap_or("").contains("docker.sock")),
        "{mounts:?}"
    );
    assert_eq!(inspect.state.unwrap().running, Some(true));

    // What the process sees matches.
    let ran = sbx.run(sh("cat /proc/1/cmdline | tr '\\0' ' '; grep -E '^Cap(Eff|Bnd)' /proc/self/status; grep NoNewPrivs /proc/self/status; id -u; ls -A /run/toolmesh")).await;
    assert!(
        ran.stdout
            .starts_with("/sbin/docker-init -- /run/toolmesh-spawner --listen"),
        "{ran:?}"
    );
    // Commands run as the sandbox user, and the spawner's socket is gone once the worker
    // connected: nobody else can.
    assert!(ran.stdout.ends_with("\n1000\n"), "{ran:?}");
    assert!(ran.stdout.contains("CapEff:\t0000000000000000"), "{ran:?}");
    assert!(ran.stdout.contains("CapBnd:\t0000000000000000"), "{ran:?}");
    assert!(ran.stdout.contains("NoNewPrivs:\t1"), "{ran:?}");
    let ran = sbx.run(sh("touch /run/toolmesh/x")).await;
    assert_ne!(ran.code, 0, "the run directory stays closed: {ran:?}");
    assert!(ran.stderr.contains("Permission denied"), "{ran:?}");
    let ran = sbx
        .run(sh("grep -E ' /(tmp|home/sandbox) ' /proc/mounts"))
        .await;
    assert!(!ran.stdout.contains("noexec"), "{ran:?}");
    assert_eq!(ran.stdout.lines().count(), 2, "{ran:?}");

    // The sandbox's folder is the worker's alone (0700): no other user of the host, the
    // sandbox's uid 1000 among them, reaches the run directory (the spawner's socket before
    // the worker connects) or the workspace; the container reaches both through its binds.
    use std::os::unix::fs::PermissionsExt;
    let folder = sbx.sandbox.workspace_dir.parent().unwrap();
    let mode = std::fs::metadata(folder).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "{}", folder.display());
    let outsider = std::process::Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "--", "ls"])
        .arg(beside("run"))
        .arg(&sbx.sandbox.workspace_dir)
        .output()
        .expect("setpriv");
    assert!(!outsider.status.success(), "{outsider:?}");
    assert!(
        String::from_utf8_lossy(&outsider.stderr).contains("Permission denied"),
        "{outsider:?}"
    );
    let ran = sbx
        .run(sh("echo mine > /workspace/own && cat /workspace/own"))
        .await;
    assert_eq!((ran.stdout.as_str(), ran.code), ("mine\n", 0), "{ran:?}");
}

/// A spawner that cannot run in the image (here one that exits at once) fails the sandbox's
/// creation with what to do, and leaves no container behind.
#[tokio::test(flavor = "multi_thread")]
async fn docker_spawner_that_cannot_start_names_the_way_out() {
    let backend = DockerBackend::new(image(), vec![image()])
        .unwrap()
        .with_spawner(Spawner::program("/bin/false"));
    let workspace = tempfile::tempdir().unwrap();
    let sandbox_id = unique("sbx-test");
    let _guard = ContainerGuard(container_name(&sandbox_id));
    let spec = SandboxSpec {
        sandbox_id: sandbox_id.clone(),
        node_id: "node-a".into(),
        scope: unique("scope"),
        workspace_dir: workspace.path().join("ws"),
        limits: limits(),
        image: None,
        env: Vec::new(),
    };
    let err = backend.create(&spec).await.unwrap_err();
    let BackendError::Failed(message) = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("did not start"), "{message}");
    assert!(
        message.contains("TOOLMESH_SANDBOX_DOCKER_COMMANDS=exec"),
        "{message}"
    );
    let inspect = docker_client()
        .await
        .inspect_container(
            &container_name(&sandbox_id),
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await;
    assert!(
        matches!(
            inspect,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        ),
        "the container is removed: {inspect:?}"
    );
}

/// With `docker exec` for each command, the container only sleeps, and binds no spawner.
#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_container_sleeps() {
    let sbx = Sandbox::docker_exec().await;
    let inspect = sbx.inspect().await;
    assert_eq!(
        inspect.config.unwrap().cmd,
        Some(vec!["sleep".to_owned(), "infinity".to_owned()])
    );
    assert_eq!(inspect.host_config.unwrap().binds.unwrap().len(), 2);
    sbx.prints(sh("id -u"), "1000\n").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_reap_orphans_removes_dead_nodes_only() {
    // One deployment (scope) with a dead and a live node; another deployment's sandbox of a
    // node this one never heard of is not its business.
    let scope = unique("scope");
    let dead_node = unique("node-dead");
    let dead = Sandbox::docker_scoped(limits(), &dead_node, &scope).await;
    let live_node = unique("node-live");
    let live = Sandbox::docker_scoped(limits(), &live_node, &scope).await;
    let stranger = Sandbox::docker_with(limits(), &unique("node-elsewhere")).await;
    let backend = DockerBackend::new(image(), vec![image()]).unwrap();
    let docker = docker_client().await;
    let live_nodes = vec![live_node.clone()];

    let removed = backend
        .reap_orphans(&scope, &unique("node-me"), Some(&live_nodes))
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert!(!exists(&docker, &dead).await, "dead node's sandbox removed");
    assert!(exists(&docker, &live).await, "live node's sandbox kept");
    assert!(
        exists(&docker, &stranger).await,
        "another deployment's sandbox kept"
    );

    // A sandbox a previous run of this node left is an orphan too; at start (no view of the
    // cluster yet) only this node's own are judged: another node's sandbox in the scope stays.
    let other = Sandbox::docker_scoped(limits(), &unique("node-other"), &scope).await;
    let removed = backend
        .reap_orphans(&scope, &live_node, None)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert!(
        exists(&docker, &other).await,
        "another node's sandbox kept when no live nodes are given"
    );
    assert!(
        !exists(&docker, &live).await,
        "this node's previous run's sandbox removed"
    );
}

/// Whether the sandbox's container exists (Docker answers 404 once it is removed).
async fn exists(docker: &Docker, sbx: &Sandbox) -> bool {
    let inspect = docker
        .inspect_container(
            &sbx.sandbox.container_id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await;
    match inspect {
        Ok(_) => true,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => false,
        Err(e) => panic!("inspecting {}: {e}", sbx.sandbox.container_id),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_missing_image_names_the_build_command() {
    let missing = "toolmesh/no-such-image:test".to_owned();
    let backend = DockerBackend::new(missing.clone(), vec![missing.clone()]).unwrap();
    let err = backend.check().await.unwrap_err();
    let BackendError::Unavailable(message) = err else {
        panic!("{err:?}")
    };
    assert!(message.contains("scripts/build-images"), "{message}");
    assert!(message.contains(&missing), "{message}");
    assert!(
        message.contains("docker build -f docker/sandbox.Dockerfile"),
        "{message}"
    );
}

#[test]
fn docker_image_must_be_allowed() {
    let err = DockerBackend::new("evil/image:latest".into(), vec![image()]).unwrap_err();
    assert!(
        matches!(&err, BackendError::Unavailable(m) if m.contains("evil/image:latest")),
        "{err:?}"
    );
}

/// Exit codes come from the daemon's `exec_die` events (no `inspect_exec` after the output),
/// also for a code a killed process leaves.
#[tokio::test(flavor = "multi_thread")]
async fn docker_exit_codes_come_from_exec_die_events() {
    let sbx = Sandbox::docker().await;
    let docker = docker_client().await;
    let exits = ExecExits::watch(docker.clone());
    for (script, code) in [("exit 0", 0), ("exit 7", 7), ("kill -9 $$", 137)] {
        let created = docker
            .create_exec(
                &sbx.sandbox.container_id,
                CreateExecOptions::<String> {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(vec!["sh".into(), "-c".into(), script.into()]),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let notice = exits.register(&created.id);
        if let StartExecResults::Attached { mut output, .. } =
            docker.start_exec(&created.id, None).await.unwrap()
        {
            while output.next().await.is_some() {}
        }
        assert_eq!(
            notice.wait(TIMEOUT).await,
            Some(code),
            "exit code of {script:?} from its event"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_destroyed_sandbox_is_gone() {
    let sbx = Sandbox::docker().await;
    sbx.backend.destroy(&sbx.sandbox).await.unwrap();
    sbx.check_gone().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_pids_limit_stops_a_fork_bomb() {
    check_fork_bomb(Commands::Spawner).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_exec_pids_limit_stops_a_fork_bomb() {
    check_fork_bomb(Commands::Exec).await;
}

async fn check_fork_bomb(commands: Commands) {
    let limits = SandboxLimits {
        pids: 40,
        ..limits()
    };
    let sbx = Sandbox::docker_in(commands, limits, "node-a", &unique("scope")).await;
    // Every process of the bomb keeps forking; a failed fork ends that process only.
    let bomb = "f() { while :; do f & sleep 0.05; done; }; f";
    let mut exec = sbx.exec(sh(bomb)).await;
    let seen = wait_for_output(&mut exec, "fork").await;
    assert!(seen.contains("Cannot fork"), "{seen}");
    exec.kill.kill().await;
    collect(exec).await;
    // The container survived and answers again.
    let began = std::time::Instant::now();
    loop {
        let ran = sbx.run(sh("echo alive")).await;
        if ran.stdout == "alive\n" {
            break;
        }
        assert!(
            began.elapsed() < TIMEOUT,
            "the sandbox does not answer: {ran:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sbx.prints(cat_pids("pids.max"), "40\n").await;
    // The bomb is gone: init, the spawner and its reaper thread (or `sleep infinity`), this
    // command's supervisor, shell and cat (the pids controller counts threads).
    let ran = sbx.run(cat_pids("pids.current")).await;
    let current: u32 = ran.stdout.trim().parse().unwrap();
    assert!(current <= 6, "{current} pids left");
}

// ---- process (bubblewrap) ------------------------------------------------------------------

/// This crate's spawner program (the node uses `toolmesh` itself), staged where the sandbox
/// user reaches it as the node stages its own: `target/` may sit in a clone under a folder
/// only root enters.
fn spawner() -> Spawner {
    static STAGED: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    Spawner::program(STAGED.get_or_init(|| {
        toolmesh_sandbox::backend::spawner::stage_in_temp(std::path::Path::new(env!(
            "CARGO_BIN_EXE_toolmesh-sandbox-spawner"
        )))
        .expect("staging the spawner")
    }))
}

fn process_backend() -> ProcessBackend {
    ProcessBackend::new().with_spawner(spawner())
}

#[tokio::test(flavor = "multi_thread")]
async fn process_output_exit_cwd_env() {
    check_output_exit_cwd_env(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_stdin_reaches_cat_and_closes() {
    check_stdin_eof(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_exec_waits_for_its_start_gate() {
    check_start_gate(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_kill_ends_the_process_tree() {
    check_kill_tree(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_leftovers_of_a_killed_supervisor_end_too() {
    check_leftovers_of_a_killed_supervisor_end(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_leftovers_end_with_their_command() {
    let sbx = Sandbox::process().await;
    // `sleep` keeps the command's stdout open; the second one also drops the marker (an
    // empty environment) and a process group of its own: the command still ends.
    let began = std::time::Instant::now();
    let ran = sbx
        .run(sh(
            "sleep 100 & setsid env -i /bin/sleep 101 & \
             until ps -eo args | grep -q '^/bin/sleep 101'; do sleep 0.01; done; echo started",
        ))
        .await;
    assert_eq!((ran.stdout.as_str(), ran.code), ("started\n", 0), "{ran:?}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "took {:?}",
        began.elapsed()
    );
    let ran = sbx
        .run(sh("ps -eo args | grep '[s]leep 10[01]' || echo none"))
        .await;
    assert_eq!(ran.stdout, "none\n", "the escaped one ended too: {ran:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn process_sandbox_is_confined() {
    let sbx = Sandbox::process().await;
    check_confinement(&sbx).await;
    // No capabilities, a private pid namespace, and no host home or /root.
    let ran = sbx.run(sh("grep -E '^CapEff' /proc/self/status; ls /root /home 2>&1 | head -c 200; echo; ps -e --no-headers | wc -l")).await;
    assert!(ran.stdout.contains("CapEff:\t0000000000000000"), "{ran:?}");
    assert!(ran.stdout.contains("No such file"), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn process_dropped_receiver_does_not_block() {
    check_dropped_receiver_does_not_block(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_escapees_end_with_their_command() {
    check_escapees_end_with_their_command(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_spawner_cannot_be_traced() {
    check_spawner_cannot_be_traced(&Sandbox::process().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_destroy_kills_running_commands() {
    let sbx = Sandbox::process().await;
    let mut exec = sbx.exec(sh("echo started; sleep 100")).await;
    wait_for_output(&mut exec, "started").await;
    sbx.backend.destroy(&sbx.sandbox).await.unwrap();
    let ran = collect(exec).await;
    assert_eq!(ran.code, 137);
    sbx.check_gone().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn process_memory_limit_applies() {
    let sbx = Sandbox::process().await;
    let ran = sbx
        .run(sh(
            "grep -E 'Max (address space|processes)' /proc/self/limits",
        ))
        .await;
    assert!(
        ran.stdout.contains(&(512u64 * 1024 * 1024).to_string()),
        "{ran:?}"
    );
    assert!(ran.stdout.contains("1024"), "{ran:?}");
    let ran = sbx
        .run(spec(&["python3", "-c", "b = bytearray(800 * 1024 * 1024)"]))
        .await;
    assert_ne!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.contains("MemoryError"), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn process_check_names_the_install_command() {
    let backend = ProcessBackend::with_bwrap("/nonexistent/bwrap".into());
    let err = backend.check().await.unwrap_err();
    assert!(
        matches!(&err, BackendError::Unavailable(m) if m.contains("apt-get install bubblewrap")),
        "{err:?}"
    );
    process_backend().check().await.expect("bwrap works here");
}

/// A folder only root may enter (as a clone under a private `mktemp -d`, or
/// `/root/.cargo/bin`), holding a copy of this crate's spawner program.
fn private_spawner() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let private = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .unwrap();
    let program = private.path().join("toolmesh");
    std::fs::copy(spawner().program, &program).unwrap();
    (private, program)
}

/// The node's binary may live where the sandbox user cannot go: staged into the sandbox
/// directory, the spawner runs from there.
#[tokio::test(flavor = "multi_thread")]
async fn process_backend_runs_a_spawner_from_a_private_folder() {
    let (_private, program) = private_spawner();
    let sandboxes = tempfile::tempdir().unwrap();
    let staged = toolmesh_sandbox::backend::spawner::stage(&program, sandboxes.path()).unwrap();
    let backend = ProcessBackend::new().with_spawner(Spawner::program(staged));
    backend.check().await.expect("bubblewrap usable");
    let limits = SandboxLimits {
        pids: 1024,
        ..limits()
    };
    let sbx = Sandbox::start(Box::new(backend), limits, "node-a", "process", false).await;
    let ran = sbx.run(sh("echo hi; id -u")).await;
    assert_eq!(
        (ran.stdout.as_str(), ran.code),
        ("hi\n1000\n", 0),
        "{ran:?}"
    );
}

/// A process sandbox that cannot start (here bwrap cannot reach the spawner in a private
/// folder) answers `unavailable` with bwrap's reason at once, not when the spawner's start
/// times out (10 s).
#[tokio::test(flavor = "multi_thread")]
async fn process_sandbox_that_cannot_start_is_unavailable_at_once() {
    if !rustix::process::geteuid().is_root() {
        // Without root the sandbox user is the caller, who may enter their own folders.
        return;
    }
    let (_private, program) = private_spawner();
    let backend = ProcessBackend::new().with_spawner(Spawner::program(&program));
    let workspace = tempfile::tempdir().unwrap();
    let spec = SandboxSpec {
        sandbox_id: unique("sbx-test"),
        node_id: "node-a".into(),
        scope: "process".into(),
        workspace_dir: workspace.path().join("ws"),
        limits: limits(),
        image: None,
        env: Vec::new(),
    };
    let began = std::time::Instant::now();
    let err = backend.create(&spec).await.unwrap_err();
    let BackendError::Unavailable(message) = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("Permission denied"), "{message}");
    assert!(
        message.contains(&program.display().to_string()),
        "{message}"
    );
    assert!(message.contains("TOOLMESH_SANDBOX_DIR"), "{message}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "took {:?}",
        began.elapsed()
    );
}

/// Every start of one binary, by any worker of the sandbox directory, shares one staged
/// spawner: a hard link when the binary may be shared as it is, else a read-only copy.
#[test]
fn the_spawner_is_staged_once_per_binary() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let sandboxes = tempfile::tempdir().unwrap();
    let (private_dir, program) = private_spawner();
    let stage = |program: &Path| {
        toolmesh_sandbox::backend::spawner::stage(program, sandboxes.path()).unwrap()
    };
    let first = stage(&program);
    let second = stage(&program);
    assert_eq!(first, second);
    let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_eq!(inode(&first), inode(&second), "not staged anew");
    assert_eq!(inode(&first), inode(&program), "a hard link");
    let staged_dir = sandboxes.path().join(".spawner");
    assert_eq!(std::fs::read_dir(&staged_dir).unwrap().count(), 1);

    // A binary others may not read is copied, readable and executable by all; another binary
    // gets its own.
    let private = private_dir.path().join("private-build");
    std::fs::write(&private, b"another build").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let copied = stage(&private);
    assert_ne!(copied, first);
    assert_ne!(inode(&copied), inode(&private), "a copy");
    let mode = std::fs::metadata(&copied).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o555);
    assert_eq!(std::fs::read(&copied).unwrap(), b"another build");
    assert_eq!(std::fs::read_dir(&staged_dir).unwrap().count(), 2);
}
