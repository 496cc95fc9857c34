//! One stream's [`Spool`]: the preview in memory, the rest written to a file in batches, and a
//! background task's file handed to the workspace when a shared cap is pressed.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use toolmesh_kernel::sync::OUTPUTS_DIR;
use toolmesh_kernel::ToolError;

use crate::output::captured::{Captured, SpoolFile};
use crate::output::handover::{Handover, Part};
use crate::output::kept::Kept;
use crate::output::quota::{take_all, Cap, Quota};
use crate::output::text::{prefix_bytes, prefix_chars};

/// Why a part handed to the workspace has no answer: the task sending it failed, or it is
/// gone. Not a refusal of the workspace (that one is its own `ToolError`), so `internal`.
#[derive(Debug, thiserror::Error)]
enum HandoverError {
    #[error("handing output to the workspace: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("a part handed to the workspace was lost")]
    Lost,
}

/// `internal` with the sentence of the error; the log line of `landed` shows it.
impl From<HandoverError> for ToolError {
    fn from(e: HandoverError) -> Self {
        ToolError::internal(e.to_string())
    }
}

/// Text kept in memory before it is written to the spool file in one go.
pub const WRITE_BATCH: usize = 64 * 1024;
/// Files one stream's text of one read is handed to the workspace in, at most; past them
/// the shared caps drop text as they do without a workspace.
pub const MAX_PARTS: usize = 32;

/// A running stream hands its file over once it holds at least this share of the pressed
/// cap (1/`PART_SHARE`), so that the 16 tasks a session runs at once all fit in half of it.
const PART_SHARE: u64 = 32;

/// Where spool files go and how much one keeps.
#[derive(Debug, Clone)]
pub struct SpoolSettings {
    /// A directory of the worker (created when the first spool file is).
    pub dir: PathBuf,
    /// Characters kept in memory: the reply's preview (`TOOLMESH_RESULT_BUDGET_CHARS`).
    pub preview_chars: usize,
    /// Bytes of text one spool file keeps at most (`TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES`); past
    /// it the text is counted, not kept.
    pub max_bytes: u64,
    /// Shared caps on top of `max_bytes` (a background task's: its session's and its
    /// worker's); past one of them the text is counted, not kept.
    pub quotas: Vec<Arc<Quota>>,
    /// Where spooled text goes when a shared cap is pressed (a background task's: its
    /// session's workspace); without one, text past a shared cap is dropped.
    pub handover: Option<Handover>,
}

impl SpoolSettings {
    /// Resolves when one of the shared caps is next pressed (never without any).
    pub async fn pressed(&self) {
        if self.quotas.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(self.quotas.iter().map(|q| Box::pin(q.pressed()))).await;
    }

    /// Whether any shared cap is more than half taken.
    pub fn is_pressed(&self) -> bool {
        self.quotas.iter().any(|q| q.is_pressed())
    }
}

/// A part on its way to the workspace: its spool file stays (and counts against the caps)
/// until the workspace has it all.
#[derive(Debug)]
pub(super) struct InFlight {
    /// Where it starts in the stream's text of this read.
    base: u64,
    bytes: u64,
    path: String,
    file: Arc<std::fs::File>,
    done: tokio::task::JoinHandle<Result<(), ToolError>>,
}

/// One stream's text: counted whole, the first `preview_chars` characters in memory, all of it
/// (up to its caps) in a spool file once it is longer than the preview.
#[derive(Debug)]
pub struct Spool {
    settings: SpoolSettings,
    label: String,
    head: String,
    head_chars: usize,
    file: Option<SpoolFile>,
    /// Kept text not written yet: the file's bytes from `written` on.
    pending: String,
    /// Bytes of the file on disk.
    written: u64,
    /// Characters and bytes of text pushed, kept or not.
    chars: u64,
    bytes: u64,
    /// Text could not be spooled (the reason was logged): the file is incomplete.
    failed: bool,
    /// The cap that stopped the kept text, if one did.
    cap: Option<Cap>,
    /// Bytes of this read's text handed to the workspace before the file's: the file starts
    /// there in the stream.
    base: u64,
    /// Parts the workspace has, in order.
    parts: Vec<Part>,
    pub(super) in_flight: Option<InFlight>,
    /// Why the workspace did not take a part.
    persist_error: Option<ToolError>,
}

impl Spool {
    /// An empty spool; its file (if it needs one) is named after `label`.
    pub fn new(settings: SpoolSettings, label: &str) -> Self {
        Self {
            settings,
            label: label.to_owned(),
            head: String::new(),
            head_chars: 0,
            file: None,
            pending: String::new(),
            written: 0,
            chars: 0,
            bytes: 0,
            failed: false,
            cap: None,
            base: 0,
            parts: Vec::new(),
            in_flight: None,
            persist_error: None,
        }
    }

    /// A fresh spool with the same settings, for the text that comes next.
    pub fn fresh(&self) -> Self {
        Self::new(self.settings.clone(), &self.label)
    }

    /// Bytes of text kept so far (in the head, or in the parts and the file once there is
    /// one): where the kept text ends.
    pub fn kept_bytes(&self) -> u64 {
        match &self.file {
            Some(file) => self.base + file.bytes,
            None if self.base > 0 => self.base,
            None => self.head.len() as u64,
        }
    }

    /// Bytes this spool holds in memory: bounded by the preview and one write batch,
    /// whatever was pushed.
    pub fn memory_bytes(&self) -> usize {
        self.head.capacity() + self.pending.capacity()
    }

    pub async fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let n = text.chars().count();
        self.chars += n as u64;
        self.bytes += text.len() as u64;
        let room = self.settings.preview_chars - self.head_chars;
        if self.file.is_none() && !self.failed && self.cap.is_none() {
            if n <= room {
                self.head.push_str(text);
                self.head_chars += n;
                return;
            }
            // Longer than the preview: from now on the whole text goes to a file, unless a
            // shared cap has no room left at all.
            if let Some(full) = self.settings.quotas.iter().find(|q| q.is_full()) {
                self.cap = Some(full.cap);
            } else if let Err(e) = self.open().await {
                tracing::warn!(error = %e, dir = %self.settings.dir.display(), "cannot spool a command's output; only its preview is kept");
                self.failed = true;
            } else {
                let head = std::mem::take(&mut self.head);
                self.keep(&head);
                self.head = head;
            }
        }
        if room > 0 {
            self.head.push_str(prefix_chars(text, room));
            self.head_chars = self.settings.preview_chars;
        }
        self.keep(text);
        if self.pending.len() >= WRITE_BATCH {
            self.write().await;
        }
        if self.wants_hand_over(false) {
            let permit = self
                .settings
                .handover
                .as_ref()
                .and_then(|h| h.slot.clone().try_acquire_owned().ok());
            if let Some(permit) = permit {
                self.hand_over(permit).await;
            }
        }
    }

    /// Whether any text is spooled that a hand-over could take.
    pub fn holds_spooled(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.bytes > 0) || !self.pending.is_empty()
    }

    /// Whether the file should go to the workspace now: a shared cap is more than half
    /// taken, no part of this stream is on its way, and the file holds a fair share of the
    /// pressed cap (any text at all once the task has `ended`).
    pub fn wants_hand_over(&mut self, ended: bool) -> bool {
        self.collect();
        let Some(file) = &self.file else {
            return false;
        };
        if self.settings.handover.is_none()
            || self.failed
            || self.in_flight.is_some()
            || self.parts.len() >= MAX_PARTS
            || file.bytes == 0
        {
            return false;
        }
        let share = self
            .settings
            .quotas
            .iter()
            .filter(|q| q.is_pressed())
            .map(|q| (q.limit / PART_SHARE).min(self.settings.max_bytes / 4))
            .min();
        match share {
            None => false,
            Some(_) if ended => true,
            Some(share) => file.bytes >= share.max(1),
        }
    }

    /// Hands the file to the workspace (with the task's one `permit` to do so) and goes on
    /// in a fresh file. The part keeps its bytes of the caps until the workspace has it.
    pub async fn hand_over(&mut self, permit: OwnedSemaphorePermit) {
        let Some(handover) = self.settings.handover.clone() else {
            return;
        };
        self.write().await; // the file on disk whole
        if self.failed {
            return;
        }
        let Some(file) = self.file.take() else {
            return;
        };
        let n = handover.next.fetch_add(1, Ordering::Relaxed);
        let path = format!("{OUTPUTS_DIR}/{}-part-{n}.txt", self.label);
        let (bytes, handle) = (file.bytes, file.handle());
        let kept = handle.clone();
        let capped = file.capped;
        let put = handover.put.clone();
        let target = path.clone();
        let done = tokio::spawn(async move {
            let put = put(target, bytes, handle).await;
            drop((file, permit)); // its bytes go back to the caps, its spool file goes
            put
        });
        self.in_flight = Some(InFlight {
            base: self.base,
            bytes,
            path,
            file: kept,
            done,
        });
        self.base += bytes;
        self.written = 0;
        if let Err(e) = self.open().await {
            tracing::warn!(error = %e, dir = %self.settings.dir.display(), "cannot spool a task's output past a part handed to the workspace");
            self.failed = true;
        } else if capped {
            if let Some(file) = self.file.as_mut() {
                file.capped = true; // the stream's cap still holds
            }
        }
    }

    async fn open(&mut self) -> std::io::Result<()> {
        let dir = self.settings.dir.clone();
        let path = dir.join(format!(
            "{}-{}.txt",
            self.label,
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let opened = path.clone();
        let file = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)?;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&opened)
        })
        .await
        .map_err(std::io::Error::other)??;
        self.file = Some(SpoolFile {
            path,
            bytes: 0,
            capped: false,
            file: Arc::new(file),
            quotas: self.settings.quotas.clone(),
        });
        Ok(())
    }

    /// Records the part on its way if the workspace has answered (without waiting).
    pub(super) fn collect(&mut self) {
        if self
            .in_flight
            .as_ref()
            .is_some_and(|f| f.done.is_finished())
        {
            if let Some(part) = self.in_flight.take() {
                let InFlight {
                    path, bytes, done, ..
                } = part;
                self.landed(path, bytes, done.now_or_never());
            }
        }
    }

    /// Waits for the part on its way, if one is, and records it.
    async fn land(&mut self) {
        if let Some(part) = self.in_flight.take() {
            let done = part.done.await;
            self.landed(part.path, part.bytes, Some(done));
        }
    }

    fn landed(
        &mut self,
        path: String,
        bytes: u64,
        done: Option<Result<Result<(), ToolError>, tokio::task::JoinError>>,
    ) {
        let error = match done {
            Some(Ok(Ok(()))) => {
                self.parts.push(Part { path, bytes });
                return;
            }
            Some(Ok(Err(e))) => e,
            Some(Err(e)) => HandoverError::Task(e).into(),
            None => HandoverError::Lost.into(),
        };
        tracing::warn!(error = %error, path = %path, "the workspace did not take a task's output; it is dropped");
        // The kept text stays one piece from the start: what followed the lost part goes too.
        self.file = None; // its bytes go back to the caps
        self.pending = String::new();
        self.failed = true;
        self.cap = Some(Cap::Workspace);
        self.persist_error = Some(error);
    }

    /// Keeps `text` for the file, up to the caps: the stream's own and the shared ones.
    fn keep(&mut self, text: &str) {
        let max = self.settings.max_bytes.saturating_sub(self.base);
        let Some(spool) = self.file.as_mut() else {
            return;
        };
        if spool.capped || self.failed {
            return;
        }
        let room = usize::try_from(max.saturating_sub(spool.bytes)).unwrap_or(usize::MAX);
        let mut part = prefix_bytes(text, room);
        let mut cap = (part.len() < text.len()).then_some(Cap::Stream);
        let (got, short) = take_all(&self.settings.quotas, part.len() as u64);
        if got < part.len() as u64 {
            let cut = prefix_bytes(part, got as usize);
            for quota in &self.settings.quotas {
                quota.give(got - cut.len() as u64);
            }
            part = cut;
            cap = short;
        }
        self.pending.push_str(part);
        spool.bytes += part.len() as u64;
        if let Some(cap) = cap {
            spool.capped = true;
            self.cap = Some(cap);
        }
    }

    /// Writes the pending text to the file, on the blocking pool.
    async fn write(&mut self) {
        let Some(spool) = self.file.as_mut() else {
            return;
        };
        if self.pending.is_empty() || self.failed {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        let file = spool.file.clone();
        let at = self.written;
        let written = tokio::task::spawn_blocking(move || {
            file.write_all_at(batch.as_bytes(), at).map(|()| batch)
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        match written {
            Ok(mut batch) => {
                self.written += batch.len() as u64;
                batch.clear();
                self.pending = batch; // its capacity, for the next batch
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %spool.path.display(), "cannot spool a command's output; the file stops here");
                for quota in &spool.quotas {
                    quota.give(spool.bytes - self.written);
                }
                spool.bytes = self.written;
                self.failed = true;
            }
        }
    }

    /// Writes what is pending and lets go of the write buffer (a task that ended keeps only
    /// its preview in memory).
    pub async fn settle(&mut self) {
        self.write().await;
        self.pending = String::new();
    }

    /// The kept text from byte `from` on, to read without holding the spool.
    pub fn kept_from(&self, from: u64) -> Kept {
        let part = self
            .in_flight
            .as_ref()
            .filter(|p| from < p.base + p.bytes)
            .map(|p| (p.base, p.bytes, p.file.clone()));
        match &self.file {
            None if self.base > 0 => Kept {
                part,
                file: None,
                base: self.base,
                written: 0,
                tail: String::new(),
                tail_at: self.base,
            },
            None => {
                // From the character boundary at or before `from`.
                let at =
                    prefix_bytes(&self.head, usize::try_from(from).unwrap_or(usize::MAX)).len();
                Kept {
                    part: None,
                    file: None,
                    base: 0,
                    written: 0,
                    tail: self.head[at..].to_owned(),
                    tail_at: at as u64,
                }
            }
            Some(spool) => {
                let on_disk = self.base + self.written;
                let skip = usize::try_from(from.saturating_sub(on_disk)).unwrap_or(usize::MAX);
                let skip = prefix_bytes(&self.pending, skip).len();
                Kept {
                    part,
                    file: Some(spool.file.clone()),
                    base: self.base,
                    written: self.written,
                    tail: self.pending[skip..].to_owned(),
                    tail_at: on_disk + skip as u64,
                }
            }
        }
    }

    /// The stream's text of this read, once the part on its way (if any) has landed.
    pub async fn finish(mut self) -> Captured {
        self.settle().await;
        self.land().await;
        let truncated = self.chars > self.settings.preview_chars as u64;
        let file = self.file.take();
        Captured {
            preview: std::mem::take(&mut self.head),
            chars: self.chars,
            bytes: self.bytes,
            truncated,
            file: if truncated && !self.failed {
                file
            } else {
                None
            },
            parts: std::mem::take(&mut self.parts),
            cap: self.cap,
            persist_error: self.persist_error.take(),
        }
    }
}
