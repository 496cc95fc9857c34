//! The kept text of a spool from some offset on, read without holding the spool.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::output::text::{prefix_bytes, utf8_complete_len};

/// The kept text of a spool from some offset on, taken under the spool's lock and read
/// without it: the part on disk through the files' handles (blocking: call off the async
/// threads), the rest from memory. Offsets count bytes of the stream's text of this read;
/// text already handed to the workspace is not here (see [`Kept::start`]).
#[derive(Debug)]
pub struct Kept {
    /// The part on its way to the workspace, when the text asked for starts in it: where it
    /// starts, its bytes, its spool file.
    pub(super) part: Option<(u64, u64, Arc<std::fs::File>)>,
    pub(super) file: Option<Arc<std::fs::File>>,
    /// Where the file starts in the stream's text.
    pub(super) base: u64,
    /// Bytes of the file on disk when taken.
    pub(super) written: u64,
    /// The kept text from `tail_at` on that is not on disk.
    pub(super) tail: String,
    pub(super) tail_at: u64,
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
