//! `kill_task`: a background task stopped, its whole process tree with it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Define, Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};

use crate::service::{no_task, object, Placed, Placement, SandboxTool, QUICK, SANDBOX};

pub struct KillTask;

impl Define for KillTask {
    type Args = TaskIdArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "kill_task",
        description: "Stop a background task.",
        risk_level: RiskLevel::Medium,
        side_effects: &[SideEffect::ProcessControl],
        ..SANDBOX
    };
}

impl SandboxTool for KillTask {
    const PLACEMENT: &'static Placement = &QUICK;
}

impl Tool for KillTask {
    type Host = Placed;

    async fn run(&self, placed: &Self::Host, _call: &ToolCall<'_>, a: Self::Args) -> ToolResult {
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
