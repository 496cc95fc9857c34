//! Reply bodies, written member by member ([`ReplyWriter`]): the call's reply, the failure and
//! success shapes, and the public reply to a routed call.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::ToolError;
use crate::ids::InvocationId;

/// Writes a reply body member by member, without building an intermediate map (replies are
/// the gateway's hot path): `{"ok":…,"invocation_id":…,…members}`.
#[derive(Debug)]
pub struct ReplyWriter {
    buf: Vec<u8>,
}

impl ReplyWriter {
    pub fn new(ok: bool, invocation_id: Option<&InvocationId>) -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(if ok {
            b"{\"ok\":true"
        } else {
            b"{\"ok\":false"
        });
        let mut writer = Self { buf };
        if let Some(id) = invocation_id {
            writer.member("invocation_id", id.as_str());
        }
        writer
    }

    /// `,"key":value`
    pub fn member<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> &mut Self {
        self.buf.push(b',');
        serde_json::to_writer(&mut self.buf, key).expect("a str serializes");
        self.buf.push(b':');
        serde_json::to_writer(&mut self.buf, value).expect("wire values serialize");
        self
    }

    /// Every member of `fields` but `ok` and `invocation_id` (those are written first).
    pub fn members(&mut self, fields: &Map<String, Value>) -> &mut Self {
        for (key, value) in fields {
            if key != "ok" && key != "invocation_id" {
                self.member(key, value);
            }
        }
        self
    }

    /// Members already serialized as `"k":v,"k2":v2` (no braces, no leading comma).
    pub fn raw_members(&mut self, members: &[u8]) -> &mut Self {
        if !members.is_empty() {
            self.buf.push(b',');
            self.buf.extend_from_slice(members);
        }
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.buf.push(b'}');
        self.buf
    }
}

/// Builds the reply body: `{"ok": …, "invocation_id": …, …fields}`.
pub fn reply_body(invocation_id: &InvocationId, fields: Map<String, Value>) -> Vec<u8> {
    let ok = fields.get("ok") != Some(&Value::Bool(false));
    let mut writer = ReplyWriter::new(ok, Some(invocation_id));
    writer.members(&fields);
    writer.finish()
}

/// Failure shape without `invocation_id` (for subjects other than the call subject).
pub fn error_body(error: ToolError) -> Vec<u8> {
    let mut writer = ReplyWriter::new(false, None);
    writer.members(&error.into_fields());
    writer.finish()
}

/// Success shape without `invocation_id`.
pub fn ok_body(fields: Map<String, Value>) -> Vec<u8> {
    let mut writer = ReplyWriter::new(true, None);
    writer.members(&fields);
    writer.finish()
}
/// The public reply to a routed call from an actor's reply fields (`ok` first, then
/// `invocation_id`, the fields in order, and `dispatched_tool_name` for a dispatched call).
pub fn public_reply(
    invocation_id: &InvocationId,
    fields: &Map<String, Value>,
    dispatched_tool_name: Option<&str>,
) -> Vec<u8> {
    let ok = fields.get("ok") != Some(&Value::Bool(false));
    let mut writer = ReplyWriter::new(ok, Some(invocation_id));
    writer.members(fields);
    if let Some(name) = dispatched_tool_name {
        writer.member("dispatched_tool_name", name);
    }
    writer.finish()
}
