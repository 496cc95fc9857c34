//! `list_skills`: the active skills, local ones and those of the configured skill spaces.

use serde_json::json;
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::{Define, Tool, ToolCall, ToolDef, ToolResult};

use crate::library::{fields, SkillsService};

pub struct ListSkills;

impl Define for ListSkills {
    type Args = NoArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "list_skills",
        description: "List the active skills: local ones and those of the configured skill spaces.",
        ..crate::library::SKILLS
    };
}

impl Tool for ListSkills {
    type Host = SkillsService;

    async fn run(&self, service: &Self::Host, call: &ToolCall<'_>, _a: Self::Args) -> ToolResult {
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
