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

use std::time::Duration;

use async_nats::{Client, Request, RequestErrorKind};
use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ErrorCode, ToolError};
use crate::ids::{Account, SessionId};
use crate::role::Role;
use crate::subjects::internal;

/// Most content bytes one request or reply carries (NATS `max_payload` is 1 MiB by default;
/// the rest is room for the JSON head).
pub const BODY_CONTENT_BUDGET: usize = 512 * 1024;
/// A manifest reply stops listing (and says `truncated`) before its JSON passes this size.
pub const MANIFEST_REPLY_BUDGET: usize = 512 * 1024;
/// A put larger than this is refused (`limit_exceeded`).
pub const MAX_PUT_BYTES: u64 = 1 << 30;
/// How long a client waits for one sync reply.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Directories never synced, at any depth.
pub const SKIPPED_DIRS: [&str; 5] = [
    ".git",
    "__pycache__",
    ".venv",
    "node_modules",
    ".pytest_cache",
];
/// Top-level directory never synced: the workspace's own bookkeeping (outputs, staging).
pub const TOOLMESH_DIR: &str = ".toolmesh";
/// Where multi-part puts are staged, relative to the workspace root.
pub const STAGING_DIR: &str = ".toolmesh/sync";
/// Where over-budget outputs are persisted, relative to the workspace root.
pub const OUTPUTS_DIR: &str = ".toolmesh/outputs";

/// The workspace-relative file under [`OUTPUTS_DIR`] that holds the whole text of `field` of
/// the call `invocation_id` (PROTOCOL.md "Large data").
pub fn output_path(invocation_id: impl std::fmt::Display, field: &str) -> String {
    format!("{OUTPUTS_DIR}/{invocation_id}-{field}.txt")
}

/// The permission bits a put carries: read, write and execute for owner, group and others.
pub const MODE_PERMISSION_BITS: u32 = 0o777;

/// The mode a receiving side gives a synced file whose sender reported `mode` (see the module
/// docs): `(mode & 0o755) | 0o600`, so never setuid, setgid, sticky, or writable by others.
pub fn applied_mode(mode: u32) -> u32 {
    (mode & 0o755) | 0o600
}

/// Whether a directory called `name` is skipped; `top_level` when its parent is the root.
pub fn is_skipped_dir(name: &str, top_level: bool) -> bool {
    SKIPPED_DIRS.contains(&name) || (top_level && name == TOOLMESH_DIR)
}

/// Whether a relative, `/`-separated path lies under a skipped directory.
pub fn is_skipped_path(path: &str) -> bool {
    let mut parts = path.split('/').peekable();
    let mut top = true;
    while let Some(part) = parts.next() {
        if parts.peek().is_some() && is_skipped_dir(part, top) {
            return true;
        }
        top = false;
    }
    false
}

// ------------------------------------------------------------------------------------------
// Types

/// Identity of a regular file's content as seen by `stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileStamp {
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    pub ino: u64,
    /// `st_mode & 0o7777`; `None` from a peer of an older version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

impl FileStamp {
    /// Whether a precondition stamp holds for the file stamp `have`: the same size, mtime and
    /// inode, and the same mode unless the precondition names none (an older peer).
    pub fn holds_for(&self, have: &FileStamp) -> bool {
        self.size == have.size
            && self.mtime_ns == have.mtime_ns
            && self.ino == have.ino
            && (self.mode.is_none() || self.mode == have.mode)
    }
}

/// Caps of one manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestLimits {
    /// Listing stops (`truncated`) after this many files and directories together.
    pub max_files: u64,
    /// Bigger files are left out and counted in `skipped`.
    pub max_file_bytes: u64,
    /// Listing stops (`truncated`) before the listed sizes would add up past this.
    pub max_total_bytes: u64,
}

/// `manifest` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestRequest {
    pub account: Account,
    pub session_id: SessionId,
    pub limits: ManifestLimits,
}

/// One regular file of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
    /// See [`FileStamp::mode`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

impl ManifestEntry {
    pub fn stamp(&self) -> FileStamp {
        FileStamp {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ino: self.ino,
            mode: self.mode,
        }
    }
}

/// `manifest` reply (beside `"ok": true`). Entries are in walk order: depth first, names
/// sorted byte-wise within a directory. A missing workspace is an empty manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub entries: Vec<ManifestEntry>,
    /// Every synced directory (relative, `/`-separated), parents before children; `None`
    /// from a workspace of an older version, which syncs no directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirs: Option<Vec<String>>,
    /// Regular files left out: over `max_file_bytes`, or a name that is not UTF-8.
    pub skipped: u64,
    /// The walk stopped early (`max_files`, `max_total_bytes`, or the reply's size): files
    /// and directories not listed may exist.
    pub truncated: bool,
}

/// One file to read, from `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchFile {
    pub path: String,
    #[serde(default)]
    pub offset: u64,
}

/// `fetch` request: files are answered in order until the content budget is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchRequest {
    pub account: Account,
    pub session_id: SessionId,
    pub files: Vec<FetchFile>,
}

/// Head of one chunk in a fetch reply; its `len` content bytes follow in the frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkHeader {
    pub path: String,
    pub offset: u64,
    pub len: u64,
    /// The file's stamp when this chunk was read (a changed stamp between chunks means the
    /// file changed: start over).
    pub stamp: FileStamp,
    /// `offset + len` reached the size in `stamp`.
    pub eof: bool,
}

/// A file of a fetch that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchFailure {
    pub path: String,
    pub error: ErrorCode,
    pub error_message: String,
}

/// `fetch` reply head. Files of the request that appear in neither list were not reached
/// (the content budget ran out): ask again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchReplyHeader {
    pub chunks: Vec<ChunkHeader>,
    pub failed: Vec<FetchFailure>,
}

/// A chunk with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub path: String,
    pub offset: u64,
    pub stamp: FileStamp,
    pub eof: bool,
    pub content: Bytes,
}

/// A fetch reply, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fetched {
    pub chunks: Vec<Chunk>,
    pub failed: Vec<FetchFailure>,
}

/// The precondition of a change (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Expected {
    /// Unconditional.
    Any,
    /// Nothing may exist at the path.
    Absent,
    /// A regular file with exactly this stamp.
    Stamp(FileStamp),
}

/// What a change does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeOp {
    /// Bytes `offset..offset+content.len()` of a file of `total` bytes. A put in one part
    /// (`offset == 0`, `content.len() == total`) needs no `upload`; a put in several parts
    /// names its staging file by `upload` (`[A-Za-z0-9_-]{1,64}`, unique per put), sends its
    /// parts in order, and the last part moves the file into place.
    /// `mode` is the sender's permission bits: the file gets [`applied_mode`] of the last
    /// part's `mode`, or the default mode of a new file when it is `None`.
    Put {
        upload: Option<String>,
        offset: u64,
        total: u64,
        content: Bytes,
        mode: Option<u32>,
    },
    /// Creates the directory, and its missing parents. A directory already there counts as
    /// applied; a file, link or anything else there is a conflict (`expected` is not looked at).
    MakeDir,
    /// Removes the directory only if it is empty; a path already absent counts as applied; a
    /// directory that is not empty, a file, a link or anything else there is a conflict
    /// (`expected` is not looked at). Parents are left alone: remove each one by name.
    RemoveDir,
    /// Removes the regular file (or, with [`Expected::Any`], a symlink) at the path; a path
    /// already absent counts as applied. With `prune_empty_dirs`, its parent directories that
    /// became empty are removed too, up to the root.
    Delete { prune_empty_dirs: bool },
}

/// One change of an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: String,
    pub expected: Expected,
    pub op: ChangeOp,
}

/// Wire head of a change; a put's `len` content bytes follow in the frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeHeader {
    pub path: String,
    pub expected: Expected,
    #[serde(flatten)]
    pub op: OpHeader,
}

/// Wire head of a [`ChangeOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpHeader {
    Put {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upload: Option<String>,
        offset: u64,
        total: u64,
        len: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
    Delete {
        #[serde(default)]
        prune_empty_dirs: bool,
    },
    MakeDir,
    RemoveDir,
}

/// `apply` request head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequestHeader {
    pub account: Account,
    pub session_id: SessionId,
    pub changes: Vec<ChangeHeader>,
}

/// What is at a path in the workspace now (in a conflict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Current {
    Absent,
    File(FileStamp),
    Dir,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// The outcome of one change, in the order of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ChangeOutcome {
    /// Done: a put's new stamp (`None` for a delete or a directory change).
    Applied {
        path: String,
        stamp: Option<FileStamp>,
    },
    /// A part that is not the last was stored; `received` bytes so far.
    Staged { path: String, received: u64 },
    /// The precondition failed; nothing changed. The workspace's state wins.
    Conflict { path: String, current: Current },
    /// Refused (e.g. `path_outside_workspace`); nothing changed.
    Rejected {
        path: String,
        error: ErrorCode,
        error_message: String,
    },
}

impl ChangeOutcome {
    pub fn path(&self) -> &str {
        match self {
            ChangeOutcome::Applied { path, .. }
            | ChangeOutcome::Staged { path, .. }
            | ChangeOutcome::Conflict { path, .. }
            | ChangeOutcome::Rejected { path, .. } => path,
        }
    }

    pub fn rejected(path: &str, error: &ToolError) -> ChangeOutcome {
        ChangeOutcome::Rejected {
            path: path.to_owned(),
            error: error.code,
            error_message: error.message.clone(),
        }
    }
}

/// `apply` reply (beside `"ok": true`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReply {
    pub outcomes: Vec<ChangeOutcome>,
}

// ------------------------------------------------------------------------------------------
// Encoding

/// `[u32 BE head length][JSON head][content]`.
pub fn encode_frame(head: &impl Serialize, content: &[&[u8]]) -> Vec<u8> {
    let head = serde_json::to_vec(head).expect("a sync head serializes");
    let total: usize = content.iter().map(|c| c.len()).sum();
    let mut out = Vec::with_capacity(4 + head.len() + total);
    out.extend_from_slice(&u32::try_from(head.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&head);
    for part in content {
        out.extend_from_slice(part);
    }
    out
}

/// Splits a frame into its JSON head and its content.
pub fn decode_frame(body: &Bytes) -> Result<(Value, Bytes), ToolError> {
    let malformed = |why: &str| ToolError::invalid_request(format!("malformed sync frame: {why}"));
    if body.len() < 4 {
        return Err(malformed("shorter than its length prefix"));
    }
    let n = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
    let end = 4usize
        .checked_add(n)
        .filter(|end| *end <= body.len())
        .ok_or_else(|| malformed("head longer than the body"))?;
    let head: Value = serde_json::from_slice(&body[4..end])
        .map_err(|e| malformed(&format!("head is not JSON ({e})")))?;
    Ok((head, body.slice(end..)))
}

/// A success reply: `{"ok": true, …fields of value}`.
pub fn ok_body(value: &impl Serialize) -> Value {
    let fields = match serde_json::to_value(value).expect("a sync reply serializes") {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    let mut ordered = serde_json::Map::with_capacity(fields.len());
    ordered.insert("ok".into(), Value::Bool(true));
    ordered.extend(fields);
    Value::Object(ordered)
}

/// A failure reply: the failure shape of PROTOCOL.md.
pub fn error_body(error: ToolError) -> Value {
    Value::Object(error.into_fields())
}

/// Reads a reply (JSON value): the failure shape becomes the error, else `T`.
pub fn parse_reply<T: DeserializeOwned>(value: Value) -> Result<T, ToolError> {
    match &value {
        Value::Object(map) if map.get("ok") == Some(&Value::Bool(false)) => {
            Err(ToolError::from_fields(map).unwrap_or_else(|| {
                ToolError::internal("the workspace answered an unreadable error")
            }))
        }
        Value::Object(map) if map.get("ok") == Some(&Value::Bool(true)) => {
            serde_json::from_value(value).map_err(|e| {
                ToolError::internal(format!(
                    "the workspace answered an unreadable sync reply: {e}"
                ))
            })
        }
        _ => Err(ToolError::internal(
            "the workspace answered a sync reply without `ok`",
        )),
    }
}

/// Encodes an apply request as a frame.
pub fn encode_apply(account: &Account, session: &SessionId, changes: &[Change]) -> Vec<u8> {
    let head = ApplyRequestHeader {
        account: account.clone(),
        session_id: session.clone(),
        changes: changes
            .iter()
            .map(|c| ChangeHeader {
                path: c.path.clone(),
                expected: c.expected,
                op: match &c.op {
                    ChangeOp::Put {
                        upload,
                        offset,
                        total,
                        content,
                        mode,
                    } => OpHeader::Put {
                        upload: upload.clone(),
                        offset: *offset,
                        total: *total,
                        len: content.len() as u64,
                        mode: *mode,
                    },
                    ChangeOp::Delete { prune_empty_dirs } => OpHeader::Delete {
                        prune_empty_dirs: *prune_empty_dirs,
                    },
                    ChangeOp::MakeDir => OpHeader::MakeDir,
                    ChangeOp::RemoveDir => OpHeader::RemoveDir,
                },
            })
            .collect(),
    };
    let parts: Vec<&[u8]> = changes
        .iter()
        .filter_map(|c| match &c.op {
            ChangeOp::Put { content, .. } => Some(&content[..]),
            ChangeOp::Delete { .. } | ChangeOp::MakeDir | ChangeOp::RemoveDir => None,
        })
        .collect();
    encode_frame(&head, &parts)
}

/// Decodes an apply request frame.
pub fn decode_apply(body: &Bytes) -> Result<(Account, SessionId, Vec<Change>), ToolError> {
    let (head, content) = decode_frame(body)?;
    let head: ApplyRequestHeader = serde_json::from_value(head)
        .map_err(|e| ToolError::invalid_request(format!("malformed apply request: {e}")))?;
    let changes = split_content(head.changes, content, |h| match &h.op {
        OpHeader::Put { len, .. } => *len,
        OpHeader::Delete { .. } | OpHeader::MakeDir | OpHeader::RemoveDir => 0,
    })?
    .into_iter()
    .map(|(h, content)| Change {
        path: h.path,
        expected: h.expected,
        op: match h.op {
            OpHeader::Put {
                upload,
                offset,
                total,
                mode,
                ..
            } => ChangeOp::Put {
                upload,
                offset,
                total,
                content,
                mode,
            },
            OpHeader::Delete { prune_empty_dirs } => ChangeOp::Delete { prune_empty_dirs },
            OpHeader::MakeDir => ChangeOp::MakeDir,
            OpHeader::RemoveDir => ChangeOp::RemoveDir,
        },
    })
    .collect();
    Ok((head.account, head.session_id, changes))
}

/// Encodes a fetch reply frame.
pub fn encode_fetched(fetched: &Fetched) -> Vec<u8> {
    let head = ok_body(&FetchReplyHeader {
        chunks: fetched
            .chunks
            .iter()
            .map(|c| ChunkHeader {
                path: c.path.clone(),
                offset: c.offset,
                len: c.content.len() as u64,
                stamp: c.stamp,
                eof: c.eof,
            })
            .collect(),
        failed: fetched.failed.clone(),
    });
    let parts: Vec<&[u8]> = fetched.chunks.iter().map(|c| &c.content[..]).collect();
    encode_frame(&head, &parts)
}

/// Decodes a fetch reply frame (the failure shape becomes the error).
pub fn decode_fetched(body: &Bytes) -> Result<Fetched, ToolError> {
    let (head, content) = decode_frame(body)?;
    let head: FetchReplyHeader = parse_reply(head)?;
    let chunks = split_content(head.chunks, content, |h| h.len)?
        .into_iter()
        .map(|(h, content)| Chunk {
            path: h.path,
            offset: h.offset,
            stamp: h.stamp,
            eof: h.eof,
            content,
        })
        .collect();
    Ok(Fetched {
        chunks,
        failed: head.failed,
    })
}

/// Pairs each head with its `len_of(head)` bytes of `content`; the lengths must add up.
fn split_content<H>(
    heads: Vec<H>,
    content: Bytes,
    len_of: impl Fn(&H) -> u64,
) -> Result<Vec<(H, Bytes)>, ToolError> {
    let mut at = 0usize;
    let mut out = Vec::with_capacity(heads.len());
    for head in heads {
        let len = usize::try_from(len_of(&head)).unwrap_or(usize::MAX);
        let end = at
            .checked_add(len)
            .filter(|end| *end <= content.len())
            .ok_or_else(|| {
                ToolError::invalid_request(
                    "malformed sync frame: content shorter than its heads say",
                )
            })?;
        out.push((head, content.slice(at..end)));
        at = end;
    }
    if at != content.len() {
        return Err(ToolError::invalid_request(
            "malformed sync frame: content longer than its heads say",
        ));
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// Client

/// A typed client of the workspace sync subjects.
#[derive(Debug, Clone)]
pub struct WorkspaceSync {
    client: Client,
    timeout: Duration,
}

impl WorkspaceSync {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// How long to wait for each reply (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The regular files of the workspace with their stamps.
    pub async fn manifest(
        &self,
        account: &Account,
        session: &SessionId,
        limits: ManifestLimits,
    ) -> Result<Manifest, ToolError> {
        let body = serde_json::to_vec(&ManifestRequest {
            account: account.clone(),
            session_id: session.clone(),
            limits,
        })
        .expect("a manifest request serializes");
        let reply = self
            .request(internal::WORKSPACE_MANIFEST, body, "manifest")
            .await?;
        let value: Value = serde_json::from_slice(&reply).map_err(|e| {
            ToolError::internal(format!(
                "the workspace answered a manifest that is not JSON: {e}"
            ))
        })?;
        parse_reply(value)
    }

    /// One fetch round trip: chunks of the files asked for, in order, until the reply's
    /// content budget is used (files not answered were not reached; ask again).
    pub async fn fetch(
        &self,
        account: &Account,
        session: &SessionId,
        files: Vec<FetchFile>,
    ) -> Result<Fetched, ToolError> {
        let body = serde_json::to_vec(&FetchRequest {
            account: account.clone(),
            session_id: session.clone(),
            files,
        })
        .expect("a fetch request serializes");
        let reply = self
            .request(internal::WORKSPACE_FETCH, body, "fetch")
            .await?;
        decode_fetched(&reply)
    }

    /// A whole file, over as many fetches as it takes; starts over (at most 3 times) when
    /// the file changes between chunks.
    pub async fn fetch_file(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
    ) -> Result<(Bytes, FileStamp), ToolError> {
        for _ in 0..3 {
            let mut content = BytesMut::new();
            let mut stamp: Option<FileStamp> = None;
            loop {
                let offset = content.len() as u64;
                let fetched = self
                    .fetch(
                        account,
                        session,
                        vec![FetchFile {
                            path: path.to_owned(),
                            offset,
                        }],
                    )
                    .await?;
                if let Some(failure) = fetched.failed.into_iter().next() {
                    return Err(ToolError::new(failure.error, failure.error_message));
                }
                let Some(chunk) = fetched.chunks.into_iter().next() else {
                    return Err(ToolError::internal(
                        "the workspace answered a fetch without the file",
                    ));
                };
                if stamp.is_some_and(|s| s != chunk.stamp) {
                    break; // changed between chunks: start over
                }
                stamp = Some(chunk.stamp);
                content.extend_from_slice(&chunk.content);
                if chunk.eof {
                    return Ok((content.freeze(), chunk.stamp));
                }
                if chunk.content.is_empty() {
                    return Err(ToolError::internal(
                        "the workspace answered an empty chunk before the end",
                    ));
                }
            }
        }
        Err(ToolError::new(
            ErrorCode::Conflict,
            format!("'{path}' kept changing while it was read; try again"),
        ))
    }

    /// Applies changes in order; one outcome per change. The body must stay under NATS
    /// `max_payload`: keep the content of one call under [`BODY_CONTENT_BUDGET`].
    pub async fn apply(
        &self,
        account: &Account,
        session: &SessionId,
        changes: &[Change],
    ) -> Result<Vec<ChangeOutcome>, ToolError> {
        let body = encode_apply(account, session, changes);
        self.apply_encoded(body, changes.len()).await
    }

    /// [`WorkspaceSync::apply`] of a body [`encode_apply`] made of `count` changes.
    async fn apply_encoded(
        &self,
        body: Vec<u8>,
        count: usize,
    ) -> Result<Vec<ChangeOutcome>, ToolError> {
        let reply = self
            .request(internal::WORKSPACE_APPLY, body, "apply")
            .await?;
        let value: Value = serde_json::from_slice(&reply).map_err(|e| {
            ToolError::internal(format!(
                "the workspace answered an apply that is not JSON: {e}"
            ))
        })?;
        let reply: ApplyReply = parse_reply(value)?;
        if reply.outcomes.len() != count {
            return Err(ToolError::internal(format!(
                "the workspace answered {} outcomes for {count} changes",
                reply.outcomes.len(),
            )));
        }
        Ok(reply.outcomes)
    }

    /// Writes `bytes` to `path` unconditionally (in parts of [`BODY_CONTENT_BUDGET`] when
    /// big), atomically: readers see the old file or the whole new one. For outputs persisted
    /// under [`OUTPUTS_DIR`]. A conflict cannot happen; a rejection is its error.
    pub async fn put_file(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        bytes: Bytes,
    ) -> Result<(), ToolError> {
        let total = bytes.len() as u64;
        self.put_parts(account, session, path, total, |offset, len| {
            let offset = offset as usize;
            std::future::ready(Ok(bytes.slice(offset..offset + len)))
        })
        .await
    }

    /// [`WorkspaceSync::put_file`] of the first `total` bytes of `source` (a file on the
    /// worker). Each part is read on tokio's blocking pool, never on the async threads; one
    /// part of [`BODY_CONTENT_BUDGET`] is in memory at a time.
    pub async fn put_from(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        total: u64,
        source: std::sync::Arc<std::fs::File>,
    ) -> Result<(), ToolError> {
        self.put_parts(account, session, path, total, |offset, len| {
            let source = source.clone();
            async move {
                let read = tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    let mut part = vec![0u8; len];
                    source.read_exact_at(&mut part, offset).map(|()| part)
                })
                .await
                .map_err(std::io::Error::other)
                .and_then(|read| read);
                read.map(Bytes::from).map_err(|e| {
                    ToolError::internal(format!("cannot read what to put into '{path}': {e}"))
                })
            }
        })
        .await
    }

    /// Puts `total` bytes in parts, one after the other; `part(offset, len)` gives each. The
    /// first part creates the staging file, the last one lands the file.
    async fn put_parts<F, Fut>(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        total: u64,
        part: F,
    ) -> Result<(), ToolError>
    where
        F: Fn(u64, usize) -> Fut,
        Fut: std::future::Future<Output = Result<Bytes, ToolError>>,
    {
        let budget = BODY_CONTENT_BUDGET as u64;
        let upload = (total > budget).then(|| format!("put-{}", nuid::next()));
        let mut offset = 0u64;
        loop {
            let end = (offset + budget).min(total);
            let content = part(offset, (end - offset) as usize).await?;
            let change = Change {
                path: path.to_owned(),
                expected: Expected::Any,
                op: ChangeOp::Put {
                    upload: upload.clone(),
                    offset,
                    total,
                    content,
                    mode: None,
                },
            };
            // The part's bytes go once they are in the body: one copy in memory per part.
            let body = encode_apply(account, session, std::slice::from_ref(&change));
            drop(change);
            let outcome = self
                .apply_encoded(body, 1)
                .await?
                .pop()
                .expect("apply checked the outcome count");
            let last = end == total;
            match outcome {
                ChangeOutcome::Applied { stamp: Some(_), .. } if last => return Ok(()),
                ChangeOutcome::Staged { .. } if !last => offset = end,
                ChangeOutcome::Rejected {
                    error,
                    error_message,
                    ..
                } => return Err(ToolError::new(error, error_message)),
                other => {
                    return Err(ToolError::internal(format!(
                        "unexpected outcome of an unconditional put of '{path}': {other:?}"
                    )))
                }
            }
        }
    }

    async fn request(&self, subject: &str, body: Vec<u8>, what: &str) -> Result<Bytes, ToolError> {
        let request = Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(self.timeout));
        match self.client.send_request(subject.to_owned(), request).await {
            Ok(message) => Ok(message.payload),
            Err(error) => Err(request_failed(&error, what)),
        }
    }
}

/// A delivery failure of a sync request, as a PROTOCOL.md code.
fn request_failed(error: &async_nats::RequestError, what: &str) -> ToolError {
    let role = Role::Workspace;
    match error.kind() {
        RequestErrorKind::NoResponders => ToolError::new(
            ErrorCode::Unavailable,
            format!("no {role} actor is running in the cluster to serve a workspace sync {what}; start a node with --roles {role} and retry"),
        ),
        RequestErrorKind::TimedOut => ToolError::new(
            ErrorCode::Timeout,
            format!("the {role} actor did not answer a workspace sync {what} in time"),
        ),
        RequestErrorKind::MaxPayloadExceeded => ToolError::new(
            ErrorCode::LimitExceeded,
            format!("a workspace sync {what} is over the NATS max_payload; send less per request"),
        ),
        RequestErrorKind::InvalidSubject | RequestErrorKind::Other => ToolError::new(
            ErrorCode::Unavailable,
            format!("could not reach the {role} actor for a workspace sync {what} ({error}); retry"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_rules() {
        let check =
            |path: &str, skipped: bool| assert_eq!(is_skipped_path(path), skipped, "{path}");
        check("a.txt", false);
        check(".git/config", true);
        check("src/node_modules/x/y.js", true);
        check(".toolmesh/outputs/o.txt", true);
        check("src/.toolmesh/x", false);
        check("node_modules", false); // a file named so is not a directory
        check("a/__pycache__/m.pyc", true);
    }

    #[test]
    fn apply_frames_round_trip() {
        let account = Account::parse("acme").unwrap();
        let session = SessionId::parse("s1").unwrap();
        let changes = vec![
            Change {
                path: "a.txt".into(),
                expected: Expected::Absent,
                op: ChangeOp::Put {
                    upload: None,
                    offset: 0,
                    total: 3,
                    content: Bytes::from_static(b"abc"),
                    mode: Some(0o755),
                },
            },
            Change {
                path: "gone.txt".into(),
                expected: Expected::Stamp(FileStamp {
                    size: 1,
                    mtime_ns: 2,
                    ino: 3,
                    mode: Some(0o644),
                }),
                op: ChangeOp::Delete {
                    prune_empty_dirs: true,
                },
            },
            Change {
                path: "b.bin".into(),
                expected: Expected::Any,
                op: ChangeOp::Put {
                    upload: Some("u1".into()),
                    offset: 0,
                    total: 10,
                    content: Bytes::from_static(&[0, 255, 10]),
                    mode: None,
                },
            },
            Change {
                path: "empty/dir".into(),
                expected: Expected::Any,
                op: ChangeOp::MakeDir,
            },
            Change {
                path: "old".into(),
                expected: Expected::Any,
                op: ChangeOp::RemoveDir,
            },
        ];
        let body = Bytes::from(encode_apply(&account, &session, &changes));
        let (a, s, decoded) = decode_apply(&body).unwrap();
        assert_eq!((a, s), (account, session));
        assert_eq!(decoded, changes);
    }

    #[test]
    fn expected_and_outcomes_have_readable_json() {
        assert_eq!(
            serde_json::to_value(Expected::Absent).unwrap(),
            serde_json::json!({"kind": "absent"})
        );
        assert_eq!(
            serde_json::to_value(Expected::Stamp(FileStamp {
                size: 1,
                mtime_ns: 2,
                ino: 3,
                mode: Some(0o755),
            }))
            .unwrap(),
            serde_json::json!({"kind": "stamp", "size": 1, "mtime_ns": 2, "ino": 3, "mode": 0o755})
        );
        let conflict = ChangeOutcome::Conflict {
            path: "x".into(),
            current: Current::Dir,
        };
        assert_eq!(
            serde_json::to_value(&conflict).unwrap(),
            serde_json::json!({"outcome": "conflict", "path": "x", "current": {"kind": "dir"}})
        );
    }

    #[test]
    fn truncated_frames_are_refused() {
        let body = Bytes::from(encode_fetched(&Fetched {
            chunks: vec![Chunk {
                path: "a".into(),
                offset: 0,
                stamp: FileStamp {
                    size: 4,
                    mtime_ns: 0,
                    ino: 1,
                    mode: None,
                },
                eof: true,
                content: Bytes::from_static(b"data"),
            }],
            failed: vec![],
        }));
        assert_eq!(decode_fetched(&body).unwrap().chunks[0].content, "data");
        let cut = body.slice(..body.len() - 1);
        assert_eq!(
            decode_fetched(&cut).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            decode_frame(&Bytes::from_static(b"\0\0")).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        let error = Bytes::from(encode_frame(
            &error_body(ToolError::new(ErrorCode::NotFound, "nope")),
            &[],
        ));
        assert_eq!(
            decode_fetched(&error).unwrap_err().code,
            ErrorCode::NotFound
        );
    }

    #[test]
    fn applied_modes_keep_exec_bits_and_drop_the_rest() {
        let check = |sent: u32, applied: u32| assert_eq!(applied_mode(sent), applied, "{sent:o}");
        check(0o755, 0o755);
        check(0o644, 0o644);
        check(0o700, 0o700);
        check(0o4755, 0o755); // setuid
        check(0o2755, 0o755); // setgid
        check(0o1777, 0o755); // sticky, and no write for group or others
        check(0o000, 0o600); // the owner keeps read and write
        check(0o111, 0o711);
    }

    #[test]
    fn a_stamp_without_a_mode_holds_for_any_mode() {
        let have = FileStamp {
            size: 1,
            mtime_ns: 2,
            ino: 3,
            mode: Some(0o755),
        };
        assert!(have.holds_for(&have));
        assert!(
            FileStamp { mode: None, ..have }.holds_for(&have),
            "an older peer"
        );
        assert!(!FileStamp {
            mode: Some(0o644),
            ..have
        }
        .holds_for(&have));
        assert!(!FileStamp { ino: 4, ..have }.holds_for(&have));
    }

    #[test]
    fn heads_of_an_older_version_still_decode() {
        // An apply of an older mirror: no mode on the put or the stamp.
        let head = serde_json::json!({
            "account": "acme",
            "session_id": "s1",
            "changes": [
                {"path": "a", "expected": {"kind": "stamp", "size": 1, "mtime_ns": 2, "ino": 3},
                 "op": "put", "offset": 0, "total": 1, "len": 1},
                {"path": "b", "expected": {"kind": "any"}, "op": "delete"},
            ],
        });
        let body = Bytes::from(encode_frame(&head, &[b"x"]));
        let (_, _, changes) = decode_apply(&body).unwrap();
        assert_eq!(
            changes[0].expected,
            Expected::Stamp(FileStamp {
                size: 1,
                mtime_ns: 2,
                ino: 3,
                mode: None
            })
        );
        assert!(matches!(changes[0].op, ChangeOp::Put { mode: None, .. }));
        // A manifest of an older workspace: no modes, no directories.
        let manifest: Manifest = parse_reply(serde_json::json!({
            "ok": true,
            "entries": [{"path": "a", "size": 1, "mtime_ns": 2, "ino": 3}],
            "skipped": 0,
            "truncated": false,
        }))
        .unwrap();
        assert_eq!(manifest.dirs, None);
        assert_eq!(manifest.entries[0].stamp().mode, None);
        // And what a new side sends stays readable by an older one: no new field is required,
        // and a stamp without a mode serializes as before.
        let old_stamp = serde_json::to_value(FileStamp {
            size: 1,
            mtime_ns: 2,
            ino: 3,
            mode: None,
        })
        .unwrap();
        assert_eq!(
            old_stamp,
            serde_json::json!({"size": 1, "mtime_ns": 2, "ino": 3})
        );
    }
}
