//! One stream of a command's output as text: decoded from UTF-8 as it arrives, counted whole,
//! its first characters kept in memory for the reply, and all of it spooled to a file on the
//! worker once it is longer than that (up to its caps), so a worker's memory stays flat
//! whatever a command writes. The file is written in batches on tokio's blocking pool, never
//! on the async threads: a stream holds at most one batch ([`WRITE_BATCH`]) besides its
//! preview, and its writer waits for the disk (so does the command, through its pipe).
//!
//! A background task's spool can also hand what it has spooled to the session's workspace
//! ([`Handover`]) when a shared cap fills up, and keep spooling into a fresh file: the text
//! of one read may so be several files, the earlier ones already in the workspace.
//!
//! Caps: a spool file keeps at most `TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES` of text; past it the
//! stream is counted, not kept. A background task's spools also take from two [`Quota`]s, the
//! session's (`TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES`) and the worker's
//! (`TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES`); a spool file gives its bytes back when it goes.
//! Foreground commands are persisted at once and take from no quota.
//!
//! Hand-over: once a quota is more than half taken, a task's stream whose file holds 1/32 of
//! it (or a quarter of the stream cap, whichever is less) hands the file to a spawned put into
//! `.toolmesh/outputs/<label>-part-<n>.txt`, then spools on in a fresh file. Parts go one at a
//! time per task and [`MAX_HANDOVERS`] at a time per worker, at most [`MAX_PARTS`] per stream
//! per read. Text that finds no room is dropped until the next read, which counts it in
//! `_original_chars`, `dropped_bytes` and `dropped_by`; a part the workspace refuses is dropped
//! with what followed it, so the kept text stays one piece from the start.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use toolmesh_kernel::ids::{Account, SessionId};
use toolmesh_kernel::sync::{WorkspaceSync, OUTPUTS_DIR};
use toolmesh_kernel::ToolError;

use crate::exec::utf8_complete_len;

/// Text kept in memory before it is written to the spool file in one go.
pub const WRITE_BATCH: usize = 64 * 1024;
/// Files one stream's text of one read is handed to the workspace in, at most; past them
/// the shared caps drop text as they do without a workspace.
pub const MAX_PARTS: usize = 32;
/// Parts on their way to workspaces at once, per worker: each holds a put's part in memory
/// on a blocking thread, and concurrent ones multiply the allocator arenas the worker keeps
/// (four at once grew a worker by over 100 MiB where one stays flat).
pub const MAX_HANDOVERS: usize = 1;
/// A running stream hands its file over once it holds at least this share of the pressed
/// cap (1/`PART_SHARE`), so that the 16 tasks a session runs at once all fit in half of it.
const PART_SHARE: u64 = 32;

/// Where a session's spool files go: a sibling of its workspace directory on the worker,
/// never shown to the sandbox (and removed with the sandbox's directory).
pub fn spool_dir_of(workspace_dir: &Path) -> PathBuf {
    workspace_dir.with_file_name("outputs")
}

/// The cap that cut a stream's kept text first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// One stream's cap (`TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES`).
    Stream,
    /// Unread background-task output one session keeps (`TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES`).
    Session,
    /// Unread background-task output one worker keeps (`TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES`).
    Worker,
    /// The workspace did not take a part handed to it (its text and what followed are lost).
    Workspace,
}

impl Cap {
    pub fn as_str(self) -> &'static str {
        match self {
            Cap::Stream => "stream",
            Cap::Session => "session",
            Cap::Worker => "worker",
            Cap::Workspace => "workspace",
        }
    }
}

/// Bytes of spooled text several streams share (a session's tasks, a worker's tasks). A
/// stream takes from it what it keeps and gives it back when its spool file goes.
#[derive(Debug)]
pub struct Quota {
    cap: Cap,
    limit: u64,
    used: AtomicU64,
    /// Told whenever a take leaves more than half of it taken.
    pressed: tokio::sync::Notify,
}

impl Quota {
    pub fn new(cap: Cap, limit: u64) -> Arc<Self> {
        Arc::new(Self {
            cap,
            limit,
            used: AtomicU64::new(0),
            pressed: tokio::sync::Notify::new(),
        })
    }

    /// Resolves at the next take that leaves more than half of it taken.
    pub fn pressed(&self) -> tokio::sync::futures::Notified<'_> {
        self.pressed.notified()
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn is_full(&self) -> bool {
        self.used() >= self.limit
    }

    /// More than half of it is taken: spools that can hand text to the workspace do.
    fn is_pressed(&self) -> bool {
        self.used() > self.limit / 2
    }

    /// Takes up to `want` bytes; how many it got.
    fn take(&self, want: u64) -> u64 {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let got = want.min(self.limit.saturating_sub(used));
            if got == 0 {
                return 0;
            }
            match self.used.compare_exchange_weak(
                used,
                used + got,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if used + got > self.limit / 2 {
                        self.pressed.notify_waiters();
                    }
                    return got;
                }
                Err(now) => used = now,
            }
        }
    }

    fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Takes `want` bytes from every quota of `quotas`: as many as all of them have, and the cap
/// of the first one short.
fn take_all(quotas: &[Arc<Quota>], want: u64) -> (u64, Option<Cap>) {
    let mut got = want;
    let mut short = None;
    for (i, quota) in quotas.iter().enumerate() {
        let this = quota.take(got);
        if this < got {
            short = short.or(Some(quota.cap));
            for earlier in &quotas[..i] {
                earlier.give(got - this);
            }
            got = this;
        }
    }
    (got, short)
}

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

/// Puts the first `bytes` of a spool file at a workspace-relative path.
pub type PutPart = Arc<
    dyn Fn(String, u64, Arc<std::fs::File>) -> BoxFuture<'static, Result<(), ToolError>>
        + Send
        + Sync,
>;

/// Hands a task's spooled text to its session's workspace, one part at a time per task (the
/// settings of both its streams share one `Handover`). Each part is a file
/// `.toolmesh/outputs/<label>-part-<n>.txt`, `n` counting the task's parts.
#[derive(Clone)]
pub struct Handover {
    put: PutPart,
    slot: Arc<Semaphore>,
    next: Arc<AtomicU64>,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("busy", &(self.slot.available_permits() == 0))
            .finish_non_exhaustive()
    }
}

impl Handover {
    pub fn new(put: PutPart) -> Self {
        Self {
            put,
            slot: Arc::new(Semaphore::new(1)),
            next: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The worker's [`MAX_HANDOVERS`] slots, shared by every task's `Handover`.
    pub fn worker_slots() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(MAX_HANDOVERS))
    }

    /// Parts go into the session's workspace through `put_from` (as over-budget outputs do),
    /// at most as many at once on the worker as `worker` has permits.
    pub fn to_workspace(
        sync: WorkspaceSync,
        account: Account,
        session: SessionId,
        worker: Arc<Semaphore>,
    ) -> Self {
        Self::new(Arc::new(move |path, bytes, file| {
            let (sync, account, session) = (sync.clone(), account.clone(), session.clone());
            let worker = worker.clone();
            async move {
                let _one_of_the_worker_s = worker.acquire_owned().await;
                sync.put_from(&account, &session, &path, bytes, file).await
            }
            .boxed()
        }))
    }

    /// Waits until no part of this task is on its way.
    pub async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slot.clone().acquire_owned().await.ok()
    }
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

/// A part of a stream's text in the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Workspace-relative.
    pub path: String,
    pub bytes: u64,
}

/// A part on its way to the workspace: its spool file stays (and counts against the caps)
/// until the workspace has it all.
#[derive(Debug)]
struct InFlight {
    /// Where it starts in the stream's text of this read.
    base: u64,
    bytes: u64,
    path: String,
    file: Arc<std::fs::File>,
    done: tokio::task::JoinHandle<Result<(), ToolError>>,
}

/// Turns pipe-sized pieces of bytes into text, holding back a character cut short (at most
/// three bytes) for the piece that completes it. Invalid bytes become U+FFFD, exactly as one
/// `String::from_utf8_lossy` of the whole stream would make them.
#[derive(Debug, Default)]
pub struct Utf8Decoder {
    carry: Vec<u8>,
}

impl Utf8Decoder {
    /// The whole characters `data` completes.
    pub fn decode(&mut self, data: &[u8]) -> String {
        if self.carry.is_empty() {
            let cut = utf8_complete_len(data);
            self.carry.extend_from_slice(&data[cut..]);
            return String::from_utf8_lossy(&data[..cut]).into_owned();
        }
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(data);
        let cut = utf8_complete_len(&bytes);
        self.carry.extend_from_slice(&bytes[cut..]);
        bytes.truncate(cut);
        String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// What is held back, once no more bytes will come.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.carry);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

/// A spool file on the worker; removed (off the async threads) when dropped, giving back the
/// bytes it took from its quotas.
#[derive(Debug)]
pub struct SpoolFile {
    pub path: PathBuf,
    /// Bytes of text it keeps (once the spool is finished, all of them are in the file).
    pub bytes: u64,
    /// The stream was longer than a cap: the file holds its first `bytes` only.
    pub capped: bool,
    file: Arc<std::fs::File>,
    quotas: Vec<Arc<Quota>>,
}

impl SpoolFile {
    /// The open file, to read it at offsets (`FileExt::read_exact_at`), off the async threads.
    pub fn handle(&self) -> Arc<std::fs::File> {
        self.file.clone()
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        for quota in &self.quotas {
            quota.give(self.bytes);
        }
        let path = std::mem::take(&mut self.path);
        let remove = move || {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(error = %e, path = %path.display(), "cannot remove a spool file");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
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
    in_flight: Option<InFlight>,
    /// Why the workspace did not take a part.
    persist_error: Option<ToolError>,
}

/// A finished stream, for the reply.
#[derive(Debug)]
pub struct Captured {
    /// The first `preview_chars` characters (all of the text when not `truncated`).
    pub preview: String,
    /// Every character of the stream, kept or not.
    pub chars: u64,
    /// Bytes of text of the stream, kept or not.
    pub bytes: u64,
    /// Longer than the preview.
    pub truncated: bool,
    /// The whole text (up to the caps) when `truncated` and it could be spooled; after
    /// `parts`, the text that follows them.
    pub file: Option<SpoolFile>,
    /// The text's first parts, already in the workspace, in order (a task's, handed over
    /// when a shared cap was pressed).
    pub parts: Vec<Part>,
    /// The cap that stopped the kept text, if one did.
    pub cap: Option<Cap>,
    /// Why the workspace did not take a part (`cap` is then [`Cap::Workspace`]).
    pub persist_error: Option<ToolError>,
}

impl Captured {
    /// Bytes of text neither in the preview, nor in the parts, nor in the file.
    pub fn dropped_bytes(&self) -> u64 {
        let handed: u64 = self.parts.iter().map(|p| p.bytes).sum();
        let kept = match &self.file {
            Some(file) => handed + file.bytes,
            None if !self.parts.is_empty() => handed,
            None if self.truncated => self.preview.len() as u64,
            None => self.bytes,
        };
        self.bytes.saturating_sub(kept)
    }
}

/// `persisted_outputs[<field>]` of a stream whose text is in `parts`, in order: the last
/// one's `path` and `bytes`, and `parts` (every one, the last last) when there are several;
/// `truncated` when text was dropped, with the stream's cap `max_bytes` when that cut it.
pub fn persisted_entry(
    parts: &[Part],
    truncated: bool,
    max_bytes: Option<u64>,
) -> Option<serde_json::Value> {
    let last = parts.last()?;
    let mut entry = serde_json::json!({
        "path": last.path,
        "mime_type": "text/plain",
        "bytes": last.bytes,
    });
    if parts.len() > 1 {
        entry["parts"] = parts
            .iter()
            .map(|p| serde_json::json!({"path": p.path, "bytes": p.bytes}))
            .collect();
    }
    if truncated {
        entry["truncated"] = true.into();
        if let Some(max) = max_bytes {
            entry["max_bytes"] = max.into();
        }
    }
    Some(entry)
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn prefix_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// `text` cut to its first `max` characters.
fn prefix_chars(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// The kept text of a spool from some offset on, taken under the spool's lock and read
/// without it: the part on disk through the files' handles (blocking: call off the async
/// threads), the rest from memory. Offsets count bytes of the stream's text of this read;
/// text already handed to the workspace is not here (see [`Kept::start`]).
#[derive(Debug)]
pub struct Kept {
    /// The part on its way to the workspace, when the text asked for starts in it: where it
    /// starts, its bytes, its spool file.
    part: Option<(u64, u64, Arc<std::fs::File>)>,
    file: Option<Arc<std::fs::File>>,
    /// Where the file starts in the stream's text.
    base: u64,
    /// Bytes of the file on disk when taken.
    written: u64,
    /// The kept text from `tail_at` on that is not on disk.
    tail: String,
    tail_at: u64,
}

impl Kept {
    /// The first offset still here: earlier text is in the workspace only.
    pub fn start(&self) -> u64 {
        self.part.as_ref().map_or(self.base, |(base, _, _)| *base)
    }

    /// Whether a read from `from` touches the disk.
    pub fn on_disk(&self, from: u64) -> bool {
        let in_part = self
            .part
            .as_ref()
            .is_some_and(|(base, bytes, _)| (*base..base + bytes).contains(&from));
        let in_file = self.file.is_some() && (self.base..self.base + self.written).contains(&from);
        in_part || in_file
    }

    /// Up to `max` bytes of the kept text from byte `from` on, ending on a whole character
    /// (empty when `from` is at the end). Blocking when [`Kept::on_disk`].
    pub fn read(&self, from: u64, max: usize) -> std::io::Result<String> {
        let on_disk = |file: &std::fs::File, at: u64, left: u64| {
            let len = usize::try_from(left).unwrap_or(usize::MAX).min(max);
            let mut buffer = vec![0u8; len];
            file.read_exact_at(&mut buffer, at)?;
            // The file holds whole characters; only the cut at `max` can split one.
            buffer.truncate(utf8_complete_len(&buffer));
            Ok(String::from_utf8_lossy(&buffer).into_owned())
        };
        if let Some((base, bytes, file)) = &self.part {
            if (*base..base + bytes).contains(&from) {
                return on_disk(file, from - base, base + bytes - from);
            }
        }
        match &self.file {
            Some(file) if (self.base..self.base + self.written).contains(&from) => {
                on_disk(file, from - self.base, self.base + self.written - from)
            }
            _ => {
                let from = usize::try_from(from.saturating_sub(self.tail_at))
                    .unwrap_or(usize::MAX)
                    .min(self.tail.len());
                Ok(prefix_bytes(&self.tail[from..], max).to_owned())
            }
        }
    }
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
    fn collect(&mut self) {
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
            Some(Err(e)) => ToolError::internal(format!("handing output to the workspace: {e}")),
            None => ToolError::internal("a part handed to the workspace was lost"),
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
                let at = usize::try_from(from)
                    .unwrap_or(usize::MAX)
                    .min(self.head.len());
                let mut at = at;
                while !self.head.is_char_boundary(at) {
                    at -= 1;
                }
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
                let skip = usize::try_from(from.saturating_sub(on_disk))
                    .unwrap_or(usize::MAX)
                    .min(self.pending.len());
                let mut skip = skip;
                while !self.pending.is_char_boundary(skip) {
                    skip -= 1;
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, preview_chars: usize, max_bytes: u64) -> SpoolSettings {
        SpoolSettings {
            dir: dir.to_owned(),
            preview_chars,
            max_bytes,
            quotas: Vec::new(),
            handover: None,
        }
    }

    fn file_text(captured: &Captured) -> String {
        std::fs::read_to_string(&captured.file.as_ref().expect("a spool file").path)
            .expect("spool file")
    }

    #[test]
    fn pieces_decode_as_the_whole_stream_would() {
        // Valid text, cut characters, and bytes that are no UTF-8 at all.
        let mut bytes = "naïve €uro 🦀 ".repeat(40).into_bytes();
        bytes.extend_from_slice(&[0xE2, 0x82, b'a', 0xFF, 0xF0, 0x9F, 0xA6, 0x80, 0x80, 0xC3]);
        let whole = String::from_utf8_lossy(&bytes).into_owned();
        for size in 1..=9 {
            let mut decoder = Utf8Decoder::default();
            let mut text = String::new();
            for piece in bytes.chunks(size) {
                text.push_str(&decoder.decode(piece));
            }
            text.push_str(&decoder.finish());
            assert_eq!(text, whole, "pieces of {size}");
        }
    }

    #[tokio::test]
    async fn short_text_stays_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(settings(dir.path(), 10, 1000), "s");
        spool.push("héllo").await;
        spool.push("wörld").await;
        let captured = spool.finish().await;
        assert_eq!(captured.preview, "héllowörld");
        assert_eq!((captured.chars, captured.truncated), (10, false));
        assert!(captured.file.is_none());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// Waits (briefly) until `path` is gone: a spool file is removed on the blocking pool.
    async fn gone(path: &Path) -> bool {
        for _ in 0..200 {
            if !path.exists() {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn long_text_is_spooled_whole_and_counted_in_characters() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(settings(dir.path(), 4, 1000), "s");
        spool.push("ab").await;
        spool.push("cdé€f").await;
        spool.push("g").await;
        let captured = spool.finish().await;
        assert_eq!(captured.preview, "abcd");
        assert_eq!((captured.chars, captured.truncated), (8, true));
        assert_eq!(file_text(&captured), "abcdé€fg");
        assert_eq!(captured.file.as_ref().unwrap().bytes, 11);
        assert_eq!(captured.dropped_bytes(), 0);
        assert_eq!(captured.cap, None);
        let path = captured.file.as_ref().unwrap().path.clone();
        drop(captured);
        assert!(gone(&path).await, "a spool file goes with its capture");
    }

    #[tokio::test]
    async fn past_the_cap_text_is_counted_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(settings(dir.path(), 2, 5), "s");
        spool.push("abc€€").await; // 3 + 6 bytes; the cap cuts inside the first €
        spool.push("xyz").await;
        let captured = spool.finish().await;
        assert_eq!(captured.chars, 8);
        assert_eq!(file_text(&captured), "abc");
        let file = captured.file.as_ref().unwrap();
        assert!(file.capped);
        assert_eq!(captured.cap, Some(Cap::Stream));
        assert_eq!(captured.dropped_bytes(), 12 - 3);
    }

    #[tokio::test]
    async fn memory_stays_bounded_by_the_preview_whatever_is_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let preview = 1000;
        let mut spool = Spool::new(settings(dir.path(), preview, 64 << 20), "s");
        let mut decoder = Utf8Decoder::default();
        let piece = "€ 16 KiB of output, line after line\n".repeat(450);
        let mut pushed = 0u64;
        while pushed < 50_000_000 {
            spool.push(&decoder.decode(piece.as_bytes())).await;
            pushed += piece.len() as u64;
            assert!(
                spool.memory_bytes() <= 4 * preview + 2 * (WRITE_BATCH + piece.len()),
                "{} bytes in memory",
                spool.memory_bytes()
            );
        }
        let captured = spool.finish().await;
        assert_eq!(captured.bytes, pushed);
        assert_eq!(captured.file.as_ref().unwrap().bytes, pushed);
        assert_eq!(
            std::fs::metadata(&captured.file.as_ref().unwrap().path)
                .unwrap()
                .len(),
            pushed
        );
    }

    #[tokio::test]
    async fn kept_text_reads_back_from_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        for preview in [100, 3] {
            let mut spool = Spool::new(settings(dir.path(), preview, 1000), "s");
            spool.push("line-1\nlïne-2\n").await;
            // Pending (in memory), then written: the same text either way.
            for _ in 0..2 {
                let kept = spool.kept_from(0);
                assert_eq!(kept.read(0, 100).unwrap(), "line-1\nlïne-2\n");
                assert_eq!(kept.read(7, 100).unwrap(), "lïne-2\n");
                // A cut inside a character stops before it.
                assert_eq!(kept.read(7, 2).unwrap(), "l");
                assert_eq!(kept.read(spool.kept_bytes(), 100).unwrap(), "");
                assert_eq!(spool.kept_from(7).read(7, 100).unwrap(), "lïne-2\n");
                spool.settle().await;
            }
        }
        // Part on disk, part pending: a read crosses from one to the other.
        let mut spool = Spool::new(settings(dir.path(), 3, 1000), "s");
        spool.push("on disk\n").await;
        spool.settle().await;
        spool.push("pending\n").await;
        let kept = spool.kept_from(0);
        assert!(kept.on_disk(0) && !kept.on_disk(8));
        assert_eq!(kept.read(0, 100).unwrap(), "on disk\n");
        assert_eq!(kept.read(8, 100).unwrap(), "pending\n");
    }

    #[tokio::test]
    async fn shared_caps_keep_what_they_have_room_for_and_give_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let session = Quota::new(Cap::Session, 10);
        let worker = Quota::new(Cap::Worker, 100);
        let with_quotas = SpoolSettings {
            quotas: vec![session.clone(), worker.clone()],
            ..settings(dir.path(), 2, 1000)
        };
        // The first stream takes 6 of the session's 10 bytes …
        let mut first = Spool::new(with_quotas.clone(), "a");
        first.push("abcdef").await;
        let first = first.finish().await;
        assert_eq!((first.file.as_ref().unwrap().bytes, first.cap), (6, None));
        assert_eq!((session.used(), worker.used()), (6, 6));
        // … the second gets the 4 left, the rest is counted, not kept …
        let mut second = Spool::new(with_quotas.clone(), "b");
        second.push("0123456789").await;
        let second = second.finish().await;
        assert_eq!(second.chars, 10);
        assert_eq!(file_text(&second), "0123");
        assert_eq!(second.cap, Some(Cap::Session));
        assert_eq!(second.dropped_bytes(), 6);
        assert_eq!((session.used(), worker.used()), (10, 10));
        // … a third finds the session full and keeps its preview only …
        let mut third = Spool::new(with_quotas.clone(), "c");
        third.push("xyz").await;
        let third = third.finish().await;
        assert!(third.file.is_none());
        assert_eq!(third.cap, Some(Cap::Session));
        assert_eq!(third.preview, "xy");
        assert_eq!(third.dropped_bytes(), 1);
        // … and what a stream took comes back when its file goes.
        drop((first, second, third));
        assert_eq!((session.used(), worker.used()), (0, 0));
        // The worker's cap binds across sessions the same way.
        let small_worker = Quota::new(Cap::Worker, 5);
        let other = SpoolSettings {
            quotas: vec![Quota::new(Cap::Session, 100), small_worker.clone()],
            ..settings(dir.path(), 2, 1000)
        };
        let mut spool = Spool::new(other, "d");
        spool.push("abcdefgh").await;
        let captured = spool.finish().await;
        assert_eq!(file_text(&captured), "abcde");
        assert_eq!(captured.cap, Some(Cap::Worker));
    }

    /// A workspace in memory: what each put wrote, by path; a put waits for `gate` to open
    /// and fails when `refuse` is set.
    #[derive(Default)]
    struct FakeWorkspace {
        files: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
        gate: Option<Arc<Semaphore>>,
        refuse: bool,
    }

    fn handover_to(workspace: &Arc<FakeWorkspace>) -> Handover {
        let workspace = workspace.clone();
        Handover::new(Arc::new(move |path, bytes, file| {
            let workspace = workspace.clone();
            async move {
                if let Some(gate) = &workspace.gate {
                    drop(gate.acquire().await);
                }
                if workspace.refuse {
                    return Err(ToolError::new(
                        toolmesh_kernel::ErrorCode::LimitExceeded,
                        "the workspace is full",
                    ));
                }
                let mut text = vec![0u8; bytes as usize];
                file.read_exact_at(&mut text, 0).unwrap();
                let text = String::from_utf8(text).unwrap();
                workspace.files.lock().unwrap().insert(path, text);
                Ok(())
            }
            .boxed()
        }))
    }

    /// Lets the spawned puts run until no part of `spool` is on its way.
    async fn landed(spool: &mut Spool) {
        for _ in 0..10_000 {
            spool.collect();
            if spool.in_flight.is_none() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("a part never landed");
    }

    /// The text of a capture: its parts (from the workspace), then its file.
    fn whole_text(captured: &Captured, workspace: &FakeWorkspace) -> String {
        let files = workspace.files.lock().unwrap();
        let mut text: String = captured
            .parts
            .iter()
            .map(|p| files[&p.path].clone())
            .collect();
        if let Some(file) = &captured.file {
            text.push_str(&std::fs::read_to_string(&file.path).unwrap());
        }
        text
    }

    #[tokio::test]
    async fn past_half_a_shared_cap_the_spool_goes_to_the_workspace_and_spooling_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Arc::new(FakeWorkspace::default());
        let session = Quota::new(Cap::Session, 1000);
        let settings = SpoolSettings {
            quotas: vec![session.clone()],
            handover: Some(handover_to(&workspace)),
            ..settings(dir.path(), 2, 1 << 20)
        };
        let mut spool = Spool::new(settings, "task-1-stdout");
        let mut all = String::new();
        for i in 0..500 {
            let line = format!("line {i:04} ünïcode\n");
            spool.push(&line).await;
            all.push_str(&line);
            assert!(session.used() <= 1000, "{} bytes held", session.used());
            landed(&mut spool).await;
        }
        let captured = spool.finish().await;
        assert_eq!(captured.bytes, all.len() as u64);
        assert!(captured.parts.len() > 5, "{} parts", captured.parts.len());
        assert_eq!(whole_text(&captured, &workspace), all, "nothing is lost");
        assert_eq!((captured.dropped_bytes(), captured.cap), (0, None));
        assert!(captured.parts[0]
            .path
            .starts_with(".toolmesh/outputs/task-1-stdout-part-"));
        // The parts' bytes went back to the cap; the last file's go with it.
        assert_eq!(session.used(), captured.file.as_ref().unwrap().bytes);
        drop(captured);
        assert_eq!(session.used(), 0);
    }

    #[tokio::test]
    async fn while_a_part_is_on_its_way_the_cap_holds_and_the_excess_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let workspace = Arc::new(FakeWorkspace {
            gate: Some(gate.clone()),
            ..FakeWorkspace::default()
        });
        let session = Quota::new(Cap::Session, 100);
        let settings = SpoolSettings {
            quotas: vec![session.clone()],
            handover: Some(handover_to(&workspace)),
            ..settings(dir.path(), 2, 1 << 20)
        };
        let mut spool = Spool::new(settings, "s");
        spool.push(&"a".repeat(60)).await; // past half: handed over, held until it lands
        assert!(spool.in_flight.is_some());
        spool.push(&"b".repeat(30)).await; // room for 30 more
        spool.push(&"c".repeat(30)).await; // room for 10: 20 dropped
        assert_eq!(session.used(), 100, "the cap holds");
        spool.push(&"d".repeat(5)).await; // after a drop nothing more is kept until the read
        gate.add_permits(1);
        let captured = spool.finish().await;
        assert_eq!(captured.chars, 125);
        assert_eq!(captured.parts.len(), 1);
        let text = whole_text(&captured, &workspace);
        assert_eq!(
            text,
            format!("{}{}{}", "a".repeat(60), "b".repeat(30), "c".repeat(10))
        );
        assert_eq!(
            (captured.dropped_bytes(), captured.cap),
            (25, Some(Cap::Session))
        );
    }

    #[tokio::test]
    async fn a_part_the_workspace_refuses_is_dropped_with_what_followed_it() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Arc::new(FakeWorkspace {
            refuse: true,
            ..FakeWorkspace::default()
        });
        let session = Quota::new(Cap::Session, 100);
        let settings = SpoolSettings {
            quotas: vec![session.clone()],
            handover: Some(handover_to(&workspace)),
            ..settings(dir.path(), 2, 1 << 20)
        };
        let mut spool = Spool::new(settings, "s");
        spool.push(&"a".repeat(60)).await;
        landed(&mut spool).await;
        spool.push(&"b".repeat(30)).await;
        let captured = spool.finish().await;
        assert_eq!(captured.chars, 90);
        assert!(captured.parts.is_empty() && captured.file.is_none());
        assert_eq!(captured.preview, "aa");
        assert_eq!(
            (captured.dropped_bytes(), captured.cap),
            (88, Some(Cap::Workspace))
        );
        let error = captured.persist_error.as_ref().expect("why");
        assert_eq!(error.code, toolmesh_kernel::ErrorCode::LimitExceeded);
        assert_eq!(session.used(), 0, "nothing is held for text that is gone");
    }

    #[tokio::test]
    async fn kept_text_reads_across_a_part_on_its_way() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let workspace = Arc::new(FakeWorkspace {
            gate: Some(gate.clone()),
            ..FakeWorkspace::default()
        });
        let settings = SpoolSettings {
            quotas: vec![Quota::new(Cap::Session, 100)],
            handover: Some(handover_to(&workspace)),
            ..settings(dir.path(), 2, 1 << 20)
        };
        let mut spool = Spool::new(settings, "s");
        spool.push(&format!("{}\n", "a".repeat(59))).await;
        spool.push("next\n").await;
        let kept = spool.kept_from(0);
        assert_eq!(kept.start(), 0);
        assert!(kept.on_disk(0));
        assert_eq!(kept.read(0, 100).unwrap(), format!("{}\n", "a".repeat(59)));
        assert_eq!(kept.read(60, 100).unwrap(), "next\n");
        gate.add_permits(1);
        landed(&mut spool).await;
        // Once it landed, what it held is in the workspace only.
        assert_eq!(spool.kept_from(0).start(), 60);
    }
}
