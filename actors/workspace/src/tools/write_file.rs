//! `write_workspace_file`: one whole file, written atomically.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel, SideEffect};
use toolmesh_kernel::{Role, SessionId, ToolError};

use super::{object, WorkspaceService};
use crate::confine::{self, WorkspacePath};
use crate::writing;

pub struct WriteFile;

impl Define for WriteFile {
    type Args = WriteWorkspaceFileArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "write_workspace_file",
        group: ToolGroup::Workspace,
        description:
            "Write a whole file in the workspace, atomically, creating parent directories.",
        risk_level: RiskLevel::Medium,
        side_effects: &[SideEffect::WorkspaceWrite],
        needs_session: true,
        role: Role::Workspace,
        profiles: &[Profile::Coding],
        review: Review::Diff {
            each: None,
            path: "path",
            old: None,
            new: "content",
        },
    };
}

impl Tool for WriteFile {
    type Host = WorkspaceService;

    async fn run(
        &self,
        service: &WorkspaceService,
        call: &ToolCall<'_>,
        args: WriteWorkspaceFileArgs,
    ) -> ToolResult {
        service.write(call.ctx, call.session()?.clone(), args).await
    }
}

/// Write a whole file (creating parent directories).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteWorkspaceFileArgs {
    pub path: String,
    pub content: String,
    #[serde(default = "super::yes")]
    pub overwrite: bool,
}

impl WorkspaceService {
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
                    writing::write_atomic(ws, &p, a.content.as_bytes(), a.overwrite)
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
}
