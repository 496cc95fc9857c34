//! The engine of `search_workspace_files`: ripgrep's own crates (`ignore` walk, `grep-regex`
//! matcher, `grep-searcher` line search) over one workspace, every file opened through its
//! capability. It takes [`SearchOptions`]; the tool turns its arguments into them.
//!
//! Semantics, where PROTOCOL.md and the seed say nothing (each choice follows `rg` unless noted):
//!
//! * The walk starts at the searched directory, in parallel (one thread per core, at most 12 as
//!   `rg` does), skips hidden entries below it, never follows a symlink, and skips `.git` and
//!   `.toolmesh` (persisted outputs) wherever they are met. Naming a hidden directory (or
//!   `.toolmesh/outputs`) as the search path searches it, as `rg` searches a path it is given.
//! * `.gitignore`, `.ignore` and `.git/info/exclude` apply also outside a git repository. Those in
//!   the searched directory and below are read by the walker; those in the directories between
//!   the workspace root and the searched directory are read here and apply too (`rg` reads every
//!   parent; we stop at the root so nothing of the host above it shapes a reply). The user's
//!   global git excludes are host configuration and are never read.
//! * `glob` is one gitignore-style glob on paths relative to the searched directory, as `rg -g`:
//!   a glob without `/` matches the file name at any depth, one with `/` is anchored, `**` crosses
//!   directories, a leading `!` excludes instead of selecting.
//! * Literal queries are case-insensitive unless `case_sensitive`; a query that contains a line
//!   break (literal or regex `\n`) or a NUL can never match a line and is `invalid_arguments`
//!   on `/query`, like an invalid regex.
//! * Line breaks: a line ends at `\n`, and a `\r` before it belongs to the terminator (the
//!   matcher's CRLF mode): `text` and the context lines never end in `\r`, and `$` matches at
//!   the end of a CRLF line too.
//! * A file is searched until a NUL byte shows it is binary (`rg`'s default for files found by a
//!   walk); files over 1 MiB are skipped and counted in `files_skipped_large`; unreadable files
//!   and files whose confined open is refused are skipped silently.
//! * `match_count` is the number of matching lines returned (at most `max_results`, clamped to
//!   5000). `truncated` is true only when one more matching line was found beyond that, and the
//!   search stops there. When truncated, which lines are returned depends on the parallel walk's
//!   order; the reply is always sorted by `(path, line)`.
//! * Each hit carries its own context (`min(context_lines, 20)` lines each side), even where the
//!   context of neighbouring hits overlaps or contains other matching lines.
//! * A line longer than [`MAX_LINE_CHARS`] characters is cut to a window of that many characters
//!   starting a little before its first match, with `…` marking each cut end, so that one
//!   minified file cannot blow up a reply. Text is UTF-8, invalid bytes replaced by U+FFFD.
//! * Files are read into a small reusable heap buffer, not memory-mapped: for a directory walk
//!   `rg` itself does not use memory maps (they are slower for many small files), and the
//!   workspace lints deny `unsafe`.
//!
//! The function blocks (file I/O on its own threads); actors call it from a blocking task.

use std::collections::VecDeque;
use std::io;
use std::num::NonZeroUsize;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cap_fs_ext::OpenOptionsSyncExt;
use grep_matcher::{LineTerminator, Matcher};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{
    BinaryDetection, MmapChoice, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch,
};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::overrides::{Override, OverrideBuilder};
use ignore::{DirEntry, ParallelVisitor, ParallelVisitorBuilder, WalkBuilder, WalkState};
use serde::Serialize;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::confine::Workspace;

/// The engine's name, answered as `search_backend`.
pub const SEARCH_BACKEND: &str = "grep-searcher";
/// `max_results` above this is clamped.
pub const MAX_RESULTS: u64 = 5000;
/// `context_lines` above this is clamped.
pub const MAX_CONTEXT_LINES: u64 = 20;
/// Files larger than this are skipped (and counted).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Longer lines are cut to a window of this many characters.
pub const MAX_LINE_CHARS: usize = 2000;
/// Directory names skipped wherever the walk meets them (the walk never enters them).
const SKIPPED_NAMES: [&str; 2] = [".git", ".toolmesh"];
/// Ignore files read in the directories between the root and the searched directory, lowest
/// precedence first (a later pattern wins in one [`Gitignore`]), as the walker ranks them.
const ANCESTOR_IGNORE_FILES: [&str; 3] = [".git/info/exclude", ".gitignore", ".ignore"];
/// `rg`'s cap on walker threads: beyond it, more threads only contend.
const MAX_THREADS: usize = 12;

/// What to search for and how: `search_workspace_files`' arguments besides the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchOptions {
    pub query: String,
    /// `query` is a regex; otherwise it matches literally.
    pub is_regex: bool,
    /// One gitignore-style glob on paths relative to the searched directory.
    pub glob: Option<String>,
    pub case_sensitive: bool,
    /// Clamped to [`MAX_CONTEXT_LINES`].
    pub context_lines: u64,
    /// Clamped to `1..=`[`MAX_RESULTS`].
    pub max_results: u64,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SearchHit {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    /// 1-based.
    pub line: u64,
    pub text: String,
    pub context_before: Vec<String>,
    pub context_after: Vec<String>,
}

/// The reply's members besides `ok`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SearchOutcome {
    /// Sorted by `(path, line)`.
    pub results: Vec<SearchHit>,
    /// Matching lines found, counted until `max_results` is reached (= `results.len()`).
    pub match_count: u64,
    /// More matching lines exist than were returned.
    pub truncated: bool,
    pub search_backend: &'static str,
    /// Files opened and searched.
    pub files_searched: u64,
    /// Files skipped for being over [`MAX_FILE_BYTES`].
    pub files_skipped_large: u64,
}

/// Why a search was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("argument /query: {0}")]
    Query(#[source] grep_regex::Error),
    #[error("argument /glob: {0}")]
    Glob(#[source] ignore::Error),
    #[error("{path}: no such file or directory")]
    NotFound {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} resolves outside the workspace")]
    Outside {
        path: String,
        #[source]
        source: io::Error,
    },
    /// The start could not be opened for another reason.
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// What kind of [`SearchError`] it is; one PROTOCOL.md code each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchErrorKind {
    InvalidArgument,
    NotFound,
    Outside,
    Internal,
}

impl SearchError {
    pub fn kind(&self) -> SearchErrorKind {
        match self {
            SearchError::Query(_) | SearchError::Glob(_) => SearchErrorKind::InvalidArgument,
            SearchError::NotFound { .. } => SearchErrorKind::NotFound,
            SearchError::Outside { .. } => SearchErrorKind::Outside,
            SearchError::Open { .. } => SearchErrorKind::Internal,
        }
    }
}

/// PROTOCOL.md's code and sentence (`path` beside a start that is missing or outside); an
/// `internal` one logs its cause here.
impl From<SearchError> for ToolError {
    fn from(e: SearchError) -> Self {
        match &e {
            SearchError::Query(source) => ToolError::invalid_argument("/query", source.to_string()),
            SearchError::Glob(source) => ToolError::invalid_argument("/glob", source.to_string()),
            SearchError::NotFound { path, .. } => {
                ToolError::new(ErrorCode::NotFound, e.to_string()).with("path", path.clone())
            }
            SearchError::Outside { path, .. } => {
                ToolError::new(ErrorCode::PathOutsideWorkspace, e.to_string())
                    .with("path", path.clone())
            }
            SearchError::Open { .. } => ToolError::internal_logged(&e, "workspace search failed"),
        }
    }
}

/// Searches the files under `rel_dir` (already validated, relative to the root, `""` for the
/// root; a file searches that file) for `options.query`.
///
/// Errors: `invalid_arguments` for a bad `/query` or `/glob`; `not_found` when `rel_dir` does
/// not exist; `path_outside_workspace` when it resolves outside the root through a symlink.
pub fn search(
    ws: &Workspace,
    rel_dir: &Path,
    options: &SearchOptions,
) -> Result<SearchOutcome, SearchError> {
    let matcher = build_matcher(&options.query, options.is_regex, options.case_sensitive)?;
    let rel_start = resolve_start(ws, rel_dir)?;
    let start = ws.root().join(&rel_start);
    let overrides = build_overrides(&start, options.glob.as_deref())?;
    let ancestors = Arc::new(ancestor_ignores(ws.root(), &rel_start));
    // Both are u64 in the schema; after the clamp they fit any usize.
    let max_results = options.max_results.clamp(1, MAX_RESULTS) as usize;
    let context = options.context_lines.min(MAX_CONTEXT_LINES) as usize;

    let mut walk = WalkBuilder::new(&start);
    walk.hidden(true)
        // Parents are handled by `ancestors` so that nothing above the root is read.
        .parents(false)
        .ignore(true)
        .git_ignore(true)
        .git_exclude(true)
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .overrides(overrides)
        .threads(thread_count())
        .filter_entry(move |entry| keep_entry(entry, &ancestors));

    let shared = Shared {
        max_results,
        taken: AtomicUsize::new(0),
        truncated: AtomicBool::new(false),
        quit: AtomicBool::new(false),
        files_searched: AtomicU64::new(0),
        files_skipped_large: AtomicU64::new(0),
        hits: Mutex::new(Vec::new()),
    };
    let mut builder = VisitorBuilder {
        ws,
        shared: &shared,
        matcher: &matcher,
        context,
    };
    walk.build_parallel().visit(&mut builder);

    let mut results = shared
        .hits
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    // The walk's order is the threads' order; the reply's is deterministic.
    results.sort_unstable_by(|a, b| a.path.cmp(&b.path).then(a.line.cmp(&b.line)));
    Ok(SearchOutcome {
        match_count: results.len() as u64,
        results,
        truncated: shared.truncated.into_inner(),
        search_backend: SEARCH_BACKEND,
        files_searched: shared.files_searched.into_inner(),
        files_skipped_large: shared.files_skipped_large.into_inner(),
    })
}

/// The matcher `rg -i` / `rg -s` (with `-F` for literals) would build. The line terminator is
/// what lets grep-searcher search a whole buffer at once and find line boundaries only around
/// candidates, instead of running the regex line by line.
fn build_matcher(
    query: &str,
    is_regex: bool,
    case_sensitive: bool,
) -> Result<RegexMatcher, SearchError> {
    RegexMatcherBuilder::new()
        .case_insensitive(!case_sensitive)
        // `^`/`$` at line boundaries: the buffer searched holds many lines.
        .multi_line(true)
        .fixed_strings(!is_regex)
        // Binary detection quits at NUL, so a NUL in the query could never match.
        .ban_byte(Some(b'\0'))
        // CRLF mode sets the line terminator (`\n`, with `\r` before it treated as part of it).
        .crlf(true)
        .build(query)
        .map_err(SearchError::Query)
}

/// One searcher per walker thread (it owns its read buffer). Its line terminator must equal
/// the matcher's, or grep-searcher refuses the search.
fn build_searcher(context: usize) -> Searcher {
    SearcherBuilder::new()
        .line_terminator(LineTerminator::crlf())
        .line_number(true)
        .before_context(context)
        .after_context(context)
        .binary_detection(BinaryDetection::quit(b'\0'))
        .memory_map(MmapChoice::never())
        .build()
}

fn build_overrides(start: &Path, glob: Option<&str>) -> Result<Override, SearchError> {
    let mut builder = OverrideBuilder::new(start);
    if let Some(glob) = glob {
        builder.add(glob).map_err(SearchError::Glob)?;
    }
    builder.build().map_err(SearchError::Glob)
}

fn thread_count() -> usize {
    std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_THREADS)
}

/// The directory (or file) to walk, relative to the root. Checked through the capability, so a
/// start that climbs out through a symlink is refused before anything is listed; a start that
/// is itself a symlink inside the root is replaced by its target (the walker would not enter it).
fn resolve_start(ws: &Workspace, rel_dir: &Path) -> Result<PathBuf, SearchError> {
    let probe = if rel_dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel_dir
    };
    let meta = ws
        .dir()
        .symlink_metadata(probe)
        .map_err(|e| start_error(e, rel_dir))?;
    if meta.file_type().is_symlink() {
        ws.dir()
            .canonicalize(probe)
            .map_err(|e| start_error(e, rel_dir))
    } else {
        Ok(rel_dir.to_path_buf())
    }
}

fn start_error(source: io::Error, rel_dir: &Path) -> SearchError {
    let path = rel_dir.display().to_string();
    match source.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => {
            SearchError::NotFound { path, source }
        }
        // cap-std reports an escape as a PermissionDenied of its own making (no OS errno); a
        // real EACCES carries one.
        io::ErrorKind::PermissionDenied if source.raw_os_error().is_none() => {
            SearchError::Outside { path, source }
        }
        _ => SearchError::Open { path, source },
    }
}

/// Ignore rules of the directories from the root down to (not including) the start, deepest
/// first. Read by host path: they only choose which files are skipped, and every file searched
/// is still opened through the capability.
fn ancestor_ignores(root: &Path, rel_start: &Path) -> Vec<Gitignore> {
    let mut dirs = vec![root.to_path_buf()];
    let mut current = root.to_path_buf();
    let components: Vec<_> = rel_start
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    // The last component is the start itself, which the walker reads.
    for component in components.iter().take(components.len().saturating_sub(1)) {
        current.push(component);
        dirs.push(current.clone());
    }
    if components.is_empty() {
        return Vec::new();
    }
    dirs.iter()
        .rev()
        .filter_map(|dir| {
            let mut builder = GitignoreBuilder::new(dir);
            for name in ANCESTOR_IGNORE_FILES {
                let file = dir.join(name);
                if file.is_file() {
                    // A partly invalid file still yields its valid globs, as in the walker.
                    let _ = builder.add(file);
                }
            }
            builder.build().ok().filter(|gi| !gi.is_empty())
        })
        .collect()
}

/// The walker's entry filter: skipped names, then the ancestors' ignore rules (deepest wins).
fn keep_entry(entry: &DirEntry, ancestors: &[Gitignore]) -> bool {
    if entry.depth() > 0 {
        if let Some(name) = entry.file_name().to_str() {
            if SKIPPED_NAMES.contains(&name) {
                return false;
            }
        }
    }
    let is_dir = entry.file_type().is_some_and(|t| t.is_dir());
    for gitignore in ancestors {
        let matched = gitignore.matched(entry.path(), is_dir);
        if matched.is_ignore() {
            return false;
        }
        if matched.is_whitelist() {
            return true;
        }
    }
    true
}

/// State every walker thread shares.
struct Shared {
    max_results: usize,
    /// Matching lines claimed so far; a claim past `max_results` means truncated.
    taken: AtomicUsize,
    truncated: AtomicBool,
    /// Set once truncated: threads finish the after-context they owe, then stop.
    quit: AtomicBool,
    files_searched: AtomicU64,
    files_skipped_large: AtomicU64,
    hits: Mutex<Vec<SearchHit>>,
}

struct VisitorBuilder<'s> {
    ws: &'s Workspace,
    shared: &'s Shared,
    matcher: &'s RegexMatcher,
    context: usize,
}

impl<'s> ParallelVisitorBuilder<'s> for VisitorBuilder<'s> {
    fn build(&mut self) -> Box<dyn ParallelVisitor + 's> {
        let mut open_options = cap_std::fs::OpenOptions::new();
        open_options.read(true);
        // A regular file swapped for a FIFO between listing and opening must not block us.
        open_options.nonblock(true);
        Box::new(Visitor {
            ws: self.ws,
            shared: self.shared,
            // Cheap: the compiled regex is shared, each clone gets its own scratch cache.
            matcher: self.matcher.clone(),
            searcher: build_searcher(self.context),
            open_options,
            context: self.context,
            hits: Vec::new(),
            recent: VecDeque::new(),
            pending: Vec::new(),
            files_searched: 0,
            files_skipped_large: 0,
        })
    }
}

/// One walker thread: its own matcher, searcher and hits, merged into [`Shared`] when dropped
/// (so the threads never contend while searching).
struct Visitor<'s> {
    ws: &'s Workspace,
    shared: &'s Shared,
    matcher: RegexMatcher,
    searcher: Searcher,
    open_options: cap_std::fs::OpenOptions,
    context: usize,
    hits: Vec<SearchHit>,
    /// Per-file scratch of [`FileSink`], kept to reuse the allocations.
    recent: VecDeque<(u64, String)>,
    pending: Vec<(usize, u64)>,
    files_searched: u64,
    files_skipped_large: u64,
}

impl ParallelVisitor for Visitor<'_> {
    fn visit(&mut self, entry: Result<DirEntry, ignore::Error>) -> WalkState {
        if self.shared.quit.load(Ordering::Relaxed) {
            return WalkState::Quit;
        }
        // Unreadable directories and the like: skipped, as `rg` does (it only warns).
        let Ok(entry) = entry else {
            return WalkState::Continue;
        };
        // Directories are walked, symlinks are never followed, sockets and FIFOs never read.
        if entry.file_type().is_some_and(|t| t.is_file()) {
            self.search_entry(&entry);
        }
        if self.shared.quit.load(Ordering::Relaxed) {
            WalkState::Quit
        } else {
            WalkState::Continue
        }
    }
}

impl Visitor<'_> {
    fn search_entry(&mut self, entry: &DirEntry) {
        let Ok(rel) = entry.path().strip_prefix(self.ws.root()) else {
            return;
        };
        let Some(file) = open_confined(self.ws, rel, &self.open_options) else {
            return;
        };
        // fstat of what was opened, not of the listed name: no race with a swap.
        let Ok(meta) = file.metadata() else {
            return;
        };
        if !meta.is_file() {
            return;
        }
        if meta.len() > MAX_FILE_BYTES {
            self.files_skipped_large += 1;
            return;
        }
        self.files_searched += 1;
        self.recent.clear();
        self.pending.clear();
        let mut sink = FileSink {
            rel,
            path: None,
            shared: self.shared,
            matcher: &self.matcher,
            context: self.context,
            hits: &mut self.hits,
            recent: &mut self.recent,
            pending: &mut self.pending,
        };
        // A read error mid-file keeps the hits found before it, like `rg`.
        let _ = self.searcher.search_file(&self.matcher, &file, &mut sink);
    }
}

impl Drop for Visitor<'_> {
    fn drop(&mut self) {
        let shared = self.shared;
        shared
            .files_searched
            .fetch_add(self.files_searched, Ordering::Relaxed);
        shared
            .files_skipped_large
            .fetch_add(self.files_skipped_large, Ordering::Relaxed);
        if !self.hits.is_empty() {
            shared
                .hits
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .append(&mut self.hits);
        }
    }
}

/// Opens `rel` beneath the root (openat2 `RESOLVE_BENEATH`): a symlink on the way that leads
/// out, including a directory swapped for one after it was listed, is refused, so nothing
/// outside is ever read.
fn open_confined(
    ws: &Workspace,
    rel: &Path,
    options: &cap_std::fs::OpenOptions,
) -> Option<std::fs::File> {
    ws.dir()
        .open_with(rel, options)
        .ok()
        .map(cap_std::fs::File::into_std)
}

/// Receives one file's matching and context lines from grep-searcher.
struct FileSink<'a> {
    rel: &'a Path,
    /// `rel` as a reply path, made at the file's first hit.
    path: Option<String>,
    shared: &'a Shared,
    matcher: &'a RegexMatcher,
    context: usize,
    hits: &'a mut Vec<SearchHit>,
    /// The last `context` lines seen (matching or not), for the next hit's `context_before`.
    recent: &'a mut VecDeque<(u64, String)>,
    /// Hits (index in `hits`) still owed `context_after`, up to the line number given.
    pending: &'a mut Vec<(usize, u64)>,
}

impl FileSink<'_> {
    /// Whether to keep reading: stop once the search is over and no hit awaits context.
    fn keep_going(&self) -> bool {
        !(self.shared.quit.load(Ordering::Relaxed) && self.pending.is_empty())
    }

    fn reply_path(&mut self) -> String {
        self.path
            .get_or_insert_with(|| {
                let parts: Vec<_> = self
                    .rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect();
                parts.join("/")
            })
            .clone()
    }

    /// One line, in order: first context for earlier hits, then a hit itself when `is_hit`.
    fn line(&mut self, number: u64, bytes: &[u8], is_hit: bool) {
        if self.context == 0 {
            if is_hit {
                let hit = SearchHit {
                    path: self.reply_path(),
                    line: number,
                    text: line_text(bytes, Some(self.matcher)),
                    context_before: Vec::new(),
                    context_after: Vec::new(),
                };
                self.hits.push(hit);
            }
            return;
        }
        let text = line_text(bytes, is_hit.then_some(self.matcher));
        for &(index, last) in self.pending.iter() {
            if number <= last {
                self.hits[index].context_after.push(text.clone());
            }
        }
        self.pending.retain(|&(_, last)| last > number);
        if is_hit {
            let context = self.context as u64;
            let context_before = self
                .recent
                .iter()
                .filter(|(n, _)| *n < number && n + context >= number)
                .map(|(_, t)| t.clone())
                .collect();
            let hit = SearchHit {
                path: self.reply_path(),
                line: number,
                text: text.clone(),
                context_before,
                context_after: Vec::new(),
            };
            self.pending.push((self.hits.len(), number + context));
            self.hits.push(hit);
        }
        if self.recent.len() == self.context {
            self.recent.pop_front();
        }
        self.recent.push_back((number, text));
    }
}

impl Sink for FileSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        if !self.keep_going() {
            return Ok(false);
        }
        let number = mat.line_number().unwrap_or(0);
        let claimed = self.shared.taken.fetch_add(1, Ordering::Relaxed);
        if claimed >= self.shared.max_results {
            // One more than asked for: the reply is truncated. This line is still context of
            // the hits before it.
            self.shared.truncated.store(true, Ordering::Relaxed);
            self.shared.quit.store(true, Ordering::Relaxed);
            self.line(number, mat.bytes(), false);
        } else {
            self.line(number, mat.bytes(), true);
        }
        Ok(self.keep_going())
    }

    fn context(&mut self, _searcher: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, io::Error> {
        if !self.keep_going() {
            return Ok(false);
        }
        self.line(ctx.line_number().unwrap_or(0), ctx.bytes(), false);
        Ok(self.keep_going())
    }
}

/// A line's text without its terminator (`\n` or `\r\n`), UTF-8 lossy, cut to
/// [`MAX_LINE_CHARS`] around the first match of `matcher` when given.
fn line_text(bytes: &[u8], matcher: Option<&RegexMatcher>) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    // Characters never outnumber bytes: short lines need no counting.
    if bytes.len() <= MAX_LINE_CHARS {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let text = String::from_utf8_lossy(bytes);
    let total = text.chars().count();
    if total <= MAX_LINE_CHARS {
        return text.into_owned();
    }
    let match_start = matcher
        .and_then(|m| m.find(text.as_bytes()).ok().flatten())
        .map_or(0, |m| text[..m.start()].chars().count());
    // A little before the match, so that what precedes it on the line shows too.
    let first = match_start
        .saturating_sub(MAX_LINE_CHARS / 10)
        .min(total - MAX_LINE_CHARS);
    let last = first + MAX_LINE_CHARS;
    let mut out = String::with_capacity(MAX_LINE_CHARS * 4 + 6);
    if first > 0 {
        out.push('…');
    }
    out.extend(text.chars().skip(first).take(MAX_LINE_CHARS));
    if last < total {
        out.push('…');
    }
    out
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
