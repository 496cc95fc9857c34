//! `edit_workspace_file`: an exact snippet replaced in a file read before.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Review, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::WorkspacePath;
use crate::edit;
use crate::service::WorkspaceService;

impl Tool<WorkspaceService> for EditFile {
    const DEF: &'static ToolDef = &crate::service::WRITING
        .named("edit_workspace_file")
        .profiles(&[Profile::Focused, Profile::Coding])
        .review(Review::diff("path", Some("old_text"), "new_text"));

    async fn run(self, service: &WorkspaceService, call: &ToolCall<'_>) -> ToolResult {
        let path = WorkspacePath::parse(&self.path, "path")?;
        service
            .change(call, path, move |before| {
                let applied = edit::apply_edit(
                    before,
                    &self.old_text,
                    &self.new_text,
                    self.expected_replacements,
                    self.replace_all,
                )?;
                let mut fields = Map::new();
                fields.insert("replacements".into(), Value::from(applied.replacements));
                Ok((applied.content, fields))
            })
            .await
    }
}

/// Replace an exact snippet in a file read before; returns a unified diff.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFile {
    pub path: String,
    pub old_text: String,
    pub new_text: String,
    #[serde(default = "crate::service::one")]
    #[schemars(range(min = 1))]
    pub expected_replacements: u64,
    #[serde(default)]
    pub replace_all: bool,
}
