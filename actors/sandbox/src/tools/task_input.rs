//! `task_input`: text written to a background task's standard input.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

use crate::service::{object, Placed, SandboxTool, EXECUTING};

impl Tool<Placed> for TaskInput {
    const DEF: &'static ToolDef = &EXECUTING.named("task_input");

    async fn run(self, placed: &Placed, _call: &ToolCall<'_>) -> ToolResult {
        let (_, task) = placed.task(&self.task_id)?;
        task.write_input(&self.input).await?;
        Ok(object(json!({
            "task_id": self.task_id,
            "bytes_written": self.input.len(),
            "status": task.status().0.as_str(),
        })))
    }
}

impl SandboxTool for TaskInput {}

/// Write to a background task's standard input.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskInput {
    pub task_id: String,
    pub input: String,
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}
