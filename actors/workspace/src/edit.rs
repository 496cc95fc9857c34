//! The engine of `edit_workspace_file` and `multi_edit_workspace_file`, snippet edits of one
//! file's text: pure functions from the current text and an [`Edit`] (or a single snippet) to the
//! new text, plus the unified diff the tools answer with. The tools turn their arguments into
//! these.
//!
//! Matching rules, in order of preference (the first rule with any match decides):
//! 1. `old_text` literally;
//! 2. `old_text` with its line endings converted to the file's (a consistently CRLF or LF file),
//!    because agents usually send `\n` whatever the file uses;
//! 3. the same two with straight and curly quotes made interchangeable (the replaced region is
//!    the original text's, `new_text` goes in as given).
//!
//! When the file uses one line ending consistently, the line endings of `new_text` are converted
//! to it, so a CRLF file stays CRLF after the edit (the rest of the file is never touched).

use std::ops::Range;
use std::time::{Duration, Instant};

use serde::Serialize;
use similar::TextDiff;
use toolmesh_kernel::{ErrorCode, ToolError};

/// How many `nearby_candidates` a `snippet_not_found` carries.
pub const MAX_NEARBY_CANDIDATES: usize = 3;
/// A candidate's `text` is cut at this many characters (with `truncated: true`) so that the
/// failure reply stays small whatever the size of `old_text`.
pub const MAX_CANDIDATE_CHARS: usize = 2000;
/// Passages less similar than this are noise rather than help (every window shares newlines
/// and spaces with any snippet), so they are not offered.
pub const MIN_CANDIDATE_SIMILARITY: f64 = 0.3;

/// One edit of a batch ([`apply_edits`]): `old_text` replaced by `new_text`. An edit that
/// names neither `replace_all` nor `expected_replacements` follows the batch's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub old_text: String,
    pub new_text: String,
    pub expected_replacements: Option<u64>,
    pub replace_all: Option<bool>,
}

/// The result of one edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditApplied {
    pub content: String,
    pub replacements: u64,
}

/// The result of a batch of edits: the final text, the total count, and per edit
/// `(index, replacements)` in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiEditApplied {
    pub content: String,
    pub replacements: u64,
    pub edits: Vec<(usize, u64)>,
}

/// A passage of the file resembling an `old_text` that matched nowhere.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NearbyCandidate {
    /// 1-based line the passage starts at.
    pub line: u64,
    /// The passage as it is in the file (line endings included, final one dropped).
    pub text: String,
    /// `similar`'s character ratio against `old_text` (quotes straightened, `\r` ignored),
    /// rounded to two decimals.
    pub similarity: f64,
    /// Present (and true) when `text` was cut at [`MAX_CANDIDATE_CHARS`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// Why one edit could not be applied.
#[derive(Debug, Clone, PartialEq)]
pub enum EditFailure {
    /// A batch without edits.
    NoEdits,
    /// `old_text` is empty: it would match everywhere.
    EmptyOldText,
    /// `old_text == new_text`.
    NothingToChange,
    /// `expected_replacements: 0` without `replace_all`.
    ZeroExpected,
    /// `old_text` matched nowhere.
    NotFound {
        nearby_candidates: Vec<NearbyCandidate>,
    },
    /// The match count differs from `expected_replacements`.
    Ambiguous {
        match_count: u64,
        expected_replacements: u64,
    },
}

/// A refused edit; `failed_edit_index` is set by [`apply_edits`]. Its text is the wire's
/// sentence without the file's name; [`EditError::into_tool_error`] names the file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.to_tool_error(None).message)]
pub struct EditError {
    pub failure: EditFailure,
    pub failed_edit_index: Option<usize>,
}

impl EditError {
    fn single(failure: EditFailure) -> Self {
        Self {
            failure,
            failed_edit_index: None,
        }
    }

    /// The protocol code this failure answers with.
    pub fn code(&self) -> ErrorCode {
        match self.failure {
            EditFailure::NotFound { .. } => ErrorCode::SnippetNotFound,
            EditFailure::Ambiguous { .. } => ErrorCode::AmbiguousEdit,
            EditFailure::NoEdits
            | EditFailure::EmptyOldText
            | EditFailure::NothingToChange
            | EditFailure::ZeroExpected => ErrorCode::InvalidArguments,
        }
    }

    /// The failure reply, naming the file in the message.
    pub fn into_tool_error(self, path: &str) -> ToolError {
        self.to_tool_error(Some(path))
    }

    /// JSON pointer of the offending argument (for `invalid_arguments` details).
    fn pointer(&self, member: &str) -> String {
        match self.failed_edit_index {
            Some(i) => format!("/edits/{i}/{member}"),
            None => format!("/{member}"),
        }
    }

    fn to_tool_error(&self, path: Option<&str>) -> ToolError {
        let prefix = match self.failed_edit_index {
            Some(i) => format!("edit {i}: "),
            None => String::new(),
        };
        let file = path.map(|p| format!(" in {p}")).unwrap_or_default();
        let error = match &self.failure {
            EditFailure::NoEdits => {
                ToolError::invalid_argument("/edits", "must hold at least one edit")
            }
            EditFailure::EmptyOldText => ToolError::invalid_argument(
                &self.pointer("old_text"),
                "must not be empty; quote the exact text to replace",
            ),
            EditFailure::NothingToChange => ToolError::invalid_argument(
                &self.pointer("new_text"),
                "equals old_text, nothing to change",
            ),
            EditFailure::ZeroExpected => ToolError::invalid_argument(
                &self.pointer("expected_replacements"),
                "must be at least 1 (or set replace_all)",
            ),
            EditFailure::NotFound { nearby_candidates } => {
                let hint = if nearby_candidates.is_empty() {
                    "read the file again and copy the exact text".to_owned()
                } else {
                    "nearby_candidates lists the most similar passages; copy the exact text from \
                     there or read the file again"
                        .to_owned()
                };
                ToolError::new(
                    ErrorCode::SnippetNotFound,
                    format!("{prefix}old_text was not found{file}; {hint}"),
                )
                .with(
                    "nearby_candidates",
                    serde_json::to_value(nearby_candidates).unwrap_or_default(),
                )
            }
            EditFailure::Ambiguous {
                match_count,
                expected_replacements,
            } => {
                let hint = if match_count > expected_replacements {
                    "add surrounding lines to old_text to make it unique, or set replace_all \
                     (or expected_replacements) to change them all"
                } else {
                    "set expected_replacements to the count found, or set replace_all"
                };
                ToolError::new(
                    ErrorCode::AmbiguousEdit,
                    format!(
                        "{prefix}old_text matches {match_count} place{s}{file} but \
                         expected_replacements is {expected_replacements}; {hint}",
                        s = if *match_count == 1 { "" } else { "s" },
                    ),
                )
                .with("match_count", *match_count)
                .with("expected_replacements", *expected_replacements)
            }
        };
        match self.failed_edit_index {
            Some(i) => error.with("failed_edit_index", i as u64),
            None => error,
        }
    }
}

impl From<EditError> for ToolError {
    fn from(error: EditError) -> Self {
        error.to_tool_error(None)
    }
}

/// Replaces `old_text` by `new_text` in `content` (see the module documentation for matching).
/// `replace_all` replaces every match (at least one); otherwise the number of non-overlapping
/// matches must equal `expected_replacements`.
pub fn apply_edit(
    content: &str,
    old_text: &str,
    new_text: &str,
    expected_replacements: u64,
    replace_all: bool,
) -> Result<EditApplied, EditError> {
    apply_one(
        content,
        old_text,
        new_text,
        expected_replacements,
        replace_all,
    )
    .map_err(EditError::single)
}

/// Applies `edits` in order, each to the result of the previous, all or nothing. An edit's own
/// `replace_all` wins; an edit naming only `expected_replacements` has that count checked (the
/// more specific instruction); an edit naming neither follows `default_replace_all`.
pub fn apply_edits(
    content: &str,
    edits: &[Edit],
    default_replace_all: bool,
) -> Result<MultiEditApplied, EditError> {
    if edits.is_empty() {
        return Err(EditError::single(EditFailure::NoEdits));
    }
    let mut current = content.to_owned();
    let mut total = 0u64;
    let mut per_edit = Vec::with_capacity(edits.len());
    for (index, edit) in edits.iter().enumerate() {
        let replace_all = match (edit.replace_all, edit.expected_replacements) {
            (Some(all), _) => all,
            (None, Some(_)) => false,
            (None, None) => default_replace_all,
        };
        let expected = edit.expected_replacements.unwrap_or(1);
        let applied = apply_one(
            &current,
            &edit.old_text,
            &edit.new_text,
            expected,
            replace_all,
        )
        .map_err(|failure| EditError {
            failure,
            failed_edit_index: Some(index),
        })?;
        current = applied.content;
        total += applied.replacements;
        per_edit.push((index, applied.replacements));
    }
    Ok(MultiEditApplied {
        content: current,
        replacements: total,
        edits: per_edit,
    })
}

/// The unified diff of an edit, headers `a/<path>` and `b/<path>`, 3 lines of context; empty
/// when nothing changed.
pub fn unified_diff(path: &str, before: &str, after: &str) -> String {
    TextDiff::configure()
        // A pathological pair of large files must not stall the actor; past the deadline the
        // diff is coarser but still correct.
        .timeout(Duration::from_secs(2))
        .diff_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

fn apply_one(
    content: &str,
    old_text: &str,
    new_text: &str,
    expected_replacements: u64,
    replace_all: bool,
) -> Result<EditApplied, EditFailure> {
    if old_text.is_empty() {
        return Err(EditFailure::EmptyOldText);
    }
    if old_text == new_text {
        return Err(EditFailure::NothingToChange);
    }
    if !replace_all && expected_replacements == 0 {
        return Err(EditFailure::ZeroExpected);
    }
    let ending = LineEnding::of(content);
    let mut olds = vec![old_text.to_owned()];
    if let Some(adapted) = ending.adapt(old_text) {
        olds.push(adapted);
    }
    let new_text = ending
        .adapt(new_text)
        .unwrap_or_else(|| new_text.to_owned());

    let mut ranges = Vec::new();
    for old in &olds {
        ranges = literal_matches(content, old);
        if !ranges.is_empty() {
            break;
        }
    }
    if ranges.is_empty() {
        let normalized = Normalized::new(content);
        for old in &olds {
            ranges = normalized.matches(old);
            if !ranges.is_empty() {
                break;
            }
        }
    }
    if ranges.is_empty() {
        return Err(EditFailure::NotFound {
            nearby_candidates: nearby_candidates(content, old_text),
        });
    }
    let match_count = ranges.len() as u64;
    if !replace_all && match_count != expected_replacements {
        return Err(EditFailure::Ambiguous {
            match_count,
            expected_replacements,
        });
    }
    let mut out = String::with_capacity(content.len() + ranges.len() * new_text.len());
    let mut last = 0;
    for range in &ranges {
        out.push_str(&content[last..range.start]);
        out.push_str(&new_text);
        last = range.end;
    }
    out.push_str(&content[last..]);
    Ok(EditApplied {
        content: out,
        replacements: match_count,
    })
}

/// Non-overlapping byte ranges of `needle` in `haystack`, left to right.
fn literal_matches(haystack: &str, needle: &str) -> Vec<Range<usize>> {
    haystack
        .match_indices(needle)
        .map(|(start, m)| start..start + m.len())
        .collect()
}

/// The line ending a file uses throughout, if it uses one consistently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineEnding {
    Lf,
    Crlf,
    /// No newline, or both kinds: the text is left exactly as given.
    Unknown,
}

impl LineEnding {
    fn of(content: &str) -> Self {
        let newlines = content.bytes().filter(|&b| b == b'\n').count();
        let crlfs = content.matches("\r\n").count();
        match (newlines, crlfs) {
            (0, _) => LineEnding::Unknown,
            (n, c) if n == c => LineEnding::Crlf,
            (_, 0) => LineEnding::Lf,
            _ => LineEnding::Unknown,
        }
    }

    /// `text` with its line endings converted to this one, when that changes anything.
    fn adapt(self, text: &str) -> Option<String> {
        let converted = match self {
            LineEnding::Unknown => return None,
            LineEnding::Lf => text.replace("\r\n", "\n"),
            LineEnding::Crlf => text.replace("\r\n", "\n").replace('\n', "\r\n"),
        };
        (converted != text).then_some(converted)
    }
}

/// Maps curly (and prime) quotes to their straight counterparts; everything else is kept.
fn straight_quote(c: char) -> char {
    match c {
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' | '\u{2032}' => '\'',
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' | '\u{2033}' => '"',
        other => other,
    }
}

/// A text with quotes straightened, remembering how to map its byte offsets back: the curly
/// quotes are 3 bytes in UTF-8 and the straight ones 1, so offsets shift after each.
struct Normalized {
    text: String,
    /// `(offset in `text` just after a replaced quote, bytes removed up to and including it)`,
    /// ascending.
    shifts: Vec<(usize, usize)>,
}

impl Normalized {
    fn new(original: &str) -> Self {
        let mut text = String::with_capacity(original.len());
        let mut shifts = Vec::new();
        let mut removed = 0;
        for c in original.chars() {
            let s = straight_quote(c);
            text.push(s);
            if s != c {
                removed += c.len_utf8() - s.len_utf8();
                shifts.push((text.len(), removed));
            }
        }
        Self { text, shifts }
    }

    fn to_original(&self, offset: usize) -> usize {
        let i = self.shifts.partition_point(|&(after, _)| after <= offset);
        match i {
            0 => offset,
            _ => offset + self.shifts[i - 1].1,
        }
    }

    /// Matches of the straightened `needle`, as byte ranges of the original text.
    fn matches(&self, needle: &str) -> Vec<Range<usize>> {
        let needle: String = needle.chars().map(straight_quote).collect();
        literal_matches(&self.text, &needle)
            .into_iter()
            .map(|r| self.to_original(r.start)..self.to_original(r.end))
            .collect()
    }
}

/// Characters as the candidate search compares them: quotes straightened, `\r` dropped.
fn scoring_char(c: char) -> Option<char> {
    match c {
        '\r' => None,
        c => Some(straight_quote(c)),
    }
}

/// Appends one line as scored: normalised, always ending in `\n` (so windows and `old_text`
/// compare alike whether or not the file ends with a newline).
fn push_scored_line(out: &mut String, line: &str) {
    out.extend(line.trim_end_matches('\n').chars().filter_map(scoring_char));
    out.push('\n');
}

/// Up to [`MAX_NEARBY_CANDIDATES`] non-overlapping windows of `content` (as many lines as
/// `old_text` has) most similar to `old_text`, best first.
///
/// Each window gets a cheap upper bound first (the multiset overlap of characters, difflib's
/// `quick_ratio`, kept up to date while the window slides), and the exact ratio is computed in
/// the order of that bound until no remaining window can beat the chosen ones, so a large
/// file costs one pass plus a handful of real diffs.
fn nearby_candidates(content: &str, old_text: &str) -> Vec<NearbyCandidate> {
    // Past this many exact ratios or this much time, the search keeps the best found so far:
    // a slow answer is worse than slightly worse candidates. The first few always run.
    const BUDGET: Duration = Duration::from_millis(300);
    const MIN_EXACT: usize = 10;
    const MAX_EXACT: usize = 300;

    let lines: Vec<&str> = content.split_inclusive('\n').collect();
    if lines.is_empty() {
        return Vec::new();
    }
    let mut target = String::new();
    for line in old_text.split_inclusive('\n') {
        push_scored_line(&mut target, line);
    }
    let window = old_text.split_inclusive('\n').count().clamp(1, lines.len());

    let mut wanted = CharCounts::default();
    for c in target.chars() {
        wanted.add_wanted(c);
    }
    let target_len = target.chars().count();

    // Slide: `have` counts the window's characters, `common` their overlap with `target`.
    let mut have = CharCounts::default();
    let mut common = 0usize;
    let mut window_len = 0usize;
    let mut scan = |line: &str, delta: i64, common: &mut usize, window_len: &mut usize| {
        for c in line
            .trim_end_matches('\n')
            .chars()
            .filter_map(scoring_char)
            .chain(std::iter::once('\n'))
        {
            if delta > 0 {
                *window_len += 1;
                if have.get(c) < wanted.get(c) {
                    *common += 1;
                }
                have.bump(c, 1);
            } else {
                *window_len -= 1;
                have.bump(c, -1);
                if have.get(c) < wanted.get(c) {
                    *common -= 1;
                }
            }
        }
    };
    let mut bounds: Vec<(f64, usize)> = Vec::with_capacity(lines.len() - window + 1);
    for (i, line) in lines.iter().enumerate() {
        scan(line, 1, &mut common, &mut window_len);
        if i >= window {
            scan(lines[i - window], -1, &mut common, &mut window_len);
        }
        if i + 1 >= window {
            let bound = 2.0 * common as f64 / (target_len + window_len).max(1) as f64;
            bounds.push((bound, i + 1 - window));
        }
    }
    bounds.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

    let started = Instant::now();
    let mut scored: Vec<(f64, usize)> = Vec::new();
    for (evaluated, &(bound, start)) in bounds.iter().enumerate() {
        let chosen = choose(&scored, window);
        if chosen.len() == MAX_NEARBY_CANDIDATES && bound < chosen[chosen.len() - 1].0 {
            break;
        }
        if evaluated >= MIN_EXACT && (evaluated >= MAX_EXACT || started.elapsed() > BUDGET) {
            break;
        }
        if bound < MIN_CANDIDATE_SIMILARITY {
            break;
        }
        let mut text = String::new();
        for line in &lines[start..start + window] {
            push_scored_line(&mut text, line);
        }
        let ratio = TextDiff::configure()
            .timeout(Duration::from_millis(50))
            .diff_chars(target.as_str(), text.as_str())
            .ratio();
        scored.push((f64::from(ratio), start));
    }

    choose(&scored, window)
        .into_iter()
        .map(|(ratio, start)| {
            let raw: String = lines[start..start + window].concat();
            let raw = raw
                .strip_suffix('\n')
                .map(|r| r.strip_suffix('\r').unwrap_or(r))
                .unwrap_or(&raw);
            let truncated = raw.chars().count() > MAX_CANDIDATE_CHARS;
            let text = if truncated {
                raw.chars().take(MAX_CANDIDATE_CHARS).collect()
            } else {
                raw.to_owned()
            };
            NearbyCandidate {
                line: start as u64 + 1,
                text,
                similarity: (ratio * 100.0).round() / 100.0,
                truncated,
            }
        })
        .collect()
}

/// Greedy best-first choice of non-overlapping windows of `window` lines.
fn choose(scored: &[(f64, usize)], window: usize) -> Vec<(f64, usize)> {
    let mut sorted = scored.to_vec();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<(f64, usize)> = Vec::new();
    for (ratio, start) in sorted {
        if chosen.len() == MAX_NEARBY_CANDIDATES {
            break;
        }
        if ratio < MIN_CANDIDATE_SIMILARITY {
            break;
        }
        let overlaps = chosen
            .iter()
            .any(|&(_, s)| start < s + window && s < start + window);
        if !overlaps {
            chosen.push((ratio, start));
        }
    }
    chosen
}

/// Character counts with an array for ASCII (nearly all source text) and a map for the rest.
#[derive(Default)]
struct CharCounts {
    ascii: Vec<i64>,
    other: std::collections::HashMap<char, i64>,
}

impl CharCounts {
    fn get(&self, c: char) -> i64 {
        if c.is_ascii() {
            self.ascii.get(c as usize).copied().unwrap_or(0)
        } else {
            self.other.get(&c).copied().unwrap_or(0)
        }
    }

    fn bump(&mut self, c: char, delta: i64) {
        if c.is_ascii() {
            if self.ascii.is_empty() {
                self.ascii = vec![0; 128];
            }
            self.ascii[c as usize] += delta;
        } else {
            *self.other.entry(c).or_insert(0) += delta;
        }
    }

    fn add_wanted(&mut self, c: char) {
        self.bump(c, 1);
    }
}

#[cfg(test)]
#[path = "edit_tests.rs"]
mod tests;
