//! `search_workspace_files`: file contents searched for text or a regex (ripgrep's crates).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel};
use toolmesh_kernel::{budget, Role, SessionId, ToolError};

use super::{object, WorkspaceService};
use crate::confine::WorkspacePath;
use crate::search::{self, SearchOptions};

pub struct SearchFiles;

impl Define for SearchFiles {
    type Args = SearchWorkspaceFilesArgs;
    const DEF: &'static ToolDef = &ToolDef {
    name: "search_workspace_files",
    group: ToolGroup::Workspace,
    description: "Search file contents of the workspace for text or a regex, with context lines; respects .gitignore.",
    risk_level: RiskLevel::Low,
    side_effects: &[],
    needs_session: true,
    role: Role::Workspace,
        profiles: &[Profile::Focused, Profile::Coding],
        review: Review::Arguments,
    };
}

impl Tool for SearchFiles {
    type Host = WorkspaceService;

    async fn run(
        &self,
        service: &WorkspaceService,
        call: &ToolCall<'_>,
        args: SearchWorkspaceFilesArgs,
    ) -> ToolResult {
        service
            .search(call.ctx, call.session()?.clone(), args, call.fields_limit)
            .await
    }
}

/// Search file contents (ripgrep-class engine, `.gitignore` respected).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchWorkspaceFilesArgs {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "super::dot")]
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

impl From<SearchWorkspaceFilesArgs> for SearchOptions {
    fn from(a: SearchWorkspaceFilesArgs) -> Self {
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

impl WorkspaceService {
    async fn search(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: SearchWorkspaceFilesArgs,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        let dir = WorkspacePath::parse(&a.path, "path")?;
        let options = SearchOptions::from(a);
        self.blocking(ctx, session, move |ws| {
            let outcome = search::search(ws, dir.as_path(), &options)?;
            let mut fields = object(serde_json::to_value(&outcome).unwrap_or_default());
            fields.insert("query".into(), Value::from(options.query));
            if budget::fit_list(&mut fields, "results", fields_limit) {
                // `match_count` counts the matching lines returned.
                let kept = fields["results"].as_array().map_or(0, Vec::len);
                fields.insert("match_count".into(), Value::from(kept));
            }
            Ok(fields)
        })
        .await
    }
}
