//! The workspace tools, one method each: arguments are the kernel's types (the schema the
//! gateway validated), results are PROTOCOL.md's shapes. File work runs on the blocking pool;
//! read state and locks are in Redis ([`ReadState`]).

use std::path::PathBuf;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::args::*;
use toolmesh_kernel::wire::{ActorCall, InvocationContext};
use toolmesh_kernel::{ErrorCode, SessionId, ToolError};

use crate::confine::{self, Workspace, WorkspacePath};
use crate::readstate::{FileLock, ReadState};
use crate::{edit, lint, search};

/// Largest file read whole (PROTOCOL.md); a line range may read further into a bigger file.
pub const READ_MAX_BYTES: u64 = 2 * 1024 * 1024;
/// Largest file `read_workspace_file` reads without the blocking pool.
pub const INLINE_READ_MAX_BYTES: u64 = 16 * 1024;
/// Largest file an edit or lint takes in.
pub const EDIT_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// `write_workspace_files` writes at most this many files per call.
pub const BATCH_MAX_FILES: usize = 100;
/// Where results over the budget are persisted, inside the workspace.
pub const OUTPUTS_DIR: &str = ".toolmesh/outputs";

/// What the tools share.
#[derive(Debug)]
pub struct WorkspaceService {
    pub data_dir: PathBuf,
    pub read_state: ReadState,
    pub budget_chars: usize,
}

fn args<T: DeserializeOwned>(value: &Value) -> Result<T, ToolError> {
    serde_json::from_value(value.clone())
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, format!("arguments: {e}")))
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn not_utf8(path: &WorkspacePath) -> ToolError {
    ToolError::new(
        ErrorCode::NotUtf8,
        format!(
            "{} is not UTF-8 text; it cannot be read or edited as text",
            path.display()
        ),
    )
}

fn too_large(path: &WorkspacePath, size: u64, limit: u64) -> ToolError {
    ToolError::new(
        ErrorCode::FileTooLarge,
        format!(
            "{} is {size} bytes, over the {limit} byte limit of this tool",
            path.display()
        ),
    )
}

impl WorkspaceService {
    /// Runs one routed call. `fields_limit`: the most bytes its result fields may take
    /// ([`budget::fields_limit`] of the connection's `max_payload`); list results are cut to it
    /// with `truncated: true`.
    pub async fn run(
        self: &Arc<Self>,
        call: &ActorCall,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        let ctx = &call.invocation;
        let session = ctx.session_id.clone().ok_or_else(|| {
            ToolError::invalid_request(format!(
                "{} works in a session: add \"session_id\"",
                call.tool
            ))
        })?;
        let a = &call.arguments;
        match call.tool.as_str() {
            "workspace_status" => self.status(ctx, session, fields_limit).await,
            "list_workspace_files" => self.list(ctx, session, args(a)?, fields_limit).await,
            "read_workspace_file" => self.read(ctx, session, args(a)?).await,
            "write_workspace_file" => self.write(ctx, session, args(a)?).await,
            "write_workspace_files" => self.write_many(ctx, session, args(a)?).await,
            "edit_workspace_file" => self.edit(ctx, session, args(a)?).await,
            "multi_edit_workspace_file" => self.multi_edit(ctx, session, args(a)?).await,
            "lint_workspace_file" => self.lint(ctx, session, args(a)?, fields_limit).await,
            "search_workspace_files" => self.search(ctx, session, args(a)?, fields_limit).await,
            "delete_workspace_file" => self.delete(ctx, session, args(a)?).await,
            other => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the workspace actor does not serve {other}"),
            )),
        }
    }

    /// Opens the session's workspace and runs `work` on the blocking pool.
    async fn blocking<T, F>(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        work: F,
    ) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce(&Workspace) -> Result<T, ToolError> + Send + 'static,
    {
        let data_dir = self.data_dir.clone();
        let account = ctx.account.clone();
        tokio::task::spawn_blocking(move || {
            let ws = Workspace::open(&data_dir, &account, &session)?;
            work(&ws)
        })
        .await
        .map_err(|e| {
            ToolError::internal(format!(
                "a workspace task failed ({e}); see the workspace log"
            ))
        })?
    }

    /// Runs `work` on the blocking pool.
    async fn offload<T, F>(&self, work: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, ToolError> + Send + 'static,
    {
        tokio::task::spawn_blocking(work).await.map_err(|e| {
            ToolError::internal(format!(
                "a workspace task failed ({e}); see the workspace log"
            ))
        })?
    }

    async fn status(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        self.blocking(ctx, session, move |ws| {
            let (files, sampled) = confine::sample(ws, 50)?;
            let mut fields = object(json!({
                "root": ws.root().display().to_string(),
                "files": files,
                "file_count_sampled": sampled,
            }));
            budget::fit_list(&mut fields, "files", fields_limit);
            Ok(fields)
        })
        .await
    }

    async fn list(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: ListWorkspaceFilesArgs,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        self.blocking(ctx, session, move |ws| {
            let listed = confine::list(ws, &a)?;
            let mut fields = object(serde_json::to_value(&listed).unwrap_or_default());
            fields.insert("path".into(), Value::from(a.path.clone()));
            fields.insert("count".into(), Value::from(listed.entries.len()));
            if budget::fit_list(&mut fields, "entries", fields_limit) {
                let kept = fields["entries"].as_array().map_or(0, Vec::len);
                fields.insert("count".into(), Value::from(kept));
            }
            Ok(fields)
        })
        .await
    }

    async fn read(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: ReadWorkspaceFileArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let path = WorkspacePath::parse(&a.path, "path")?;
        if let (Some(start), Some(end)) = (a.start_line, a.end_line) {
            if end < start {
                return Err(ToolError::invalid_argument(
                    "/end_line",
                    "must not be before start_line",
                ));
            }
        }
        let budget_chars = a
            .max_chars
            .map_or(self.budget_chars, |c| c.clamp(1_000, 100_000) as usize);
        let invocation = ctx.invocation_id.to_string();
        let ranged = a.start_line.is_some() || a.end_line.is_some();
        // A small file is opened, read and rendered right here: handing ~20 µs of cached file
        // work to the blocking pool and back costs more than the work (two thread wake-ups).
        // Anything bigger, or a result that might have to be persisted (fsync), goes to the
        // blocking pool as every other file operation does.
        let ws = Workspace::open(&self.data_dir, &ctx.account, &session)?;
        let (file, size) = confine::open_sized(&ws, &path)?;
        let (mut fields, sha) = if size <= INLINE_READ_MAX_BYTES {
            let text = read_opened_text(file, size, &path, ranged)?;
            if text.rendered_bound() <= budget_chars {
                render_read(&ws, &path, text, &a, budget_chars, &invocation)?
            } else {
                let p = path.clone();
                self.offload(move || render_read(&ws, &p, text, &a, budget_chars, &invocation))
                    .await?
            }
        } else {
            let p = path.clone();
            self.offload(move || {
                let text = if ranged && size > EDIT_MAX_BYTES {
                    read_streamed_range(file, size, &p, a.start_line.unwrap_or(1), a.end_line)?
                } else {
                    read_opened_text(file, size, &p, ranged)?
                };
                render_read(&ws, &p, text, &a, budget_chars, &invocation)
            })
            .await?
        };
        if let Some(sha) = sha {
            // Sent, not awaited (see `ReadState::record_pipelined`): a read that is not
            // recorded still returns the file; a later edit then says file_not_read, which is
            // the safe side.
            let recorded = self
                .read_state
                .record_pipelined(&ctx.account, &session, path.display().as_str(), &sha)
                .await;
            fields.insert("read_state_recorded".into(), Value::Bool(recorded));
        }
        Ok(fields)
    }

    async fn locked<T>(
        &self,
        ctx: &InvocationContext,
        session: &SessionId,
        paths: &[WorkspacePath],
        work: impl std::future::Future<Output = Result<T, ToolError>>,
    ) -> Result<T, ToolError> {
        let mut names: Vec<String> = paths.iter().map(|p| p.display()).collect();
        names.sort();
        names.dedup();
        let mut held: Vec<FileLock> = Vec::with_capacity(names.len());
        for name in &names {
            match self.read_state.lock(&ctx.account, session, name).await {
                Ok(lock) => held.push(lock),
                Err(e) => {
                    for lock in held {
                        self.read_state.unlock(lock).await;
                    }
                    return Err(e);
                }
            }
        }
        let result = work.await;
        for lock in held {
            self.read_state.unlock(lock).await;
        }
        result
    }

    async fn write(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: WriteWorkspaceFileArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let path = WorkspacePath::parse(&a.path, "path")?;
        let sha = confine::sha256_of(a.content.as_bytes());
        let p = path.clone();
        self.locked(ctx, &session, std::slice::from_ref(&path), async {
            let outcome = self
                .blocking(ctx, session.clone(), move |ws| {
                    confine::write_atomic(ws, &p, a.content.as_bytes(), a.overwrite)
                })
                .await?;
            self.read_state
                .record(&ctx.account, &session, path.display().as_str(), &sha)
                .await?;
            Ok(object(json!({
                "path": path.display(),
                "bytes_written": outcome.bytes,
                "created": outcome.created,
            })))
        })
        .await
    }

    async fn write_many(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: WriteWorkspaceFilesArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let truncated = a.files.len() > BATCH_MAX_FILES;
        let mut files = Vec::new();
        for (i, f) in a.files.into_iter().take(BATCH_MAX_FILES).enumerate() {
            let path = WorkspacePath::parse(&f.path, &format!("files/{i}/path"))?;
            files.push((path, f.content));
        }
        let paths: Vec<WorkspacePath> = files.iter().map(|(p, _)| p.clone()).collect();
        let hashes: Vec<(String, String)> = files
            .iter()
            .map(|(p, c)| (p.display(), confine::sha256_of(c.as_bytes())))
            .collect();
        let overwrite = a.overwrite;
        self.locked(ctx, &session, &paths, async {
            let written = self
                .blocking(ctx, session.clone(), move |ws| {
                    confine::write_batch(ws, &files, overwrite)
                })
                .await?;
            for (path, sha) in &hashes {
                self.read_state
                    .record(&ctx.account, &session, path, sha)
                    .await?;
            }
            let count = written.len();
            Ok(object(json!({
                "written": written,
                "count": count,
                "truncated": truncated,
            })))
        })
        .await
    }

    /// Reads the file under lock, checks the read state, applies `change`, writes atomically.
    async fn change<F>(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        path: WorkspacePath,
        change: F,
    ) -> Result<Map<String, Value>, ToolError>
    where
        F: FnOnce(&str) -> Result<(String, Map<String, Value>), ToolError> + Send + 'static,
    {
        let name = path.display();
        let invocation = ctx.invocation_id.to_string();
        let budget_chars = self.budget_chars;
        self.locked(ctx, &session, std::slice::from_ref(&path), async {
            let seen = self
                .read_state
                .recorded(&ctx.account, &session, &name)
                .await?;
            let Some(seen) = seen else {
                return Err(ToolError::new(
                    ErrorCode::FileNotRead,
                    format!("{name} was not read in this session; read_workspace_file it first"),
                ));
            };
            let p = path.clone();
            let (fields, sha) = self
                .blocking(ctx, session.clone(), move |ws| {
                    let bytes = confine::read(ws, &p, EDIT_MAX_BYTES)?;
                    if confine::sha256_of(&bytes) != seen {
                        return Err(ToolError::new(
                            ErrorCode::Conflict,
                            format!(
                                "{} changed since it was last read in this session; read it again",
                                p.display()
                            ),
                        ));
                    }
                    let before = String::from_utf8(bytes).map_err(|_| not_utf8(&p))?;
                    let (after, mut fields) = change(&before)?;
                    confine::write_atomic(ws, &p, after.as_bytes(), true)?;
                    let diff = edit::unified_diff(&p.display(), &before, &after);
                    fields.insert("path".into(), Value::from(p.display()));
                    budgeted(ws, &mut fields, "diff", &diff, budget_chars, &invocation)?;
                    Ok((fields, confine::sha256_of(after.as_bytes())))
                })
                .await?;
            self.read_state
                .record(&ctx.account, &session, &name, &sha)
                .await?;
            Ok(fields)
        })
        .await
    }

    async fn edit(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: EditWorkspaceFileArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let path = WorkspacePath::parse(&a.path, "path")?;
        self.change(ctx, session, path, move |before| {
            let applied = edit::apply_edit(
                before,
                &a.old_text,
                &a.new_text,
                a.expected_replacements,
                a.replace_all,
            )?;
            let mut fields = Map::new();
            fields.insert("replacements".into(), Value::from(applied.replacements));
            Ok((applied.content, fields))
        })
        .await
    }

    async fn multi_edit(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: MultiEditWorkspaceFileArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let path = WorkspacePath::parse(&a.path, "path")?;
        self.change(ctx, session, path, move |before| {
            let applied = edit::apply_edits(before, &a.edits, a.replace_all)?;
            let mut fields = Map::new();
            fields.insert("edit_count".into(), Value::from(a.edits.len()));
            fields.insert("replacements".into(), Value::from(applied.replacements));
            let edits: Vec<Value> = applied
                .edits
                .iter()
                .map(|(index, n)| json!({"index": index, "replacements": n}))
                .collect();
            fields.insert("edits".into(), Value::from(edits));
            Ok((applied.content, fields))
        })
        .await
    }

    async fn lint(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: LintWorkspaceFileArgs,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        let path = WorkspacePath::parse(&a.path, "path")?;
        self.blocking(ctx, session, move |ws| {
            let bytes = confine::read(ws, &path, EDIT_MAX_BYTES)?;
            let report = lint::lint(&path.display(), &bytes, a.language);
            let failed = lint::has_errors(&report);
            let mut fields = object(json!({
                "path": path.display(),
                "language": report.language,
                "issues": report.issues,
                "lint_model": lint::LINT_MODEL,
            }));
            // An error's envelope (code, message) takes a little more: leave it room.
            budget::fit_list(&mut fields, "issues", fields_limit.saturating_sub(512));
            if failed {
                let errors = report
                    .issues
                    .iter()
                    .filter(|i| i.level == lint::LintLevel::Error)
                    .count();
                let mut error = ToolError::new(
                    ErrorCode::LintErrors,
                    format!(
                        "{} has {errors} error-level issue(s); see issues",
                        path.display()
                    ),
                );
                error.details = fields;
                return Err(error);
            }
            Ok(fields)
        })
        .await
    }

    async fn search(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: SearchWorkspaceFilesArgs,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        let dir = WorkspacePath::parse(&a.path, "path")?;
        self.blocking(ctx, session, move |ws| {
            let outcome = search::search(ws, dir.as_path(), &a)?;
            let mut fields = object(serde_json::to_value(&outcome).unwrap_or_default());
            fields.insert("query".into(), Value::from(a.query.clone()));
            if budget::fit_list(&mut fields, "results", fields_limit) {
                // `match_count` counts the matching lines returned.
                let kept = fields["results"].as_array().map_or(0, Vec::len);
                fields.insert("match_count".into(), Value::from(kept));
            }
            Ok(fields)
        })
        .await
    }

    async fn delete(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: PathArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let path = WorkspacePath::parse(&a.path, "path")?;
        let name = path.display();
        let p = path.clone();
        self.locked(ctx, &session, std::slice::from_ref(&path), async {
            let outcome = self
                .blocking(ctx, session.clone(), move |ws| confine::delete(ws, &p))
                .await?;
            self.read_state
                .forget(&ctx.account, &session, &name)
                .await?;
            Ok(object(
                json!({"path": name, "deleted": true, "type": outcome.kind}),
            ))
        })
        .await
    }
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
            .map_err(|e| ToolError::internal(format!("cannot read '{path}': {e}")))?;
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

/// The fields of a `read_workspace_file` reply for a file already read, and the file's hash
/// for the read state.
fn render_read(
    ws: &Workspace,
    p: &WorkspacePath,
    text: TextRead,
    a: &ReadWorkspaceFileArgs,
    budget_chars: usize,
    invocation: &str,
) -> Result<(Map<String, Value>, Option<String>), ToolError> {
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
    let cut = budgeted(
        ws,
        &mut fields,
        "content",
        &content,
        budget_chars,
        invocation,
    )?;
    fields.insert("read_range".into(), json!([start, end]));
    fields.insert("total_lines".into(), Value::from(total));
    fields.insert(
        "partial".into(),
        Value::Bool(range_partial || cut || capped),
    );
    fields.insert("size".into(), Value::from(text.size));
    Ok((fields, text.sha256))
}

/// Puts a budgeted text field in `fields`; over the budget, the whole text is persisted under
/// `.toolmesh/outputs/` and named in `persisted_outputs`.
fn budgeted(
    ws: &Workspace,
    fields: &mut Map<String, Value>,
    field: &str,
    text: &str,
    budget_chars: usize,
    invocation: &str,
) -> Result<bool, ToolError> {
    let cut = budget::insert_budgeted(fields, field, text, budget_chars);
    if cut {
        let rel = format!("{OUTPUTS_DIR}/{invocation}-{field}.txt");
        let path = WorkspacePath::parse(&rel, field)?;
        confine::write_atomic(ws, &path, text.as_bytes(), true)?;
        let persisted = fields
            .entry("persisted_outputs")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(map) = persisted {
            map.insert(
                field.to_owned(),
                json!({"path": rel, "mime_type": "text/plain"}),
            );
        }
    }
    Ok(cut)
}
