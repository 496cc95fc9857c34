//! `task_input`: text written to a background task's standard input.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Define, Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};

use crate::service::{no_task, object, Placed, Placement, SandboxTool, QUICK, SANDBOX};

pub struct TaskInput;

impl Define for TaskInput {
    type Args = TaskInputArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "task_input",
        description: "Write to a background task's standard input.",
        risk_level: RiskLevel::High,
        side_effects: &[SideEffect::IsolatedRuntimeExecution],
        ..SANDBOX
    };
}

impl SandboxTool for TaskInput {
    const PLACEMENT: &'static Placement = &QUICK;
}

impl Tool for TaskInput {
    type Host = Placed;

    async fn run(&self, placed: &Self::Host, _call: &ToolCall<'_>, a: Self::Args) -> ToolResult {
        let session = placed.session.as_ref().ok_or_else(|| no_task(&a.task_id))?;
        let task = session.tasks.get(&a.task_id)?;
        task.write_input(&a.input).await?;
        Ok(object(json!({
            "task_id": a.task_id,
            "bytes_written": a.input.len(),
            "status": task.status().0.as_str(),
        })))
    }
}

/// Feed a background task's standard input.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskInputArgs {
    pub task_id: String,
    pub input: String,
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}
