//! `sandbox_status`: the session sandbox's backend, limits, lifetime and boundary.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use toolmesh_kernel::tools::args::NoArgs;
use toolmesh_kernel::tools::{schema_of, ToolDef, ToolGroup};
use toolmesh_kernel::wire::{ActorCall, RiskLevel};
use toolmesh_kernel::{Role, ToolError};

use super::{object, Run, SandboxService, Tool};
use crate::pool::{Session, SessionUse};

pub const TOOL: Tool = Tool {
    def: ToolDef {
        name: "sandbox_status",
        group: ToolGroup::Sandbox,
        description:
            "The session sandbox's backend, limits, lifetime and boundary; runs no command.",
        risk_level: RiskLevel::Low,
        side_effects: &[],
        needs_session: true,
        role: Role::Sandbox,
        schema: schema_of::<NoArgs>,
    },
    precheck: None,
    run: Run::Quick(run),
};

fn run<'a>(
    service: &'a SandboxService,
    _call: &'a ActorCall,
    session: Option<SessionUse>,
) -> BoxFuture<'a, Result<Map<String, Value>, ToolError>> {
    Box::pin(async move { Ok(service.status(session.as_deref().map(Arc::as_ref))) })
}

impl SandboxService {
    fn status(&self, session: Option<&Session>) -> Map<String, Value> {
        let settings = &self.pool.settings;
        let idle_ttl = settings.idle_ttl.as_secs();
        let mut fields = object(json!({
            "backend": self.backend_name(),
            "enabled": true,
            "isolated": true,
            "template_bound": false,
            "template_id": self.image,
            "timeout_seconds": self.default_timeout.as_secs(),
            "ttl_seconds": Value::Null,
            "idle_ttl_seconds": idle_ttl,
            "max_sessions": settings.max_sessions,
            "sandbox_id": Value::Null,
            "created_at": Value::Null,
            "last_used_at": Value::Null,
            "expires_at": Value::Null,
            "idle_seconds": Value::Null,
            "boundary": self.pool.backend.boundary(),
            "node_id": settings.node.as_str(),
            "limits": {
                "memory_mb": settings.limits.memory_mb,
                "pids": settings.limits.pids,
                "cpus": settings.limits.cpus,
                "network": settings.limits.network,
            },
        }));
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
