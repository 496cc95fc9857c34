//! `delete_workspace_file`: a file, a symlink (not its target) or an empty directory removed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel, SideEffect};
use toolmesh_kernel::{Role, SessionId, ToolError};

use super::{object, WorkspaceService};
use crate::confine::{self, WorkspacePath};

pub struct DeleteFile;

impl Define for DeleteFile {
    type Args = PathArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "delete_workspace_file",
        group: ToolGroup::Workspace,
        description:
            "Delete a file, a symlink (not its target) or an empty directory of the workspace.",
        risk_level: RiskLevel::High,
        side_effects: &[SideEffect::WorkspaceDelete],
        needs_session: true,
        role: Role::Workspace,
        profiles: &[Profile::Coding],
        review: Review::Arguments,
    };
}

impl Tool for DeleteFile {
    type Host = WorkspaceService;

    async fn run(
        &self,
        service: &WorkspaceService,
        call: &ToolCall<'_>,
        args: PathArgs,
    ) -> ToolResult {
        service
            .delete(call.ctx, call.session()?.clone(), args)
            .await
    }
}

/// Delete a file, a symlink (not its target) or an empty directory.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    pub path: String,
}

impl WorkspaceService {
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
