//! One stream of a command's output as text: decoded from UTF-8 as it arrives, counted whole,
//! its first characters kept in memory for the reply, and all of it spooled to a file on the
//! worker once it is longer than that (up to a cap), so a worker's memory stays flat whatever
//! a command writes.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::exec::utf8_complete_len;

/// Where a session's spool files go: a sibling of its workspace directory on the worker,
/// never shown to the sandbox (and removed with the sandbox's directory).
pub fn spool_dir_of(workspace_dir: &Path) -> PathBuf {
    workspace_dir.with_file_name("outputs")
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

/// A spool file on the worker; removed when dropped.
#[derive(Debug)]
pub struct SpoolFile {
    pub path: PathBuf,
    /// Bytes of text in it.
    pub bytes: u64,
    /// The stream was longer than the cap: the file holds its first `bytes` only.
    pub capped: bool,
    file: std::fs::File,
}

impl SpoolFile {
    /// The file, to read it from the start.
    pub fn reader(&self) -> std::io::Result<std::fs::File> {
        std::fs::File::open(&self.path)
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One stream's text: counted whole, the first `preview_chars` characters in memory, all of it
/// (up to `max_bytes`) in a spool file once it is longer than the preview.
#[derive(Debug)]
pub struct Spool {
    settings: SpoolSettings,
    label: String,
    head: String,
    head_chars: usize,
    file: Option<SpoolFile>,
    /// Characters and bytes of text pushed, kept or not.
    chars: u64,
    bytes: u64,
    /// Text could not be spooled (the reason was logged): the file is incomplete.
    failed: bool,
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
    /// The whole text (up to the cap) when `truncated` and it could be spooled.
    pub file: Option<SpoolFile>,
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

impl Spool {
    /// An empty spool; its file (if it needs one) is named after `label`.
    pub fn new(settings: SpoolSettings, label: &str) -> Self {
        Self {
            settings,
            label: label.to_owned(),
            head: String::new(),
            head_chars: 0,
            file: None,
            chars: 0,
            bytes: 0,
            failed: false,
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

    /// Bytes this spool holds in memory: bounded by the preview, whatever was pushed.
    pub fn memory_bytes(&self) -> usize {
        self.head.capacity()
    }

    pub fn push(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let n = text.chars().count();
        self.chars += n as u64;
        self.bytes += text.len() as u64;
        let room = self.settings.preview_chars - self.head_chars;
        if self.file.is_none() && !self.failed {
            if n <= room {
                self.head.push_str(text);
                self.head_chars += n;
                return;
            }
            // Longer than the preview: from now on the whole text goes to a file.
            if let Err(e) = self.open() {
                tracing::warn!(error = %e, dir = %self.settings.dir.display(), "cannot spool a command's output; only its preview is kept");
                self.failed = true;
            } else {
                let head = std::mem::take(&mut self.head);
                self.write(&head);
                self.head = head;
            }
        }
        if room > 0 {
            self.head.push_str(prefix_chars(text, room));
            self.head_chars = self.settings.preview_chars;
        }
        self.write(text);
    }

    fn open(&mut self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.settings.dir)?;
        let path = self.settings.dir.join(format!(
            "{}-{}.txt",
            self.label,
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        self.file = Some(SpoolFile {
            path,
            bytes: 0,
            capped: false,
            file,
        });
        Ok(())
    }

    /// Appends `text` to the file, up to the cap.
    fn write(&mut self, text: &str) {
        let max = self.settings.max_bytes;
        let Some(spool) = self.file.as_mut() else {
            return;
        };
        if spool.capped || self.failed {
            return;
        }
        let room = usize::try_from(max.saturating_sub(spool.bytes)).unwrap_or(usize::MAX);
        let part = prefix_bytes(text, room);
        if let Err(e) = spool.file.write_all(part.as_bytes()) {
            tracing::warn!(error = %e, path = %spool.path.display(), "cannot spool a command's output; the file stops here");
            self.failed = true;
            return;
        }
        spool.bytes += part.len() as u64;
        if part.len() < text.len() {
            spool.capped = true;
        }
    }

    /// Up to `max` bytes of the kept text from byte `from` on, ending on a whole character
    /// (empty when `from` is at the end).
    pub fn read_from(&self, from: u64, max: usize) -> std::io::Result<String> {
        let Some(spool) = &self.file else {
            let from = usize::try_from(from)
                .unwrap_or(usize::MAX)
                .min(self.head.len());
            return Ok(prefix_bytes(&self.head[from..], max).to_owned());
        };
        let len = usize::try_from(spool.bytes.saturating_sub(from))
            .unwrap_or(usize::MAX)
            .min(max);
        let mut buffer = vec![0u8; len];
        spool.file.read_exact_at(&mut buffer, from)?;
        // The file holds whole characters; only the cut at `max` can split one.
        buffer.truncate(utf8_complete_len(&buffer));
        Ok(String::from_utf8_lossy(&buffer).into_owned())
    }

    pub fn finish(self) -> Captured {
        let truncated = self.chars > self.settings.preview_chars as u64;
        Captured {
            preview: self.head,
            chars: self.chars,
            bytes: self.bytes,
            truncated,
            file: if truncated && !self.failed {
                self.file
            } else {
                None
            },
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

    #[test]
    fn short_text_stays_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(settings(dir.path(), 10, 1000), "s");
        spool.push("héllo");
        spool.push("wörld");
        let captured = spool.finish();
        assert_eq!(captured.preview, "héllowörld");
        assert_eq!((captured.chars, captured.truncated), (10, false));
        assert!(captured.file.is_none());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn long_text_is_spooled_whole_and_counted_in_characters() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(settings(dir.path(), 4, 1000), "s");
        spool.push("ab");
        spool.push("cdé€f");
        spool.push("g");
        let captured = spool.finish();
        assert_eq!(captured.preview, "abcd");
        assert_eq!((captured.chars, captured.truncated), (8, true));
        assert_eq!(file_text(&captured), "abcdé€fg");
        assert_eq!(captured.file.as_ref().unwrap().bytes, 11);
        assert_eq!(captured.dropped_bytes(), 0);
        let path = captured.file.as_ref().unwrap().path.clone();
        drop(captured);
        assert!(!path.exists(), "a spool file goes with its capture");
    }

    #[test]
    fn past_the_cap_text_is_counted_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(settings(dir.path(), 2, 5), "s");
        spool.push("abc€€"); // 3 + 6 bytes; the cap cuts inside the first €
        spool.push("xyz");
        let captured = spool.finish();
        assert_eq!(captured.chars, 8);
        assert_eq!(file_text(&captured), "abc");
        let file = captured.file.as_ref().unwrap();
        assert!(file.capped);
        assert_eq!(captured.dropped_bytes(), 12 - 3);
    }

    #[test]
    fn memory_stays_bounded_by_the_preview_whatever_is_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let preview = 1000;
        let mut spool = Spool::new(settings(dir.path(), preview, 64 << 20), "s");
        let mut decoder = Utf8Decoder::default();
        let piece = "€ 16 KiB of output, line after line\n".repeat(450);
        let mut pushed = 0u64;
        while pushed < 50_000_000 {
            spool.push(&decoder.decode(piece.as_bytes()));
            pushed += piece.len() as u64;
            assert!(
                spool.memory_bytes() <= 4 * preview + piece.len(),
                "{} bytes in memory",
                spool.memory_bytes()
            );
        }
        let captured = spool.finish();
        assert_eq!(captured.bytes, pushed);
        assert_eq!(captured.file.as_ref().unwrap().bytes, pushed);
        assert_eq!(
            std::fs::metadata(&captured.file.as_ref().unwrap().path)
                .unwrap()
                .len(),
            pushed
        );
    }

    #[test]
    fn kept_text_reads_back_from_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        for preview in [100, 3] {
            let mut spool = Spool::new(settings(dir.path(), preview, 1000), "s");
            spool.push("line-1\nlïne-2\n");
            assert_eq!(spool.read_from(0, 100).unwrap(), "line-1\nlïne-2\n");
            assert_eq!(spool.read_from(7, 100).unwrap(), "lïne-2\n");
            // A cut inside a character stops before it.
            assert_eq!(spool.read_from(7, 2).unwrap(), "l");
            assert_eq!(spool.read_from(spool.kept_bytes(), 100).unwrap(), "");
        }
    }
}
