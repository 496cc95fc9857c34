//! `list_skills`: the active skills, local ones and those of the configured skill spaces.

use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup};
use toolmesh_kernel::wire::{ActorCall, RiskLevel};
use toolmesh_kernel::{budget, Role, ToolError};

use super::{fields, SkillsService, Tool};

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: "list_skills",
        group: ToolGroup::Skills,
        description: "List the active skills: local ones and those of the configured skill spaces.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: false,
        role: Role::Skills,
        schema: schema_of::<NoArgs>,
    },
    run,
};

fn run<'a>(
    service: &'a SkillsService,
    _call: &'a ActorCall,
    fields_limit: usize,
) -> BoxFuture<'a, Result<Map<String, Value>, ToolError>> {
    Box::pin(async move { service.list_skills(fields_limit).await })
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
