//! `sandbox_status`: the session sandbox's backend, limits, lifetime and boundary.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};

use crate::pool::Session;
use crate::service::{object, Placed, SandboxService, SandboxTool, QUICK, SANDBOX};
use crate::templates::Template;

impl Tool<Placed> for Status {
    const DEF: &'static ToolDef = &SANDBOX
        .named("sandbox_status")
        .profiles(&[Profile::Focused, Profile::Coding]);

    async fn run(self, placed: &Placed, call: &ToolCall<'_>) -> ToolResult {
        let service = &placed.service;
        let session = placed.session.as_deref().map(Arc::as_ref);
        // The session's template; before it has a sandbox, the one its first would be of.
        let template = match session {
            Some(session) => session.template.clone(),
            None => service
                .template_of(&QUICK, call.arguments)
                .await?
                .unwrap_or_else(|| service.pool.settings.templates.default_template().clone()),
        };
        Ok(service.status(session, &template))
    }
}

impl SandboxTool for Status {}

/// The session sandbox's backend, limits, lifetime and boundary; runs no command.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Status {
    /// The sandbox template (PROTOCOL.md "Sandbox templates"); none: the session's, or
    /// `default` for a new sandbox.
    #[serde(default)]
    pub template: Option<String>,
}

impl SandboxService {
    fn status(&self, session: Option<&Session>, template: &Template) -> Map<String, Value> {
        let settings = &self.pool.settings;
        let idle_ttl = template.idle_ttl.as_secs();
        let limits = &template.limits;
        let mut fields = object(json!({
            "backend": self.backend_name(),
            "enabled": true,
            "isolated": true,
            "template_bound": true,
            "template_id": template.name,
            "image": template.image,
            "runtime": template.runtime_name(),
            "commands": self.pool.backend.commands(template.limits.runtime.as_deref()),
            "network": template.network.wire_name(),
            "timeout_seconds": self.default_timeout.as_secs(),
            "ttl_seconds": Value::Null,
            "idle_ttl_seconds": idle_ttl,
            "max_sessions": settings.max_sessions,
            "sandbox_id": Value::Null,
            "created_at": Value::Null,
            "last_used_at": Value::Null,
            "expires_at": Value::Null,
            "idle_seconds": Value::Null,
            "boundary": self.boundary(template),
            "node_id": settings.node.as_str(),
            "limits": {
                "memory_mb": limits.memory_mb,
                "pids": limits.pids,
                "cpus": limits.cpus,
                "network": template.network.wire_name(),
                "disk_mb": (settings.disk.mb > 0).then_some(settings.disk.mb),
            },
        }));
        if let Some(note) = &settings.disk.note {
            fields.insert("disk_note".into(), note.clone().into());
        }
        if let Some(session) = session {
            let (last_used, last_used_ms) = session.last_used();
            let idle = last_used.elapsed().as_secs();
            let ms = toolmesh_kernel::time::ms_to_rfc3339;
            fields.insert(
                "sandbox_id".into(),
                session.sandbox.sandbox_id.clone().into(),
            );
            fields.insert("created_at".into(), ms(session.created_at_ms).into());
            fields.insert("last_used_at".into(), ms(last_used_ms).into());
            fields.insert(
                "expires_at".into(),
                ms(last_used_ms + idle_ttl * 1000).into(),
            );
            fields.insert("idle_seconds".into(), idle.into());
        }
        fields
    }
}
