//! The result budget of PROTOCOL.md "Large data": text fields over the budget are cut to a
//! preview with `<field>_truncated`, `<field>_original_chars`, `<field>_preview_chars` beside
//! them (the whole text is kept by [`crate::outputs`]), and no reply is
//! larger than the server's `max_payload`: list results are cut to fit ([`fit_list`], with
//! `truncated: true`), and the reply path answers `limit_exceeded` ([`oversize`]) for any body
//! still too big. The byte limits of one reply, by where it goes:
//!
//! * [`reply_limit`]: a body published to its final reader (the caller, an approvals or status
//!   client);
//! * [`routed_limit`]: an `ActorReply` to the gateway, which re-wraps its members (`ok`,
//!   `invocation_id`, `dispatched_tool_name`) for the caller;
//! * [`fields_limit`]: a tool's own result fields, inside that `ActorReply`;
//! * [`listing_limit`]: the members of a reply its sender wraps in `ok` and a page's own
//!   members (`more`, `truncated`) itself: an approvals list, an audit page, the node list.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{ErrorCode, ToolError};

/// Bytes kept free below `max_payload` for NATS headers (a claim, a status) and slack.
pub const HEADER_ROOM: usize = 512;
/// Bytes the gateway may add to a routed reply's members when it passes them on: `ok`, an
/// `invocation_id` of up to 128 characters, `dispatched_tool_name`, with their quoting.
pub const GATEWAY_ROOM: usize = 1024;
/// Bytes of the `ActorReply` envelope around a tool's fields (`reply`, `ok`,
/// `events_emitted`, `not_run`).
pub const ACTOR_ROOM: usize = 512;

/// Bytes of the envelope a sender puts around a listing's members itself (`"ok":true`, a
/// page's `more` or `truncated`, the braces).
pub const ENVELOPE_ROOM: usize = 64;

/// Bytes an approval's record takes in a reply beside its arguments (`approvals.<account>.get`,
/// a gate's `Proceed` with edited arguments): arguments an approval is bound to leave this
/// much below the reply limit, so they always travel with their approval in full.
pub const APPROVAL_ROOM: usize = 8 * 1024;

/// The largest body a reply to its final reader may have.
pub fn reply_limit(max_payload: usize) -> usize {
    max_payload.saturating_sub(HEADER_ROOM)
}

/// The largest `ActorReply` an actor may send the gateway: the gateway's reply built from it
/// still fits [`reply_limit`].
pub fn routed_limit(max_payload: usize) -> usize {
    reply_limit(max_payload).saturating_sub(GATEWAY_ROOM)
}

/// The most bytes a tool's result fields may take (serialized as one JSON object), so that
/// the reply carrying them fits wherever it goes.
pub fn fields_limit(max_payload: usize) -> usize {
    routed_limit(max_payload).saturating_sub(ACTOR_ROOM)
}

/// The most bytes the members of a listing may take, its sender adding the envelope
/// ([`ENVELOPE_ROOM`]) within [`reply_limit`].
pub fn listing_limit(max_payload: usize) -> usize {
    reply_limit(max_payload).saturating_sub(ENVELOPE_ROOM)
}

/// Bytes of `value` serialized as compact JSON, without building the text.
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Wire values serialize; a failure would count what was written so far.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Cuts the array `fields[list]` to the longest prefix with which `fields` serializes within
/// `limit` bytes, and then sets `fields["truncated"] = true`; an existing `truncated: true`
/// stays. Returns whether it cut. Fields that do not fit even with an empty list are left to
/// the reply path's last guard ([`oversize`]).
pub fn fit_list(fields: &mut Map<String, Value>, list: &str, limit: usize) -> bool {
    if json_len(fields) <= limit {
        return false;
    }
    let Some(Value::Array(items)) = fields.get_mut(list) else {
        return false;
    };
    let mut items = std::mem::take(items);
    fields.insert("truncated".into(), Value::Bool(true));
    // What the object takes with an empty list (and `truncated`), then each item and its comma.
    let mut size = json_len(fields);
    let mut keep = 0;
    for (i, item) in items.iter().enumerate() {
        size += json_len(item) + usize::from(i > 0);
        if size > limit {
            break;
        }
        keep += 1;
    }
    items.truncate(keep);
    fields.insert(list.to_owned(), Value::Array(items));
    true
}

/// The `limit_exceeded` error a reply of `size` bytes gets in place of itself when the
/// server's `max_payload` allows only `limit`: PROTOCOL.md "Large data", never silence.
pub fn oversize(size: usize, limit: usize) -> ToolError {
    ToolError::new(
        ErrorCode::LimitExceeded,
        format!(
            "the reply is {size} bytes, over the {limit} bytes a NATS message may carry here (max_payload); ask for less (a narrower path, glob or line range, fewer results)"
        ),
    )
    .with("reply_bytes", size)
    .with("limit_bytes", limit)
}

/// The [`oversize`] error for a reply of `size` bytes when only `limit` fit, logged at error
/// level; `None` when it fits. The one check every reply path makes before it sends.
pub fn over_limit(size: usize, limit: usize) -> Option<ToolError> {
    if size <= limit {
        return None;
    }
    tracing::error!(
        reply_bytes = size,
        limit_bytes = limit,
        "a reply is over the NATS max_payload; answering limit_exceeded instead"
    );
    Some(oversize(size, limit))
}

/// A text cut to the budget (counted in characters, not bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub preview: String,
    pub original_chars: usize,
    pub truncated: bool,
}

impl Cut {
    pub fn preview_chars(&self) -> usize {
        if self.truncated {
            self.preview.chars().count()
        } else {
            self.original_chars
        }
    }
}

/// Cuts `text` to at most `budget_chars` characters (each counted once).
pub fn cut(text: &str, budget_chars: usize) -> Cut {
    match fits(text, budget_chars) {
        Ok(chars) => Cut {
            preview: text.to_owned(),
            original_chars: chars,
            truncated: false,
        },
        Err(end) => cut_at(text, end, budget_chars),
    }
}

/// The cut of `text` when it is over `budget_chars` characters; `None`, and nothing copied,
/// when it fits.
pub fn cut_over(text: &str, budget_chars: usize) -> Option<Cut> {
    fits(text, budget_chars)
        .err()
        .map(|end| cut_at(text, end, budget_chars))
}

/// `Ok(its length in characters)` when `text` fits in `budget_chars`, else `Err(the byte
/// offset of the first character past it)`: one pass over the text either way.
fn fits(text: &str, budget_chars: usize) -> Result<usize, usize> {
    let mut chars = 0;
    for (at, _) in text.char_indices() {
        if chars == budget_chars {
            return Err(at);
        }
        chars += 1;
    }
    Ok(chars)
}

/// `text` cut at byte `end`, after its first `budget_chars` characters.
fn cut_at(text: &str, end: usize, budget_chars: usize) -> Cut {
    Cut {
        preview: text[..end].to_owned(),
        original_chars: budget_chars + text[end..].chars().count(),
        truncated: true,
    }
}

/// Puts `field` (cut to the budget) and its `_truncated` / `_original_chars` /
/// `_preview_chars` companions into `fields`; returns whether it was cut.
pub fn insert_budgeted(
    fields: &mut Map<String, Value>,
    field: &str,
    text: &str,
    budget_chars: usize,
) -> bool {
    insert_cut(fields, field, cut(text, budget_chars))
}

/// [`insert_budgeted`] of a text the caller owns, giving it back when it was cut, to be kept
/// whole ([`crate::outputs`]) once the caller can.
pub fn insert_over(
    fields: &mut Map<String, Value>,
    field: &str,
    text: String,
    budget_chars: usize,
) -> Option<String> {
    insert_budgeted(fields, field, &text, budget_chars).then_some(text)
}

/// Puts a cut made elsewhere (a stream counted as it went) and its companions into `fields`;
/// returns whether it was cut.
pub fn insert_cut(fields: &mut Map<String, Value>, field: &str, cut: Cut) -> bool {
    let (truncated, original, preview_chars) =
        (cut.truncated, cut.original_chars, cut.preview_chars());
    // The text first, its companions right after it.
    fields.insert(field.to_owned(), Value::from(cut.preview));
    fields.insert(format!("{field}_truncated"), Value::Bool(truncated));
    fields.insert(format!("{field}_original_chars"), Value::from(original));
    fields.insert(format!("{field}_preview_chars"), Value::from(preview_chars));
    truncated
}

/// Names the file that holds the whole of `field` in `fields`' `persisted_outputs` (made when
/// missing): `entry` is `{"path", "mime_type", …}`.
pub fn insert_persisted(fields: &mut Map<String, Value>, field: &str, entry: Value) {
    let persisted = fields
        .entry("persisted_outputs")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(map) = persisted {
        map.insert(field.to_owned(), entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, budget: usize, preview: &str, original: usize, truncated: bool) {
        let got = cut(text, budget);
        assert_eq!(
            (got.preview.as_str(), got.original_chars, got.truncated),
            (preview, original, truncated),
            "{text:?} / {budget}"
        );
    }

    #[test]
    fn cuts_by_characters() {
        check("hello", 10, "hello", 5, false);
        check("hello", 5, "hello", 5, false);
        check("hello", 4, "hell", 5, true);
        check("héllo wörld", 3, "hél", 11, true);
        check("", 0, "", 0, false);
        check("ab", 0, "", 2, true);
        // cut_over agrees where the text is over, and copies nothing where it fits.
        for (text, budget) in [("hello", 4), ("héllo wörld", 3), ("ab", 0)] {
            assert_eq!(cut_over(text, budget), Some(cut(text, budget)), "{text:?}");
        }
        assert_eq!(cut_over("hello", 5), None);
        assert_eq!(cut_over("", 0), None);
    }

    fn list_of(n: usize) -> Map<String, Value> {
        let items: Vec<Value> = (0..n)
            .map(|i| Value::from(format!("item-{i:04}")))
            .collect();
        let mut fields = Map::new();
        fields.insert("path".into(), Value::from("."));
        fields.insert("entries".into(), Value::Array(items));
        fields
    }

    #[test]
    fn a_list_is_cut_to_fit_and_says_so() {
        for limit in [60, 100, 1000, 5000] {
            let mut fields = list_of(1000);
            assert!(fit_list(&mut fields, "entries", limit), "{limit}");
            assert!(json_len(&fields) <= limit, "{limit}: {}", json_len(&fields));
            assert_eq!(fields["truncated"], true);
            let kept = fields["entries"].as_array().unwrap().len();
            // One more item would not have fitted.
            let mut one_more = list_of(kept + 1);
            one_more.insert("truncated".into(), Value::Bool(true));
            assert!(json_len(&one_more) > limit, "{limit}: {kept}");
        }
        // Too small even for an empty list: emptied, and left to the reply path's guard.
        let mut tiny = list_of(3);
        assert!(fit_list(&mut tiny, "entries", 10));
        assert_eq!(tiny["entries"], serde_json::json!([]));
        let mut small = list_of(3);
        let before = small.clone();
        assert!(!fit_list(&mut small, "entries", 1000));
        assert_eq!(small, before, "a list that fits is left alone");
    }

    #[test]
    fn json_len_counts_the_compact_text() {
        let value = serde_json::json!({"a": [1, "é\"", null], "b": {"c": true}});
        assert_eq!(json_len(&value), serde_json::to_vec(&value).unwrap().len());
    }

    #[test]
    fn limits_nest() {
        let max = 1024 * 1024;
        assert!(fields_limit(max) < routed_limit(max));
        assert!(routed_limit(max) < reply_limit(max));
        assert!(reply_limit(max) < max);
        assert_eq!(fields_limit(10), 0);
    }

    #[test]
    fn companions_are_inserted() {
        let mut fields = Map::new();
        assert!(insert_budgeted(&mut fields, "stdout", "abcdef", 2));
        assert_eq!(fields["stdout"], "ab");
        assert_eq!(fields["stdout_truncated"], true);
        assert_eq!(fields["stdout_original_chars"], 6);
        assert_eq!(fields["stdout_preview_chars"], 2);
    }
}
