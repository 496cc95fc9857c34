//! `list_skills`: the active skills, local ones and those of the configured skill spaces.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

use crate::library::{fields, SkillsService};

impl Tool<SkillsService> for ListSkills {
    const DEF: &'static ToolDef = &crate::library::SKILLS.named("list_skills");

    async fn run(self, service: &SkillsService, call: &ToolCall<'_>) -> ToolResult {
        let catalog = service.catalog().await;
        let skills: Vec<_> = catalog.skills.iter().map(|s| &s.manifest).collect();
        let mut out = fields(json!({
            "skills": skills,
            "skill_space_ids": service.loader.service.space_ids(),
            "warnings": catalog.warnings,
        }));
        budget::fit_list(&mut out, "skills", call.fields_limit);
        Ok(out)
    }
}

/// List the active skills: local ones and those of the configured skill spaces.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSkills {}
