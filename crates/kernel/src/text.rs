//! Text a person reads: names and values made display-safe and shortened with a marker that
//! says what is hidden. PROTOCOL.md "Display-safe text".
//!
//! Tool results keep every path and value exact (a tool must be able to pass a name back);
//! what a person reads — approval previews, `error_message`, the command line's output — goes
//! through [`display_safe`], so a file called `rtl\u202etxt.exe` cannot show as `rtlexe.txt`
//! and a control character cannot rewrite a terminal line.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;

/// `text` with the secrets a URL may carry taken out of every URL in it: the userinfo
/// (`https://user:pw@host` → `https://***@host`), the query and the fragment (`?api_key=…` →
/// `?***`). Error texts of HTTP clients name the URL they failed on, and a status or a log
/// line must not hand its credentials to whoever reads it (PROTOCOL.md "Tenancy and trust",
/// "No secret in a reply").
pub fn redact_urls(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut changed = false;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters, digits, `+`, `-`, `.` just before `://`.
        let scheme_start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let after = at + 3;
        let end = rest[after..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |i| after + i);
        if scheme_start == at {
            // No scheme: not a URL; keep the `://` and go on after it.
            out.push_str(&rest[..after]);
            rest = &rest[after..];
            continue;
        }
        out.push_str(&rest[..after]);
        let url = &rest[after..end];
        // The authority ends at the first `/`, `?` or `#`.
        let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let (authority, tail) = url.split_at(authority_end);
        match authority.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&authority[at..]);
                changed = true;
            }
            None => out.push_str(authority),
        }
        match tail.find(['?', '#']) {
            Some(q) => {
                // Keep a closing bracket or punctuation that ends the sentence, not the URL.
                let trailing = tail[q..]
                    .rfind(|c: char| !matches!(c, ')' | ']' | '}' | ',' | ';' | '.' | ':'))
                    .map_or(q, |i| q + i + 1);
                out.push_str(&tail[..q]);
                out.push_str(&tail[q..q + 1]);
                out.push_str("***");
                out.push_str(&tail[trailing..]);
                changed = true;
            }
            None => out.push_str(tail),
        }
        rest = &rest[end..];
    }
    if !changed {
        return Cow::Borrowed(text);
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Whether `c` is escaped in display-safe text: control characters (C0, DEL, C1),
/// bidirectional controls (U+061C, U+200E/F, U+202A–E, U+2066–9) and the invisible format
/// characters that make two different names look alike (soft hyphen, zero-width characters,
/// line and paragraph separators, word joiners, the byte order mark, interlinear annotations,
/// tag characters).
pub fn is_hidden_char(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{ad}'
        | '\u{61c}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e007f}')
}

/// `text` with every [`is_hidden_char`] written as a JSON escape (`\u202e`; a surrogate pair
/// past U+FFFF), everything else unchanged. Applied to JSON text it gives JSON of the same
/// value (inside a JSON string such an escape means the character itself), so
/// `display_safe(serde_json::to_string(v))` is a safe rendering of `v` that parses back to `v`.
/// Idempotent: the escapes are printable ASCII.
pub fn display_safe(text: &str) -> Cow<'_, str> {
    escape(text, is_hidden_char)
}

/// A name a caller or a sandbox chose (a file name, a tool or skill name, an approver), as a
/// log field: written [`display_safe`], so a log line cannot be forged with a newline, an ANSI
/// escape or a bidirectional control. `tracing::warn!(path = %DisplaySafe(&path), "…")`; it
/// takes anything that is `Display` and escapes what that writes, without copying it first.
#[derive(Debug, Clone, Copy)]
pub struct DisplaySafe<T>(pub T);

impl<T: std::fmt::Display> std::fmt::Display for DisplaySafe<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        /// Escapes each piece `T` writes; a piece is whole characters, so nothing splits.
        struct Escaping<'a, 'b>(&'a mut std::fmt::Formatter<'b>);
        impl std::fmt::Write for Escaping<'_, '_> {
            fn write_str(&mut self, piece: &str) -> std::fmt::Result {
                self.0.write_str(&display_safe(piece))
            }
        }
        write!(Escaping(f), "{}", self.0)
    }
}

/// `text` with every character for which `hidden` holds written as a JSON escape.
fn escape(text: &str, hidden: fn(char) -> bool) -> Cow<'_, str> {
    let Some(first) = text.find(hidden) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if hidden(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Compact JSON of `value`, display-safe ([`display_safe`]); it parses back to `value`.
pub fn display_json(value: &Value) -> String {
    display_safe(&value.to_string()).into_owned()
}

/// Pretty-printed JSON of `value`, display-safe; it parses back to `value`. Its line breaks
/// are the layout's own: serde_json already escapes every C0 control inside a string.
pub fn display_json_pretty(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    escape(&text, |c| is_hidden_char(c) && c >= ' ').into_owned()
}

/// The marker that stands for `hidden` characters cut out of a text.
fn hidden_marker(hidden: usize) -> String {
    format!("…({hidden} chars hidden)…")
}

/// `text` cut to `max_chars` characters of its own — the first and the last halves — with
/// `…(N chars hidden)…` between them when something was cut; unchanged when it fits.
pub fn shorten_middle(text: &str, max_chars: usize) -> Cow<'_, str> {
    let total = text.chars().count();
    if total <= max_chars {
        return Cow::Borrowed(text);
    }
    let (head, tail) = ends(text, total, max_chars);
    Cow::Owned(format!("{head}{}{tail}", hidden_marker(total - max_chars)))
}

/// The first `max_chars / 2` (rounded up) and the last `max_chars / 2` characters of `text`,
/// which has `total` characters, more than `max_chars`.
fn ends(text: &str, total: usize, max_chars: usize) -> (&str, &str) {
    let head_chars = max_chars.div_ceil(2);
    let tail_chars = max_chars - head_chars;
    let byte_at = |n: usize| text.char_indices().nth(n).map_or(text.len(), |(i, _)| i);
    (
        &text[..byte_at(head_chars)],
        &text[byte_at(total - tail_chars)..],
    )
}

/// How much of a value a rendering shows at one level of detail.
#[derive(Debug, Clone, Copy)]
struct Detail {
    /// Characters of a string value shown (its two ends).
    string: usize,
    /// Characters of a member name shown.
    key: usize,
    /// Members or items of a nested object or array shown (the rest are counted).
    items: usize,
    /// Levels of nesting shown (deeper containers are counted).
    depth: usize,
}

/// From most to least detail: a rendering takes the first that fits its bound.
const DETAILS: [Detail; 6] = [
    Detail {
        string: 256,
        key: 64,
        items: 32,
        depth: 8,
    },
    Detail {
        string: 120,
        key: 48,
        items: 16,
        depth: 5,
    },
    Detail {
        string: 48,
        key: 32,
        items: 8,
        depth: 4,
    },
    Detail {
        string: 24,
        key: 24,
        items: 4,
        depth: 3,
    },
    Detail {
        string: 10,
        key: 16,
        items: 2,
        depth: 2,
    },
    Detail {
        string: 4,
        key: 12,
        items: 1,
        depth: 1,
    },
];

/// A one-line, display-safe rendering of `value` in at most `max_chars` characters, for a
/// person. JSON-like: strings are JSON-quoted and display-safe; a string longer than the
/// detail allows shows its two ends around `…(N chars hidden)…`, outside the quotes so no
/// content can imitate it (a quote inside a string is always `\"`); a container with more
/// members than shown ends with `…(+N members)` / `…(+N items)`; a container nested deeper
/// than shown is `{…(N members)}` / `[…(N items)]`. With `all_top_members`, every member of
/// the top object (or item of the top array) is shown whatever the detail, so none can hide
/// behind another's length. When even the least detail passes `max_chars`, the text is cut at
/// the end with `…(N chars hidden)` (the marker alone when `max_chars` is shorter than it).
pub fn preview_value(value: &Value, max_chars: usize, all_top_members: bool) -> String {
    let mut last = String::new();
    for detail in DETAILS {
        let mut out = String::new();
        render(value, detail, 0, all_top_members, &mut out);
        if out.chars().count() <= max_chars {
            return out;
        }
        last = out;
    }
    let total = last.chars().count();
    let marker = |hidden: usize| format!("…({hidden} chars hidden)");
    // The marker for `total` is at least as long as the one finally written.
    let keep = max_chars.saturating_sub(marker(total).chars().count());
    let cut = last.char_indices().nth(keep).map_or(last.len(), |(i, _)| i);
    last.truncate(cut);
    last.push_str(&marker(total - keep));
    last
}

/// The entries of an array (no keys) or an object.
type Entries<'a> = Box<dyn ExactSizeIterator<Item = (Option<&'a String>, &'a Value)> + 'a>;

fn render(value: &Value, detail: Detail, depth: usize, all_top: bool, out: &mut String) {
    let (open, close, noun, entries): (char, char, &str, Entries) = match value {
        Value::String(s) => return quoted(s, detail.string, out),
        Value::Array(items) => ('[', ']', "items", Box::new(items.iter().map(|v| (None, v)))),
        Value::Object(members) => (
            '{',
            '}',
            "members",
            Box::new(members.iter().map(|(k, v)| (Some(k), v))),
        ),
        scalar => return out.push_str(&scalar.to_string()),
    };
    let len = entries.len();
    let show_all = all_top && depth == 0;
    if depth >= detail.depth && len > 0 && !show_all {
        let _ = write!(out, "{open}…({len} {noun}){close}");
        return;
    }
    let shown = if show_all { len } else { len.min(detail.items) };
    out.push(open);
    for (i, (key, entry)) in entries.take(shown).enumerate() {
        if i > 0 {
            out.push(',');
        }
        if let Some(key) = key {
            quoted(key, detail.key, out);
            out.push(':');
        }
        render(entry, detail, depth + 1, all_top, out);
    }
    if shown < len {
        if shown > 0 {
            out.push(',');
        }
        let _ = write!(out, "…(+{} {noun})", len - shown);
    }
    out.push(close);
}

/// `s` as a display-safe JSON string, or its two ends as two such strings around the marker.
fn quoted(s: &str, max_chars: usize, out: &mut String) {
    fn piece(text: &str, out: &mut String) {
        let json = Value::from(text).to_string();
        out.push_str(&display_safe(&json));
    }
    let total = s.chars().count();
    if total <= max_chars {
        piece(s, out);
        return;
    }
    let (head, tail) = ends(s, total, max_chars);
    piece(head, out);
    out.push_str(&hidden_marker(total - max_chars));
    piece(tail, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hidden_characters_are_escaped_and_the_rest_is_kept() {
        assert_eq!(display_safe("plain é 日本 ✓"), "plain é 日本 ✓");
        assert!(matches!(display_safe("plain"), Cow::Borrowed(_)));
        assert_eq!(display_safe("rtl\u{202e}txt.exe"), "rtl\\u202etxt.exe");
        assert_eq!(
            display_safe("a\u{0}b\u{1b}[2Jc\u{7f}\u{85}"),
            "a\\u0000b\\u001b[2Jc\\u007f\\u0085"
        );
        for c in [
            '\u{61c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{2066}', '\u{2069}', '\u{200b}',
            '\u{feff}', '\u{2028}',
        ] {
            let shown = display_safe(&c.to_string()).into_owned();
            assert_eq!(shown, format!("\\u{:04x}", c as u32), "{c:?}");
        }
        // A tag character (past U+FFFF) becomes a JSON surrogate pair.
        assert_eq!(display_safe("\u{e0041}"), "\\udb40\\udc41");
        // Idempotent.
        let once = display_safe("x\u{202e}y").into_owned();
        assert_eq!(display_safe(&once), once);
    }

    #[test]
    fn display_json_parses_back_to_the_same_value() {
        let value = json!({"name": "rtl\u{202e}txt.exe", "ctl": "\u{1b}\u{85}\u{7f}", "tag": "\u{e0041}", "k\u{2066}": [1, "\\u202e"]});
        let text = display_json(&value);
        assert!(!text.chars().any(is_hidden_char), "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), value);
        let pretty = display_json_pretty(&value);
        assert!(
            !pretty.chars().any(|c| is_hidden_char(c) && c != '\n'),
            "{pretty}"
        );
        assert_eq!(serde_json::from_str::<Value>(&pretty).unwrap(), value);
    }

    #[test]
    fn shorten_middle_keeps_both_ends_and_counts_the_rest() {
        assert_eq!(shorten_middle("short", 10), "short");
        assert_eq!(shorten_middle("abcdefghij", 4), "ab…(6 chars hidden)…ij");
        assert_eq!(shorten_middle("héllo wörld", 5), "hél…(6 chars hidden)…ld");
        assert_eq!(shorten_middle("abc", 0), "…(3 chars hidden)…");
    }

    #[test]
    fn a_value_preview_is_bounded_and_counts_what_it_hides() {
        let value = json!({"files": (0..1000).map(|i| json!({"path": format!("f{i}"), "content": "x".repeat(5000)})).collect::<Vec<_>>()});
        let shown = preview_value(&value, 300, true);
        assert!(shown.chars().count() <= 300, "{shown}");
        assert!(
            shown.contains("hidden") || shown.contains("items)"),
            "{shown}"
        );
        let deep = json!([[[[[[[[[["bottom"]]]]]]]]]]);
        let shown = preview_value(&deep, 1000, false);
        assert!(shown.contains("[…(1 items)]"), "{shown}");
        let tiny = preview_value(&json!({"a": "b".repeat(100)}), 12, true);
        assert!(tiny.chars().count() <= 12 + 24, "{tiny}");
        assert!(tiny.contains("hidden"), "{tiny}");
    }

    #[test]
    fn a_marker_cannot_be_imitated_by_content() {
        let forged = json!({"a": "x\"…(5 chars hidden)…\"y"});
        let shown = preview_value(&forged, 1000, true);
        assert_eq!(shown, r#"{"a":"x\"…(5 chars hidden)…\"y"}"#);
    }

    /// A name with a newline and an ANSI escape, logged through [`DisplaySafe`], stays on its
    /// one log line and shows its escapes, in both of a node's log formats; so does a
    /// `ToolError` quoting it.
    #[test]
    fn a_logged_name_cannot_forge_a_log_line() {
        let name = "ok.txt\n2026-12-01T00:00:00Z  INFO forged\u{1b}[2K\u{202e}";
        let error = crate::ToolError::new(crate::ErrorCode::NotFound, format!("no '{name}'"));
        for json in [false, true] {
            let logs = toolmesh_testkit::captured_logs(json, || {
                tracing::warn!(path = %DisplaySafe(name), error = %error, "not pulled");
            });
            assert_eq!(logs.lines().count(), 1, "{logs}");
            assert!(!logs.contains(['\u{1b}', '\u{202e}']), "{logs}");
            let escaped = if json { r"\\u000a" } else { r"\u000a" };
            assert_eq!(logs.matches(escaped).count(), 2, "{logs}");
        }
        assert_eq!(
            DisplaySafe(format_args!("{}-{}", "a\n", 1)).to_string(),
            "a\\u000a-1"
        );
    }

    #[test]
    fn urls_lose_their_credentials_query_and_fragment() {
        let cases = [
            (
                "error sending request for url (http://mcp.example/mcp?api_key=s3cret)",
                "error sending request for url (http://mcp.example/mcp?***)",
            ),
            (
                "connect https://bob:pw@host:8443/x#tok failed",
                "connect https://***@host:8443/x#*** failed",
            ),
            (
                "see \"nats://u:p@10.0.0.1:4222\".",
                "see \"nats://***@10.0.0.1:4222\".",
            ),
            ("no url here: a://", "no url here: a://"),
            (
                "plain http://host/path stays",
                "plain http://host/path stays",
            ),
            ("://x?y", "://x?y"),
        ];
        for (text, want) in cases {
            assert_eq!(redact_urls(text), want, "{text}");
        }
        assert!(matches!(redact_urls("http://host/a b"), Cow::Borrowed(_)));
    }
}
