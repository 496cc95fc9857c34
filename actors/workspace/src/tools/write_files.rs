//! `write_workspace_files`: up to [`BATCH_MAX_FILES`] whole files in one call.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Review, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::{self, WorkspacePath};
use crate::service::{object, WorkspaceService, BATCH_MAX_FILES};
use crate::writing;

impl Tool<WorkspaceService> for WriteFiles {
    const DEF: &'static ToolDef = &crate::service::WRITING
        .named("write_workspace_files")
        .review(Review::diff_each("files", "path", None, "content"));

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let session = call.session()?.clone();
        let truncated = self.files.len() > BATCH_MAX_FILES;
        let mut files = Vec::new();
        for (i, f) in self.files.into_iter().take(BATCH_MAX_FILES).enumerate() {
            let path = WorkspacePath::parse(&f.path, &format!("files/{i}/path"))?;
            files.push((path, f.content));
        }
        let paths: Vec<WorkspacePath> = files.iter().map(|(p, _)| p.clone()).collect();
        let hashes: Vec<(String, String)> = files
            .iter()
            .map(|(p, c)| (p.display(), confine::sha256_of(c.as_bytes())))
            .collect();
        let overwrite = self.overwrite;
        service
            .locked(call, &paths, async {
                let written = service
                    .blocking(call, move |ws| writing::write_batch(ws, &files, overwrite))
                    .await?;
                for (path, sha) in &hashes {
                    service
                        .read_state
                        .record(&call.ctx.account, &session, path, sha)
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

/// One file of a batch write.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileContent {
    pub path: String,
    pub content: String,
}

/// Write up to 100 whole files in the workspace in one call.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFiles {
    pub files: Vec<FileContent>,
    #[serde(default = "crate::service::yes")]
    pub overwrite: bool,
}
