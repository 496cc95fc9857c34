//! The tools the gateway answers itself, one file each (definition, arguments, answer), listed
//! in [`TOOLS`]. Their bodies share the registry and the cluster view (`builtin.rs`).

mod component_status;
pub mod tool_dispatcher;
pub mod tool_search;

use serde_json::Value;
use toolmesh_kernel::tools::{TableEntry, ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::ToolError;

use crate::core::{Answer, GatewayCore};

/// The gateway's own tools, in the order of PROTOCOL.md's tool table.
pub const TOOLS: &[Tool] = &[
    component_status::TOOL,
    tool_dispatcher::TOOL,
    tool_search::TOOL,
];

/// One tool of the gateway: its definition and how it is answered.
#[derive(Debug)]
pub struct Tool {
    pub def: ToolDef,
    /// `None` for `tool_dispatcher`, which the call path runs before the approval gate.
    answer: Option<AnswerFn>,
}

impl TableEntry for Tool {
    fn def(&self) -> &ToolDef {
        &self.def
    }
}

/// Answers with the registry the call took when it arrived (built-in and provider tools).
type AnswerFn =
    fn(&GatewayCore, &ToolRegistry, &InvocationContext, Value) -> Result<Answer, ToolError>;

impl Tool {
    /// Answers a call of this tool whose arguments are valid (and approved, when the policy
    /// asks); `None` when the call path runs it.
    pub(crate) fn answer(
        &self,
        core: &GatewayCore,
        registry: &ToolRegistry,
        ctx: &InvocationContext,
        arguments: Value,
    ) -> Option<Result<Answer, ToolError>> {
        self.answer
            .map(|answer| answer(core, registry, ctx, arguments))
    }
}
