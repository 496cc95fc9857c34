//! `multi_edit_workspace_file`: several snippet edits of one file, all or nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::{Review, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::WorkspacePath;
use crate::edit::{self, Edit};
use crate::service::WorkspaceService;

impl Tool<WorkspaceService> for MultiEditFile {
    const DEF: &'static ToolDef = &crate::service::WRITING
        .named("multi_edit_workspace_file")
        .review(Review::diff_each(
            "edits",
            "path",
            Some("old_text"),
            "new_text",
        ));

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let path = WorkspacePath::parse(&self.path, "path")?;
        let edits: Vec<Edit> = self.edits.into_iter().map(Edit::from).collect();
        let replace_all = self.replace_all;
        service
            .change(call, path, move |before| {
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

/// Apply several snippet edits to one file, all or nothing; returns a unified diff.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiEditFile {
    pub path: String,
    #[schemars(length(min = 1))]
    pub edits: Vec<SnippetEdit>,
    #[serde(default)]
    pub replace_all: bool,
}
