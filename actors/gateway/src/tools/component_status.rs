//! `component_status`: what the cluster has bound and running, answered by the gateway
//! (`builtin::component_status`).

use toolmesh_kernel::tools::args::{NoArgs, Profile};
use toolmesh_kernel::tools::{BuiltinGroup, Define, ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::ToolError;

use super::tool::{Builtin, GATEWAY};
use crate::core::{Answer, GatewayCore};

pub struct ComponentStatus;

impl Define for ComponentStatus {
    type Args = NoArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "component_status",
        description: "What toolmesh has bound and running in the cluster right now: skill spaces, sandbox workers, workspace, skill runtime.",
        group: BuiltinGroup::Platform,
        profiles: &[Profile::Focused],
        ..GATEWAY
    };
}

impl Builtin for ComponentStatus {
    fn answer(
        &self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        ctx: &InvocationContext,
        _args: NoArgs,
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
