//! `list_tasks`: the background tasks of the session.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

use crate::service::{object, Placed, SandboxTool, SANDBOX};

impl Tool<Placed> for ListTasks {
    const DEF: &'static ToolDef = &SANDBOX.named("list_tasks");

    async fn run(self, placed: &Placed, call: &ToolCall<'_>) -> ToolResult {
        let tasks: Vec<Value> = placed
            .session
            .as_ref()
            .map(|s| s.tasks.list())
            .unwrap_or_default()
            .iter()
            .map(|t| {
                let (status, exit_code) = t.status();
                json!({
                    "task_id": t.task_id,
                    "command": t.command,
                    "status": status.as_str(),
                    "started_at": t.started_at,
                    "exit_code": exit_code,
                })
            })
            .collect();
        let mut fields = object(json!({ "tasks": tasks }));
        budget::fit_list(&mut fields, "tasks", call.fields_limit);
        Ok(fields)
    }
}

impl SandboxTool for ListTasks {}

/// List the background tasks of the session.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasks {
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}
