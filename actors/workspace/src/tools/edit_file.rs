//! `edit_workspace_file`: an exact snippet replaced in a file read before.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::WorkspacePath;
use crate::edit;
use crate::service::WorkspaceService;

pub struct EditFile;

impl Define for EditFile {
    type Args = EditWorkspaceFileArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "edit_workspace_file",
        description: "Replace an exact snippet in a file read before; returns a unified diff.",
        profiles: &[Profile::Focused, Profile::Coding],
        review: Review::diff("path", Some("old_text"), "new_text"),
        ..crate::service::WRITING
    };
}

impl Tool for EditFile {
    type Host = WorkspaceService;

    async fn run(&self, service: &Self::Host, call: &ToolCall<'_>, a: Self::Args) -> ToolResult {
        let session = call.session()?.clone();
        let path = WorkspacePath::parse(&a.path, "path")?;
        service
            .change(call.ctx, session, path, move |before| {
                let applied = edit::apply_edit(
                    before,
                    &a.old_text,
                    &a.new_text,
                    a.expected_replacements,
                    a.replace_all,
                )?;
                let mut fields = Map::new();
                fields.insert("replacements".into(), Value::from(applied.replacements));
                Ok((applied.content, fields))
            })
            .await
    }
}

/// Replace an exact snippet (a prior read of the file is required).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditWorkspaceFileArgs {
    pub path: String,
    pub old_text: String,
    pub new_text: String,
    #[serde(default = "crate::service::one")]
    #[schemars(range(min = 1))]
    pub expected_replacements: u64,
    #[serde(default)]
    pub replace_all: bool,
}
