//! Listing a workspace's directories, the engine of `list_workspace_files` (and of the file
//! sample of `workspace_status`): bounded breadth-first walks over open directory handles that
//! never follow a symlink. It takes [`ListOptions`]; the tool turns its arguments into them.
//! Every path goes through [`crate::confine`]'s rules.

use std::collections::VecDeque;
use std::io;

use cap_fs_ext::DirExt;
use cap_std::fs::Dir;
use globset::{GlobBuilder, GlobMatcher};
use serde::Serialize;
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::ToolError;

use crate::confine::{
    join, map_io, mtime_ns, ConfineError, ConfineErrorKind, EntryType, Workspace, WorkspacePath,
};

/// Why a listing was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// A path rule refused it, or the file system failed ([`crate::confine`]).
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// The glob does not parse.
    #[error("argument /glob: is not a valid glob: {}", .0.kind())]
    Glob(#[source] globset::Error),
}

/// What kind of [`ListError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListErrorKind {
    /// See [`ConfineError::kind`].
    Confine(ConfineErrorKind),
    /// `invalid_arguments` at `/glob`.
    Glob,
}

impl ListError {
    pub fn kind(&self) -> ListErrorKind {
        match self {
            ListError::Confine(e) => ListErrorKind::Confine(e.kind()),
            ListError::Glob(_) => ListErrorKind::Glob,
        }
    }
}

/// PROTOCOL.md's code and sentence.
impl From<ListError> for ToolError {
    fn from(e: ListError) -> Self {
        match e {
            ListError::Confine(e) => e.into(),
            ListError::Glob(e) => {
                ToolError::invalid_argument("/glob", format!("is not a valid glob: {}", e.kind()))
            }
        }
    }
}

/// `list_workspace_files` never returns more entries than this (PROTOCOL.md).
pub const LIST_MAX_RESULTS: u64 = 5000;
/// A listing stops walking after this many directory entries and answers `truncated`, so a
/// huge tree costs bounded time and memory (the name sort needs every match in memory).
pub const LIST_WALK_LIMIT: usize = 100_000;
/// `workspace_status` samples at most this many directory entries.
pub const SAMPLE_WALK_LIMIT: usize = 5000;

/// How a listing orders its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// Ascending by path.
    Name,
    /// Newest first.
    Mtime,
    /// Largest first.
    Size,
}

/// What to list and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOptions {
    /// The directory listed, relative to the workspace root.
    pub path: String,
    /// Matched against the path relative to `path`; `**` crosses directories.
    pub glob: Option<String>,
    pub recursive: bool,
    pub include_dirs: bool,
    /// Clamped to [`LIST_MAX_RESULTS`].
    pub max_results: u64,
    pub sort_by: SortBy,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// The last component.
    pub name: String,
    /// Relative to the workspace root.
    pub path: String,
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// Bytes; for a symlink, the size of the link itself (it is never followed).
    pub size: u64,
    pub mtime_ns: i64,
}

/// The result of [`list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListOutcome {
    pub entries: Vec<Entry>,
    /// More entries matched than were returned, or the walk stopped at [`LIST_WALK_LIMIT`].
    pub truncated: bool,
    /// Directories that matched the walk but could not be opened (their contents are
    /// missing from `entries`); never silently skipped, absent from JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// Lists `options.path` (a directory).
///
/// * `glob` matches the path relative to the listed directory; `*` stays within one
///   component, `**` crosses directories. Without `recursive`, a glob still reaches as deep as
///   it can match: one level per `/` in it, every level when it holds `**`.
/// * Symlinked directories are listed as `symlink` and never descended into.
/// * `max_results` is clamped to [`LIST_MAX_RESULTS`]; `name` sorts ascending by path, `mtime`
///   and `size` descending (ties by path).
pub fn list(ws: &Workspace, options: &ListOptions) -> Result<ListOutcome, ListError> {
    let listed = WorkspacePath::parse(&options.path, "path")?;
    let matcher = match &options.glob {
        Some(glob) if !glob.is_empty() => Some(compile_glob(glob)?),
        _ => None,
    };
    let max_depth = match &options.glob {
        _ if options.recursive => usize::MAX,
        Some(glob) if glob.contains("**") => usize::MAX,
        Some(glob) => 1 + glob.matches('/').count(),
        None => 1,
    };
    let max_results =
        usize::try_from(options.max_results.min(LIST_MAX_RESULTS)).unwrap_or(usize::MAX);

    let top = ws
        .dir()
        .open_dir(listed.as_path())
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotADirectory => ConfineError::argument(
                listed.pointer(),
                format!("'{listed}' is a file, not a directory; read it with read_workspace_file"),
            ),
            _ => map_io("list", &listed, e),
        })?;

    let mut entries = Vec::new();
    let mut unreadable = Vec::new();
    let mut visited = 0usize;
    let mut walk_cut = false;
    // Breadth-first over open directory handles: each level is read through the handle of its
    // parent, so nothing is resolved by path again below the top.
    let mut queue: VecDeque<(Dir, String, usize)> = VecDeque::from([(top, String::new(), 1)]);
    'walk: while let Some((dir, rel, depth)) = queue.pop_front() {
        let here = listed.child_or_self(&rel);
        let read = match dir.entries() {
            Ok(read) => read,
            Err(e) if rel.is_empty() => return Err(map_io("list", &here, e).into()),
            Err(e) => {
                tracing::warn!(path = %DisplaySafe(&here), error = %e, "directory unreadable while listing");
                unreadable.push(here.display());
                continue;
            }
        };
        for item in read {
            let item = match item {
                Ok(item) => item,
                Err(e) => {
                    unreadable.push(here.display());
                    tracing::warn!(path = %DisplaySafe(&here), error = %e, "directory entry unreadable while listing");
                    continue;
                }
            };
            visited += 1;
            if visited > LIST_WALK_LIMIT {
                walk_cut = true;
                break 'walk;
            }
            let os_name = item.file_name();
            let name = os_name.to_string_lossy().into_owned();
            let entry_rel = join(&rel, &name);
            let Ok(meta) = item.metadata() else {
                // Removed between readdir and stat: it no longer exists.
                continue;
            };
            let kind = EntryType::of(meta.file_type());
            if kind == EntryType::Dir && depth < max_depth {
                match dir.open_dir_nofollow(&os_name) {
                    Ok(child) => queue.push_back((child, entry_rel.clone(), depth + 1)),
                    Err(e) => {
                        tracing::warn!(path = %DisplaySafe(listed.child_or_self(&entry_rel)), error = %e, "directory unreadable while listing");
                        unreadable.push(listed.child_or_self(&entry_rel).display());
                    }
                }
            }
            if kind == EntryType::Dir && !options.include_dirs {
                continue;
            }
            if let Some(matcher) = &matcher {
                if !matcher.is_match(&entry_rel) {
                    continue;
                }
            }
            entries.push(Entry {
                name,
                path: listed.child_or_self(&entry_rel).display(),
                kind,
                size: meta.len(),
                mtime_ns: mtime_ns(&meta),
            });
        }
    }

    match options.sort_by {
        SortBy::Name => entries.sort_by(|a, b| a.path.cmp(&b.path)),
        SortBy::Mtime => entries.sort_by(|a, b| {
            b.mtime_ns
                .cmp(&a.mtime_ns)
                .then_with(|| a.path.cmp(&b.path))
        }),
        SortBy::Size => {
            entries.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.path.cmp(&b.path)))
        }
    }
    let truncated = walk_cut || entries.len() > max_results;
    entries.truncate(max_results);
    unreadable.sort();
    unreadable.dedup();
    Ok(ListOutcome {
        entries,
        truncated,
        unreadable,
    })
}

fn compile_glob(glob: &str) -> Result<GlobMatcher, ListError> {
    GlobBuilder::new(glob)
        // `*` stays within one component; only `**` crosses directories.
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(ListError::Glob)
}

/// Up to `limit` relative paths of regular files, breadth-first (top-level files first), names
/// sorted within each directory, and how many files the bounded walk saw
/// (`file_count_sampled`). The walk stops after [`SAMPLE_WALK_LIMIT`] entries and never
/// follows symlinks.
pub fn sample(ws: &Workspace, limit: usize) -> Result<(Vec<String>, usize), ConfineError> {
    let root = WorkspacePath::root("path");
    let top = ws
        .dir()
        .open_dir(".")
        .map_err(|e| map_io("list", &root, e))?;
    let mut files = Vec::new();
    let mut count = 0usize;
    let mut visited = 0usize;
    let mut queue: VecDeque<(Dir, String)> = VecDeque::from([(top, String::new())]);
    'walk: while let Some((dir, rel)) = queue.pop_front() {
        let Ok(read) = dir.entries() else {
            continue;
        };
        let mut items: Vec<_> = read
            .filter_map(Result::ok)
            .filter_map(|item| Some((item.file_name(), item.file_type().ok()?)))
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        for (os_name, file_type) in items {
            visited += 1;
            if visited > SAMPLE_WALK_LIMIT {
                break 'walk;
            }
            let entry_rel = join(&rel, &os_name.to_string_lossy());
            if file_type.is_dir() {
                if let Ok(child) = dir.open_dir_nofollow(&os_name) {
                    queue.push_back((child, entry_rel));
                }
            } else if file_type.is_file() {
                count += 1;
                if files.len() < limit {
                    files.push(entry_rel);
                }
            }
        }
    }
    Ok((files, count))
}
