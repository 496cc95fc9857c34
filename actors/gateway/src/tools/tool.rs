//! What one of the gateway's own tools is: a type (its arguments, its doc comment the
//! description) that answers at once ([`Builtin`]), from the registry the call took when it
//! arrived and the cluster view. `tool_dispatcher` answers nothing itself: the call path runs
//! it before the gate, so it is listed ([`super::LISTED`]) but is no entry of
//! [`super::TOOLS`].

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;
use toolmesh_kernel::tools::{parse_args, BuiltinGroup, Entry, ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::{Role, ToolError};

use crate::core::{Answer, GatewayCore};

/// What a gateway tool's definition says unless it says otherwise: the dispatcher group, run by
/// the gateway, low risk, no side effect, no session, no named profile.
pub(crate) const GATEWAY: ToolDef = ToolDef::of(BuiltinGroup::Dispatcher, Role::Gateway);

/// How a tool of the gateway answers a call whose arguments are valid (and approved, when the
/// policy asks): the type is its arguments, as for an actor's [`toolmesh_kernel::tools::Tool`].
pub trait Builtin: DeserializeOwned + JsonSchema + 'static {
    const DEF: &'static ToolDef;

    fn answer(
        self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        ctx: &InvocationContext,
    ) -> Result<Answer, ToolError>;
}

/// How an entry of [`super::TOOLS`] answers: parses the arguments into the tool's type, then
/// answers.
pub type AnswerFn =
    fn(&GatewayCore, &ToolRegistry, &InvocationContext, &Value) -> Result<Answer, ToolError>;

/// The table entry of gateway tool `T`.
pub const fn builtin<T: Builtin>() -> Entry<AnswerFn> {
    Entry::new::<T>(T::DEF, answer_parsed::<T>)
}

fn answer_parsed<T: Builtin>(
    core: &GatewayCore,
    registry: &ToolRegistry,
    ctx: &InvocationContext,
    arguments: &Value,
) -> Result<Answer, ToolError> {
    parse_args::<T>(arguments)?.answer(core, registry, ctx)
}
