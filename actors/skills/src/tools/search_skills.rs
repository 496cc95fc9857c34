//! `search_skills`: fuzzy search over skill names, aliases, tags, descriptions and examples.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::{budget, ToolError};

use crate::library::{fields, SkillsService};
use crate::search;

impl Tool<SkillsService> for SearchSkills {
    const DEF: &'static ToolDef = &crate::library::SKILLS.named("search_skills");

    async fn run(self, service: &SkillsService, call: &ToolCall<'_>) -> ToolResult {
        if self.query.trim().is_empty() {
            return Err(ToolError::invalid_argument(
                "/query",
                "the query is empty; say what the skill should do",
            ));
        }
        let catalog = service.catalog().await;
        let hits = search::search(
            &self.query,
            catalog.skills.iter().map(|s| &s.manifest),
            usize::try_from(self.max_results).unwrap_or(usize::MAX),
        );
        let mut out = fields(json!({
            "query": self.query,
            "results": hits,
            "warnings": catalog.warnings,
        }));
        budget::fit_list(&mut out, "results", call.fields_limit);
        Ok(out)
    }
}

/// Fuzzy search over skill names, aliases, tags, descriptions and examples.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchSkills {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "ten")]
    #[schemars(range(min = 1, max = 100))]
    pub max_results: u64,
}
fn ten() -> u64 {
    10
}
