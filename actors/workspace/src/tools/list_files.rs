//! `list_workspace_files`: files and directories with an optional glob, recursion and sorting.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::{Define, Tool, ToolCall, ToolDef, ToolResult};

use crate::listing::{self, ListError, ListOptions};
use crate::service::{object, WorkspaceService};

pub struct ListFiles;

impl Define for ListFiles {
    type Args = ListWorkspaceFilesArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "list_workspace_files",
        description: "List files and directories of the workspace with an optional glob, recursion and sorting.",
        ..crate::service::WORKSPACE
    };
}

impl Tool for ListFiles {
    type Host = WorkspaceService;

    async fn run(&self, service: &Self::Host, call: &ToolCall<'_>, a: Self::Args) -> ToolResult {
        let fields_limit = call.fields_limit;
        let session = call.session()?.clone();
        let options = ListOptions::from(a);
        service
            .blocking(call.ctx, session, move |ws| {
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

/// List files and directories.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListWorkspaceFilesArgs {
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

impl From<ListWorkspaceFilesArgs> for ListOptions {
    fn from(a: ListWorkspaceFilesArgs) -> Self {
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
