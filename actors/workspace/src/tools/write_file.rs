//! `write_workspace_file`: one whole file, written atomically.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::{self, WorkspacePath};
use crate::service::{object, WorkspaceService};
use crate::writing;

pub struct WriteFile;

impl Define for WriteFile {
    type Args = WriteWorkspaceFileArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "write_workspace_file",
        description:
            "Write a whole file in the workspace, atomically, creating parent directories.",
        review: Review::diff("path", None, "content"),
        ..crate::service::WRITING
    };
}

impl Tool for WriteFile {
    type Host = WorkspaceService;

    async fn run(&self, service: &Self::Host, call: &ToolCall<'_>, a: Self::Args) -> ToolResult {
        let session = call.session()?.clone();
        let path = WorkspacePath::parse(&a.path, "path")?;
        let sha = confine::sha256_of(a.content.as_bytes());
        let p = path.clone();
        service
            .locked(call.ctx, &session, std::slice::from_ref(&path), async {
                let outcome = service
                    .blocking(call.ctx, session.clone(), move |ws| {
                        writing::write_atomic(ws, &p, a.content.as_bytes(), a.overwrite)
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

/// Write a whole file (creating parent directories).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteWorkspaceFileArgs {
    pub path: String,
    pub content: String,
    #[serde(default = "crate::service::yes")]
    pub overwrite: bool,
}
