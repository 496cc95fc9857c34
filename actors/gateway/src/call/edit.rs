//! Edit before approving (PROTOCOL.md "Approval policy"), the gateway's two parts: it checks a
//! reviewer's arguments for the approval actor before they are approved
//! (`toolmesh.internal.v1.gateway.check`), and a call whose approval was edited runs with the
//! edited arguments, checked once more against the tool and the policy of the call.

use std::sync::Arc;

use async_nats::Message;
use serde_json::Value;

use toolmesh_kernel::canonical::bindable;
use toolmesh_kernel::host::respond;
use toolmesh_kernel::policy::{Decision, Facts, Policy};
use toolmesh_kernel::tools::RegisteredTool;
use toolmesh_kernel::wire::{self, ArgumentsCheck};
use toolmesh_kernel::ToolError;

use super::{denied, Call};
use crate::builtin;
use crate::core::GatewayCore;

/// Answers one check of edited arguments: `{"ok": true}` or the error a call with them gets.
pub async fn handle_check(core: Arc<GatewayCore>, msg: Message) {
    let answer = serde_json::from_slice::<ArgumentsCheck>(&msg.payload)
        .map_err(|e| ToolError::invalid_request(format!("not an ArgumentsCheck: {e}")))
        .and_then(|check| {
            let registry = core.tools.snapshot();
            let policy = core.config.policy.current();
            let tool = registry
                .get(&check.tool_name)
                .filter(|tool| !tool.spec.is_dispatcher())
                .ok_or_else(|| builtin::unknown_tool(&check.tool_name))?;
            admit(tool, &policy, &check)
        });
    let body = match answer {
        Ok(()) => wire::ok_body(Default::default()),
        Err(error) => wire::error_body(error),
    };
    respond(&core.client, msg.reply.as_ref(), body).await;
}

/// What a call of `tool` with the edited arguments would meet before its gate: the schema,
/// exact numbers for the hash, and the policy's `deny` rules.
fn admit(tool: &RegisteredTool, policy: &Policy, check: &ArgumentsCheck) -> Result<(), ToolError> {
    tool.validate(&check.arguments, "")?;
    bindable(&check.arguments)?;
    not_denied(
        policy,
        &Facts {
            tool: &tool.spec.name,
            account: check.account.as_str(),
            session: check.session_id.as_ref().map(|s| s.as_str()),
            arguments: &check.arguments,
        },
    )
}

/// `policy_denied` when a `deny` rule matches.
fn not_denied(policy: &Policy, facts: &Facts<'_>) -> Result<(), ToolError> {
    match policy.rules().decide(facts) {
        Some(rule) if rule.decision == Decision::Deny => Err(denied(rule, policy)),
        _ => Ok(()),
    }
}

impl Call<'_> {
    /// The arguments a reviewer approved in place of the call's: checked against the tool and
    /// the call's policy once more (the policy may have been reloaded since), then the call's.
    pub(super) fn take_edit(
        &mut self,
        target: &RegisteredTool,
        edited: Value,
    ) -> Result<Value, ToolError> {
        target.validate(&edited, "")?;
        not_denied(
            &self.policy,
            &Facts {
                tool: &target.spec.name,
                account: self.ctx.account.as_str(),
                session: self.ctx.session_id.as_ref().map(|s| s.as_str()),
                arguments: &edited,
            },
        )?;
        self.edited = true;
        if let Some(audit) = self.audit.as_mut() {
            audit.edited(&edited);
        }
        Ok(edited)
    }
}
