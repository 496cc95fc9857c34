//! `tool_search`: scored matches over the registry's names, descriptions and groups
//! (`builtin::tool_search`); runs nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup, ToolRegistry, TOOL_SEARCH};
use toolmesh_kernel::wire::{InvocationContext, RiskLevel};
use toolmesh_kernel::{ErrorCode, Role, ToolError};

use super::tool::Tool;
use crate::builtin;
use crate::core::{Answer, GatewayCore};

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: TOOL_SEARCH,
        group: ToolGroup::Dispatcher,
        description: "Search the tools (built-in and registered by providers) by name, description and group; returns scored matches and deferred_tool_names to call later. Runs nothing.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: false,
        role: Role::Gateway,
        schema: schema_of::<ToolSearchArgs>,
    },
    answer: Some(answer),
};

fn answer(
    core: &GatewayCore,
    registry: &ToolRegistry,
    _ctx: &InvocationContext,
    arguments: Value,
) -> Result<Answer, ToolError> {
    let args: ToolSearchArgs = serde_json::from_value(arguments)
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, e.to_string()))?;
    let search = builtin::Search {
        query: args.query,
        profile: args.profile,
        max_results: args.max_results,
        include_disabled: args.include_disabled,
    };
    Ok(Answer::Fields(builtin::tool_search(
        registry,
        &core.config.policy,
        &core.cluster,
        search,
    )))
}

/// Scored search over tool names, descriptions and groups.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSearchArgs {
    /// Words to look for.
    #[schemars(length(min = 1))]
    pub query: String,
    /// The tools searched: every tool (built-in and provider) unless given.
    #[serde(default)]
    pub profile: Profile,
    #[serde(default = "eight")]
    #[schemars(range(min = 1, max = 100))]
    pub max_results: u64,
    /// Also return tools whose actor is not running anywhere in the cluster.
    #[serde(default)]
    pub include_disabled: bool,
}
fn eight() -> u64 {
    8
}
