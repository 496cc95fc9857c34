//! What one of the gateway's own tools is: its definition and how it is answered.

use serde_json::Value;
use toolmesh_kernel::tools::{TableEntry, ToolDef, ToolRegistry};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::ToolError;

use crate::core::{Answer, GatewayCore};

/// One tool of the gateway: its definition and how it is answered.
#[derive(Debug)]
pub struct Tool {
    pub def: ToolDef,
    /// `None` for `tool_dispatcher`, which the call path runs before the approval gate.
    pub(super) answer: Option<AnswerFn>,
}

impl TableEntry for Tool {
    fn def(&self) -> &ToolDef {
        &self.def
    }
}

/// Answers with the registry the call took when it arrived (built-in and provider tools).
pub(super) type AnswerFn =
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
