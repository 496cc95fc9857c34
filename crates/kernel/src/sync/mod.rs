//! Workspace sync: how a sandbox worker keeps a local copy ("mirror") of a session's workspace
//! in step with the workspace actor, over NATS request/reply only (no shared disk).
//!
//! Three internal subjects, all in the queue group `toolmesh.workspace`
//! (`subjects::queue::of(Role::Workspace)`):
//!
//! | subject | request | reply |
//! | --- | --- | --- |
//! | [`internal::WORKSPACE_MANIFEST`] | JSON [`ManifestRequest`] | JSON `{"ok":true,…`[`Manifest`]`}` |
//! | [`internal::WORKSPACE_FETCH`] | JSON [`FetchRequest`] | frame: [`FetchReplyHeader`] + content |
//! | [`internal::WORKSPACE_APPLY`] | frame: [`ApplyRequestHeader`] + content | JSON `{"ok":true,"outcomes":[…]}` |
//!
//! Any reply may instead be the failure shape `{"ok":false,"error","error_message",…}` (as a
//! frame with an empty content part on `fetch`), with a PROTOCOL.md code.
//!
//! **Frames.** File content travels as raw bytes, not base64: a *frame* is a 4-byte big-endian
//! length `n`, `n` bytes of a JSON header, then the content of every chunk (or put part)
//! concatenated in the order the header lists them, each one `len` bytes long. Base64 would
//! cost a third more bytes per chunk (a 512 KiB chunk would need ~683 KiB of a 1 MiB
//! `max_payload`) and an encode and decode pass; NATS headers are text and count against
//! `max_payload` too, so one binary body with a JSON head is the simplest exact encoding.
//! Content in one body stays under [`BODY_CONTENT_BUDGET`] (512 KiB); a bigger file takes
//! several fetches (by `offset`) or several put parts.
//!
//! **Stamps.** A [`FileStamp`] is `(size, mtime_ns, ino, mode)` of a regular file. The inode is
//! part of it because mtimes come from a coarse clock (a few ms): every write the workspace
//! actor makes replaces the file by rename, so two writes within one tick still differ by
//! inode. The mode is part of it because `chmod` changes no mtime: a mode-only change is a
//! change, and its file travels again, content and mode together.
//!
//! **Modes.** A stamp's `mode` is the file's `st_mode & 0o7777`. A put carries the sender's
//! permission bits (`& 0o777`), and the receiving side writes the file with
//! [`applied_mode`]: read and execute bits as sent, the owner's read and write always, no write
//! for group or others, and never setuid, setgid or sticky — whatever the sender asks. So
//! `chmod +x` travels both ways, and a sandbox cannot make a workspace file setuid or
//! world-writable. Directory modes do not travel. A peer of an older version sends no `mode`
//! (serde default `None`): its puts keep the receiver's default mode, and its `stamp`
//! preconditions are checked without the mode.
//!
//! **Directories.** A manifest lists every synced directory beside the files (`dirs`), and
//! directories count toward `max_files` with the files. [`ChangeOp::MakeDir`] creates one
//! (with missing parents); [`ChangeOp::RemoveDir`] removes one only while it is empty in the
//! workspace. So empty directories travel both ways. A manifest without `dirs` comes from a
//! workspace of an older version, which has no directory changes either.
//!
//! **Preconditions.** Each change carries [`Expected`]: `any` (unconditional), `absent` (there
//! must be nothing at the path — not a file, directory or symlink), or `stamp` (there must be a
//! regular file with exactly that stamp). A change whose precondition fails is not applied and
//! comes back as [`ChangeOutcome::Conflict`] with the workspace's current state: the workspace
//! version wins. A multi-part put checks its precondition at the first part (so a conflict
//! costs no upload) and again at the last, just before the rename. Its parts go one after the
//! other, each taken only where the staged bytes end.
//!
//! **Read state.** A put is not a "read" for the workspace's read-before-edit rule: the sync
//! path never touches the shared read state (Redis), so an agent still has to read a file a
//! sandbox command created before it may edit it. The check-then-rename of a conditional put
//! does not take the read state's per-file lock either, so a workspace tool writing the same
//! file in the same instant may be overwritten (the window is the time between a `stat` and a
//! `rename`).
//!
//! **Skip rules** ([`is_skipped_dir`]): directories named `.git`, `__pycache__`, `.venv`,
//! `node_modules`, `.pytest_cache` at any depth, and `.toolmesh` at the top level, are never
//! listed, walked or synced; symlinks are never followed or synced; only regular files are.
//!
//! The parts: limits, reserved paths, skip rules and modes (`rules`), the requests, replies
//! and changes (`messages`), frames and reply bodies (`frames`), the client [`WorkspaceSync`]
//! (`client`) and why it could not use a reply ([`SyncClientError`], `error`).
//!
//! [`internal::WORKSPACE_MANIFEST`]: crate::subjects::internal::WORKSPACE_MANIFEST
//! [`internal::WORKSPACE_FETCH`]: crate::subjects::internal::WORKSPACE_FETCH
//! [`internal::WORKSPACE_APPLY`]: crate::subjects::internal::WORKSPACE_APPLY

mod client;
mod error;
mod frames;
mod messages;
mod rules;

pub use client::WorkspaceSync;
pub use error::SyncClientError;
pub use frames::{
    decode_apply, decode_fetched, decode_frame, encode_apply, encode_fetched, encode_frame,
    error_body, ok_body, parse_reply,
};
pub use messages::{
    ApplyReply, ApplyRequestHeader, Change, ChangeHeader, ChangeOp, ChangeOutcome, Chunk,
    ChunkHeader, Current, Expected, FetchFailure, FetchFile, FetchReplyHeader, FetchRequest,
    Fetched, FileStamp, Manifest, ManifestEntry, ManifestLimits, ManifestRequest, OpHeader,
};
pub use rules::{
    applied_mode, is_skipped_dir, is_skipped_path, output_path, BODY_CONTENT_BUDGET,
    DEFAULT_TIMEOUT, MANIFEST_REPLY_BUDGET, MAX_PUT_BYTES, MODE_PERMISSION_BITS, OUTPUTS_DIR,
    SKIPPED_DIRS, STAGING_DIR, TOOLMESH_DIR,
};

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
