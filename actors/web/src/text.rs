//! From a response body to the `text` of `web_fetch`: the charset of `Content-Type`, HTML
//! parsed with a real parser (html5ever, through scraper) with `script`, `style`,
//! `noscript` and `template` dropped, block elements on lines of their own, runs of
//! whitespace collapsed; plain text, JSON, XML and the like passed through as they are.

use ego_tree::iter::Edge;
use scraper::{Html, Node};

/// How a body is turned into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Html,
    Plain,
}

/// `text/html; charset=utf-8` → (`text/html`, `Some("utf-8")`).
pub fn parse_content_type(value: &str) -> (String, Option<String>) {
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let charset = parts.find_map(|param| {
        let (key, value) = param.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches('"').to_owned())
    });
    (essence, charset)
}

/// How to read a body of media type `essence` (lowercase, no parameters; empty when the
/// response named none), or `None` when it is not text.
pub fn kind_of(essence: &str, body: &[u8]) -> Option<Kind> {
    match essence {
        "text/html" | "application/xhtml+xml" => Some(Kind::Html),
        "" | "application/octet-stream" | "binary/octet-stream" => sniff(body),
        e if e.starts_with("text/") => Some(Kind::Plain),
        e if e.ends_with("+json") || e.ends_with("+xml") || e.ends_with("+yaml") => {
            Some(Kind::Plain)
        }
        "application/json"
        | "application/ld+json"
        | "application/x-ndjson"
        | "application/xml"
        | "application/javascript"
        | "application/x-javascript"
        | "application/ecmascript"
        | "application/yaml"
        | "application/x-yaml"
        | "application/toml"
        | "application/x-sh"
        | "application/sql"
        | "application/graphql" => Some(Kind::Plain),
        _ => None,
    }
}

/// A body with no useful type: HTML when it starts like HTML, text when it has no NUL byte
/// in its first KiB, else not text.
fn sniff(body: &[u8]) -> Option<Kind> {
    let head = &body[..body.len().min(1024)];
    if head.contains(&0) {
        return None;
    }
    let start = String::from_utf8_lossy(head);
    let start = start.trim_start().to_ascii_lowercase();
    if start.starts_with("<!doctype html") || start.starts_with("<html") {
        Some(Kind::Html)
    } else {
        Some(Kind::Plain)
    }
}

/// Decodes `body` in `charset` (UTF-8 when absent or unknown; a BOM wins). When the body was
/// cut short, a character split by the cut is dropped rather than shown as U+FFFD.
pub fn decode(body: &[u8], charset: Option<&str>, cut_short: bool) -> String {
    let encoding = charset
        .and_then(|label| encoding_rs::Encoding::for_label(label.as_bytes()))
        .unwrap_or(encoding_rs::UTF_8);
    let mut decoder = encoding.new_decoder();
    let mut out = String::with_capacity(
        decoder
            .max_utf8_buffer_length(body.len())
            .unwrap_or(body.len()),
    );
    let (_, _, _) = decoder.decode_to_string(body, &mut out, !cut_short);
    out
}

/// Elements whose content is never text a reader sees.
const SKIPPED: &[&str] = &["script", "style", "noscript", "template"];

/// Elements that stand on lines of their own (and [`HEADINGS`]).
const BLOCKS: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "body",
    "caption",
    "dd",
    "details",
    "dialog",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "summary",
    "table",
    "tbody",
    "thead",
    "tfoot",
    "title",
    "tr",
    "ul",
];

/// Headings: blocks followed by a blank line, as [`PARAGRAPHS`] are.
const HEADINGS: &[&str] = &["h1", "h2", "h3", "h4", "h5", "h6"];

/// Elements followed by a blank line (and [`HEADINGS`]).
const PARAGRAPHS: &[&str] = &["p", "pre", "blockquote", "table", "title", "ul", "ol"];

/// Whether `name` starts and ends a line: [`BLOCKS`] and [`HEADINGS`].
fn is_block(name: &str) -> bool {
    BLOCKS.contains(&name) || HEADINGS.contains(&name)
}

/// Builds text: inline whitespace collapsed to one space, lines trimmed, at most one blank
/// line in a row.
#[derive(Default)]
struct TextBuilder {
    out: String,
    /// A space is due before the next word on the current line.
    space: bool,
}

impl TextBuilder {
    fn at_line_start(&self) -> bool {
        self.out.is_empty() || self.out.ends_with('\n')
    }

    fn word_text(&mut self, text: &str) {
        for c in text.chars() {
            if c.is_whitespace() {
                self.space = true;
            } else {
                if self.space && !self.at_line_start() {
                    self.out.push(' ');
                }
                self.space = false;
                self.out.push(c);
            }
        }
    }

    fn pre_text(&mut self, text: &str) {
        if self.space && !self.at_line_start() {
            self.out.push(' ');
        }
        self.space = false;
        self.out.push_str(&text.replace("\r\n", "\n"));
    }

    fn line_break(&mut self) {
        self.space = false;
        let trimmed = self.out.trim_end_matches([' ', '\t']).len();
        self.out.truncate(trimmed);
        self.out.push('\n');
    }

    /// A line break unless the line is empty already.
    fn end_line(&mut self) {
        if !self.at_line_start() {
            self.line_break();
        }
        self.space = false;
    }

    fn blank_line(&mut self) {
        self.end_line();
        if !self.out.is_empty() && !self.out.ends_with("\n\n") {
            self.out.push('\n');
        }
    }

    fn finish(self) -> String {
        let mut text = String::with_capacity(self.out.len());
        let mut blank_run = 0;
        for line in self.out.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                blank_run += 1;
                if blank_run > 1 {
                    continue;
                }
            } else {
                blank_run = 0;
            }
            text.push_str(line);
            text.push('\n');
        }
        text.trim_matches('\n').to_owned()
    }
}

/// The readable text of an HTML document.
pub fn html_to_text(html: &str) -> String {
    let document = Html::parse_document(html);
    let mut builder = TextBuilder::default();
    // Depth inside skipped elements, and inside `pre`.
    let mut skipped = 0usize;
    let mut pre = 0usize;
    for edge in document.tree.root().traverse() {
        match edge {
            Edge::Open(node) => match node.value() {
                Node::Element(element) => {
                    let name = element.name();
                    if SKIPPED.contains(&name) {
                        skipped += 1;
                    } else if skipped == 0 {
                        match name {
                            "br" => builder.line_break(),
                            "td" | "th" => builder.space = true,
                            _ if is_block(name) => builder.end_line(),
                            _ => {}
                        }
                        if name == "pre" {
                            pre += 1;
                        }
                    }
                }
                Node::Text(text) if skipped == 0 => {
                    if pre > 0 {
                        builder.pre_text(text);
                    } else {
                        builder.word_text(text);
                    }
                }
                _ => {}
            },
            Edge::Close(node) => {
                if let Node::Element(element) = node.value() {
                    let name = element.name();
                    if SKIPPED.contains(&name) {
                        skipped = skipped.saturating_sub(1);
                    } else if skipped == 0 {
                        if name == "pre" {
                            pre = pre.saturating_sub(1);
                        }
                        if PARAGRAPHS.contains(&name) || HEADINGS.contains(&name) {
                            builder.blank_line();
                        } else if is_block(name) {
                            builder.end_line();
                        } else if matches!(name, "td" | "th") {
                            builder.space = true;
                        }
                    }
                }
            }
        }
    }
    builder.finish()
}

/// Plain text as it came, with `\r\n` made `\n`.
pub fn plain_text(text: String) -> String {
    if text.contains('\r') {
        text.replace("\r\n", "\n")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(html: &str, expect: &str) {
        assert_eq!(html_to_text(html), expect, "{html}");
    }

    #[test]
    fn scripts_styles_and_noscript_are_dropped() {
        check(
            "<html><head><title>T</title><style>body{color:red}</style>\
             <script>var secret = 1;</script></head>\
             <body><p>Hello <b>world</b></p><noscript>enable js</noscript>\
             <script type=\"module\">alert('x')</script><template><p>tpl</p></template></body></html>",
            "T\n\nHello world",
        );
        // A script that looks like closing tags is still one script to a real parser.
        check(
            "<p>a</p><script>document.write('</p><p>evil')</script><p>b</p>",
            "a\n\nb",
        );
        check("<p>x<!-- a comment --></p>", "x");
    }

    #[test]
    fn whitespace_is_collapsed_and_blocks_break_lines() {
        check(
            "<div>  one\n\n   two  </div><div>three</div>",
            "one two\nthree",
        );
        check(
            "<h1>Title</h1><p>para   one</p><p>para two</p>",
            "Title\n\npara one\n\npara two",
        );
        check("<ul><li>a</li><li>b</li></ul><p>after</p>", "a\nb\n\nafter");
        check("line<br>next<br/>last", "line\nnext\nlast");
        check(
            "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>",
            "a b\nc d",
        );
        check(
            "<span>in</span><span>line</span> <i>words</i>",
            "inline words",
        );
        check(
            "<pre>  keep\n    indent</pre><p>x</p>",
            "  keep\n    indent\n\nx",
        );
        check("", "");
        check("&lt;tag&gt; &amp; &eacute;", "<tag> & é");
    }

    #[test]
    fn content_types_decide_the_reading() {
        let (essence, charset) = parse_content_type("Text/HTML; Charset=\"ISO-8859-1\"");
        assert_eq!(
            (essence.as_str(), charset.as_deref()),
            ("text/html", Some("ISO-8859-1"))
        );
        assert_eq!(kind_of("text/html", b""), Some(Kind::Html));
        assert_eq!(kind_of("text/plain", b""), Some(Kind::Plain));
        assert_eq!(kind_of("application/json", b""), Some(Kind::Plain));
        assert_eq!(kind_of("application/problem+json", b""), Some(Kind::Plain));
        assert_eq!(kind_of("image/png", b"\x89PNG"), None);
        assert_eq!(kind_of("", b"  <!DOCTYPE html><p>x"), Some(Kind::Html));
        assert_eq!(kind_of("", b"just text"), Some(Kind::Plain));
        assert_eq!(kind_of("application/octet-stream", b"a\0b"), None);
    }

    #[test]
    fn bodies_are_decoded_in_their_charset() {
        assert_eq!(decode(b"caf\xe9", Some("iso-8859-1"), false), "café");
        assert_eq!(decode("café".as_bytes(), None, false), "café");
        assert_eq!(decode(b"\xef\xbb\xbfbom", None, false), "bom");
        // A multi-byte character cut in half by the byte cap is dropped, not mangled.
        assert_eq!(decode(&"aé".as_bytes()[..2], None, true), "a");
        assert_eq!(decode(&"aé".as_bytes()[..2], None, false), "a\u{fffd}");
        assert_eq!(plain_text("a\r\nb".into()), "a\nb");
    }
}
