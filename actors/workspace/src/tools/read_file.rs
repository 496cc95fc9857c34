//! `read_workspace_file`: a UTF-8 text file with line numbers, a line range and a character
//! budget; the read is recorded so that the file may be edited later.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::outputs::Whole;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::ToolError;

use crate::confine::{self, Workspace, WorkspacePath};
use crate::service::{
    not_utf8, too_large, WorkspaceService, EDIT_MAX_BYTES, INLINE_READ_MAX_BYTES, READ_MAX_BYTES,
};

impl Tool<WorkspaceService> for ReadFile {
    const DEF: &'static ToolDef = &crate::service::FOCUSED.named("read_workspace_file");

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let session = call.session()?.clone();
        let path = WorkspacePath::parse(&self.path, "path")?;
        if let (Some(start), Some(end)) = (self.start_line, self.end_line) {
            if end < start {
                return Err(ToolError::invalid_argument(
                    "/end_line",
                    "must not be before start_line",
                ));
            }
        }
        let budget_chars = self.max_chars.map_or(call.outputs.budget_chars, |c| {
            c.clamp(1_000, 100_000) as usize
        });
        let ranged = self.start_line.is_some() || self.end_line.is_some();
        // A small file is opened, read and rendered right here: handing ~20 µs of cached file
        // work to the blocking pool and back costs more than the work (two thread wake-ups).
        // Anything bigger, or a result that might have to be persisted (fsync), goes to the
        // blocking pool as every other file operation does.
        let ws = Workspace::open(&service.data_dir, &call.ctx.account, &session)?;
        let (file, size) = confine::open_sized(&ws, &path)?;
        let (mut fields, over, sha) = if size <= INLINE_READ_MAX_BYTES {
            let text = read_opened_text(file, size, &path, ranged)?;
            if text.rendered_bound() <= budget_chars {
                render_read(&path, text, &self, budget_chars)?
            } else {
                let p = path.clone();
                service
                    .offload(move || render_read(&p, text, &self, budget_chars))
                    .await?
            }
        } else {
            let p = path.clone();
            service
                .offload(move || {
                    let text = if ranged && size > EDIT_MAX_BYTES {
                        read_streamed_range(
                            file,
                            size,
                            &p,
                            self.start_line.unwrap_or(1),
                            self.end_line,
                        )?
                    } else {
                        read_opened_text(file, size, &p, ranged)?
                    };
                    render_read(&p, text, &self, budget_chars)
                })
                .await?
        };
        if let Some(content) = over {
            call.outputs
                .persist_named(&mut fields, "content", Whole::Text(content.into()))
                .await?;
        }
        if let Some(sha) = sha {
            // Sent, not awaited (see `ReadState::record_pipelined`): a read that is not
            // recorded still returns the file; a later edit then says file_not_read, which is
            // the safe side.
            let recorded = service
                .read_state
                .record_pipelined(&call.ctx.account, &session, path.display().as_str(), &sha)
                .await;
            fields.insert("read_state_recorded".into(), Value::Bool(recorded));
        }
        Ok(fields)
    }
}

/// Read a UTF-8 text file of the workspace with line numbers, a line range and a character budget;
/// allows later edits of the file.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    pub path: String,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub start_line: Option<u64>,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub end_line: Option<u64>,
    /// Character budget of this read, clamped to 1000–100000.
    #[serde(default)]
    pub max_chars: Option<u64>,
    #[serde(default = "crate::service::yes")]
    pub include_line_numbers: bool,
}

/// A text file read for `read_workspace_file`.
struct TextRead {
    body: String,
    size: u64,
    /// The whole file's hash when it is small enough to edit (the read state).
    sha256: Option<String>,
    /// A ranged read of a big file stopped at the 2 MB cap.
    capped: bool,
    /// The line number of `body`'s first line: 1, or where a streamed range begins.
    first_line: u64,
    /// The file's line count when `body` holds only part of the file (a streamed range).
    total_lines: Option<u64>,
}

impl TextRead {
    /// At most this many characters once rendered, line numbers included (`{n:>6}\t` and the
    /// newline per line): under the budget, nothing can need persisting.
    fn rendered_bound(&self) -> usize {
        let lines = self.body.bytes().filter(|b| *b == b'\n').count() + 1;
        self.body.len() + 8 * lines
    }
}

/// A ranged read of a big file failed part way: `internal`.
#[derive(Debug, thiserror::Error)]
#[error("cannot read '{path}': {source}")]
struct RangeReadError {
    path: String,
    #[source]
    source: std::io::Error,
}

/// `internal`, its cause logged here.
impl From<RangeReadError> for ToolError {
    fn from(e: RangeReadError) -> Self {
        ToolError::internal_logged(&e, "workspace file read failed")
    }
}

/// Reads a file opened with [`confine::open_sized`].
fn read_opened_text(
    file: cap_std::fs::File,
    size: u64,
    path: &WorkspacePath,
    ranged: bool,
) -> Result<TextRead, ToolError> {
    if size > READ_MAX_BYTES && !ranged {
        return Err(too_large(path, size, READ_MAX_BYTES)
            .with("hint", "give start_line/end_line to read a part"));
    }
    let limit = if size <= EDIT_MAX_BYTES {
        EDIT_MAX_BYTES
    } else {
        READ_MAX_BYTES
    };
    let mut bytes = confine::read_opened(file, path, limit, size)?;
    let capped = (bytes.len() as u64) < size;
    let sha256 = (!capped).then(|| confine::sha256_of(&bytes));
    if capped {
        // Cut at the last whole line so the text stays valid.
        if let Some(end) = bytes.iter().rposition(|b| *b == b'\n') {
            bytes.truncate(end + 1);
        }
    }
    let body = String::from_utf8(bytes).map_err(|_| not_utf8(path))?;
    Ok(TextRead {
        body,
        size,
        sha256,
        capped,
        first_line: 1,
        total_lines: None,
    })
}

/// A line range of a file too big to hold (over the edit limit): streams through it, keeping
/// only the lines of the range (at most [`READ_MAX_BYTES`] of them) and counting the rest.
fn read_streamed_range(
    file: cap_std::fs::File,
    size: u64,
    path: &WorkspacePath,
    start: u64,
    end: Option<u64>,
) -> Result<TextRead, ToolError> {
    use std::io::BufRead as _;
    let mut reader = std::io::BufReader::with_capacity(256 * 1024, file);
    let mut kept: Vec<u8> = Vec::new();
    let mut capped = false;
    let mut line_no: u64 = 0;
    let mut line: Vec<u8> = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|source| RangeReadError {
                path: path.to_string(),
                source,
            })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let in_range = line_no >= start && end.is_none_or(|e| line_no <= e);
        if in_range && !capped {
            if (kept.len() + line.len()) as u64 > READ_MAX_BYTES {
                capped = true;
            } else {
                kept.extend_from_slice(&line);
                if !line.ends_with(b"\n") {
                    kept.push(b'\n');
                }
            }
        }
    }
    let body = String::from_utf8(kept).map_err(|_| not_utf8(path))?;
    Ok(TextRead {
        body,
        size,
        sha256: None,
        capped,
        first_line: start,
        total_lines: Some(line_no),
    })
}

/// The fields of a `read_workspace_file` reply for a file already read, the whole content
/// when it was cut (to be kept), and the file's hash for the read state.
fn render_read(
    p: &WorkspacePath,
    text: TextRead,
    a: &ReadFile,
    budget_chars: usize,
) -> Result<Rendered, ToolError> {
    use std::fmt::Write as _;
    let lines: Vec<&str> = text.body.lines().collect();
    // `lines[0]` is line `first_line` of the file.
    let offset = text.first_line - 1;
    let total = text.total_lines.unwrap_or(lines.len() as u64);
    let start = a.start_line.unwrap_or(1);
    // A streamed range may stop early at the size cap: end at the last line it holds.
    let mut end = a
        .end_line
        .unwrap_or(total)
        .min(total)
        .min(offset + lines.len() as u64);
    if total > 0 && start > total {
        return Err(ToolError::invalid_argument(
            "/start_line",
            format!("{} has {total} lines", p.display()),
        ));
    }
    let mut content = String::with_capacity(text.body.len() + 8 * lines.len());
    // A range of a file over READ_MAX_BYTES reads at most that many bytes of its lines
    // (PROTOCOL.md), ending on a whole line; a smaller file never reaches the cap.
    let mut capped = text.capped;
    let mut range_bytes: u64 = 0;
    for n in start..=end {
        let line = lines[(n - 1 - offset) as usize];
        range_bytes += line.len() as u64 + 1;
        if text.size > READ_MAX_BYTES && range_bytes > READ_MAX_BYTES {
            capped = true;
            end = n - 1;
            break;
        }
        if a.include_line_numbers {
            let _ = writeln!(content, "{n:>6}\t{line}");
        } else {
            content.push_str(line);
            content.push('\n');
        }
    }
    let mut fields = Map::new();
    fields.insert("path".into(), Value::from(p.display()));
    let range_partial = start > 1 || end < total;
    let over = budget::insert_over(&mut fields, "content", content, budget_chars);
    let cut = over.is_some();
    fields.insert("read_range".into(), json!([start, end]));
    fields.insert("total_lines".into(), Value::from(total));
    fields.insert(
        "partial".into(),
        Value::Bool(range_partial || cut || capped),
    );
    fields.insert("size".into(), Value::from(text.size));
    Ok((fields, over, text.sha256))
}

/// A rendered read: its fields, the whole content when it was cut, the file's hash.
type Rendered = (Map<String, Value>, Option<String>, Option<String>);
