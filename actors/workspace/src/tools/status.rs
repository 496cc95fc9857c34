//! `workspace_status`: the session workspace root and a sample of its files.

use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel};
use toolmesh_kernel::{budget, Role, SessionId, ToolError};

use super::{object, WorkspaceService};
use crate::listing;

pub struct Status;

impl Define for Status {
    type Args = NoArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "workspace_status",
        group: ToolGroup::Workspace,
        description: "The session workspace root and a sample of up to 50 files.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: true,
        role: Role::Workspace,
        profiles: &[Profile::Focused, Profile::Coding],
        review: Review::Arguments,
    };
}

impl Tool for Status {
    type Host = WorkspaceService;

    async fn run(
        &self,
        service: &WorkspaceService,
        call: &ToolCall<'_>,
        _args: NoArgs,
    ) -> ToolResult {
        service
            .status(call.ctx, call.session()?.clone(), call.fields_limit)
            .await
    }
}

impl WorkspaceService {
    async fn status(
        &self,
        ctx: &InvocationContext,
        session: SessionId,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        self.blocking(ctx, session, move |ws| {
            let (files, sampled) = listing::sample(ws, 50)?;
            let mut fields = object(json!({
                "root": ws.root().display().to_string(),
                "files": files,
                "file_count_sampled": sampled,
            }));
            budget::fit_list(&mut fields, "files", fields_limit);
            Ok(fields)
        })
        .await
    }
}
