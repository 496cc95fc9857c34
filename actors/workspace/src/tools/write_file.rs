//! `write_workspace_file`: one whole file, written atomically.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Review, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::{self, WorkspacePath};
use crate::service::{object, WorkspaceService};
use crate::writing;

impl Tool<WorkspaceService> for WriteFile {
    const DEF: &'static ToolDef = &crate::service::WRITING
        .named("write_workspace_file")
        .review(Review::diff("path", None, "content"));

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let session = call.session()?.clone();
        let path = WorkspacePath::parse(&self.path, "path")?;
        let sha = confine::sha256_of(self.content.as_bytes());
        let p = path.clone();
        service
            .locked(call, std::slice::from_ref(&path), async {
                let outcome = service
                    .blocking(call, move |ws| {
                        writing::write_atomic(ws, &p, self.content.as_bytes(), self.overwrite)
                    })
                    .await?;
                service
                    .read_state
                    .record(&call.ctx.account, &session, path.display().as_str(), &sha)
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

/// Write a whole file in the workspace, atomically, creating parent directories.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    pub path: String,
    pub content: String,
    #[serde(default = "crate::service::yes")]
    pub overwrite: bool,
}
