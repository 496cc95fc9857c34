//! `delete_workspace_file`: a file, a symlink (not its target) or an empty directory removed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel, SideEffect};
use toolmesh_kernel::{Role, SessionId, ToolError};

use super::{args, object, Call, Reply, Tool, WorkspaceService};
use crate::confine::{self, WorkspacePath};

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: "delete_workspace_file",
        group: ToolGroup::Workspace,
        description:
            "Delete a file, a symlink (not its target) or an empty directory of the workspace.",
        risk_level: RiskLevel::High,
        side_effects: &[SideEffect::WorkspaceDelete],
        needs_session: true,
        role: Role::Workspace,
        schema: schema_of::<PathArgs>,
    },
    run,
};

fn run<'a>(service: &'a WorkspaceService, call: Call<'a>) -> Reply<'a> {
    Box::pin(async move {
        service
            .delete(call.ctx, call.session, args(call.arguments)?)
            .await
    })
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
