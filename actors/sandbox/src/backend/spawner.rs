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
//! Every command runs in a process group of its own with `TOOLMESH_EXEC_ID` set to its marker.
//! Killing a command kills its group and every process that still carries its marker (forks
//! included, until none is left), so a tree dies even when parts of it changed their group;
//! the same happens when its first process exits, so nothing a command left behind outlives
//! it (the backend's processes ended with their command before the spawner existed too).
//! When the worker closes the socket the spawner exits, and bwrap's init with it, which ends
//! every process in the sandbox's pid namespace.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use rustix::process::{kill_process, kill_process_group, Pid, Signal};
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

/// The environment variable that marks every process of one command.
pub const MARKER_VAR: &str = super::docker::EXEC_ID_VAR;
/// The largest frame either side accepts (a command line is at most a few MiB: execve's limit).
pub const MAX_FRAME: usize = 16 << 20;
/// Kill passes over `/proc` before giving up on a tree that keeps forking.
const KILL_PASSES: usize = 50;
/// Stack of the thread that waits for one command (the sandbox's address-space limit counts
/// every thread's stack).
const WAITER_STACK: usize = 64 << 10;

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

/// A command the spawner started and has not seen end.
struct Running {
    pid: Pid,
    marker: String,
}

type Table = Arc<Mutex<HashMap<u64, Running>>>;

/// The spawner's main loop (`toolmesh sandbox-spawner [--listen PATH]`): serves the socket on
/// stdin, or the first connection to a socket it listens on at `PATH` (in a container, where
/// the worker cannot hand it a socket), until the worker closes it.
pub fn serve(listen: Option<&Path>) -> ExitCode {
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
    let running: Table = Arc::default();
    write_event(&writer, &Event::Ready);
    loop {
        match recv_frame::<Request>(&control) {
            Ok(Some((Request::Spawn(request), fds))) => spawn(request, fds, &running, &writer),
            Ok(Some((Request::Kill { id }, _))) => {
                let target = lock(&running).get(&id).map(|r| (r.pid, r.marker.clone()));
                if let Some((pid, marker)) = target {
                    // Where no thread can be had (a fork bomb holds every pid the sandbox may
                    // have), kill it here: the loop waits, but the bomb ends.
                    let in_thread = marker.clone();
                    let spawned = std::thread::Builder::new()
                        .stack_size(WAITER_STACK)
                        .spawn(move || kill_tree(Some(pid), &in_thread));
                    if spawned.is_err() {
                        kill_tree(Some(pid), &marker);
                    }
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

fn spawn(
    request: SpawnRequest,
    fds: Vec<OwnedFd>,
    running: &Table,
    writer: &Arc<Mutex<UnixStream>>,
) {
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
        .stderr(Stdio::from(stderr))
        .process_group(0);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
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
            return;
        }
    };
    drop(report);
    let pid = Pid::from_child(&child);
    lock(running).insert(
        id,
        Running {
            pid,
            marker: marker.clone(),
        },
    );
    let (table, events, mark) = (Arc::clone(running), Arc::clone(writer), marker.clone());
    let waiter = std::thread::Builder::new()
        .stack_size(WAITER_STACK)
        .spawn(move || {
            let mut child = child;
            let code = match child.wait() {
                Ok(status) => match (status.code(), status.signal()) {
                    (Some(code), _) => i64::from(code),
                    (None, Some(signal)) => 128 + i64::from(signal),
                    (None, None) => -1,
                },
                Err(_) => -1,
            };
            // What the command left running ends with it. By marker only: its pid is reaped
            // and may already name another process group.
            kill_tree(None, &mark);
            lock(&table).remove(&id);
            write_event(&events, &Event::Exited { id, code });
        });
    if waiter.is_err() {
        // No thread for it: kill it rather than leave a command nobody reports on.
        kill_tree(Some(pid), &marker);
        lock(running).remove(&id);
        exited(KILLED);
    }
}

/// Kills process group `group` and every process marked `marker`, until none is left.
fn kill_tree(group: Option<Pid>, marker: &str) {
    if let Some(group) = group {
        let _ = kill_process_group(group, Signal::KILL);
    }
    let needle = format!("{MARKER_VAR}={marker}");
    let me = rustix::process::getpid();
    for _ in 0..KILL_PASSES {
        let mut found = false;
        for pid in marked(&needle) {
            if pid != me {
                found = true;
                let _ = kill_process(pid, Signal::KILL);
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The processes whose environment holds `needle` (`NAME=value`).
fn marked(needle: &str) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(Pid::from_raw)
        .filter(|pid| {
            std::fs::read(format!("/proc/{}/environ", pid.as_raw_nonzero()))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
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
