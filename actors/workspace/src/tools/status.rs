//! `workspace_status`: the session workspace root and a sample of its files.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::ConfineError;
use crate::listing;
use crate::service::{object, WorkspaceService};

impl Tool<WorkspaceService> for Status {
    const DEF: &'static ToolDef = &crate::service::FOCUSED.named("workspace_status");

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let fields_limit = call.fields_limit;
        service
            .blocking(call, move |ws| {
                let (files, sampled) = listing::sample(ws, 50)?;
                let mut fields = object(json!({
                    "root": ws.root().display().to_string(),
                    "files": files,
                    "file_count_sampled": sampled,
                }));
                budget::fit_list(&mut fields, "files", fields_limit);
                Ok::<_, ConfineError>(fields)
            })
            .await
    }
}

/// The session workspace root and a sample of up to 50 files.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Status {}
