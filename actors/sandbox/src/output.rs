//! One stream of a command's output as text: decoded from UTF-8 as it arrives, counted whole,
//! its first characters kept in memory for the reply, and all of it spooled to a file on the
//! worker once it is longer than that (up to its caps), so a worker's memory stays flat
//! whatever a command writes. The file is written in batches on tokio's blocking pool, never
//! on the async threads: a stream holds at most one batch ([`WRITE_BATCH`]) besides its
//! preview, and its writer waits for the disk (so does the command, through its pipe).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::exec::utf8_complete_len;

/// Text kept in memory before it is written to the spool file in one go.
pub const WRITE_BATCH: usize = 64 * 1024;

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
}

impl Cap {
    pub fn as_str(self) -> &'static str {
        match self {
            Cap::Stream => "stream",
            Cap::Session => "session",
            Cap::Worker => "worker",
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
}

impl Quota {
    pub fn new(cap: Cap, limit: u64) -> Arc<Self> {
        Arc::new(Self {
            cap,
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn is_full(&self) -> bool {
        self.used() >= self.limit
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
                Ok(_) => return got,
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
    /// The whole text (up to the caps) when `truncated` and it could be spooled.
    pub file: Option<SpoolFile>,
    /// The cap that stopped the kept text, if one did.
    pub cap: Option<Cap>,
}

impl Captured {
    /// Bytes of text neither in the preview nor in the file.
    pub fn dropped_bytes(&self) -> u64 {
        let kept = match &self.file {
            Some(file) => file.bytes,
            None if self.truncated => self.preview.len() as u64,
            None => self.bytes,
        };
        self.bytes - kept
    }
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
/// without it: the part on disk through the file's handle (blocking: call off the async
/// threads), the rest from memory.
#[derive(Debug)]
pub struct Kept {
    file: Option<Arc<std::fs::File>>,
    /// Bytes of the file on disk when taken.
    written: u64,
    /// The kept text from `tail_at` on that is not on disk.
    tail: String,
    tail_at: u64,
}

impl Kept {
    /// Whether a read from `from` touches the disk.
    pub fn on_disk(&self, from: u64) -> bool {
        self.file.is_some() && from < self.written
    }

    /// Up to `max` bytes of the kept text from byte `from` on, ending on a whole character
    /// (empty when `from` is at the end). Blocking when [`Kept::on_disk`].
    pub fn read(&self, from: u64, max: usize) -> std::io::Result<String> {
        match &self.file {
            Some(file) if from < self.written => {
                let len = usize::try_from(self.written - from)
                    .unwrap_or(usize::MAX)
                    .min(max);
                let mut buffer = vec![0u8; len];
                file.read_exact_at(&mut buffer, from)?;
                // The file holds whole characters; only the cut at `max` can split one.
                buffer.truncate(utf8_complete_len(&buffer));
                Ok(String::from_utf8_lossy(&buffer).into_owned())
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
        }
    }

    /// A fresh spool with the same settings, for the text that comes next.
    pub fn fresh(&self) -> Self {
        Self::new(self.settings.clone(), &self.label)
    }

    /// Bytes of text kept so far (in the head, or in the file once there is one).
    pub fn kept_bytes(&self) -> u64 {
        match &self.file {
            Some(file) => file.bytes,
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

    /// Keeps `text` for the file, up to the caps: the stream's own and the shared ones.
    fn keep(&mut self, text: &str) {
        let max = self.settings.max_bytes;
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
        match &self.file {
            None => {
                let at = usize::try_from(from)
                    .unwrap_or(usize::MAX)
                    .min(self.head.len());
                let mut at = at;
                while !self.head.is_char_boundary(at) {
                    at -= 1;
                }
                Kept {
                    file: None,
                    written: 0,
                    tail: self.head[at..].to_owned(),
                    tail_at: at as u64,
                }
            }
            Some(spool) => {
                let skip = usize::try_from(from.saturating_sub(self.written))
                    .unwrap_or(usize::MAX)
                    .min(self.pending.len());
                let mut skip = skip;
                while !self.pending.is_char_boundary(skip) {
                    skip -= 1;
                }
                Kept {
                    file: Some(spool.file.clone()),
                    written: self.written,
                    tail: self.pending[skip..].to_owned(),
                    tail_at: self.written + skip as u64,
                }
            }
        }
    }

    pub async fn finish(mut self) -> Captured {
        self.settle().await;
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
            cap: self.cap,
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
}
