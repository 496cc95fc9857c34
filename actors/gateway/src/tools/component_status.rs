//! `component_status`: what the cluster has bound and running, answered by the gateway
//! (`builtin::component_status`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{BuiltinGroup, ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::ToolError;

use super::tool::{Builtin, GATEWAY};
use crate::core::{Answer, GatewayCore};

impl Builtin for ComponentStatus {
    const DEF: &'static ToolDef = &GATEWAY
        .named("component_status")
        .in_group(BuiltinGroup::Platform)
        .profiles(&[Profile::Focused]);

    fn answer(
        self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        ctx: &InvocationContext,
    ) -> Result<Answer, ToolError> {
        let mut members = core.status_cache.render(
            registry,
            &core.tools.providers(),
            &core.cluster,
            &core.config,
            ctx,
        );
        // This gateway's audit trail (on, or off and why), fresh on every call.
        members.extend_from_slice(b",\"audit\":");
        members.extend_from_slice(&serde_json::to_vec(&core.audit.status()).unwrap_or_default());
        Ok(Answer::Prepared(members))
    }
}

/// What toolmesh has bound and running in the cluster right now: skill spaces, sandbox workers,
/// workspace, skill runtime.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ComponentStatus {}
