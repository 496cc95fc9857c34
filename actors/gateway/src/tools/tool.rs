//! What one of the gateway's own tools is: a [`Define`] (its definition and argument type)
//! that answers at once ([`Builtin`]), from the registry the call took when it arrived and the
//! cluster view. `tool_dispatcher` answers nothing itself: the call path runs it before the
//! gate, so it is listed ([`super::listed`]) but is no entry of [`super::TOOLS`].

use serde_json::Value;
use toolmesh_kernel::tools::{parse_args, BuiltinGroup, Define, Listed, ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::{Role, ToolError};

use crate::core::{Answer, GatewayCore};

/// What a gateway tool's definition says unless it says otherwise: the dispatcher group, run by
/// the gateway, low risk, no side effect, no session, no named profile.
pub(crate) const GATEWAY: ToolDef = ToolDef::of(BuiltinGroup::Dispatcher, Role::Gateway);

/// How a tool of the gateway answers a call whose arguments are valid (and approved, when the
/// policy asks).
pub trait Builtin: Define {
    fn answer(
        &self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        ctx: &InvocationContext,
        args: Self::Args,
    ) -> Result<Answer, ToolError>;
}

/// An entry of [`super::TOOLS`]: implemented for every [`Builtin`].
pub trait Answering: Listed {
    /// Parses the arguments into the tool's type, then answers.
    fn answer_value(
        &self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        ctx: &InvocationContext,
        arguments: &Value,
    ) -> Result<Answer, ToolError>;
}

impl<T: Builtin> Answering for T {
    fn answer_value(
        &self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        ctx: &InvocationContext,
        arguments: &Value,
    ) -> Result<Answer, ToolError> {
        self.answer(core, registry, ctx, parse_args(arguments)?)
    }
}
