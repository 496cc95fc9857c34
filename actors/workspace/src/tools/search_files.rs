//! `search_workspace_files`: file contents searched for text or a regex (ripgrep's crates).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::WorkspacePath;
use crate::search::{self, SearchError, SearchOptions};
use crate::service::{object, WorkspaceService};

impl Tool<WorkspaceService> for SearchFiles {
    const DEF: &'static ToolDef = &crate::service::FOCUSED.named("search_workspace_files");

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let fields_limit = call.fields_limit;
        let dir = WorkspacePath::parse(&self.path, "path")?;
        let options = SearchOptions::from(self);
        service
            .blocking(call, move |ws| {
                let outcome = search::search(ws, dir.as_path(), &options)?;
                let mut fields = object(serde_json::to_value(&outcome).unwrap_or_default());
                fields.insert("query".into(), Value::from(options.query));
                if budget::fit_list(&mut fields, "results", fields_limit) {
                    // `match_count` counts the matching lines returned.
                    let kept = fields["results"].as_array().map_or(0, Vec::len);
                    fields.insert("match_count".into(), Value::from(kept));
                }
                Ok::<_, SearchError>(fields)
            })
            .await
    }
}

/// Search file contents of the workspace for text or a regex, with context lines; respects
/// .gitignore.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchFiles {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "crate::service::dot")]
    pub path: String,
    #[serde(default)]
    pub is_regex: bool,
    #[serde(default)]
    pub glob: Option<String>,
    #[serde(default)]
    pub case_sensitive: bool,
    /// Capped at 20.
    #[serde(default)]
    pub context_lines: u64,
    /// Capped at 5000.
    #[serde(default = "one_hundred")]
    #[schemars(range(min = 1))]
    pub max_results: u64,
}
fn one_hundred() -> u64 {
    100
}

impl From<SearchFiles> for SearchOptions {
    fn from(a: SearchFiles) -> Self {
        SearchOptions {
            query: a.query,
            is_regex: a.is_regex,
            glob: a.glob,
            case_sensitive: a.case_sensitive,
            context_lines: a.context_lines,
            max_results: a.max_results,
        }
    }
}
