//! `delete_workspace_file`: a file, a symlink (not its target) or an empty directory removed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};

use crate::confine::{self, WorkspacePath};
use crate::service::{object, WorkspaceService};

impl Tool<WorkspaceService> for DeleteFile {
    const DEF: &'static ToolDef = &crate::service::WORKSPACE
        .named("delete_workspace_file")
        .risk(RiskLevel::High, &[SideEffect::WorkspaceDelete]);

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let session = call.session()?.clone();
        let path = WorkspacePath::parse(&self.path, "path")?;
        let name = path.display();
        let p = path.clone();
        service
            .locked(call, std::slice::from_ref(&path), async {
                let outcome = service
                    .blocking(call, move |ws| confine::delete(ws, &p))
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

/// Delete a file, a symlink (not its target) or an empty directory of the workspace.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteFile {
    pub path: String,
}
