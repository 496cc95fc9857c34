//! `task_output`: a background task's new output, optionally after waiting for a pattern.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::ToolError;

use crate::service::{object, Placed, SandboxTool, SANDBOX};

impl Tool<Placed> for TaskOutput {
    const DEF: &'static ToolDef = &SANDBOX.named("task_output");

    async fn run(self, placed: &Placed, call: &ToolCall<'_>) -> ToolResult {
        let service = &placed.service;
        let (session, task) = placed.task(&self.task_id)?;
        if self.timeout.is_some_and(|t| t > 300) {
            return Err(ToolError::invalid_argument(
                "/timeout",
                "timeout is at most 300 seconds",
            ));
        }
        let pattern = match self.wait_for_pattern.as_deref() {
            None => None,
            Some(p) => Some(regex::Regex::new(p).map_err(|e| {
                ToolError::invalid_argument("/wait_for_pattern", format!("not a valid regex: {e}"))
            })?),
        };
        let wait = self
            .timeout
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_PATTERN_WAIT);
        let read = task.read(pattern.as_ref(), wait).await;
        service.push_quietly(session).await;
        let mut fields = object(json!({"task_id": self.task_id}));
        let dropped_bytes = read.dropped_bytes();
        let dropped_cap = read.dropped_cap();
        let persist_error = read.persist_error().map(ToolError::brief);
        service
            .put_output(call, &mut fields, "stdout", read.stdout)
            .await;
        service
            .put_output(call, &mut fields, "stderr", read.stderr)
            .await;
        fields.insert("status".into(), read.status.as_str().into());
        fields.insert("exit_code".into(), read.exit_code.into());
        if let Some(matched) = read.matched {
            fields.insert("matched".into(), matched.into());
        }
        if dropped_bytes > 0 {
            // Unread output past the cap was counted (`_original_chars`), not kept.
            fields.insert("dropped_bytes".into(), dropped_bytes.into());
            if let Some(cap) = dropped_cap {
                // Which cap: the stream's, the session's or the worker's; or the workspace
                // that did not take a part of it (`persist_error` says why).
                fields.insert("dropped_by".into(), cap.as_str().into());
            }
            if let Some(error) = persist_error {
                fields.insert("persist_error".into(), error);
            }
        }
        Ok(fields)
    }
}

impl SandboxTool for TaskOutput {}

/// `task_output` waits this long for a pattern when the call names no timeout.
const DEFAULT_PATTERN_WAIT: Duration = Duration::from_secs(30);

/// Read a background task's new output, optionally waiting for a regex to appear.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskOutput {
    pub task_id: String,
    /// A regex to wait for in the output.
    #[serde(default)]
    pub wait_for_pattern: Option<String>,
    /// Seconds to wait, at most 300.
    #[serde(default)]
    #[schemars(range(min = 0, max = 300))]
    pub timeout: Option<u64>,
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}
