//! `kill_task`: a background task stopped, its whole process tree with it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};

use crate::service::{object, Placed, SandboxTool, SANDBOX};

impl Tool<Placed> for KillTask {
    const DEF: &'static ToolDef = &SANDBOX
        .named("kill_task")
        .risk(RiskLevel::Medium, &[SideEffect::ProcessControl]);

    async fn run(self, placed: &Placed, _call: &ToolCall<'_>) -> ToolResult {
        let (session, task) = placed.task(&self.task_id)?;
        let killed = task.kill().await;
        placed.service.push_quietly(session).await;
        let (status, exit_code) = task.status();
        Ok(object(json!({
            "task_id": self.task_id,
            "killed": killed,
            "status": status.as_str(),
            "exit_code": exit_code,
        })))
    }
}

impl SandboxTool for KillTask {}

/// Stop a background task.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillTask {
    pub task_id: String,
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}
