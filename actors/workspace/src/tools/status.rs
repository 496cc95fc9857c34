//! `workspace_status`: the session workspace root and a sample of its files.

use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel};
use toolmesh_kernel::{budget, Role, SessionId, ToolError};

use super::{object, Call, Reply, Tool, WorkspaceService};
use crate::listing;

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: "workspace_status",
        group: ToolGroup::Workspace,
        description: "The session workspace root and a sample of up to 50 files.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: true,
        role: Role::Workspace,
        schema: schema_of::<NoArgs>,
    },
    run,
};

fn run<'a>(service: &'a WorkspaceService, call: Call<'a>) -> Reply<'a> {
    Box::pin(async move {
        service
            .status(call.ctx, call.session, call.fields_limit)
            .await
    })
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
