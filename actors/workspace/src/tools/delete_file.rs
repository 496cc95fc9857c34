//! `delete_workspace_file`: a file, a symlink (not its target) or an empty directory removed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Define, Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};

use crate::confine::{self, WorkspacePath};
use crate::service::{object, WorkspaceService};

pub struct DeleteFile;

impl Define for DeleteFile {
    type Args = PathArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "delete_workspace_file",
        description:
            "Delete a file, a symlink (not its target) or an empty directory of the workspace.",
        risk_level: RiskLevel::High,
        side_effects: &[SideEffect::WorkspaceDelete],
        ..crate::service::WORKSPACE
    };
}

impl Tool for DeleteFile {
    type Host = WorkspaceService;

    async fn run(&self, service: &Self::Host, call: &ToolCall<'_>, a: Self::Args) -> ToolResult {
        let session = call.session()?.clone();
        let path = WorkspacePath::parse(&a.path, "path")?;
        let name = path.display();
        let p = path.clone();
        service
            .locked(call.ctx, &session, std::slice::from_ref(&path), async {
                let outcome = service
                    .blocking(call.ctx, session.clone(), move |ws| confine::delete(ws, &p))
                    .await?;
                service
                    .read_state
                    .forget(&call.ctx.account, &session, &name)
                    .await?;
                Ok(object(
                    json!({"path": name, "deleted": true, "type": outcome.kind}),
                ))
            })
            .await
    }
}

/// Delete a file, a symlink (not its target) or an empty directory.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    pub path: String,
}
