//! `search_skills`: fuzzy search over skill names, aliases, tags, descriptions and examples.

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup};
use toolmesh_kernel::wire::{ActorCall, RiskLevel};
use toolmesh_kernel::{budget, Role, ToolError};

use super::{arguments, fields, SkillsService, Tool};
use crate::search;

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: "search_skills",
        group: ToolGroup::Skills,
        description: "Fuzzy search over skill names, aliases, tags, descriptions and examples.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: false,
        role: Role::Skills,
        schema: schema_of::<SearchSkillsArgs>,
    },
    run,
};

fn run<'a>(
    service: &'a SkillsService,
    call: &'a ActorCall,
    fields_limit: usize,
) -> BoxFuture<'a, Result<Map<String, Value>, ToolError>> {
    Box::pin(async move { service.search_skills(arguments(call)?, fields_limit).await })
}

/// Fuzzy search over skills.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchSkillsArgs {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "ten")]
    #[schemars(range(min = 1, max = 100))]
    pub max_results: u64,
}
fn ten() -> u64 {
    10
}

impl SkillsService {
    async fn search_skills(
        &self,
        args: SearchSkillsArgs,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        if args.query.trim().is_empty() {
            return Err(ToolError::invalid_argument(
                "/query",
                "the query is empty; say what the skill should do",
            ));
        }
        let catalog = self.catalog().await;
        let hits = search::search(
            &args.query,
            catalog.skills.iter().map(|s| &s.manifest),
            usize::try_from(args.max_results).unwrap_or(usize::MAX),
        );
        let mut out = fields(json!({
            "query": args.query,
            "results": hits,
            "warnings": catalog.warnings,
        }));
        budget::fit_list(&mut out, "results", fields_limit);
        Ok(out)
    }
}
