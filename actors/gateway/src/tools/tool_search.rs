//! `tool_search`: scored matches over the registry's names, descriptions and groups
//! (`builtin::tool_search`); runs nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::ToolError;

use super::tool::{Builtin, GATEWAY};
use crate::builtin;
use crate::core::{Answer, GatewayCore};

impl Builtin for ToolSearch {
    const DEF: &'static ToolDef = &GATEWAY.named("tool_search").profiles(&[Profile::Coding]);

    fn answer(
        self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        _ctx: &InvocationContext,
    ) -> Result<Answer, ToolError> {
        let search = builtin::Search {
            query: self.query,
            profile: self.profile,
            max_results: self.max_results,
            include_disabled: self.include_disabled,
        };
        Ok(Answer::Fields(builtin::tool_search(
            registry,
            &core.config.policy.current(),
            &core.cluster,
            search,
        )))
    }
}

/// Search the tools (built-in and registered by providers) by name, description and group; returns
/// scored matches and deferred_tool_names to call later. Runs nothing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSearch {
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
