//! The engine of `lint_workspace_file`, lightweight built-in checks: a pure function from a
//! file's bytes and a [`Language`] to a list of issues. Python is parsed in-process with
//! `rustpython-parser` (no interpreter to shell out to), JSON with serde_json; every language
//! also gets the byte-level checks (NUL bytes, invalid UTF-8, trailing whitespace). Not a
//! formatter and not a project's lint setup.

use std::path::Path;

use rustpython_parser::lexer::{lex, LexicalErrorType};
use rustpython_parser::{parse, Mode, ParseErrorType, Tok};
use serde::Serialize;

/// The fixed `lint_model` of every reply.
pub const LINT_MODEL: &str = "built_in_lightweight";
/// Trailing-whitespace warnings listed one by one; past this, one warning counts the rest, so a
/// file full of them cannot flood the reply.
pub const MAX_WHITESPACE_WARNINGS: usize = 200;

/// Python sources larger than this are not parsed; a warning says so (see `lint_python`).
pub const MAX_PYTHON_PARSE_BYTES: usize = 4 << 20;

const BOM: &str = "\u{feff}";
/// The parser's thread gets this stack plus [`PARSE_STACK_PER_BYTE`] per byte of source.
const PARSE_STACK_BASE: usize = 32 << 20;
/// rustpython's AST is freed recursively, one frame per nesting level (measured: 64 bytes a
/// level in release builds, 192 in debug ones), and a level takes at least one byte of source
/// (`-` * n, `[` * n), so this many bytes of stack per byte of source cannot overflow.
const PARSE_STACK_PER_BYTE: usize = 256;

/// The language a file is checked as; `Auto` picks it by the path's extension
/// ([`effective_language`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Auto,
    Python,
    Json,
    Markdown,
    Text,
}

/// How bad an issue is; only errors make the tool answer `lint_errors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LintLevel {
    Error,
    Warning,
}

impl LintLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LintLevel::Error => "error",
            LintLevel::Warning => "warning",
        }
    }
}

/// One finding, serialised as the protocol's `{"line","column","level","message"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LintIssue {
    /// 1-based.
    pub line: u64,
    /// 1-based, in characters (not bytes).
    pub column: u64,
    pub level: LintLevel,
    pub message: String,
}

/// The result of [`lint`]: the language actually checked (`auto` resolved) and the issues,
/// errors first, each level in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LintReport {
    pub language: &'static str,
    pub issues: Vec<LintIssue>,
}

/// Whether any issue is an error (the tool then answers `lint_errors`).
pub fn has_errors(report: &LintReport) -> bool {
    report.issues.iter().any(|i| i.level == LintLevel::Error)
}

/// The language `auto` stands for, by the path's extension (case-insensitive).
pub fn effective_language(path: &str, language: Language) -> Language {
    if language != Language::Auto {
        return language;
    }
    let extension = Path::new(path)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("py" | "pyi") => Language::Python,
        Some("json") => Language::Json,
        Some("md" | "markdown") => Language::Markdown,
        _ => Language::Text,
    }
}

fn language_name(language: Language) -> &'static str {
    match language {
        Language::Python => "python",
        Language::Json => "json",
        Language::Markdown => "markdown",
        Language::Text | Language::Auto => "text",
    }
}

/// Checks `content` (the bytes of the file at `path`) as `language`.
pub fn lint(path: &str, content: &[u8], language: Language) -> LintReport {
    let language = effective_language(path, language);
    let mut issues = Vec::new();
    // A UTF-8 byte order mark is invisible in an editor, so it is never a column: every check
    // runs on the bytes after it.
    let bom = content.starts_with(BOM.as_bytes());
    let content = if bom { &content[BOM.len()..] } else { content };

    let nul = content.iter().position(|&b| b == 0);
    if let Some(offset) = nul {
        let (line, column) = locate_bytes(content, offset);
        let count = content.iter().filter(|&&b| b == 0).count();
        issues.push(error(
            line,
            column,
            format!("NUL byte in the file ({count} in total); is it a binary file?"),
        ));
    }
    let text = match std::str::from_utf8(content) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(e) => {
            let (line, column) = locate_bytes(content, e.valid_up_to());
            issues.push(error(
                line,
                column,
                format!(
                    "the file is not valid UTF-8 (first bad byte at offset {})",
                    e.valid_up_to()
                ),
            ));
            String::from_utf8_lossy(content)
        }
    };

    // The parsers run only on clean text: with NUL bytes or bad UTF-8 the byte-level error is
    // the cause, and a parser error on top would point at the same place or be noise.
    let clean = issues.is_empty();
    if clean {
        match language {
            Language::Python => issues.extend(lint_python(path, &text)),
            Language::Json => issues.extend(lint_json(&text, bom)),
            Language::Markdown | Language::Text | Language::Auto => {}
        }
    }
    issues.extend(trailing_whitespace(&text, language));

    // Errors decide the outcome and must survive any cut of a long list, so they come first.
    issues.sort_by_key(|i| (i.level, i.line, i.column));
    LintReport {
        language: language_name(language),
        issues,
    }
}

fn error(line: u64, column: u64, message: String) -> LintIssue {
    LintIssue {
        line,
        column,
        level: LintLevel::Error,
        message,
    }
}

fn warning(line: u64, column: u64, message: String) -> LintIssue {
    LintIssue {
        line,
        column,
        level: LintLevel::Warning,
        message,
    }
}

/// 1-based line and character column of byte `offset` in `text` (clamped into the text).
fn locate(text: &str, offset: usize) -> (u64, u64) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let column = text[line_start..offset].chars().count() + 1;
    (line as u64, column as u64)
}

/// [`locate`] for bytes that may not be UTF-8: a column counts the bytes that start a
/// character (anything but a continuation byte).
fn locate_bytes(bytes: &[u8], offset: usize) -> (u64, u64) {
    let offset = offset.min(bytes.len());
    let before = &bytes[..offset];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before[line_start..]
        .iter()
        .filter(|&&b| b & 0xC0 != 0x80)
        .count()
        + 1;
    (line as u64, column as u64)
}

/// Python syntax errors (Python's own reading of a file accepts a byte order mark, so one is
/// no issue here).
///
/// A deeply nested expression (`x = ----…1`) would overflow an ordinary thread's stack while
/// the AST is dropped, and a stack overflow aborts the whole node; so the parser runs on a
/// thread whose stack is sized from the source (reserved, only touched pages cost memory),
/// which also confines any panic inside the parser to a warning.
fn lint_python(path: &str, source: &str) -> Option<LintIssue> {
    if source.len() > MAX_PYTHON_PARSE_BYTES {
        return Some(warning(
            1,
            1,
            format!(
                "Python syntax not checked: the file is larger than {} MiB",
                MAX_PYTHON_PARSE_BYTES >> 20
            ),
        ));
    }
    let stack = PARSE_STACK_BASE + source.len() * PARSE_STACK_PER_BYTE;
    let outcome = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("lint-python".to_owned())
            .stack_size(stack)
            .spawn_scoped(scope, || python_syntax(path, source))
            .map(|handle| handle.join())
    });
    match outcome {
        Ok(Ok(issue)) => issue,
        Ok(Err(_panic)) => Some(warning(
            1,
            1,
            "Python syntax not checked: the parser failed on this file".to_owned(),
        )),
        Err(e) => Some(warning(
            1,
            1,
            format!("Python syntax not checked: cannot start the parser's thread ({e})"),
        )),
    }
}

///
/// The parser's raw error often points where the damage shows rather than where it is (an
/// unclosed bracket fails at the end of the file, or at the first token of a later line), so,
/// like CPython, a pass of the lexer over the file relocates bracket and string errors.
fn python_syntax(path: &str, source: &str) -> Option<LintIssue> {
    let err = parse(source, Mode::Module, path).err()?;
    let err_offset = usize::from(err.offset);
    let at = |offset: usize| locate(source, offset);
    let scan = scan_brackets(source);

    if let Some((offset, message)) = scan.problem {
        if offset <= err_offset {
            let (line, column) = at(offset);
            return Some(error(line, column, format!("SyntaxError: {message}")));
        }
    }
    let stringish = matches!(
        &err.error,
        ParseErrorType::Eof
            | ParseErrorType::Lexical(
                LexicalErrorType::Eof
                    | LexicalErrorType::StringError
                    | LexicalErrorType::OtherError(_)
            )
    );
    if stringish {
        if let Some((offset, triple)) = scan.unterminated_string {
            let (line, column) = at(offset);
            let kind = if triple { "triple-quoted " } else { "" };
            return Some(error(
                line,
                column,
                format!("SyntaxError: unterminated {kind}string literal"),
            ));
        }
    }
    if let Some((offset, bracket)) = scan.unclosed {
        let err_line = at(err_offset).0;
        let (line, column) = at(offset);
        if stringish || err_line > line {
            return Some(error(
                line,
                column,
                format!("SyntaxError: '{bracket}' was never closed"),
            ));
        }
    }
    let kind = if err.error.is_tab_error() {
        "TabError"
    } else if err.error.is_indentation_error() {
        "IndentationError"
    } else {
        "SyntaxError"
    };
    let (line, column) = at(err_offset);
    Some(error(
        line,
        column,
        format!("{kind}: {}", python_message(&err.error)),
    ))
}

/// The parser's message, reworded where its own is a debugging aid (`Got unexpected token
/// Newline`) rather than a sentence.
fn python_message(error: &ParseErrorType) -> String {
    match error {
        ParseErrorType::UnrecognizedToken(tok, expected) if !error.is_indentation_error() => {
            let found = describe_token(tok);
            match expected {
                Some(expected) => {
                    let expected = expected
                        .strip_prefix('"')
                        .and_then(|e| e.strip_suffix('"'))
                        .map_or_else(|| expected.clone(), |e| format!("'{e}'"));
                    format!("invalid syntax: expected {expected}, found {found}")
                }
                None => format!("invalid syntax: unexpected {found}"),
            }
        }
        ParseErrorType::ExtraToken(tok) => {
            format!("invalid syntax: unexpected {}", describe_token(tok))
        }
        ParseErrorType::Eof => "unexpected end of file".to_owned(),
        other => other.to_string(),
    }
}

fn describe_token(tok: &Tok) -> String {
    match tok {
        Tok::Newline => "end of line".to_owned(),
        Tok::Indent => "indent".to_owned(),
        Tok::Dedent => "dedent".to_owned(),
        Tok::EndOfFile => "end of file".to_owned(),
        other => other.to_string(),
    }
}

/// What one lexer pass learns about brackets and strings.
#[derive(Debug, Default)]
struct BracketScan {
    /// The first closing bracket with no or the wrong opening one: offset and message.
    problem: Option<(usize, String)>,
    /// The innermost bracket still open when the lexer reached the end of the file.
    unclosed: Option<(usize, char)>,
    /// Where a string the lexer could not finish starts, and whether it is triple-quoted.
    unterminated_string: Option<(usize, bool)>,
}

fn scan_brackets(source: &str) -> BracketScan {
    let mut scan = BracketScan::default();
    let mut open: Vec<(usize, char)> = Vec::new();
    let mut last_end = 0usize;
    let note = |scan: &mut BracketScan, offset: usize, message: String| {
        if scan.problem.is_none() {
            scan.problem = Some((offset, message));
        }
    };
    // The lexer keeps failing at the end of a file with open brackets, so the first error ends
    // the pass.
    for token in lex(source, Mode::Module) {
        let (tok, range) = match token {
            Ok(token) => token,
            Err(e) => {
                let location = usize::from(e.location);
                match e.error {
                    // Raised before the closing bracket's token is handed out; the bracket is
                    // the one ASCII character before the location.
                    LexicalErrorType::NestingError => {
                        let offset = location.saturating_sub(1);
                        let bracket = source.get(offset..location).unwrap_or(")");
                        note(&mut scan, offset, format!("unmatched '{bracket}'"));
                    }
                    LexicalErrorType::Eof
                    | LexicalErrorType::StringError
                    | LexicalErrorType::OtherError(_) => {
                        scan.unterminated_string = string_start(source, last_end);
                        if scan.unterminated_string.is_none() && location >= source.len() {
                            scan.unclosed = open.last().copied();
                        }
                    }
                    _ => {}
                }
                return scan;
            }
        };
        let start = usize::from(range.start());
        last_end = usize::from(range.end());
        let closing = match tok {
            Tok::Lpar => {
                open.push((start, '('));
                continue;
            }
            Tok::Lsqb => {
                open.push((start, '['));
                continue;
            }
            Tok::Lbrace => {
                open.push((start, '{'));
                continue;
            }
            Tok::Rpar => ')',
            Tok::Rsqb => ']',
            Tok::Rbrace => '}',
            _ => continue,
        };
        match open.pop() {
            None => note(&mut scan, start, format!("unmatched '{closing}'")),
            Some((opened_at, opening))
                if !matches!((opening, closing), ('(', ')') | ('[', ']') | ('{', '}')) =>
            {
                let (open_line, _) = locate(source, opened_at);
                let (close_line, _) = locate(source, start);
                let on_line = if open_line == close_line {
                    String::new()
                } else {
                    format!(" on line {open_line}")
                };
                note(
                    &mut scan,
                    start,
                    format!(
                        "closing parenthesis '{closing}' does not match opening parenthesis \
                         '{opening}'{on_line}"
                    ),
                );
            }
            Some(_) => {}
        }
    }
    scan
}

/// The start of a string literal at the first non-blank character from `from`, if one starts
/// there (an optional prefix such as `rb` or `f`, then a quote), and whether it is
/// triple-quoted.
fn string_start(source: &str, from: usize) -> Option<(usize, bool)> {
    let rest = source.get(from..)?;
    let blank = rest.len()
        - rest
            .trim_start_matches([' ', '\t', '\x0c', '\r', '\n', '\\'])
            .len();
    let start = from + blank;
    let candidate = &source[start..];
    let prefix = candidate
        .chars()
        .take(3)
        .take_while(|c| matches!(c, 'r' | 'R' | 'b' | 'B' | 'u' | 'U' | 'f' | 'F'))
        .count();
    let body = &candidate[prefix..];
    let quote = body.chars().next().filter(|c| matches!(c, '\'' | '"'))?;
    let triple = body.starts_with(&quote.to_string().repeat(3));
    Some((start, triple))
}

/// JSON syntax errors; `bom` says the file started with a byte order mark, which RFC 8259
/// forbids generators to add and many parsers (Python's `json.loads` among them) reject.
fn lint_json(source: &str, bom: bool) -> Vec<LintIssue> {
    let mut issues = Vec::new();
    if bom {
        issues.push(warning(
            1,
            1,
            "UTF-8 byte order mark at the start; many JSON parsers reject it".to_owned(),
        ));
    }
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(source) {
        // serde_json counts the column in bytes, 1-based at the offending byte (0 at the start
        // of a line); turn it into a character column.
        let line_index = e.line().saturating_sub(1);
        let line_start: usize = source
            .split_inclusive('\n')
            .take(line_index)
            .map(str::len)
            .sum();
        let offset = line_start + e.column().saturating_sub(1);
        let (line, column) = locate(source, offset);
        let full = e.to_string();
        // Its message ends with " at line L column C", which the issue already carries.
        let message = match full.rfind(" at line ") {
            Some(cut) => &full[..cut],
            None => &full,
        };
        issues.push(error(line, column, format!("invalid JSON: {message}")));
    }
    issues
}

/// One warning per line ending in whitespace (the `\r` of a CRLF is the line ending, not
/// whitespace), up to [`MAX_WHITESPACE_WARNINGS`], then one counting the rest.
fn trailing_whitespace(text: &str, language: Language) -> Vec<LintIssue> {
    let hint = if language == Language::Markdown {
        " (in Markdown, two trailing spaces are a hard line break; a trailing backslash says so visibly)"
    } else {
        ""
    };
    let mut issues = Vec::new();
    let mut unlisted = 0usize;
    let mut first_unlisted = 0u64;
    for (index, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let kept = line.trim_end_matches(char::is_whitespace);
        if kept.len() == line.len() {
            continue;
        }
        let number = index as u64 + 1;
        if issues.len() < MAX_WHITESPACE_WARNINGS {
            let column = kept.chars().count() as u64 + 1;
            issues.push(warning(
                number,
                column,
                format!("trailing whitespace{hint}"),
            ));
        } else {
            if unlisted == 0 {
                first_unlisted = number;
            }
            unlisted += 1;
        }
    }
    if unlisted > 0 {
        issues.push(warning(
            first_unlisted,
            1,
            format!("{unlisted} more lines with trailing whitespace are not listed"),
        ));
    }
    issues
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One lint case: the effective language and the issues as `(line, column, level,
    /// message fragment)`.
    fn check(
        path: &str,
        content: &[u8],
        language: Language,
        want_language: &str,
        want: &[(u64, u64, &str, &str)],
    ) {
        let report = lint(path, content, language);
        let shown = format!("{path} {:?}: {report:#?}", String::from_utf8_lossy(content));
        assert_eq!(report.language, want_language, "{shown}");
        assert_eq!(report.issues.len(), want.len(), "{shown}");
        for (issue, (line, column, level, fragment)) in report.issues.iter().zip(want) {
            assert_eq!((issue.line, issue.column), (*line, *column), "{shown}");
            assert_eq!(issue.level.as_str(), *level, "{shown}");
            assert!(issue.message.contains(fragment), "{fragment:?}: {shown}");
        }
        let errors = want.iter().any(|w| w.2 == "error");
        assert_eq!(has_errors(&report), errors, "{shown}");
    }

    /// `(source, [(line, column, level, message fragment)])`.
    type LintCase = (
        &'static str,
        &'static [(u64, u64, &'static str, &'static str)],
    );

    const VALID_PYTHON: &str = r#"
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def deco(fn):
    return fn


@dataclass(frozen=True)
class Point(Generic[T]):
    x: int
    y: "int | None" = None

    @property
    @deco
    def norm(self) -> float:
        return (self.x**2 + (self.y or 0) ** 2) ** 0.5


async def fetch(items: list[dict[str, int]], *, limit: int = 3) -> list[int]:
    async with asyncio.timeout(1):
        results = [await asyncio.sleep(0, i) async for i in agen(items)]
    return results[:limit]


def describe(command: object) -> str:
    name = "world"
    width = 10
    match command:
        case {"action": "go", "to": str(dest)}:
            return f"going to {dest!r:>{width}} from {name}"
        case [first, *rest] if rest:
            return f'{first=} and {len(rest)} more'
        case Point(x=0, y=0) | None:
            return rf"origin \d {name}"
        case _:
            return f"""{name}
            {command}"""


lam = lambda *a, **k: (a, k)
walrus = [y for x in range(3) if (y := x * 2)]
"#;

    #[test]
    fn python() {
        let py = Language::Python;
        let cases: &[LintCase] = &[
            (VALID_PYTHON, &[]),
            ("", &[]),
            ("x = 1\r\ny = 2\r\n", &[]),
            ("\u{feff}x = 1\n", &[]),
            // Missing colon: at the end of the `if` line, where the `:` belongs.
            (
                "x = 1\nif x == 1\n    pass\n",
                &[(2, 10, "error", "SyntaxError: invalid syntax: expected ':'")],
            ),
            (
                "def f()\n    return 1\n",
                &[(1, 8, "error", "unexpected end of line")],
            ),
            (
                "x = 1 2\n",
                &[(1, 7, "error", "invalid syntax: unexpected '2'")],
            ),
            // Unclosed brackets: at the bracket, like CPython, whether the parser failed at the
            // end of the file or on a later line.
            (
                "a = 1\nprint(foo(1, 2)\nb = 2\n",
                &[(2, 6, "error", "'(' was never closed")],
            ),
            (
                "x = [1,\n  2,\n",
                &[(1, 5, "error", "'[' was never closed")],
            ),
            (
                "d = {'a': (1,\n",
                &[(1, 11, "error", "'(' was never closed")],
            ),
            // ...but an error on the bracket's own line is the parser's.
            ("f(x y\n", &[(1, 5, "error", "invalid syntax")]),
            ("x = )\n", &[(1, 5, "error", "unmatched ')'")]),
            (
                "f(]\n",
                &[(1, 3, "error", "']' does not match opening parenthesis '('")],
            ),
            ("x = (1,\n  2]\n", &[(2, 4, "error", "'(' on line 1")]),
            // Unterminated strings: at the string's start.
            (
                "x = '''abc\n\ny = 1\n",
                &[(1, 5, "error", "unterminated triple-quoted string")],
            ),
            (
                "x = 1\ny = rb'abc\n",
                &[(2, 5, "error", "unterminated string literal")],
            ),
            // Bad indentation.
            (
                "def f():\nreturn 1\n",
                &[(
                    2,
                    1,
                    "error",
                    "IndentationError: expected an indented block",
                )],
            ),
            (
                "x = 1\n    y = 2\n",
                &[(2, 1, "error", "IndentationError: unexpected indent")],
            ),
            (
                "if True:\n        a = 1\n    b = 2\n",
                &[(3, 5, "error", "IndentationError: unindent does not match")],
            ),
            (
                "def f(x, x): pass\n",
                &[(1, 10, "error", "duplicate argument 'x'")],
            ),
            // Columns count characters, not bytes; a byte order mark is not a column.
            ("s = 'é' +\n", &[(1, 10, "error", "SyntaxError")]),
            ("\u{feff}def f(:\n", &[(1, 7, "error", "unexpected ':'")]),
            // A syntax error and trailing whitespace: the error comes first.
            (
                "a = 1  \nb = (\n",
                &[
                    (2, 5, "error", "never closed"),
                    (1, 6, "warning", "trailing"),
                ],
            ),
        ];
        for (source, want) in cases {
            check("m.py", source.as_bytes(), py, "python", want);
        }
        check(
            "stub.pyi",
            b"def f(x: int) -> str: ...\n",
            Language::Auto,
            "python",
            &[],
        );
        check(
            "M.PY",
            b"if\n",
            Language::Auto,
            "python",
            &[(1, 3, "error", "SyntaxError")],
        );
    }

    /// Deep nesting neither overflows the stack nor hides a real error.
    #[test]
    fn python_deep_nesting() {
        let deep = format!("x = {}1\n", "-".repeat(300_000));
        check("deep.py", deep.as_bytes(), Language::Python, "python", &[]);
        let deep = format!("x = {}1\ny = (\n", "[".repeat(50_000));
        let report = lint("deep.py", deep.as_bytes(), Language::Python);
        assert!(has_errors(&report), "{:?}", report.issues);
    }

    #[test]
    fn json() {
        let js = Language::Json;
        let cases: &[LintCase] = &[
            ("{\"a\": [1, 2, {\"b\": null}], \"c\": \"é\"}\n", &[]),
            ("[]", &[]),
            (
                "{\n  \"a\": 1,\n  \"b\": 2,\n}\n",
                &[(4, 1, "error", "key must be a string")],
            ),
            (
                "{\"a\": 1 \"b\": 2}",
                &[(1, 9, "error", "expected `,` or `}`")],
            ),
            (
                "{\"é\": tru}",
                &[(1, 10, "error", "invalid JSON: expected ident")],
            ),
            ("", &[(1, 1, "error", "EOF while parsing")]),
            ("[1, 2", &[(1, 5, "error", "EOF while parsing a list")]),
            ("{} {}", &[(1, 4, "error", "trailing characters")]),
            (
                "\u{feff}{\"a\": x}",
                &[
                    (1, 7, "error", "expected value"),
                    (1, 1, "warning", "byte order mark"),
                ],
            ),
        ];
        for (source, want) in cases {
            check("data.json", source.as_bytes(), js, "json", want);
        }
        check(
            "x.JSON",
            b"{",
            Language::Auto,
            "json",
            &[(1, 1, "error", "EOF")],
        );
    }

    #[test]
    fn generic_checks() {
        let text = Language::Text;
        check("notes.txt", b"clean\nlines\n", text, "text", &[]);
        check("notes.txt", b"", text, "text", &[]);
        check(
            "notes.txt",
            b"a \nb\t\r\nc\r\n  \n\xc2\xa0x\xc2\xa0\nno",
            text,
            "text",
            &[
                (1, 2, "warning", "trailing whitespace"),
                (2, 2, "warning", "trailing whitespace"),
                (4, 1, "warning", "trailing whitespace"),
                (5, 3, "warning", "trailing whitespace"),
            ],
        );
        // NUL bytes: one error at the first, in any language; the parser is not run on top.
        check(
            "a.py",
            b"x = 1\nab\x00c\x00\n",
            Language::Auto,
            "python",
            &[(2, 3, "error", "NUL byte in the file (2 in total)")],
        );
        check(
            "b.bin",
            b"\x00",
            Language::Auto,
            "text",
            &[(1, 1, "error", "NUL")],
        );
        // Invalid UTF-8: an error at the first bad byte, columns counted in characters.
        check(
            "c.json",
            b"{\"a\":\n \"\xc3\xa9\xff\"}  ",
            Language::Auto,
            "json",
            &[
                (2, 4, "error", "not valid UTF-8"),
                (2, 7, "warning", "trailing"),
            ],
        );
        check(
            "d.md",
            b"# Title  \n\nbody\n",
            Language::Auto,
            "markdown",
            &[(1, 8, "warning", "hard line break")],
        );
        check("e.markdown", b"ok\n", Language::Auto, "markdown", &[]);
        // A byte order mark is not a column.
        check(
            "h.txt",
            "\u{feff}ab \n".as_bytes(),
            text,
            "text",
            &[(1, 3, "warning", "trailing")],
        );
        check(
            "i.txt",
            "\u{feff}a\x00".as_bytes(),
            text,
            "text",
            &[(1, 2, "error", "NUL")],
        );
        check("Makefile", b"all:\n", Language::Auto, "text", &[]);
        // An explicit language wins over the extension.
        check(
            "f.txt",
            b"{",
            Language::Json,
            "json",
            &[(1, 1, "error", "EOF")],
        );
        check("g.py", b"if\n", Language::Markdown, "markdown", &[]);
    }

    #[test]
    fn whitespace_warnings_are_capped() {
        let content = "x \n".repeat(MAX_WHITESPACE_WARNINGS + 50);
        let report = lint("big.txt", content.as_bytes(), Language::Text);
        assert_eq!(report.issues.len(), MAX_WHITESPACE_WARNINGS + 1);
        let last = report.issues.last().unwrap();
        assert_eq!(last.line, MAX_WHITESPACE_WARNINGS as u64 + 1);
        assert!(last.message.starts_with("50 more lines"), "{last:?}");
        assert!(!has_errors(&report));
    }

    #[test]
    fn serialises_as_the_protocol_shape() {
        let report = lint("x.json", b"{", Language::Auto);
        assert_eq!(
            serde_json::to_value(&report.issues[0]).unwrap(),
            serde_json::json!({"line": 1, "column": 1, "level": "error", "message": "invalid JSON: EOF while parsing an object"})
        );
        assert_eq!(LINT_MODEL, "built_in_lightweight");
    }
}
