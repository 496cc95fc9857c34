//! `task_input`: text written to a background task's standard input.

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup};
use toolmesh_kernel::wire::{ActorCall, RiskLevel, SideEffect};
use toolmesh_kernel::{Role, ToolError};

use super::{args, no_task, object, Run, SandboxService, TemplateOf, Tool};
use crate::pool::SessionUse;

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: "task_input",
        group: ToolGroup::Sandbox,
        description: "Write to a background task's standard input.",
        risk_level: RiskLevel::High,
        side_effects: &[SideEffect::IsolatedRuntimeExecution],
        needs_session: true,
        role: Role::Sandbox,
        schema: schema_of::<TaskInputArgs>,
    },
    precheck: None,
    template: TemplateOf::Argument,
    run: Run::Quick(run),
};

fn run<'a>(
    _service: &'a SandboxService,
    call: &'a ActorCall,
    session: Option<SessionUse>,
) -> BoxFuture<'a, Result<Map<String, Value>, ToolError>> {
    Box::pin(async move {
        let a: TaskInputArgs = args(call)?;
        let session = session.ok_or_else(|| no_task(&a.task_id))?;
        let task = session.tasks.get(&a.task_id)?;
        task.write_input(&a.input).await?;
        Ok(object(json!({
            "task_id": a.task_id,
            "bytes_written": a.input.len(),
            "status": task.status().0.as_str(),
        })))
    })
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
