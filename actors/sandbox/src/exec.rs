//! A foreground command: output collected for the reply and streamed as `stdout` / `stderr`
//! RunEvents while it runs, bounded by a timeout and cancellable.

use std::time::{Duration, Instant};

use async_nats::Client;
use bytes::Bytes;
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;
use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::wire::{self, InvocationContext, RunEventKind};

use crate::backend::{Execution, Output};

/// Output kept per stream for the reply; past it the rest is counted, not kept.
pub const COLLECT_CAP: usize = 8 * 1024 * 1024;
/// Output streamed as events per stream; past it, no more events (the reply still has it).
pub const STREAM_CAP: usize = 1024 * 1024;
/// Events carry at most this much, and go out at least this often while output flows.
const EVENT_CHUNK: usize = 16 * 1024;
const EVENT_INTERVAL: Duration = Duration::from_millis(50);
/// After a kill, how long the output may take to end.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// Publishes a call's `stdout` / `stderr` events, counting them (gap-free `seq`).
pub struct EventSink<'a> {
    client: &'a Client,
    ctx: &'a InvocationContext,
    tool: &'a str,
    subject: String,
    next_seq: u64,
    pub emitted: u64,
}

impl<'a> EventSink<'a> {
    pub fn new(
        client: &'a Client,
        ctx: &'a InvocationContext,
        tool: &'a str,
        first_seq: u64,
    ) -> Self {
        Self {
            client,
            ctx,
            tool,
            subject: public::events(&ctx.account, &ctx.invocation_id),
            next_seq: first_seq,
            emitted: 0,
        }
    }

    async fn publish(&mut self, kind: RunEventKind, data: &[u8]) {
        let mut extra = Map::with_capacity(1);
        extra.insert(
            "data".into(),
            Value::from(String::from_utf8_lossy(data).into_owned()),
        );
        let body = wire::run_event(self.ctx, self.tool, self.next_seq, kind, &extra);
        if let Err(e) = self
            .client
            .publish(self.subject.clone(), Bytes::from(body))
            .await
        {
            tracing::warn!(error = %e, "cannot publish an output event");
        }
        self.next_seq += 1;
        self.emitted += 1;
    }
}

/// One stream's collected and pending-to-stream output.
#[derive(Default)]
struct Stream {
    kept: Vec<u8>,
    total: u64,
    pending: Vec<u8>,
    streamed: usize,
}

impl Stream {
    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let room = COLLECT_CAP.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&data[..data.len().min(room)]);
        let stream_room = STREAM_CAP.saturating_sub(self.streamed + self.pending.len());
        self.pending
            .extend_from_slice(&data[..data.len().min(stream_room)]);
    }

    /// The text for the reply, with a note when output was dropped past the cap.
    fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        let dropped = self.total - self.kept.len() as u64;
        if dropped > 0 {
            text.push_str(&format!(
                "\n[toolmesh: {dropped} more bytes of output were dropped past {COLLECT_CAP} bytes]\n"
            ));
        }
        text
    }
}

/// How a foreground command ended.
#[derive(Debug)]
pub struct CommandOutcome {
    pub stdout: String,
    pub stderr: String,
    /// `None` when it was killed for a timeout or a cancel before it could report one.
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: u64,
}

/// Runs `execution` to its end (or the timeout, or a cancel), streaming its output.
pub async fn run_to_end(
    mut execution: Execution,
    stdin: Option<Bytes>,
    timeout: Duration,
    events: &mut EventSink<'_>,
    cancel: &mut CancelWatch,
) -> CommandOutcome {
    let started = Instant::now();
    if let (Some(mut writer), Some(data)) = (execution.stdin.take(), stdin) {
        // Feed stdin beside the output loop: a program may write before it reads everything.
        tokio::spawn(async move {
            let _ = writer.write_all(&data).await;
            let _ = writer.shutdown().await;
        });
    }
    let mut out = Stream::default();
    let mut err = Stream::default();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(EVENT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut timed_out = false;
    let mut cancelled = false;
    let mut grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            chunk = execution.output.recv() => match chunk {
                Some(Output::Stdout(b)) => {
                    out.push(&b);
                    if out.pending.len() >= EVENT_CHUNK { flush(events, &mut out, RunEventKind::Stdout).await; }
                }
                Some(Output::Stderr(b)) => {
                    err.push(&b);
                    if err.pending.len() >= EVENT_CHUNK { flush(events, &mut err, RunEventKind::Stderr).await; }
                }
                None => break,
            },
            _ = tick.tick() => {
                flush(events, &mut out, RunEventKind::Stdout).await;
                flush(events, &mut err, RunEventKind::Stderr).await;
            }
            _ = &mut deadline, if !timed_out && !cancelled => {
                timed_out = true;
                execution.kill.kill().await;
                grace = Some(Box::pin(tokio::time::sleep(KILL_GRACE)));
            }
            _ = cancel.requested(), if !timed_out && !cancelled => {
                cancelled = true;
                execution.kill.kill().await;
                grace = Some(Box::pin(tokio::time::sleep(KILL_GRACE)));
            }
            _ = async { grace.as_mut().expect("guarded").await }, if grace.is_some() => {
                tracing::warn!("a killed command's output did not end within the grace period");
                break;
            }
        }
    }
    flush(events, &mut out, RunEventKind::Stdout).await;
    flush(events, &mut err, RunEventKind::Stderr).await;
    let exit_code = if timed_out || cancelled {
        None
    } else {
        match tokio::time::timeout(KILL_GRACE, execution.exit).await {
            Ok(Ok(Ok(status))) => Some(status.code),
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "cannot read a command's exit code");
                None
            }
            _ => None,
        }
    };
    CommandOutcome {
        stdout: out.text(),
        stderr: err.text(),
        exit_code,
        timed_out,
        cancelled,
        duration_ms: toolmesh_kernel::time::elapsed_ms(started),
    }
}

async fn flush(events: &mut EventSink<'_>, stream: &mut Stream, kind: RunEventKind) {
    if stream.pending.is_empty() {
        return;
    }
    let pending = std::mem::take(&mut stream.pending);
    for chunk in pending.chunks(EVENT_CHUNK) {
        events.publish(kind, chunk).await;
    }
    stream.streamed += pending.len();
}
