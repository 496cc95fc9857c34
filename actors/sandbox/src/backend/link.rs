//! This worker's end of a sandbox's spawner ([`super::spawner`]): the socket to it, the
//! commands sent and not yet exited, and an [`Execution`] per command whose output the worker
//! reads from pipes it made itself. Both backends use it: the process backend starts the
//! spawner inside bubblewrap with the socket as its stdin; the Docker backend starts it as
//! the container's command and connects to the socket it listens on.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
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
use tokio::sync::{mpsc, oneshot, watch};
use toolmesh_kernel::text::DisplaySafe;

use super::docker::{EXEC_ID_VAR, OUTPUT_CHANNEL};
use super::spawner::{self, Event, Request, SpawnRequest, KILLED};
use super::{BackendError, ExecSpec, Execution, ExitStatus, KillSwitch, Output, StdinWriter};

/// How long a kill waits for the process tree to be gone.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long a new sandbox's spawner may take to say it is ready.
pub(crate) const SPAWNER_START: Duration = Duration::from_secs(10);
/// How long output is still read after the command exited (and its leftovers were killed).
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

/// How a command's environment is made.
#[derive(Debug, Clone)]
pub(crate) struct CommandBase {
    /// Variables every command gets (the spec's own override them).
    pub env: Vec<(String, String)>,
    /// Start from the spawner's own environment (a container's: the image's `ENV`).
    pub inherit_env: bool,
    /// The working directory when the spec names none.
    pub cwd: &'static str,
}

/// Commands sent and not yet exited, by id, each with where its exit code goes; `None` once
/// the spawner is gone.
type Waiting = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<i64>>>>>;

/// Why a sandbox's spawner did not start.
pub(crate) enum LinkError {
    Spawn(io::Error),
    NotReady(String),
}

/// This worker's end of one sandbox: the spawner's socket (and bwrap's process).
pub(crate) struct Link {
    sandbox_id: String,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Waiting,
    /// bwrap, for the process backend (a container's spawner ends with its container).
    process: tokio::sync::Mutex<Option<Child>>,
    next_exec: AtomicU64,
}

impl Link {
    /// Starts bwrap with the spawner and waits for the spawner's `ready`.
    pub(crate) async fn start(mut command: Command, sandbox_id: &str) -> Result<Self, LinkError> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(LinkError::Spawn)?;
        command.stdin(Stdio::from(OwnedFd::from(theirs)));
        let mut child = command.spawn().map_err(LinkError::Spawn)?;
        // The command holds our copy of the spawner's end: without it, a sandbox that dies
        // before its `ready` (bwrap cannot set it up) closes the socket at once, and the
        // start fails then, not at `SPAWNER_START`.
        drop(command);
        let said = Arc::new(Mutex::new(String::new()));
        let logger = child.stderr.take().map(|stderr| {
            tokio::spawn(log_stderr(stderr, sandbox_id.to_owned(), Arc::clone(&said)))
        });
        match Self::ready(ours, sandbox_id).await {
            Ok(mut link) => {
                link.process = tokio::sync::Mutex::new(Some(child));
                Ok(link)
            }
            Err(why) => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(KILL_WAIT, child.wait()).await;
                // bwrap's last words: its stderr ends with it.
                if let Some(logger) = logger {
                    let _ = tokio::time::timeout(KILL_WAIT, logger).await;
                }
                let said = lock(&said).trim().to_owned();
                Err(LinkError::NotReady(if said.is_empty() {
                    why
                } else {
                    format!("{why}: {said}")
                }))
            }
        }
    }

    /// Takes over a connected socket to a spawner and waits for its `ready`; `Err` says why
    /// it did not come.
    pub(crate) async fn ready(
        socket: std::os::unix::net::UnixStream,
        sandbox_id: &str,
    ) -> Result<Self, String> {
        socket.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (mut reader, writer) = tokio::net::UnixStream::from_std(socket)
            .map_err(|e| e.to_string())?
            .into_split();
        let ready = tokio::time::timeout(SPAWNER_START, spawner::next_event(&mut reader)).await;
        match ready {
            Ok(Ok(Some(Event::Ready))) => {}
            Err(_) => return Err(format!("no answer within {} s", SPAWNER_START.as_secs())),
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(_)) => return Err("it ended at once".to_owned()),
        }
        let waiting = Arc::new(Mutex::new(Some(HashMap::new())));
        tokio::spawn(read_events(reader, Arc::clone(&waiting)));
        Ok(Self {
            sandbox_id: sandbox_id.to_owned(),
            writer: tokio::sync::Mutex::new(writer),
            waiting,
            process: tokio::sync::Mutex::new(None),
            next_exec: AtomicU64::new(0),
        })
    }

    /// Starts `spec` through the spawner: the worker makes the pipes, the spawner forks and
    /// execs with them, the worker reads the output itself.
    pub(crate) async fn exec(
        self: &Arc<Self>,
        spec: ExecSpec,
        base: &CommandBase,
    ) -> Result<Execution, BackendError> {
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
        let mut env = base.env.clone();
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
                base.cwd.to_owned()
            } else {
                spec.cwd
            },
            marker: spec.exec_id,
            inherit_env: base.inherit_env,
        };
        let exited = self
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
        let killer = Arc::clone(self);
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

    /// Kills bwrap (the sandbox ends with it) and waits until it is gone; a container's
    /// spawner exits when the socket closes, as the link is dropped.
    pub(crate) async fn shut(&self) {
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
        tracing::warn!(sandbox_id = %sandbox_id, "sandbox: {}", DisplaySafe(&line));
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

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
