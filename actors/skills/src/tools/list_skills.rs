//! `list_skills`: the active skills, local ones and those of the configured skill spaces.

use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::RiskLevel;
use toolmesh_kernel::{budget, Role, ToolError};

use super::{fields, SkillsService};

pub struct ListSkills;

impl Define for ListSkills {
    type Args = NoArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "list_skills",
        group: ToolGroup::Skills,
        description: "List the active skills: local ones and those of the configured skill spaces.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: false,
        role: Role::Skills,
        profiles: &[Profile::Focused, Profile::Coding],
        review: Review::Arguments,
    };
}

impl Tool for ListSkills {
    type Host = SkillsService;

    async fn run(&self, service: &SkillsService, call: &ToolCall<'_>, _args: NoArgs) -> ToolResult {
        service.list_skills(call.fields_limit).await
    }
}

impl SkillsService {
    async fn list_skills(&self, fields_limit: usize) -> Result<Map<String, Value>, ToolError> {
        let catalog = self.catalog().await;
        let skills: Vec<_> = catalog.skills.iter().map(|s| &s.manifest).collect();
        let mut out = fields(json!({
            "skills": skills,
            "skill_space_ids": self.loader.service.space_ids(),
            "warnings": catalog.warnings,
        }));
        budget::fit_list(&mut out, "skills", fields_limit);
        Ok(out)
    }
}
