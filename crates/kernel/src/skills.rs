//! Skill bundles: how a sandbox worker (possibly on another host, with no shared disk) gets the
//! files of the skills an `execute_skills` call names, from the skills actor, over NATS
//! request/reply only.
//!
//! One internal subject, in the queue group `toolmesh.skills`
//! (`subjects::queue::of(Role::Skills)`):
//!
//! | subject | request | reply |
//! | --- | --- | --- |
//! | [`BUNDLE_SUBJECT`] | JSON [`BundleRequest`] | frame: [`BundleReplyHeader`] + content |
//!
//! The reply is a *frame* as in [`crate::sync`]: a 4-byte big-endian length `n`, `n` bytes of a
//! JSON head (`{"ok":true,…BundleReplyHeader}`), then the bytes of every chunk the head lists,
//! concatenated in that order. A failure is the failure shape of PROTOCOL.md as the head with no
//! content: `skill_not_found` (with `available_skills`) for a name that is not an active skill,
//! and the codes of `load_skill` (`hash_mismatch`, `unsafe_archive`, `invalid_skill`, …) for a
//! remote skill that cannot be loaded.
//!
//! **Paging.** The skills' files form one list, in the order of the names asked for, each
//! skill's files sorted by path. A reply carries chunks of that list, starting at the request's
//! `continue_from` (file index + byte offset in that file), until [`BUNDLE_CONTENT_BUDGET`] bytes
//! of content; `next` is where the following request continues (`None`: done). Every page
//! repeats the skill heads with a `fingerprint` (the archive's sha256 for a remote skill, a hash
//! of the file list with sizes and mtimes for a local one): a fingerprint that changes between
//! pages means a local skill changed while it was read, and [`SkillBundles::fetch`] starts over.
//!
//! **Files.** Paths are relative to the skill's root (the folder holding `SKILL.md`),
//! `/`-separated, never absolute and never with `.` or `..` components; `SKILL.md` itself is one
//! of them. Only regular files travel (symlinks in a local skill folder are not followed);
//! `mode` is `0o755` for an executable file, else `0o644`. The worker writes them under
//! `/skills/<name>/`.

use std::time::Duration;

use async_nats::{Client, Request, RequestErrorKind};
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ErrorCode, ToolError};
use crate::role::Role;
use crate::sync::{decode_frame, parse_reply};

/// Where the skills actor answers bundle requests (queue group `toolmesh.skills`).
pub const BUNDLE_SUBJECT: &str = crate::subjects::internal::SKILLS_BUNDLE;
/// Most content bytes one bundle reply carries (NATS `max_payload` is 1 MiB by default).
pub const BUNDLE_CONTENT_BUDGET: usize = 512 * 1024;
/// How long [`SkillBundles::fetch`] waits for one reply (the first may download an archive).
pub const DEFAULT_BUNDLE_TIMEOUT: Duration = Duration::from_secs(150);
/// The `sha256` of a local skill (it has no archive).
pub const LOCAL_SHA256: &str = "local";
/// The `space_id` of a local skill.
pub const LOCAL_SPACE_ID: &str = "local";

/// Whether `name` may name a skill: `[A-Za-z0-9_.-]{1,128}`, not `.` or `..`, so that
/// `/skills/<name>/` is always one folder.
pub fn is_skill_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Where a page starts: the `file`-th file of the bundle's file list, at byte `offset`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleCursor {
    pub file: u64,
    pub offset: u64,
}

/// `bundle` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleRequest {
    /// Exact skill names, each at most once.
    pub names: Vec<String>,
    /// Absent on the first page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_from: Option<BundleCursor>,
    /// Only the skill heads, no files ([`SkillBundles::heads`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub heads_only: bool,
}

/// One skill of a bundle reply (repeated on every page).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillHead {
    pub name: String,
    pub version: String,
    /// The archive's sha256, or [`LOCAL_SHA256`].
    pub sha256: String,
    pub space_id: String,
    /// See the module docs.
    pub fingerprint: String,
    /// The `SKILL.md` body; on the first page only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// How many files the skill has.
    pub file_count: u64,
    /// Their total size.
    pub total_bytes: u64,
    /// The sandbox template the skill's `requires_sandbox` names (PROTOCOL.md "Sandbox
    /// templates"); `None`: any (the session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_template: Option<String>,
}

/// One chunk of a file; `len` bytes of content follow in the frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleChunkHeader {
    pub skill: String,
    pub path: String,
    pub mode: u32,
    /// Where in the file this chunk starts.
    pub offset: u64,
    pub len: u64,
    /// The whole file's size.
    pub size: u64,
}

/// `bundle` reply head (beside `"ok": true`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleReplyHeader {
    pub skills: Vec<SkillHead>,
    pub chunks: Vec<BundleChunkHeader>,
    /// Where the next page starts; `None` when this was the last.
    #[serde(default)]
    pub next: Option<BundleCursor>,
}

/// A chunk with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleChunk {
    pub head: BundleChunkHeader,
    pub content: Bytes,
}

/// One page, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundlePage {
    pub skills: Vec<SkillHead>,
    pub chunks: Vec<BundleChunk>,
    pub next: Option<BundleCursor>,
}

/// One file of a skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    /// Relative to the skill root, `/`-separated.
    pub path: String,
    pub mode: u32,
    pub bytes: Bytes,
}

/// A resolved skill with all its files: what a worker writes under `/skills/<name>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillBundle {
    pub name: String,
    pub version: String,
    /// The archive's sha256, or [`LOCAL_SHA256`].
    pub sha256: String,
    pub space_id: String,
    /// The `SKILL.md` body.
    pub instructions: Option<String>,
    pub files: Vec<SkillFile>,
}

/// Encodes a reply page as a frame.
pub fn encode_page(page: &BundlePage) -> Vec<u8> {
    let head = crate::sync::ok_body(&BundleReplyHeader {
        skills: page.skills.clone(),
        chunks: page.chunks.iter().map(|c| c.head.clone()).collect(),
        next: page.next,
    });
    let parts: Vec<&[u8]> = page.chunks.iter().map(|c| &c.content[..]).collect();
    crate::sync::encode_frame(&head, &parts)
}

/// Encodes a failure reply as a frame (the failure shape, no content).
pub fn encode_error(error: ToolError) -> Vec<u8> {
    crate::sync::encode_frame(&crate::sync::error_body(error), &[])
}

/// Decodes a reply frame (the failure shape becomes the error).
pub fn decode_page(body: &Bytes) -> Result<BundlePage, ToolError> {
    let (head, content) = decode_frame(body)?;
    let head: BundleReplyHeader = parse_reply(head)?;
    let mut at = 0usize;
    let mut chunks = Vec::with_capacity(head.chunks.len());
    for chunk in head.chunks {
        let len = usize::try_from(chunk.len).unwrap_or(usize::MAX);
        let end = at
            .checked_add(len)
            .filter(|end| *end <= content.len())
            .ok_or_else(|| {
                ToolError::invalid_request("malformed bundle frame: content shorter than its heads")
            })?;
        chunks.push(BundleChunk {
            head: chunk,
            content: content.slice(at..end),
        });
        at = end;
    }
    if at != content.len() {
        return Err(ToolError::invalid_request(
            "malformed bundle frame: content longer than its heads",
        ));
    }
    Ok(BundlePage {
        skills: head.skills,
        chunks,
        next: head.next,
    })
}

/// The typed client of [`BUNDLE_SUBJECT`].
#[derive(Debug, Clone, Copy)]
pub struct SkillBundles;

impl SkillBundles {
    /// The named skills with all their files, in the order asked for (duplicates are asked
    /// once). No names: no skills, without a request.
    pub async fn fetch(client: &Client, names: &[String]) -> Result<Vec<SkillBundle>, ToolError> {
        Self::fetch_with_timeout(client, names, DEFAULT_BUNDLE_TIMEOUT).await
    }

    /// [`SkillBundles::fetch`] with a timeout per reply.
    pub async fn fetch_with_timeout(
        client: &Client,
        names: &[String],
        timeout: Duration,
    ) -> Result<Vec<SkillBundle>, ToolError> {
        let mut unique: Vec<String> = Vec::with_capacity(names.len());
        for name in names {
            if !unique.contains(name) {
                unique.push(name.clone());
            }
        }
        if unique.is_empty() {
            return Ok(Vec::new());
        }
        // A local skill that changes between pages makes us start over, at most 3 times.
        for _ in 0..3 {
            if let Some(bundles) = Self::fetch_once(client, &unique, timeout).await? {
                return Ok(bundles);
            }
        }
        Err(ToolError::new(
            ErrorCode::Conflict,
            "a skill kept changing while its files were read; try again",
        ))
    }

    /// The heads of the named skills (what they are, which sandbox template they need), without
    /// their files: one request.
    pub async fn heads(client: &Client, names: &[String]) -> Result<Vec<SkillHead>, ToolError> {
        let request = BundleRequest {
            names: names.to_vec(),
            continue_from: None,
            heads_only: true,
        };
        let page = Self::page(client, &request, DEFAULT_BUNDLE_TIMEOUT).await?;
        Ok(page.skills)
    }

    /// One page of a bundle request: one round trip, `timeout` for its reply.
    async fn page(
        client: &Client,
        request: &BundleRequest,
        timeout: Duration,
    ) -> Result<BundlePage, ToolError> {
        let body = serde_json::to_vec(request).expect("a bundle request serializes");
        let request = Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(timeout));
        let reply = client
            .send_request(BUNDLE_SUBJECT.to_owned(), request)
            .await
            .map_err(|e| request_failed(&e))?;
        decode_page(&reply.payload)
    }

    /// `None` when a fingerprint changed between pages.
    async fn fetch_once(
        client: &Client,
        names: &[String],
        timeout: Duration,
    ) -> Result<Option<Vec<SkillBundle>>, ToolError> {
        let mut cursor: Option<BundleCursor> = None;
        let mut heads: Option<Vec<SkillHead>> = None;
        let mut bundles: Vec<SkillBundle> = Vec::new();
        // Files being assembled: (skill index, path) → content so far.
        let mut open: Option<(usize, SkillFile, u64)> = None;
        loop {
            let request = BundleRequest {
                names: names.to_vec(),
                continue_from: cursor,
                heads_only: false,
            };
            let page = Self::page(client, &request, timeout).await?;
            match &heads {
                None => {
                    bundles = page
                        .skills
                        .iter()
                        .map(|h| SkillBundle {
                            name: h.name.clone(),
                            version: h.version.clone(),
                            sha256: h.sha256.clone(),
                            space_id: h.space_id.clone(),
                            instructions: h.instructions.clone(),
                            files: Vec::new(),
                        })
                        .collect();
                    heads = Some(page.skills.clone());
                }
                Some(first) => {
                    let same = first.len() == page.skills.len()
                        && first
                            .iter()
                            .zip(&page.skills)
                            .all(|(a, b)| a.name == b.name && a.fingerprint == b.fingerprint);
                    if !same {
                        return Ok(None);
                    }
                }
            }
            for chunk in page.chunks {
                let index = bundles
                    .iter()
                    .position(|b| b.name == chunk.head.skill)
                    .ok_or_else(|| BundleError::UnknownSkill {
                        skill: chunk.head.skill.clone(),
                    })?;
                let (mut file, size) = match open.take() {
                    Some((i, file, size))
                        if i == index && file.path == chunk.head.path && chunk.head.offset > 0 =>
                    {
                        (file, size)
                    }
                    Some((i, file, _)) => {
                        return Err(BundleError::Unfinished {
                            skill: bundles[i].name.clone(),
                            path: file.path,
                        }
                        .into())
                    }
                    None => (
                        SkillFile {
                            path: chunk.head.path.clone(),
                            mode: chunk.head.mode,
                            bytes: Bytes::new(),
                        },
                        chunk.head.size,
                    ),
                };
                if chunk.head.offset != file.bytes.len() as u64 {
                    return Err(BundleError::OutOfOrder {
                        skill: chunk.head.skill,
                        path: chunk.head.path,
                    }
                    .into());
                }
                let mut content = BytesMut::from(&file.bytes[..]);
                content.extend_from_slice(&chunk.content);
                file.bytes = content.freeze();
                if file.bytes.len() as u64 >= size {
                    bundles[index].files.push(file);
                } else {
                    open = Some((index, file, size));
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        if let Some((i, file, _)) = open {
            return Err(BundleError::EndedInside {
                skill: bundles[i].name.clone(),
                path: file.path,
            }
            .into());
        }
        Ok(Some(bundles))
    }
}

/// A bundle whose pages break the paging rules of the module docs: the skills actor is of
/// another version, or has a bug. No caller can fix it, so every one is `internal`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error("the skills actor sent a chunk of '{skill}', which is not in the bundle")]
    UnknownSkill { skill: String },
    /// A file's chunks stopped before its size, and another file began.
    #[error("the skills actor left '{path}' of '{skill}' unfinished")]
    Unfinished { skill: String, path: String },
    /// A chunk that does not start where the file's bytes so far end.
    #[error("the skills actor sent '{path}' of '{skill}' out of order")]
    OutOfOrder { skill: String, path: String },
    /// The last page ended before a file's size.
    #[error("the skills actor ended the bundle inside '{path}' of '{skill}'")]
    EndedInside { skill: String, path: String },
}

/// `internal` with the sentence of the error, logged here.
impl From<BundleError> for ToolError {
    fn from(e: BundleError) -> Self {
        ToolError::internal_logged(&e, "a malformed skill bundle")
    }
}

/// A delivery failure of a bundle request, as a PROTOCOL.md code.
fn request_failed(error: &async_nats::RequestError) -> ToolError {
    let role = Role::Skills;
    match error.kind() {
        RequestErrorKind::NoResponders => ToolError::new(
            ErrorCode::Unavailable,
            format!("no {role} actor is running in the cluster to hand out skill files; start a node with --roles {role} and retry"),
        ),
        RequestErrorKind::TimedOut => ToolError::new(
            ErrorCode::Timeout,
            format!("the {role} actor did not hand out the skill files in time"),
        ),
        _ => ToolError::new(
            ErrorCode::Unavailable,
            format!("could not reach the {role} actor for skill files ({error}); retry"),
        ),
    }
}

/// Reads a JSON bundle request (for the server side).
pub fn parse_request(body: &[u8]) -> Result<BundleRequest, ToolError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ToolError::invalid_request(format!("malformed bundle request: {e}")))?;
    serde_json::from_value(value)
        .map_err(|e| ToolError::invalid_request(format!("malformed bundle request: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip() {
        let page = BundlePage {
            skills: vec![SkillHead {
                name: "a".into(),
                version: "1".into(),
                sha256: LOCAL_SHA256.into(),
                space_id: LOCAL_SPACE_ID.into(),
                fingerprint: "f".into(),
                instructions: Some("do".into()),
                file_count: 2,
                total_bytes: 5,
                sandbox_template: None,
            }],
            chunks: vec![
                BundleChunk {
                    head: BundleChunkHeader {
                        skill: "a".into(),
                        path: "SKILL.md".into(),
                        mode: 0o644,
                        offset: 0,
                        len: 2,
                        size: 2,
                    },
                    content: Bytes::from_static(b"hi"),
                },
                BundleChunk {
                    head: BundleChunkHeader {
                        skill: "a".into(),
                        path: "scripts/x.sh".into(),
                        mode: 0o755,
                        offset: 0,
                        len: 3,
                        size: 3,
                    },
                    content: Bytes::from_static(&[0, 1, 255]),
                },
            ],
            next: Some(BundleCursor { file: 2, offset: 0 }),
        };
        let body = Bytes::from(encode_page(&page));
        assert_eq!(decode_page(&body).unwrap(), page);
        let cut = body.slice(..body.len() - 1);
        assert_eq!(
            decode_page(&cut).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        let error = Bytes::from(encode_error(
            ToolError::new(ErrorCode::SkillNotFound, "no").with("available_skills", vec!["a"]),
        ));
        let error = decode_page(&error).unwrap_err();
        assert_eq!(error.code, ErrorCode::SkillNotFound);
        assert_eq!(error.details["available_skills"][0], "a");
    }

    #[test]
    fn skill_names_are_one_folder() {
        for ok in ["diagram", "baoyu-diagram", "a.b_c", "X1"] {
            assert!(is_skill_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a\\b", "a b", &"x".repeat(129)] {
            assert!(!is_skill_name(bad), "{bad}");
        }
    }

    #[test]
    fn requests_refuse_unknown_members() {
        assert!(parse_request(br#"{"names":["a"]}"#).is_ok());
        assert!(parse_request(br#"{"names":["a"],"continue_from":{"file":1,"offset":2}}"#).is_ok());
        assert_eq!(
            parse_request(br#"{"names":["a"],"x":1}"#).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
    }
}
