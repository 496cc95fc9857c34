//! `write_workspace_files`: up to [`BATCH_MAX_FILES`] whole files in one call.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel, SideEffect};
use toolmesh_kernel::{Role, SessionId, ToolError};

use super::{object, WorkspaceService, BATCH_MAX_FILES};
use crate::confine::{self, WorkspacePath};
use crate::writing;

pub struct WriteFiles;

impl Define for WriteFiles {
    type Args = WriteWorkspaceFilesArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "write_workspace_files",
        group: ToolGroup::Workspace,
        description: "Write up to 100 whole files in the workspace in one call.",
        risk_level: RiskLevel::Medium,
        side_effects: &[SideEffect::WorkspaceWrite],
        needs_session: true,
        role: Role::Workspace,
        profiles: &[Profile::Coding],
        review: Review::Diff {
            each: Some("files"),
            path: "path",
            old: None,
            new: "content",
        },
    };
}

impl Tool for WriteFiles {
    type Host = WorkspaceService;

    async fn run(
        &self,
        service: &WorkspaceService,
        call: &ToolCall<'_>,
        args: WriteWorkspaceFilesArgs,
    ) -> ToolResult {
        service
            .write_many(call.ctx, call.session()?.clone(), args)
            .await
    }
}

/// One file of a batch write.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileContent {
    pub path: String,
    pub content: String,
}

/// Write several whole files; past 100, the rest are ignored and `truncated` is set.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteWorkspaceFilesArgs {
    pub files: Vec<FileContent>,
    #[serde(default = "super::yes")]
    pub overwrite: bool,
}

impl WorkspaceService {
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
                    writing::write_batch(ws, &files, overwrite)
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
}
