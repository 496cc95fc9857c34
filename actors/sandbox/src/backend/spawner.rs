//! The sandbox spawner: one long-lived process per sandbox, started once inside the sandbox's
//! bubblewrap namespaces or as its Docker container's command, that starts every command of
//! the session there.
//!
//! Why: setting up namespaces and mounts is most of a bwrap run's cost (about 9 ms here, see
//! `benches/sandbox.rs`), while a fork and exec inside namespaces that already exist costs
//! about one. It also makes a process sandbox behave like a container: `/tmp` and background
//! processes live as long as the session, not as long as one command.
//!
//! The worker talks to the spawner over a Unix stream socket — the spawner's stdin under
//! bubblewrap, the one connection it accepts at `--listen PATH` in a container — in frames
//! of a little-endian `u32` length and a JSON body:
//! - worker → spawner: [`Request::Spawn`], with the command's stdin, stdout and stderr attached
//!   to the frame as three `SCM_RIGHTS` descriptors (the worker keeps the other pipe ends and
//!   reads them directly, so output never passes through the spawner), and [`Request::Kill`];
//! - spawner → worker: [`Event::Exited`], once per spawned command.
//!
//! **Nothing a command starts outlives it**, whatever it does to itself: a new session or
//! process group, a cleared environment (`TOOLMESH_EXEC_ID` is set on every command, but only
//! as information), double forks. The spawner kills by lineage, which a process cannot shed:
//! - the spawner is a *child subreaper* (`PR_SET_CHILD_SUBREAPER`), and so is each command's
//!   *supervisor*: a fork of the spawner (made in the child of the spawner's own fork, before
//!   the command's exec, with nothing but system calls: see `fork_supervisor`) whose only
//!   child is the command. A process orphaned under a command is re-parented to the nearest
//!   living subreaper above it, its command's supervisor, never beyond it; the supervisor
//!   reaps those and exits with the command's status once the command's first process ended;
//! - when a supervisor ends (its command ended, [`Request::Kill`] SIGKILLed it, or the command
//!   killed it), everything it still had is re-parented to the spawner, which kills every
//!   process under it that is not a supervisor it started itself, round after round until none
//!   is left (a tree that keeps forking included), and only then reports [`Event::Exited`]. So
//!   by the time a command's end is reported (its timeout or kill answered), its whole tree is
//!   gone, while a background command's children live as long as it does;
//! - that sweep reads every process's `/proc/<pid>/stat`, so it runs only when something may
//!   be left: a supervisor that exits by itself first reaps what has ended below it and, if
//!   it still has a child, writes its pid into a pipe only supervisors hold (the *leftovers*
//!   pipe) before it exits. The spawner sweeps after reaping a supervisor that told so, one
//!   killed by a signal (by [`Request::Kill`], or by its command: it could tell nothing), or a
//!   child that is no supervisor, and while a sweep gave up. A supervisor with no child has
//!   nothing below it (an orphan is re-parented to it, never past it), so a command that left
//!   nothing costs no scan however many processes the sandbox holds (`benches/spawner.rs`);
//! - the spawner and every supervisor are not dumpable (`PR_SET_DUMPABLE 0`, kept across the
//!   supervisor's fork, which execs nothing): a command, the same uid, cannot ptrace them or
//!   read their `/proc` entries, so it cannot forge what they tell the worker.
//!
//! Killing the spawner (a command may: it is the same uid) ends the sandbox: it is the
//! container's command under docker-init, or bwrap's only child, and every process of the
//! sandbox's pid namespace dies with it.
//! When the worker closes the socket the spawner exits, and bwrap's init with it, which ends
//! every process in the sandbox's pid namespace.

use std::collections::{HashMap, HashSet};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use rustix::pipe::PipeFlags;
use rustix::process::{kill_process, Pid, Signal, WaitId, WaitIdOptions, WaitOptions};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};

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

/// The folder of the sandbox directory that holds staged spawners ([`stage`]); a leading dot,
/// so it never names a node (node ids are letters, digits, `-` and `_`).
pub const STAGED_DIR: &str = ".spawner";

/// Puts `program` (the node's own binary) into `<dir>/.spawner/`, where both backends bind it
/// from: the Docker daemon can (a worker in a container sees its binary at a path that means
/// nothing to the daemon), and so can the sandbox user (the binary may live in a folder only
/// its owner can enter, a clone under a private `mktemp -d` or `/root/.cargo/bin`). Returns
/// the staged path.
///
/// Staged once per binary, not per start: the name carries the binary's size and
/// modification time, so every start of one binary (and every worker of one image sharing
/// the directory) finds it there. A hard link where the file system allows and the binary is
/// readable and executable by everyone already, otherwise a copy made read-only (0555);
/// either is made beside it and renamed into place, so a racing worker or a container
/// binding the old file never sees half of one. Blocking: run it off the async threads.
pub fn stage(program: &Path, dir: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(program)?;
    if !meta.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a file",
            program.display()
        )));
    }
    let folder = dir.join(STAGED_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&folder)?;
    let staged = folder.join(format!(
        "toolmesh-{:x}-{:x}.{:09}",
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec()
    ));
    if std::fs::symlink_metadata(&staged).is_ok_and(|m| m.is_file() && m.size() == meta.size()) {
        return Ok(staged);
    }
    let fresh = folder.join(format!(
        ".toolmesh-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let shared = meta.mode() & 0o005 == 0o005;
    if !(shared && std::fs::hard_link(program, &fresh).is_ok()) {
        let copied = std::fs::copy(program, &fresh)
            .and_then(|_| std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o555)));
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&fresh);
            return Err(e);
        }
    }
    std::fs::rename(&fresh, &staged).inspect_err(|_| {
        let _ = std::fs::remove_file(&fresh);
    })?;
    Ok(staged)
}

/// [`stage`] into a folder of the system's temporary directory that only this user writes
/// (`$TMPDIR/toolmesh-spawner-<uid>`), for a program in a folder the sandbox user cannot
/// enter: the tests run the crate's spawner from `target/`, which may sit in a clone under a
/// private folder. A folder of that name owned by another user, or writable by others, is
/// refused (it could hold a planted program).
pub fn stage_in_temp(program: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = rustix::process::geteuid().as_raw();
    let dir = std::env::temp_dir().join(format!("toolmesh-spawner-{uid}"));
    match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is not a folder of uid {uid} that only it writes; remove it",
            dir.display()
        )));
    }
    stage(program, &dir)
}

/// The environment variable set on every command (its execution id; information only: the
/// spawner kills by lineage, see the module docs).
pub const MARKER_VAR: &str = super::docker::EXEC_ID_VAR;
/// The largest frame either side accepts (a command line is at most a few MiB: execve's limit).
pub const MAX_FRAME: usize = 16 << 20;
/// Kill rounds over `/proc` before an end is reported anyway (a tree that keeps forking dies
/// in a few; what is left is killed by the next sweep).
const SWEEP_ROUNDS: usize = 1000;
/// Stack of the reaper thread (the sandbox's address-space limit counts every thread's stack).
const REAPER_STACK: usize = 256 << 10;

/// The write end of the leftovers pipe (see the module docs), for the supervisors; -1 when
/// there is none (then the spawner sweeps after every end). Set before the first spawn.
static LEFTOVERS: AtomicI32 = AtomicI32::new(-1);

/// Worker → spawner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Start a command; the frame carries its stdin, stdout and stderr.
    Spawn(SpawnRequest),
    /// Kill command `id` and everything it started.
    Kill { id: u64 },
}

/// Start `argv` with exactly `env` (plus `marker` as [`MARKER_VAR`]) in `cwd`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnRequest {
    pub id: u64,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub marker: String,
    /// Start from the spawner's own environment instead of an empty one (a container's: the
    /// image's `ENV`), `env` on top.
    #[serde(default)]
    pub inherit_env: bool,
}

/// The exit code of a command killed by SIGKILL (as a shell reports it).
pub const KILLED: i64 = 137;

/// Spawner → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The spawner runs and reads requests (its first event).
    Ready,
    /// Command `id` ended: its exit code, 128 + the signal that killed it, or 126/127 (with a
    /// line on its stderr) when it could not be started.
    Exited { id: u64, code: i64 },
}

/// One frame: the length, then the JSON body.
pub fn encode<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let mut frame = vec![0u8; 4];
    serde_json::to_writer(&mut frame, message).map_err(io::Error::other)?;
    let len = frame.len() - 4;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a spawner frame of {len} bytes is over the limit of {MAX_FRAME}"),
        ));
    }
    frame[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(frame)
}

/// The body length a frame header announces, refused over [`MAX_FRAME`].
fn body_len(header: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a spawner frame announces {len} bytes, over the limit of {MAX_FRAME}"),
        ));
    }
    Ok(len)
}

/// Worker side: sends one frame with `fds` attached to its first bytes.
pub async fn send<T: Serialize>(
    writer: &mut tokio::net::unix::OwnedWriteHalf,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let frame = encode(message)?;
    let stream: &tokio::net::UnixStream = writer.as_ref();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one frame"));
    }
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            sendmsg(
                stream,
                &[IoSlice::new(&frame)],
                &mut control,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            )
            .map_err(io::Error::from)
        })
        .await?;
    // The descriptors went with the first bytes; a short write's rest follows.
    writer.write_all(&frame[sent..]).await
}

/// Worker side: reads one event; `None` once the spawner is gone.
pub async fn next_event(reader: &mut tokio::net::unix::OwnedReadHalf) -> io::Result<Option<Event>> {
    let mut header = [0u8; 4];
    match reader.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; body_len(header)?];
    reader.read_exact(&mut body).await?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(io::Error::other)
}

/// Spawner side: reads one frame and the descriptors attached to it; `None` at a clean end of
/// stream.
pub fn recv_frame<T: for<'de> Deserialize<'de>>(
    socket: &UnixStream,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut header = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    // A frame's descriptors arrive with its first bytes: recvmsg the header, read the rest.
    while got < header.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut header[got..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if received.bytes == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        got += received.bytes;
    }
    let mut body = vec![0u8; body_len(header)?];
    let mut reader = socket;
    reader.read_exact(&mut body)?;
    let message = serde_json::from_slice(&body).map_err(io::Error::other)?;
    Ok(Some((message, fds)))
}

/// Spawner side: writes one event.
fn write_event(writer: &Mutex<UnixStream>, event: &Event) {
    if let Ok(frame) = encode(event) {
        let _ = lock(writer).write_all(&frame);
    }
}

/// The commands the spawner started and has not seen end: each one's supervisor, by command
/// id. Its lock is held while a supervisor is forked and while children are reaped or killed,
/// so no pid in it is ever stale, a spawn's own wait for a child that could not exec is never
/// raced, and a sweep never takes a supervisor being started for a stray.
struct Shared {
    table: Mutex<HashMap<u64, Pid>>,
    /// Wakes the reaper when it had no child to wait for and a supervisor was started.
    started: Condvar,
}

/// The spawner's main loop (`toolmesh sandbox-spawner [--listen PATH]`): serves the socket on
/// stdin, or the first connection to a socket it listens on at `PATH` (in a container, where
/// the worker cannot hand it a socket), until the worker closes it.
pub fn serve(listen: Option<&Path>) -> ExitCode {
    // First of all: nothing runs in the sandbox yet that could ptrace us or escape a command.
    if let Err(e) = guard_self() {
        eprintln!("toolmesh sandbox-spawner: {e}");
        return ExitCode::FAILURE;
    }
    let control = match listen {
        Some(path) => accept_one(path),
        None => io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map(UnixStream::from)
            .map_err(|e| format!("no control socket on stdin: {e}")),
    };
    let control = match control {
        Ok(control) => control,
        Err(e) => {
            eprintln!("toolmesh sandbox-spawner: {e}");
            return ExitCode::FAILURE;
        }
    };
    let writer = match control.try_clone() {
        Ok(writer) => Arc::new(Mutex::new(writer)),
        Err(e) => {
            eprintln!("toolmesh sandbox-spawner: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shared = Arc::new(Shared {
        table: Mutex::default(),
        started: Condvar::new(),
    });
    // Without it every end is swept: slower, as safe.
    let leftovers = match rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) {
        Ok((read, write)) => {
            // Kept open for the spawner's life: every supervisor's fork inherits it.
            LEFTOVERS.store(std::os::fd::IntoRawFd::into_raw_fd(write), Ordering::SeqCst);
            Some(read)
        }
        Err(e) => {
            eprintln!(
                "toolmesh sandbox-spawner: no leftovers pipe, sweeping after every command: {e}"
            );
            None
        }
    };
    let reaper = {
        let (shared, writer) = (Arc::clone(&shared), Arc::clone(&writer));
        std::thread::Builder::new()
            .name("reaper".to_owned())
            .stack_size(REAPER_STACK)
            .spawn(move || reap(&shared, &writer, leftovers))
    };
    if let Err(e) = reaper {
        eprintln!("toolmesh sandbox-spawner: no reaper thread: {e}");
        return ExitCode::FAILURE;
    }
    write_event(&writer, &Event::Ready);
    loop {
        match recv_frame::<Request>(&control) {
            Ok(Some((Request::Spawn(request), fds))) => spawn(request, fds, &shared, &writer),
            Ok(Some((Request::Kill { id }, _))) => {
                // The supervisor's tree falls to the reaper, which kills it whole and reports
                // the end (137). Under the lock: the pid is not reaped, so it is still ours.
                if let Some(supervisor) = lock(&shared.table).get(&id) {
                    let _ = kill_process(*supervisor, Signal::KILL);
                }
            }
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("toolmesh sandbox-spawner: control socket: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}

/// Makes this process the subreaper of everything it starts and not dumpable (see the module
/// docs). The supervisors it forks keep the second and set the first themselves.
fn guard_self() -> Result<(), String> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| format!("cannot become a child subreaper: {e}"))?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("cannot make itself non-dumpable: {e}"))
}

/// Listens at `path`, takes the first connection (the worker's: nothing else runs in the
/// sandbox before it connects) and removes the socket, so nobody connects after it.
fn accept_one(path: &Path) -> Result<UnixStream, String> {
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen at {}: {e}", path.display()))?;
    let (control, _) = listener
        .accept()
        .map_err(|e| format!("accepting the worker: {e}"))?;
    let _ = std::fs::remove_file(path);
    Ok(control)
}

/// The spawner's arguments after its subcommand: none, or `--listen PATH`.
pub fn listen_arg(args: &[String]) -> Result<Option<PathBuf>, String> {
    match args {
        [] => Ok(None),
        [flag, path] if flag == "--listen" => Ok(Some(path.into())),
        _ => Err(format!(
            "unexpected arguments {args:?}: expected none or --listen PATH"
        )),
    }
}

fn spawn(request: SpawnRequest, fds: Vec<OwnedFd>, shared: &Shared, writer: &Mutex<UnixStream>) {
    let SpawnRequest {
        id,
        argv,
        env,
        cwd,
        marker,
        inherit_env,
    } = request;
    let exited = |code: i64| write_event(writer, &Event::Exited { id, code });
    let Ok([stdin, stdout, stderr]) = <[OwnedFd; 3]>::try_from(fds) else {
        exited(126);
        return;
    };
    let mut report = stderr.try_clone().ok().map(std::fs::File::from);
    let Some((program, args)) = argv.split_first() else {
        exited(126);
        return;
    };
    let mut command = Command::new(program);
    if !inherit_env {
        command.env_clear();
    }
    command
        .args(args)
        .envs(env)
        .env(MARKER_VAR, &marker)
        .current_dir(&cwd)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    // SAFETY: `fork_supervisor` makes only async-signal-safe system calls (see its docs).
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(fork_supervisor)
    };
    let spawned = {
        let mut table = lock(&shared.table);
        let spawned = command.spawn();
        if let Ok(supervisor) = &spawned {
            table.insert(id, Pid::from_child(supervisor));
        }
        spawned
    };
    shared.started.notify_one();
    // The `Child` goes unwaited: the reaper reaps every child of the spawner.
    if let Err(e) = spawned {
        // What a shell would say, on the command's own stderr.
        let (why, code) = if !Path::new(&cwd).is_dir() {
            (format!("cannot change to directory {cwd}: {e}"), 1)
        } else if e.kind() == io::ErrorKind::NotFound {
            (format!("{program}: command not found"), 127)
        } else {
            (format!("{program}: {e}"), 126)
        };
        if let Some(report) = report.as_mut() {
            let _ = writeln!(report, "toolmesh: {why}");
        }
        exited(code);
    }
}

/// Runs in the child the spawner forked for a command, right before its exec: makes it the
/// command's supervisor, a subreaper that forks once more; the new child goes on to exec the
/// command (in a process group of its own), the supervisor stays behind ([`supervise`]).
///
/// The spawner is multithreaded, so between that fork and an exec only async-signal-safe
/// calls are sound: this and [`supervise`] make system calls (libc's thin wrappers) and touch
/// no allocator, lock or Rust runtime state. The supervisor is a fork that never execs, so it
/// keeps the spawner's non-dumpable mark with no window in which a command could attach.
/// (The workspace denies `unsafe`; these two functions are the exception, for this reason.)
#[allow(unsafe_code)]
fn fork_supervisor() -> io::Result<()> {
    // SAFETY: plain system calls on this process (see above).
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        match libc::fork() {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
            command => supervise(command),
        }
    }
}

/// The supervisor: holds no descriptor but the leftovers pipe's write end (the command's pipes
/// end with the command's tree, and the spawn's exec report pipe with the command's exec),
/// reaps whatever is re-parented to it, and exits with the command's status (128 + the signal
/// that killed it) once it ends. What the command left running then falls to the spawner,
/// which kills it; the supervisor tells it so through the leftovers pipe (its pid, 4 bytes,
/// written whole) when it still has a child, and when it cannot write, it dies by SIGKILL,
/// which makes the spawner sweep too. Async-signal-safe only (see [`fork_supervisor`]).
///
/// # Safety
/// Call only in a fresh child of a fork, with `command` its own child.
#[allow(unsafe_code)]
unsafe fn supervise(command: libc::pid_t) -> ! {
    let leftovers = LEFTOVERS.load(Ordering::SeqCst);
    // SAFETY: system calls on this process's own descriptors and children.
    unsafe {
        close_all_but(leftovers);
        loop {
            let mut status = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == command {
                let code = if libc::WIFSIGNALED(status) {
                    128 + libc::WTERMSIG(status)
                } else {
                    libc::WEXITSTATUS(status)
                };
                if leftovers >= 0 && has_children() {
                    let me = libc::getpid().to_ne_bytes();
                    if libc::write(leftovers, me.as_ptr().cast(), me.len()) != me.len() as isize {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                }
                libc::_exit(code);
            }
            if pid == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // No child left (cannot be: the command is ours until reaped here).
                libc::_exit(KILLED as i32);
            }
        }
    }
}

/// Closes every descriptor of this process but `keep` (none when negative).
/// Async-signal-safe.
#[allow(unsafe_code)]
fn close_all_but(keep: libc::c_int) {
    let close = |from: u32, to: u32| {
        // SAFETY: closing descriptors of this process, which the supervisor never uses.
        unsafe {
            if libc::syscall(libc::SYS_close_range, from, to, 0u32) != 0 {
                for fd in from..to.min(1023).saturating_add(1) {
                    libc::close(fd as libc::c_int);
                }
            }
        }
    };
    match u32::try_from(keep) {
        Ok(keep) => {
            if keep > 0 {
                close(0, keep - 1);
            }
            close(keep + 1, u32::MAX);
        }
        Err(_) => close(0, u32::MAX),
    }
}

/// Whether this process still has a child once every child that ended is reaped.
/// Async-signal-safe.
#[allow(unsafe_code)]
fn has_children() -> bool {
    loop {
        let mut status = 0;
        // SAFETY: reaping this process's own children.
        match unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } {
            0 => return true,
            -1 if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            -1 => return false,
            _ => {}
        }
    }
}

/// The reaper thread: waits for any child of the spawner to end, reaps it (a supervisor: its
/// command ended), kills whatever that left ([`sweep`]) when something may be left (see the
/// module docs) and reports each ended command.
fn reap(shared: &Shared, writer: &Mutex<UnixStream>, leftovers: Option<OwnedFd>) {
    let mut reaper = Reaper {
        leftovers,
        told: HashSet::new(),
        unfinished: false,
    };
    loop {
        // Wait without reaping: the reaping happens under the table's lock.
        match rustix::process::waitid(WaitId::All, WaitIdOptions::EXITED | WaitIdOptions::NOWAIT) {
            Ok(_) => {}
            Err(rustix::io::Errno::CHILD) => {
                let table = lock(&shared.table);
                if table.is_empty() {
                    let _ = shared
                        .started
                        .wait_timeout(table, Duration::from_secs(1))
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                continue;
            }
            Err(_) => continue,
        }
        let mut ended = Vec::new();
        let left = reaper.reap_zombies(&mut lock(&shared.table), &mut ended);
        if left || reaper.unfinished {
            reaper.unfinished = !reaper.sweep(shared, &mut ended);
        }
        for (id, code) in ended {
            write_event(writer, &Event::Exited { id, code });
        }
    }
}

/// The reaper thread's state.
struct Reaper {
    /// The leftovers pipe's read end; `None`: sweep after every end.
    leftovers: Option<OwnedFd>,
    /// Supervisors that told of leftovers and are not reaped yet.
    told: HashSet<i32>,
    /// The last sweep gave up with processes left.
    unfinished: bool,
}

impl Reaper {
    /// Reaps every ended child; the supervisors among them are removed from `table` and their
    /// commands added to `ended` with their exit codes. Whether what was reaped may have left
    /// processes behind: a supervisor that told so or was killed, a child that was no
    /// supervisor.
    fn reap_zombies(&mut self, table: &mut HashMap<u64, Pid>, ended: &mut Vec<(u64, i64)>) -> bool {
        let mut reaped = Vec::new();
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            let id = table.iter().find(|(_, p)| **p == pid).map(|(id, _)| *id);
            let Some(id) = id else {
                reaped.push((pid, true));
                continue;
            };
            table.remove(&id);
            let code = match (status.exit_status(), status.terminating_signal()) {
                (Some(code), _) => i64::from(code),
                (None, Some(signal)) => 128 + i64::from(signal),
                (None, None) => -1,
            };
            ended.push((id, code));
            reaped.push((pid, status.exit_status().is_none()));
        }
        if reaped.is_empty() {
            return false;
        }
        // Read after reaping: a supervisor writes before it exits.
        let Some(pipe) = &self.leftovers else {
            return true;
        };
        let mut buf = [0u8; 4096];
        loop {
            match rustix::io::read(pipe, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.told.extend(
                    buf[..n - n % 4]
                        .chunks_exact(4)
                        .map(|pid| i32::from_ne_bytes([pid[0], pid[1], pid[2], pid[3]])),
                ),
            }
        }
        let mut left = false;
        for (pid, unsure) in reaped {
            left |= self.told.remove(&pid.as_raw_nonzero().get()) || unsure;
        }
        left
    }

    /// Kills every process under the spawner that is not under one of its running
    /// supervisors (a command's leftovers, re-parented here when its supervisor ended), round
    /// after round until a round finds none and reaps nothing that may have left more,
    /// reaping as it goes; whether it got there. Commands whose supervisors end meanwhile
    /// join `ended`.
    fn sweep(&mut self, shared: &Shared, ended: &mut Vec<(u64, i64)>) -> bool {
        let me = rustix::process::getpid();
        for round in 0..SWEEP_ROUNDS {
            let more = {
                let mut table = lock(&shared.table);
                let supervisors: HashSet<Pid> = table.values().copied().collect();
                let found = strays(me, &supervisors, &processes());
                for pid in &found {
                    // A stray's pid cannot be reused while it is unreaped; one deeper down
                    // could only be if its parent reaped it and pid_max wrapped around since
                    // the scan.
                    let _ = kill_process(*pid, Signal::KILL);
                }
                let left = self.reap_zombies(&mut table, ended);
                !found.is_empty() || left
            };
            if !more {
                return true;
            }
            if round >= 3 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        false
    }
}

/// Every live process this process sees in `/proc` with its parent (zombies left out).
fn processes() -> Vec<(Pid, Pid)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`: the name may hold anything, the fields after it not.
            let (_, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let parent = fields.next()?.parse::<i32>().ok()?;
            if matches!(state, "Z" | "X") {
                return None;
            }
            Some((Pid::from_raw(pid)?, Pid::from_raw(parent)?))
        })
        .collect()
}

/// The processes under `me` that are not under one of `supervisors`: `me`'s other children
/// and all their descendants.
fn strays(me: Pid, supervisors: &HashSet<Pid>, processes: &[(Pid, Pid)]) -> Vec<Pid> {
    let mut children: HashMap<Pid, Vec<Pid>> = HashMap::new();
    for (pid, parent) in processes {
        children.entry(*parent).or_default().push(*pid);
    }
    let mut found: Vec<Pid> = children
        .get(&me)
        .into_iter()
        .flatten()
        .filter(|pid| !supervisors.contains(pid))
        .copied()
        .collect();
    let mut next = 0;
    while next < found.len() {
        if let Some(below) = children.get(&found[next]) {
            found.extend(below.iter().copied().filter(|pid| *pid != me));
        }
        next += 1;
    }
    found
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_carry_messages_and_descriptors() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (_reader, mut writer) = tokio::net::UnixStream::from_std({
            ours.set_nonblocking(true).unwrap();
            ours
        })
        .unwrap()
        .into_split();
        let (r, w) = rustix::pipe::pipe().unwrap();
        let request = Request::Kill { id: 7 };
        send(&mut writer, &request, &[w.as_fd()]).await.unwrap();
        drop(w);
        let (got, fds) = recv_frame::<Request>(&theirs).unwrap().unwrap();
        assert_eq!(got, request);
        assert_eq!(fds.len(), 1);
        // The received descriptor is the pipe's write end.
        let mut w = std::fs::File::from(fds.into_iter().next().unwrap());
        w.write_all(b"x").unwrap();
        drop(w);
        let mut text = String::new();
        std::fs::File::from(r).read_to_string(&mut text).unwrap();
        assert_eq!(text, "x");
        drop(writer);
        drop(_reader);
        assert!(recv_frame::<Request>(&theirs).unwrap().is_none());
    }

    #[test]
    fn oversized_frames_are_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&(MAX_FRAME as u32 + 1).to_le_bytes())
            .unwrap();
        let err = recv_frame::<Request>(&b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let huge = Request::Spawn(SpawnRequest {
            id: 1,
            argv: vec!["x".repeat(MAX_FRAME)],
            env: Vec::new(),
            cwd: "/".into(),
            marker: "m".into(),
            inherit_env: false,
        });
        assert_eq!(
            encode(&huge).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
