//! What the workspace tools share: the [`WorkspaceService`] (the data folder, read state and
//! locks), running file work on the blocking pool, read-check-write of one file
//! (`WorkspaceService::change`), where over-budget text is kept (`OwnFiles`) and the
//! definitions' base (`WORKSPACE`, `WRITING`). The tools themselves are `tools/`, one file each.

use std::path::PathBuf;
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{BuiltinGroup, ToolCall, ToolDef};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};
use toolmesh_kernel::Role;

use futures::future::BoxFuture;
use serde_json::{Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::outputs::{Store, Target, Whole};
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::confine::{self, Workspace, WorkspacePath};
use crate::edit;
use crate::readstate::{FileLock, ReadState};
use crate::writing;

/// What a workspace tool's definition says unless it says otherwise: the workspace group and
/// role, low risk, no side effect, a session, the `coding` profile, arguments shown as they are.
pub(crate) const WORKSPACE: ToolDef = ToolDef {
    needs_session: true,
    profiles: &[Profile::Coding],
    ..ToolDef::of(BuiltinGroup::Workspace, Role::Workspace)
};

/// A workspace tool of the focused set (and the coding one).
pub(crate) const FOCUSED: ToolDef = WORKSPACE.profiles(&[Profile::Focused, Profile::Coding]);

/// A workspace tool that writes files: medium risk, `workspace_write`.
pub(crate) const WRITING: ToolDef = ToolDef {
    risk_level: RiskLevel::Medium,
    side_effects: &[SideEffect::WorkspaceWrite],
    ..WORKSPACE
};

/// Largest file read whole (PROTOCOL.md); a line range may read further into a bigger file.
pub const READ_MAX_BYTES: u64 = 2 * 1024 * 1024;
/// Largest file `read_workspace_file` reads without the blocking pool.
pub const INLINE_READ_MAX_BYTES: u64 = 16 * 1024;
/// Largest file an edit or lint takes in.
pub const EDIT_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// `write_workspace_files` writes at most this many files per call.
pub const BATCH_MAX_FILES: usize = 100;

pub(crate) fn dot() -> String {
    ".".into()
}
pub(crate) fn yes() -> bool {
    true
}
pub(crate) fn one() -> u64 {
    1
}

/// What the tools share.
#[derive(Debug)]
pub struct WorkspaceService {
    pub data_dir: PathBuf,
    pub read_state: ReadState,
}

pub(crate) fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

pub(crate) fn not_utf8(path: &WorkspacePath) -> ToolError {
    ToolError::new(
        ErrorCode::NotUtf8,
        format!(
            "{} is not UTF-8 text; it cannot be read or edited as text",
            path.display()
        ),
    )
}

pub(crate) fn too_large(path: &WorkspacePath, size: u64, limit: u64) -> ToolError {
    ToolError::new(
        ErrorCode::FileTooLarge,
        format!(
            "{} is {size} bytes, over the {limit} byte limit of this tool",
            path.display()
        ),
    )
}

/// A task on the blocking pool failed (it panicked): `internal`.
#[derive(Debug, thiserror::Error)]
#[error("a workspace task failed ({0}); see the workspace log")]
pub struct TaskError(#[source] tokio::task::JoinError);

/// `internal`, its cause logged here.
impl From<TaskError> for ToolError {
    fn from(e: TaskError) -> Self {
        ToolError::internal_logged(&e, "a workspace task failed")
    }
}

impl WorkspaceService {
    /// Opens the workspace of the call's session and runs `work` on the blocking pool; its
    /// error becomes a [`ToolError`] here, at the tool's edge.
    pub(crate) async fn blocking<T, E, F>(
        &self,
        call: &ToolCall<'_>,
        work: F,
    ) -> Result<T, ToolError>
    where
        T: Send + 'static,
        E: Into<ToolError> + Send + 'static,
        F: FnOnce(&Workspace) -> Result<T, E> + Send + 'static,
    {
        let session = call.session()?.clone();
        let data_dir = self.data_dir.clone();
        let account = call.ctx.account.clone();
        tokio::task::spawn_blocking(move || {
            let ws = Workspace::open(&data_dir, &account, &session).map_err(ToolError::from)?;
            work(&ws).map_err(Into::into)
        })
        .await
        .map_err(TaskError)?
    }

    /// Runs `work` on the blocking pool.
    pub(crate) async fn offload<T, E, F>(&self, work: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        E: Into<ToolError> + Send + 'static,
        F: FnOnce() -> Result<T, E> + Send + 'static,
    {
        tokio::task::spawn_blocking(move || work().map_err(Into::into))
            .await
            .map_err(TaskError)?
    }

    /// Runs `work` holding the session's locks on `paths` (taken in name order).
    pub(crate) async fn locked<T>(
        &self,
        call: &ToolCall<'_>,
        paths: &[WorkspacePath],
        work: impl std::future::Future<Output = Result<T, ToolError>>,
    ) -> Result<T, ToolError> {
        let (ctx, session) = (call.ctx, call.session()?);
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
                    return Err(e.into());
                }
            }
        }
        let result = work.await;
        for lock in held {
            self.read_state.unlock(lock).await;
        }
        result
    }

    /// Reads the file under lock, checks the read state, applies `change`, writes atomically.
    pub(crate) async fn change<F>(
        &self,
        call: &ToolCall<'_>,
        path: WorkspacePath,
        change: F,
    ) -> Result<Map<String, Value>, ToolError>
    where
        F: FnOnce(&str) -> Result<(String, Map<String, Value>), ToolError> + Send + 'static,
    {
        let (ctx, session) = (call.ctx, call.session()?);
        let name = path.display();
        let budget_chars = call.outputs.budget_chars;
        self.locked(call, std::slice::from_ref(&path), async {
            let seen = self
                .read_state
                .recorded(&ctx.account, session, &name)
                .await?;
            let Some(seen) = seen else {
                return Err(ToolError::new(
                    ErrorCode::FileNotRead,
                    format!("{name} was not read in this session; read_workspace_file it first"),
                ));
            };
            let p = path.clone();
            let (mut fields, over, sha) = self
                .blocking(call, move |ws| {
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
                    writing::write_atomic(ws, &p, after.as_bytes(), true)?;
                    let diff = edit::unified_diff(&p.display(), &before, &after);
                    fields.insert("path".into(), Value::from(p.display()));
                    let over = budget::insert_over(&mut fields, "diff", diff, budget_chars);
                    Ok((fields, over, confine::sha256_of(after.as_bytes())))
                })
                .await?;
            self.read_state
                .record(&ctx.account, session, &name, &sha)
                .await?;
            if let Some(diff) = over {
                call.outputs
                    .persist_named(&mut fields, "diff", Whole::Text(diff.into()))
                    .await?;
            }
            Ok(fields)
        })
        .await
    }
}

/// The workspace actor keeps over-budget text in its own files ([`toolmesh_kernel::outputs`]).
#[derive(Debug)]
pub(crate) struct OwnFiles {
    pub data_dir: PathBuf,
}

impl Store for OwnFiles {
    fn put<'a>(&'a self, to: Target<'a>, whole: Whole) -> BoxFuture<'a, Result<(), ToolError>> {
        let (data_dir, account, session) = (
            self.data_dir.clone(),
            to.account.clone(),
            to.session.clone(),
        );
        let path = to.path.to_owned();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || -> Result<(), ToolError> {
                let ws = Workspace::open(&data_dir, &account, &session)?;
                let path = WorkspacePath::parse(&path, "path")?;
                let bytes = match whole {
                    Whole::Text(text) => text.to_vec(),
                    Whole::File { bytes, file } => {
                        use std::os::unix::fs::FileExt;
                        let mut all = vec![0; usize::try_from(bytes).unwrap_or(usize::MAX)];
                        file.read_exact_at(&mut all, 0)
                            .map_err(|e| ToolError::internal_logged(&e, "cannot read an output"))?;
                        all
                    }
                };
                writing::write_atomic(&ws, &path, &bytes, true)?;
                Ok(())
            })
            .await
            .map_err(TaskError)?
        })
    }
}
