//! `kill_task`: a background task stopped, its whole process tree with it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};
use toolmesh_kernel::Role;

use super::{no_task, object, Placed, Placement, SandboxTool, TemplateOf};

pub struct KillTask;

impl Define for KillTask {
    type Args = TaskIdArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "kill_task",
        group: ToolGroup::Sandbox,
        description: "Stop a background task.",
        risk_level: RiskLevel::Medium,
        side_effects: &[SideEffect::ProcessControl],
        needs_session: true,
        role: Role::Sandbox,
        profiles: &[Profile::Coding],
        review: Review::Arguments,
    };
}

impl SandboxTool for KillTask {
    const PLACEMENT: &'static Placement = &Placement {
        creates_sandbox: false,
        template: TemplateOf::Argument,
        precheck: None,
    };
}

impl Tool for KillTask {
    type Host = Placed;

    async fn run(&self, placed: &Placed, _call: &ToolCall<'_>, a: TaskIdArgs) -> ToolResult {
        let session = placed.session.as_ref().ok_or_else(|| no_task(&a.task_id))?;
        let task = session.tasks.get(&a.task_id)?;
        let killed = task.kill().await;
        placed.service.push_quietly(session).await;
        let (status, exit_code) = task.status();
        Ok(object(json!({
            "task_id": a.task_id,
            "killed": killed,
            "status": status.as_str(),
            "exit_code": exit_code,
        })))
    }
}

/// Name a background task.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskIdArgs {
    pub task_id: String,
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}
