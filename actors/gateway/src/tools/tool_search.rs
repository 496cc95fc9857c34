//! `tool_search`: scored matches over the registry's names, descriptions and groups
//! (`builtin::tool_search`); runs nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::ToolError;

use super::tool::{Builtin, GATEWAY};
use crate::builtin;
use crate::core::{Answer, GatewayCore};

pub struct ToolSearch;

impl Define for ToolSearch {
    type Args = ToolSearchArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "tool_search",
        description: "Search the tools (built-in and registered by providers) by name, description and group; returns scored matches and deferred_tool_names to call later. Runs nothing.",
        profiles: &[Profile::Coding],
        ..GATEWAY
    };
}

impl Builtin for ToolSearch {
    fn answer(
        &self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        _ctx: &InvocationContext,
        args: ToolSearchArgs,
    ) -> Result<Answer, ToolError> {
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
