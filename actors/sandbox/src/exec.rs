//! A foreground command: output spooled for the reply (see [`crate::output`]) and streamed as
//! `stdout` / `stderr` RunEvents while it runs, its sandbox's egress decisions as `egress`
//! RunEvents, bounded by a timeout and cancellable.

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;
use toolmesh_kernel::events::EventSink;
use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::wire::RunEventKind;

use tokio::sync::mpsc;

use crate::backend::{Execution, Output};
use crate::egress::Decision;
use crate::output::{utf8_complete_len, Captured, Spool, SpoolSettings, Utf8Decoder};

/// Output streamed as events per stream; past it, no more events (the reply still has it).
pub const STREAM_CAP: usize = 1024 * 1024;
/// Events carry at most this much, and go out at least this often while output flows.
const EVENT_CHUNK: usize = 16 * 1024;
const EVENT_INTERVAL: Duration = Duration::from_millis(50);
/// After a kill, how long the output may take to end.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// A `stdout` / `stderr` event carrying `data` (lossy UTF-8).
async fn publish_data(events: &EventSink<'_>, kind: RunEventKind, data: &[u8]) {
    let mut extra = Map::with_capacity(1);
    extra.insert(
        "data".into(),
        Value::from(String::from_utf8_lossy(data).into_owned()),
    );
    events.publish(kind, &extra).await;
}

/// An `egress` event: the decision's `host`, `port` and `allowed`.
async fn publish_decision(events: &EventSink<'_>, decision: &Decision) {
    let extra = match decision.event() {
        Value::Object(fields) => fields,
        _ => Map::new(),
    };
    events.publish(RunEventKind::Egress, &extra).await;
}

/// Takes the front of `buffer` that ends on a whole character, leaving a character cut short
/// for the bytes that complete it; all of it when no more bytes will come (`all`).
pub fn take_whole_chars(buffer: &mut Vec<u8>, all: bool) -> Vec<u8> {
    let cut = if all {
        buffer.len()
    } else {
        utf8_complete_len(buffer)
    };
    let rest = buffer.split_off(cut);
    std::mem::replace(buffer, rest)
}

/// One stream: its text spooled (counted whole, kept up to the cap) and its bytes pending to
/// be streamed as events.
struct Stream {
    decoder: Utf8Decoder,
    spool: Spool,
    pending: Vec<u8>,
    streamed: usize,
}

impl Stream {
    fn new(settings: SpoolSettings, label: &str) -> Self {
        Self {
            decoder: Utf8Decoder::default(),
            spool: Spool::new(settings, label),
            pending: Vec::new(),
            streamed: 0,
        }
    }

    async fn push(&mut self, data: &[u8]) {
        self.spool.push(&self.decoder.decode(data)).await;
        let stream_room = STREAM_CAP.saturating_sub(self.streamed + self.pending.len());
        self.pending
            .extend_from_slice(&data[..data.len().min(stream_room)]);
    }

    /// What to stream now: all that is pending at the end (`last`), else up to the last whole
    /// character (the rest waits for the bytes that complete it).
    fn take_pending(&mut self, last: bool) -> Vec<u8> {
        let ready = take_whole_chars(&mut self.pending, last);
        self.streamed += ready.len();
        ready
    }

    /// The whole stream, once it ended.
    async fn finish(mut self) -> Captured {
        let rest = self.decoder.finish();
        self.spool.push(&rest).await;
        self.spool.finish().await
    }
}

/// How a foreground command ended.
#[derive(Debug)]
pub struct CommandOutcome {
    pub stdout: Captured,
    pub stderr: Captured,
    /// `None` when it was killed for a timeout or a cancel before it could report one.
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: u64,
}

/// Runs `execution` to its end (or the timeout, or a cancel), streaming its output and
/// spooling each stream (files named after `label`), and each of its sandbox's egress
/// `decisions` as an `egress` event (the output before it first, to keep their order).
#[allow(clippy::too_many_arguments)]
pub async fn run_to_end(
    mut execution: Execution,
    spool: &SpoolSettings,
    label: &str,
    stdin: Option<Bytes>,
    timeout: Duration,
    events: &EventSink<'_>,
    cancel: &mut CancelWatch,
    mut decisions: Option<&mut mpsc::Receiver<Decision>>,
) -> CommandOutcome {
    let started = Instant::now();
    if let (Some(mut writer), Some(data)) = (execution.stdin.take(), stdin) {
        // Feed stdin beside the output loop: a program may write before it reads everything.
        tokio::spawn(async move {
            let _ = writer.write_all(&data).await;
            let _ = writer.shutdown().await;
        });
    }
    let mut out = Stream::new(spool.clone(), &format!("{label}-stdout"));
    let mut err = Stream::new(spool.clone(), &format!("{label}-stderr"));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(EVENT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut timed_out = false;
    let mut cancelled = false;
    let mut grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut listening = decisions.is_some();
    loop {
        tokio::select! {
            decision = next_decision(&mut decisions), if listening => match decision {
                Some(decision) => {
                    flush(events, &mut out, RunEventKind::Stdout, false).await;
                    flush(events, &mut err, RunEventKind::Stderr, false).await;
                    publish_decision(events, &decision).await;
                }
                // A later command of the sandbox took its decisions over.
                None => listening = false,
            },
            chunk = execution.output.recv() => match chunk {
                Some(Output::Stdout(b)) => {
                    out.push(&b).await;
                    if out.pending.len() >= EVENT_CHUNK { flush(events, &mut out, RunEventKind::Stdout, false).await; }
                }
                Some(Output::Stderr(b)) => {
                    err.push(&b).await;
                    if err.pending.len() >= EVENT_CHUNK { flush(events, &mut err, RunEventKind::Stderr, false).await; }
                }
                None => break,
            },
            _ = tick.tick() => {
                flush(events, &mut out, RunEventKind::Stdout, false).await;
                flush(events, &mut err, RunEventKind::Stderr, false).await;
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
    flush(events, &mut out, RunEventKind::Stdout, true).await;
    flush(events, &mut err, RunEventKind::Stderr, true).await;
    if let Some(decisions) = decisions.as_mut() {
        while let Ok(decision) = decisions.try_recv() {
            publish_decision(events, &decision).await;
        }
    }
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
        stdout: out.finish().await,
        stderr: err.finish().await,
        exit_code,
        timed_out,
        cancelled,
        duration_ms: toolmesh_kernel::time::elapsed_ms(started),
    }
}

/// The next of `decisions`; never, without them.
async fn next_decision(decisions: &mut Option<&mut mpsc::Receiver<Decision>>) -> Option<Decision> {
    match decisions {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn flush(events: &EventSink<'_>, stream: &mut Stream, kind: RunEventKind, last: bool) {
    let ready = stream.take_pending(last);
    let mut rest = &ready[..];
    while !rest.is_empty() {
        // Chunks end on whole characters too (a character is at most 4 bytes, a chunk 16 KiB).
        let mut cut = rest.len().min(EVENT_CHUNK);
        if cut < rest.len() {
            cut = utf8_complete_len(&rest[..cut]).max(1);
        }
        publish_data(events, kind, &rest[..cut]).await;
        rest = &rest[cut..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_cut_short_at_the_end_is_held_back() {
        let euro = "€".as_bytes(); // 3 bytes
        assert_eq!(utf8_complete_len(b"abc"), 3);
        assert_eq!(utf8_complete_len(b""), 0);
        assert_eq!(utf8_complete_len(&[b'a', euro[0]]), 1);
        assert_eq!(utf8_complete_len(&[b'a', euro[0], euro[1]]), 1);
        assert_eq!(utf8_complete_len(&[b'a', euro[0], euro[1], euro[2]]), 4);
        let emoji = "🦀".as_bytes(); // 4 bytes
        assert_eq!(utf8_complete_len(&emoji[..3]), 0);
        assert_eq!(utf8_complete_len(emoji), 4);
        // Bytes no continuation can mend are not held back.
        assert_eq!(utf8_complete_len(&[b'a', 0x80, 0x80, 0x80, 0x80]), 5);
        assert_eq!(utf8_complete_len(&[b'a', 0xFF]), 2);
    }

    #[tokio::test]
    async fn streamed_pieces_keep_characters_whole() {
        let text = "naïve €uro 🦀 ".repeat(50);
        let bytes = text.as_bytes();
        let dir = tempfile::tempdir().unwrap();
        let settings = SpoolSettings {
            dir: dir.path().to_owned(),
            preview_chars: 100_000,
            max_bytes: 1 << 20,
            quotas: Vec::new(),
            handover: None,
        };
        let mut stream = Stream::new(settings, "t");
        let mut streamed = Vec::new();
        // Pipe-sized pieces that cut characters anywhere.
        for piece in bytes.chunks(7) {
            stream.push(piece).await;
            let ready = stream.take_pending(false);
            assert!(
                std::str::from_utf8(&ready).is_ok(),
                "a piece ends inside a character"
            );
            streamed.extend_from_slice(&ready);
        }
        streamed.extend_from_slice(&stream.take_pending(true));
        assert_eq!(streamed, bytes);
        assert_eq!(stream.finish().await.preview, text);
    }
}
