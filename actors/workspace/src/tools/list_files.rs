//! `list_workspace_files`: files and directories with an optional glob, recursion and sorting.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

use crate::listing::{self, ListError, ListOptions};
use crate::service::{object, WorkspaceService};

impl Tool<WorkspaceService> for ListFiles {
    const DEF: &'static ToolDef = &crate::service::WORKSPACE.named("list_workspace_files");

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let fields_limit = call.fields_limit;
        let options = ListOptions::from(self);
        service
            .blocking(call, move |ws| {
                let listed = listing::list(ws, &options)?;
                let mut fields = object(serde_json::to_value(&listed).unwrap_or_default());
                fields.insert("path".into(), Value::from(options.path));
                fields.insert("count".into(), Value::from(listed.entries.len()));
                if budget::fit_list(&mut fields, "entries", fields_limit) {
                    let kept = fields["entries"].as_array().map_or(0, Vec::len);
                    fields.insert("count".into(), Value::from(kept));
                }
                Ok::<_, ListError>(fields)
            })
            .await
    }
}

/// How `list_workspace_files` orders entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortBy {
    /// Ascending by path.
    #[default]
    Name,
    /// Newest first.
    Mtime,
    /// Largest first.
    Size,
}

/// List files and directories of the workspace with an optional glob, recursion and sorting.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    #[serde(default = "crate::service::dot")]
    pub path: String,
    /// Matched against the path relative to `path`; `**` crosses directories.
    #[serde(default)]
    pub glob: Option<String>,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default = "crate::service::yes")]
    pub include_dirs: bool,
    /// Clamped to 5000.
    #[serde(default = "five_hundred")]
    #[schemars(range(min = 1))]
    pub max_results: u64,
    #[serde(default)]
    pub sort_by: SortBy,
}
fn five_hundred() -> u64 {
    500
}

impl From<SortBy> for listing::SortBy {
    fn from(sort_by: SortBy) -> Self {
        match sort_by {
            SortBy::Name => listing::SortBy::Name,
            SortBy::Mtime => listing::SortBy::Mtime,
            SortBy::Size => listing::SortBy::Size,
        }
    }
}

impl From<ListFiles> for ListOptions {
    fn from(a: ListFiles) -> Self {
        ListOptions {
            path: a.path,
            glob: a.glob,
            recursive: a.recursive,
            include_dirs: a.include_dirs,
            max_results: a.max_results,
            sort_by: a.sort_by.into(),
        }
    }
}
