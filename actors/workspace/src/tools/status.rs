//! `workspace_status`: the session workspace root and a sample of its files.

use serde_json::json;
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Tool, ToolCall, ToolDef, ToolResult};

use crate::confine::ConfineError;
use crate::listing;
use crate::service::{object, WorkspaceService};

pub struct Status;

impl Define for Status {
    type Args = NoArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "workspace_status",
        description: "The session workspace root and a sample of up to 50 files.",
        profiles: &[Profile::Focused, Profile::Coding],
        ..crate::service::WORKSPACE
    };
}

impl Tool for Status {
    type Host = WorkspaceService;

    async fn run(&self, service: &Self::Host, call: &ToolCall<'_>, _a: Self::Args) -> ToolResult {
        let fields_limit = call.fields_limit;
        let session = call.session()?.clone();
        service
            .blocking(call.ctx, session, move |ws| {
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
