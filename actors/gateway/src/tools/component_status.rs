//! `component_status`: what the cluster has bound and running, answered by the gateway
//! (`builtin::component_status`).

use serde_json::Value;
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup, ToolRegistry, COMPONENT_STATUS};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel};
use toolmesh_kernel::{Role, ToolError};

use super::tool::Tool;
use crate::core::{Answer, GatewayCore};

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: COMPONENT_STATUS,
        group: ToolGroup::Platform,
        description: "What toolmesh has bound and running in the cluster right now: skill spaces, sandbox workers, workspace, skill runtime.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: false,
        role: Role::Gateway,
        schema: schema_of::<NoArgs>,
    },
    answer: Some(answer),
};

fn answer(
    core: &GatewayCore,
    registry: &ToolRegistry,
    ctx: &InvocationContext,
    _arguments: Value,
) -> Result<Answer, ToolError> {
    let mut members = core.status_cache.render(
        registry,
        &core.tools.providers(),
        &core.cluster,
        &core.config,
        ctx,
    );
    // This gateway's audit trail (on, or off and why), fresh on every call.
    members.extend_from_slice(b",\"audit\":");
    members.extend_from_slice(&serde_json::to_vec(&core.audit.status()).unwrap_or_default());
    Ok(Answer::Prepared(members))
}
