//! `write_workspace_files`: up to [`BATCH_MAX_FILES`] whole files in one call.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::{self, WorkspacePath};
use crate::service::{object, WorkspaceService, BATCH_MAX_FILES};
use crate::writing;

pub struct WriteFiles;

impl Define for WriteFiles {
    type Args = WriteWorkspaceFilesArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "write_workspace_files",
        description: "Write up to 100 whole files in the workspace in one call.",
        review: Review::diff_each("files", "path", None, "content"),
        ..crate::service::WRITING
    };
}

impl Tool for WriteFiles {
    type Host = WorkspaceService;

    async fn run(&self, service: &Self::Host, call: &ToolCall<'_>, a: Self::Args) -> ToolResult {
        let session = call.session()?.clone();
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
        service
            .locked(call.ctx, &session, &paths, async {
                let written = service
                    .blocking(call.ctx, session.clone(), move |ws| {
                        writing::write_batch(ws, &files, overwrite)
                    })
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

/// Write several whole files; past 100, the rest are ignored and `truncated` is set.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteWorkspaceFilesArgs {
    pub files: Vec<FileContent>,
    #[serde(default = "crate::service::yes")]
    pub overwrite: bool,
}
