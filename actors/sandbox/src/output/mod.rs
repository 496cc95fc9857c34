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
//!
//! The parts: [`Quota`] and [`Cap`] (`quota`), the hand-over to the workspace (`handover`),
//! the [`Spool`] itself (`spool`), what it gives back ([`Captured`] in `captured`, [`Kept`] in
//! `kept`), and UTF-8 text in pieces (`text`).

mod captured;
mod handover;
mod kept;
mod quota;
mod spool;
mod text;

use std::path::{Path, PathBuf};

pub use captured::{persisted_entry, Captured, SpoolFile};
pub use handover::{Handover, Part, PutPart, MAX_HANDOVERS};
pub use kept::Kept;
pub use quota::{Cap, Quota};
pub use spool::{Spool, SpoolSettings, MAX_PARTS, WRITE_BATCH};
pub use text::{utf8_complete_len, Utf8Decoder};

/// Where a session's spool files go: a sibling of its workspace directory on the worker,
/// never shown to the sandbox (and removed with the sandbox's directory).
pub fn spool_dir_of(workspace_dir: &Path) -> PathBuf {
    workspace_dir.with_file_name("outputs")
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;
