//! `load_skill`: a skill's SKILL.md instructions, a remote skill downloaded and verified first.

use crate::library::{list_files, FilesError, SkillsService};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map};
use toolmesh_kernel::budget::insert_budgeted;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

impl Tool<SkillsService> for LoadSkill {
    const DEF: &'static ToolDef = &crate::library::SKILLS.named("load_skill");

    async fn run(self, service: &SkillsService, call: &ToolCall<'_>) -> ToolResult {
        // A load may download an archive: claim it, so a lost node is noticed at once.
        call.claim().await;
        let catalog = service.catalog().await;
        let loaded = service.resolve(&catalog, self.skill_name.trim()).await?;
        let root = loaded.root.clone();
        let caps = service.loader.caps;
        let files = tokio::task::spawn_blocking(move || list_files(&root, caps))
            .await
            .map_err(|source| FilesError::Task {
                what: "listing",
                source,
            })??;
        let script_files: Vec<&str> = files
            .iter()
            .map(|(p, _)| p.as_str())
            .filter(|p| p.starts_with("scripts/"))
            .collect();
        let has_scripts_dir = loaded.root.join("scripts").is_dir();
        let manifest = &loaded.skill.manifest;
        let version = if manifest.version.is_empty() {
            loaded.doc.version.clone().unwrap_or_default()
        } else {
            manifest.version.clone()
        };
        let description = if manifest.description.is_empty() {
            loaded.doc.description.clone().unwrap_or_default()
        } else {
            manifest.description.clone()
        };
        let mut out = Map::new();
        out.insert("name".into(), json!(manifest.name));
        out.insert("version".into(), json!(version));
        out.insert("description".into(), json!(description));
        out.insert("space_id".into(), json!(manifest.space_id));
        out.insert("sha256".into(), json!(loaded.sha256));
        insert_budgeted(
            &mut out,
            "instructions",
            &loaded.doc.instructions,
            call.outputs.budget_chars,
        );
        out.insert(
            "tags".into(),
            json!(if loaded.doc.tags.is_empty() {
                &manifest.tags
            } else {
                &loaded.doc.tags
            }),
        );
        out.insert(
            "requires_sandbox".into(),
            json!(loaded.doc.requires_sandbox),
        );
        if let Some(template) = &loaded.doc.sandbox_template {
            out.insert("sandbox_template".into(), json!(template));
        }
        out.insert("root_dir".into(), json!(loaded.root.display().to_string()));
        out.insert("has_scripts_dir".into(), json!(has_scripts_dir));
        out.insert("script_files".into(), json!(script_files));
        out.insert("cache_hit".into(), json!(loaded.cache_hit));
        out.insert(
            "usage".into(),
            json!(format!(
                "Follow these instructions in your own context. To run the skill's scripts in an isolated runtime, call execute_skills with skill_names [\"{}\"] and your original workflow prompt.",
                manifest.name
            )),
        );
        out.insert("warnings".into(), json!(loaded.warnings));
        Ok(out)
    }
}

/// Load a skill's SKILL.md instructions (downloading and verifying a remote skill); runs nothing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadSkill {
    #[schemars(length(min = 1))]
    pub skill_name: String,
}
