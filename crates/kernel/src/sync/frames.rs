//! Frames (a JSON head, then raw content) and reply bodies: encoding and decoding of the
//! apply request and the fetch reply.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::ToolError;
use crate::ids::{Account, SessionId};
use crate::sync::error::SyncClientError;
use crate::sync::messages::{
    ApplyRequestHeader, Change, ChangeHeader, ChangeOp, Chunk, ChunkHeader, FetchReplyHeader,
    Fetched, OpHeader,
};

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
            Err(ToolError::from_fields(map)
                .unwrap_or_else(|| SyncClientError::UnreadableError.into()))
        }
        Value::Object(map) if map.get("ok") == Some(&Value::Bool(true)) => {
            serde_json::from_value(value).map_err(|e| SyncClientError::Unreadable(e).into())
        }
        _ => Err(SyncClientError::NoOk.into()),
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
