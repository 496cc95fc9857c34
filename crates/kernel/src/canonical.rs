//! The approval binding hash: hex sha256 of the RFC 8785 (JCS) canonical JSON of the arguments.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `arguments_sha256` of PROTOCOL.md.
pub fn arguments_sha256(arguments: &Value) -> String {
    let canonical = serde_json_canonicalizer::to_vec(arguments)
        .expect("a serde_json::Value always canonicalizes");
    sha256_hex(&canonical)
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        use std::fmt::Write;
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// Largest integer magnitude a JCS number (an IEEE double) holds exactly: 2^53.
const EXACT_INTEGER_LIMIT: u64 = 1 << 53;

/// `invalid_arguments` at the first number of `arguments` an approval cannot be bound to
/// exactly ([`inexact_number`]): what a gated call and a reviewer's edited arguments meet.
pub fn bindable(arguments: &Value) -> Result<(), crate::error::ToolError> {
    match inexact_number(arguments) {
        None => Ok(()),
        Some(pointer) => Err(crate::error::ToolError::invalid_argument(
            &pointer,
            "an integer past ±2^53 cannot be bound to an approval exactly (its hash would be its neighbours'); send a smaller number or a string",
        )),
    }
}

/// The JSON pointer of the first number in `value` that JCS cannot represent exactly: an
/// integer past ±2^53, which canonicalizes as the nearest double and so shares its hash with
/// its neighbours. An approval bound to such arguments would let a different number through.
pub fn inexact_number(value: &Value) -> Option<String> {
    match value {
        Value::Number(n) => {
            let exact = match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => u <= EXACT_INTEGER_LIMIT,
                (None, Some(i)) => i.unsigned_abs() <= EXACT_INTEGER_LIMIT,
                // A float was already rounded to a double when it was parsed: the tool and
                // the hash see the same value.
                (None, None) => true,
            };
            (!exact).then(String::new)
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| inexact_number(item).map(|rest| format!("/{i}{rest}"))),
        Value::Object(members) => members.iter().find_map(|(key, member)| {
            let key = key.replace('~', "~0").replace('/', "~1");
            inexact_number(member).map(|rest| format!("/{key}{rest}"))
        }),
        _ => None,
    }
}

/// Characters of an `arguments_preview` at most.
pub const PREVIEW_MAX_CHARS: usize = 2000;

/// `arguments_preview` of PROTOCOL.md: a one-line, display-safe view of the arguments for a
/// person deciding an approval, at most `max_chars` characters. Every member of the
/// arguments object is shown, each value shortened by itself (a long string shows its two
/// ends around `…(N chars hidden)…`), so a long value never pushes another member out of
/// sight; nested containers show what fits and count the rest. See [`crate::text::preview_value`].
pub fn arguments_preview(arguments: &Value, max_chars: usize) -> String {
    crate::text::preview_value(arguments, max_chars, true)
}

/// `text` cut to `max_chars` characters, with a visible `…` when something was cut.
pub fn shorten(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_number_spelling_do_not_change_the_hash() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,2],"x":"é"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"\u00e9","y":[1,2.0]},"b":1.0}"#).unwrap();
        assert_eq!(arguments_sha256(&a), arguments_sha256(&b));
        assert_ne!(arguments_sha256(&a), arguments_sha256(&json!({"b": 2})));
    }

    #[test]
    fn known_vector() {
        // sha256 of the 2 bytes `{}`
        assert_eq!(
            arguments_sha256(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn integers_past_2_pow_53_are_found_where_they_are() {
        let check = |value: Value, expect: Option<&str>| {
            assert_eq!(inexact_number(&value).as_deref(), expect, "{value}");
        };
        check(json!({"n": 9007199254740992_u64}), None);
        check(json!({"n": -9007199254740992_i64}), None);
        check(json!({"n": 1.5e300}), None);
        check(json!({"n": 9007199254740993_u64}), Some("/n"));
        check(
            json!({"a": [1, {"b/c": -9007199254740993_i64}]}),
            Some("/a/1/b~1c"),
        );
        check(json!([u64::MAX]), Some("/0"));
        // They do collide: that is what the check is for.
        assert_eq!(
            arguments_sha256(&json!({"n": 9007199254740992_u64})),
            arguments_sha256(&json!({"n": 9007199254740993_u64}))
        );
    }

    #[test]
    fn preview_is_bounded() {
        let long = json!({"content": "x".repeat(100_000), "more": (0..10_000).collect::<Vec<_>>()});
        let shown = arguments_preview(&long, 200);
        assert!(shown.chars().count() <= 200, "{shown}");
        assert!(shown.contains("\"more\""), "{shown}");
    }

    /// Issue 16: `echo harmless` + 600 spaces + `; rm -rf /workspace/*` showed as a harmless
    /// echo in the first 500 characters.
    #[test]
    fn padding_does_not_hide_the_end_of_a_command() {
        let command = format!("echo harmless{}; rm -rf /workspace/*", " ".repeat(600));
        let shown = arguments_preview(&json!({ "command": command }), PREVIEW_MAX_CHARS);
        assert!(shown.contains("; rm -rf /workspace/*"), "{shown}");
        assert!(shown.contains("chars hidden"), "{shown}");
        // Even with a preview much shorter than the command.
        let shown = arguments_preview(&json!({ "command": command }), 100);
        assert!(shown.contains("/workspace/*\""), "{shown}");
    }

    /// Issue 16: an `env` member after a long command was past the cut.
    #[test]
    fn every_member_is_shown_however_long_the_one_before() {
        let arguments = json!({
            "command": "make ".repeat(100_000),
            "env": {"LD_PRELOAD": "/workspace/evil.so"},
            "timeout": 30,
        });
        let shown = arguments_preview(&arguments, PREVIEW_MAX_CHARS);
        assert!(shown.chars().count() <= PREVIEW_MAX_CHARS, "{shown}");
        assert!(
            shown.contains(r#""env":{"LD_PRELOAD":"/workspace/evil.so"}"#),
            "{shown}"
        );
        assert!(shown.contains(r#""timeout":30"#), "{shown}");
        // A short preview keeps every member name too.
        let shown = arguments_preview(&arguments, 120);
        assert!(
            shown.contains(r#""env":"#) && shown.contains(r#""timeout":30"#),
            "{shown}"
        );
    }

    #[test]
    fn control_and_bidirectional_characters_are_escaped() {
        let arguments = json!({
            "path": "rtl\u{202e}txt.exe",
            "n\u{2066}ame": "a\u{1b}[2J\u{85}b\u{200f}",
        });
        let shown = arguments_preview(&arguments, PREVIEW_MAX_CHARS);
        assert_eq!(
            shown,
            r#"{"path":"rtl\u202etxt.exe","n\u2066ame":"a\u001b[2J\u0085b\u200f"}"#
        );
        assert!(!shown.chars().any(crate::text::is_hidden_char));
    }
}
