//! `list_tasks`: the background tasks of the session.

use std::sync::Arc;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup};
use toolmesh_kernel::wire::{ActorCall, RiskLevel};
use toolmesh_kernel::{budget, Role, ToolError};

use super::{args, object, Run, SandboxService, TemplateOf, Tool};
use crate::pool::{Session, SessionUse};

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: "list_tasks",
        group: ToolGroup::Sandbox,
        description: "List the background tasks of the session.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: true,
        role: Role::Sandbox,
        schema: schema_of::<ListTasksArgs>,
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
        let _: ListTasksArgs = args(call)?;
        Ok(service.list_tasks(session.as_deref().map(Arc::as_ref)))
    })
}

/// List the session's background tasks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasksArgs {
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}

impl SandboxService {
    fn list_tasks(&self, session: Option<&Session>) -> Map<String, Value> {
        let tasks: Vec<Value> = session
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
        budget::fit_list(
            &mut fields,
            "tasks",
            budget::fields_limit(self.client.max_payload()),
        );
        fields
    }
}
