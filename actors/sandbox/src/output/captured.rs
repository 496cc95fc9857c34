//! A finished stream ([`Captured`]), its spool file on the worker, and its entry in a reply's
//! `persisted_outputs`.

use std::path::PathBuf;
use std::sync::Arc;

use toolmesh_kernel::ToolError;

use crate::output::handover::Part;
use crate::output::quota::{Cap, Quota};

/// A spool file on the worker; removed (off the async threads) when dropped, giving back the
/// bytes it took from its quotas.
#[derive(Debug)]
pub struct SpoolFile {
    pub path: PathBuf,
    /// Bytes of text it keeps (once the spool is finished, all of them are in the file).
    pub bytes: u64,
    /// The stream was longer than a cap: the file holds its first `bytes` only.
    pub capped: bool,
    pub(super) file: Arc<std::fs::File>,
    pub(super) quotas: Vec<Arc<Quota>>,
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
