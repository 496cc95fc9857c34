//! Exec mode: each command is a `docker exec` under the sweep's wrapper, its output passed on
//! without the end line, its exit code from the daemon's events or from inspect_exec.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::backend::docker::common::{
    container_ref, container_running, exec_error, status, EXEC_ID_VAR, OUTPUT_CHANNEL,
    SANDBOX_USER, WORKSPACE,
};
use crate::backend::docker::sweep::{kill_switch, kill_tree, EndLine, Swept, KILL_ROUNDS, WRAPPER};
use crate::backend::exits::{ExecExits, EVENT_WAIT};
use crate::backend::{
    BackendError, ExecSpec, Execution, ExitStatus, Output, SandboxRef, StartGate, StdinWriter,
};

/// Runs `spec` in `sandbox`'s container as a `docker exec` (exec mode, see the module docs);
/// `exits` watches the daemon's exit events from the first exec on.
pub(super) async fn exec(
    docker: Docker,
    exits: &OnceLock<Arc<ExecExits>>,
    sandbox: &SandboxRef,
    spec: ExecSpec,
    gate: StartGate,
) -> Result<Execution, BackendError> {
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
    let exit_notice = exits
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
