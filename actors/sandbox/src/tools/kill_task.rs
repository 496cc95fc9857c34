//! `kill_task`: a background task stopped, its whole process tree with it.

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
        name: "kill_task",
        group: ToolGroup::Sandbox,
        description: "Stop a background task.",
        risk_level: RiskLevel::Medium,
        side_effects: &[SideEffect::ProcessControl],
        needs_session: true,
        role: Role::Sandbox,
        schema: schema_of::<TaskIdArgs>,
    },
    precheck: None,
    template: TemplateOf::Argument,
    run: Run::Quick(run),
};

fn run<'a>(
    service: &'a SandboxService,
    call: &'a ActorCall,
    session: Option<SessionUse>,
) -> BoxFuture<'a, Result<Map<String, Value>, ToolError>> {
    Box::pin(async move {
        let a: TaskIdArgs = args(call)?;
        let session = session.ok_or_else(|| no_task(&a.task_id))?;
        let task = session.tasks.get(&a.task_id)?;
        let killed = task.kill().await;
        service.push_quietly(&session).await;
        let (status, exit_code) = task.status();
        Ok(object(json!({
            "task_id": a.task_id,
            "killed": killed,
            "status": status.as_str(),
            "exit_code": exit_code,
        })))
    })
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
