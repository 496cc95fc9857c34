//! An actor's successful reply passed through to the caller as raw JSON: the members of the
//! `ActorReply`'s `reply` object are cut out of the payload as text and written into the
//! public reply after the gateway's envelope, without building (and re-serializing) a JSON
//! value of the tool's result. Anything unusual — `ok` other than `true`, an escaped key where
//! a plain one is expected, a shape that is not an `ActorReply` — returns `None`, and the
//! caller takes the general path (a full parse, which also turns `ok: false` into the
//! `ToolError` with its code).

use serde::de::IgnoredAny;

/// The successful reply of an actor, as raw members.
#[derive(Debug, PartialEq, Eq)]
pub struct RawSuccess {
    /// `"k":v,"k2":v2` of the tool's fields in the actor's order, without `ok` and
    /// `invocation_id` (the envelope writes those), ready for `ReplyWriter::raw_members`.
    pub members: Vec<u8>,
    pub events_emitted: u64,
}

/// Splits an `ActorReply` body (`{"reply":{"ok":true,…},"events_emitted":n}`, members in any
/// order) whose reply is a success; `None` for anything else.
pub fn success(payload: &[u8]) -> Option<RawSuccess> {
    // Valid JSON first (no values are built): the scanner below may then trust the syntax.
    serde_json::from_slice::<IgnoredAny>(payload).ok()?;
    let mut outer = Scanner::new(payload);
    let mut reply: Option<Vec<(&[u8], &[u8])>> = None;
    let mut events_emitted = 0;
    for (key, value) in outer.object()? {
        match key {
            b"\"reply\"" => reply = Some(Scanner::new(value).object()?),
            b"\"events_emitted\"" => {
                events_emitted = std::str::from_utf8(value).ok()?.parse().ok()?;
            }
            _ => {}
        }
    }
    let reply = reply?;
    let ok = reply.iter().find(|(k, _)| *k == b"\"ok\"").map(|(_, v)| *v);
    if ok != Some(b"true") {
        return None;
    }
    let mut members = Vec::with_capacity(payload.len());
    for (key, value) in reply {
        if key == b"\"ok\"" || key == b"\"invocation_id\"" {
            continue;
        }
        // A key written with escapes could spell `ok` or `invocation_id`: leave it to the
        // general path rather than risk a duplicate envelope member.
        if key.contains(&b'\\') {
            return None;
        }
        if !members.is_empty() {
            members.push(b',');
        }
        members.extend_from_slice(key);
        members.push(b':');
        members.extend_from_slice(value);
    }
    Some(RawSuccess {
        members,
        events_emitted,
    })
}

/// Walks JSON text already known to be valid.
struct Scanner<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Scanner<'a> {
    fn new(text: &'a [u8]) -> Self {
        Self { text, at: 0 }
    }

    fn skip_ws(&mut self) {
        while self.at < self.text.len() && self.text[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.text.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// The members of the object at the cursor: raw key (with its quotes) and raw value.
    fn object(&mut self) -> Option<Vec<(&'a [u8], &'a [u8])>> {
        self.expect(b'{')?;
        let mut members = Vec::new();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(members);
        }
        loop {
            self.skip_ws();
            let key_start = self.at;
            self.string()?;
            let key = &self.text[key_start..self.at];
            self.expect(b':')?;
            self.skip_ws();
            let value_start = self.at;
            self.value()?;
            members.push((key, &self.text[value_start..self.at]));
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(members);
                }
                _ => return None,
            }
        }
    }

    /// Moves past the string at the cursor.
    fn string(&mut self) -> Option<()> {
        if self.text.get(self.at) != Some(&b'"') {
            return None;
        }
        self.at += 1;
        loop {
            match *self.text.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' => self.at += 2,
                _ => self.at += 1,
            }
        }
    }

    /// Moves past the value at the cursor (strings, nesting, scalars).
    fn value(&mut self) -> Option<()> {
        match *self.text.get(self.at)? {
            b'"' => self.string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.text.get(self.at)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                while let Some(b) = self.text.get(self.at) {
                    if matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace() {
                        break;
                    }
                    self.at += 1;
                }
                Some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map, Value};
    use toolmesh_kernel::wire::{ActorReply, ReplyWriter};
    use toolmesh_kernel::{ErrorCode, InvocationId, ToolError};

    /// The spliced reply equals the one built through `serde_json::Value`s (the general path).
    fn check(fields: Value) {
        let Value::Object(fields) = fields else {
            panic!("fields must be an object")
        };
        let body = serde_json::to_vec(&ActorReply {
            events_emitted: 3,
            ..ActorReply::ok(fields.clone())
        })
        .unwrap();
        let raw = success(&body).expect("a success splits");
        assert_eq!(raw.events_emitted, 3);
        let id = InvocationId::parse("inv-1").unwrap();
        let mut spliced = ReplyWriter::new(true, Some(&id));
        spliced.raw_members(&raw.members);
        let mut built = ReplyWriter::new(true, Some(&id));
        built.members(&fields);
        assert_eq!(
            String::from_utf8(spliced.finish()).unwrap(),
            String::from_utf8(built.finish()).unwrap()
        );
    }

    #[test]
    fn successes_are_spliced_as_the_general_path_writes_them() {
        check(json!({}));
        check(
            json!({"path": "a.txt", "content": "     1\tx \"q\" \\ {}[],:\n", "read_range": [1, 1],
            "total_lines": 1, "partial": false, "size": 12, "read_state_recorded": true}),
        );
        check(json!({"nested": {"a": [{"b": "}]"}, [], {}], "c": null}, "n": -1.5e3, "t": true}));
        check(json!({"invocation_id": "spoofed", "ünï": "🦀\u{1}"}));
    }

    #[test]
    fn anything_but_a_plain_success_takes_the_general_path() {
        let failure = ActorReply::error(ToolError::new(ErrorCode::NotFound, "gone"));
        assert_eq!(success(&serde_json::to_vec(&failure).unwrap()), None);
        for body in [
            &b""[..],
            b"{",
            b"[]",
            b"{\"events_emitted\":0}",
            b"{\"reply\":{\"ok\":\"true\"}}",
            b"{\"reply\":{\"ok\":true,\"o\\u006b\":false}}",
            b"{\"reply\":[1]}",
            b"{\"reply\":{\"ok\":true},\"events_emitted\":-1}",
        ] {
            assert_eq!(success(body), None, "{}", String::from_utf8_lossy(body));
        }
        let mut map = Map::new();
        map.insert("ok".into(), Value::Bool(true));
        let body = serde_json::to_vec(&json!({"events_emitted": 2, "reply": map})).unwrap();
        assert_eq!(
            success(&body),
            Some(RawSuccess {
                members: Vec::new(),
                events_emitted: 2
            })
        );
    }
}
