//! `multi_edit_workspace_file`: several snippet edits of one file, all or nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel, SideEffect};
use toolmesh_kernel::{Role, SessionId, ToolError};

use super::WorkspaceService;
use crate::confine::WorkspacePath;
use crate::edit::{self, Edit};

pub struct MultiEditFile;

impl Define for MultiEditFile {
    type Args = MultiEditWorkspaceFileArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "multi_edit_workspace_file",
        group: ToolGroup::Workspace,
        description:
            "Apply several snippet edits to one file, all or nothing; returns a unified diff.",
        risk_level: RiskLevel::Medium,
        side_effects: &[SideEffect::WorkspaceWrite],
        needs_session: true,
        role: Role::Workspace,
        profiles: &[Profile::Coding],
        review: Review::Diff {
            each: Some("edits"),
            path: "path",
            old: Some("old_text"),
            new: "new_text",
        },
    };
}

impl Tool for MultiEditFile {
    type Host = WorkspaceService;

    async fn run(
        &self,
        service: &WorkspaceService,
        call: &ToolCall<'_>,
        args: MultiEditWorkspaceFileArgs,
    ) -> ToolResult {
        service
            .multi_edit(call.ctx, call.session()?.clone(), args)
            .await
    }
}

/// One edit of `multi_edit_workspace_file`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnippetEdit {
    pub old_text: String,
    pub new_text: String,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub expected_replacements: Option<u64>,
    #[serde(default)]
    pub replace_all: Option<bool>,
}

impl From<SnippetEdit> for Edit {
    fn from(e: SnippetEdit) -> Self {
        Edit {
            old_text: e.old_text,
            new_text: e.new_text,
            expected_replacements: e.expected_replacements,
            replace_all: e.replace_all,
        }
    }
}

/// Apply several edits to one file, all or nothing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiEditWorkspaceFileArgs {
    pub path: String,
    #[schemars(length(min = 1))]
    pub edits: Vec<SnippetEdit>,
    #[serde(default)]
    pub replace_all: bool,
}

impl WorkspaceService {
    async fn multi_edit(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        a: MultiEditWorkspaceFileArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let path = WorkspacePath::parse(&a.path, "path")?;
        let edits: Vec<Edit> = a.edits.into_iter().map(Edit::from).collect();
        let replace_all = a.replace_all;
        self.change(ctx, session, path, move |before| {
            let applied = edit::apply_edits(before, &edits, replace_all)?;
            let mut fields = Map::new();
            fields.insert("edit_count".into(), Value::from(edits.len()));
            fields.insert("replacements".into(), Value::from(applied.replacements));
            let edits: Vec<Value> = applied
                .edits
                .iter()
                .map(|(index, n)| json!({"index": index, "replacements": n}))
                .collect();
            fields.insert("edits".into(), Value::from(edits));
            Ok((applied.content, fields))
        })
        .await
    }
}
