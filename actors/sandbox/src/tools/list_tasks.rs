//! `list_tasks`: the background tasks of the session.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::RiskLevel;
use toolmesh_kernel::{budget, Role};

use super::{object, Placed, Placement, SandboxService, SandboxTool, TemplateOf};
use crate::pool::Session;

pub struct ListTasks;

impl Define for ListTasks {
    type Args = ListTasksArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "list_tasks",
        group: ToolGroup::Sandbox,
        description: "List the background tasks of the session.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: true,
        role: Role::Sandbox,
        profiles: &[Profile::Coding],
        review: Review::Arguments,
    };
}

impl SandboxTool for ListTasks {
    const PLACEMENT: &'static Placement = &Placement {
        creates_sandbox: false,
        template: TemplateOf::Argument,
        precheck: None,
    };
}

impl Tool for ListTasks {
    type Host = Placed;

    async fn run(&self, placed: &Placed, _call: &ToolCall<'_>, _a: ListTasksArgs) -> ToolResult {
        let session = placed.session.as_deref().map(Arc::as_ref);
        Ok(placed.service.list_tasks(session))
    }
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
