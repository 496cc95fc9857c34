//! `search_skills`: fuzzy search over skill names, aliases, tags, descriptions and examples.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::RiskLevel;
use toolmesh_kernel::{budget, Role, ToolError};

use super::{fields, SkillsService};
use crate::search;

pub struct SearchSkills;

impl Define for SearchSkills {
    type Args = SearchSkillsArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "search_skills",
        group: ToolGroup::Skills,
        description: "Fuzzy search over skill names, aliases, tags, descriptions and examples.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: false,
        role: Role::Skills,
        profiles: &[Profile::Focused, Profile::Coding],
        review: Review::Arguments,
    };
}

impl Tool for SearchSkills {
    type Host = SkillsService;

    async fn run(
        &self,
        service: &SkillsService,
        call: &ToolCall<'_>,
        args: SearchSkillsArgs,
    ) -> ToolResult {
        service.search_skills(args, call.fields_limit).await
    }
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
