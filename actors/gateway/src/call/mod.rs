//! The path of one tool call through the gateway: parse → tool exists → arguments valid →
//! approval gate → run (here or in the actor that owns the tool) → `finished` → reply.
//!
//! This file is the lifecycle, in order, and `tool_dispatcher`; the other rooms add to `Call`:
//! `review.rs` (the pre-reviewer), `gate.rs` (approval), `route.rs` (actors, claims, direct
//! replies) and `provider.rs`;
//! `error.rs` says why a request to an actor failed on the gateway's side.

pub(crate) mod edit;
mod error;
pub(crate) mod gate;
mod provider;
pub(crate) mod review;
pub(crate) mod route;

use std::sync::Arc;
use std::time::Instant;

use async_nats::Message;
use serde_json::{Map, Value};
use tracing::{field, Instrument};

use toolmesh_kernel::budget;
use toolmesh_kernel::host::respond;
use toolmesh_kernel::metrics::UNKNOWN_TOOL;
use toolmesh_kernel::policy::{Decision, Facts, Policy, Rule};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::time::elapsed_ms;
use toolmesh_kernel::tools::{self as registry_tools, RegisteredTool, Runs, ToolRegistry};
use toolmesh_kernel::trace;
use toolmesh_kernel::wire::{
    self, finished_extra, InvocationContext, ReplyWriter, RunEventKind, ToolRequest,
};
use toolmesh_kernel::{Account, ErrorCode, ToolError};

use crate::builtin;
use crate::core::{Answer, GatewayCore};
use crate::tools::{self, tool_dispatcher::DispatcherAction, tool_dispatcher::ToolDispatcher};
use toolmesh_kernel::events::RunEvents;

/// Handles one message on `toolmesh.v1.call.<account>`; always replies when it can.
pub async fn handle_call(core: Arc<GatewayCore>, msg: Message) {
    let _held = core.in_flight.enter();
    let arrived = Instant::now();
    let Some(reply_to) = msg.reply.clone() else {
        tracing::warn!(subject = %DisplaySafe(&msg.subject), "tool call published without a reply subject; send it as a request");
        return;
    };
    let request = match ToolRequest::parse(&msg.payload) {
        Ok(request) => request,
        Err(refused) => {
            let elapsed = arrived.elapsed();
            core.metrics
                .call_finished(UNKNOWN_TOOL, Some(refused.error.code), elapsed);
            let body = wire::reply_body(&refused.invocation_id, refused.error.into_fields());
            respond(&core.client, Some(&reply_to), body).await;
            return;
        }
    };
    let account = match subject_account(&msg, "call") {
        Ok(account) => account,
        Err(error) => {
            let registry = core.tools.snapshot();
            let tool = metric_tool(&registry, &request.tool);
            core.metrics
                .call_finished(tool, Some(error.code), arrived.elapsed());
            let body = wire::reply_body(&request.invocation_id, error.into_fields());
            respond(&core.client, Some(&reply_to), body).await;
            return;
        }
    };
    let span = tracing::info_span!(
        "call",
        otel.kind = "server",
        otel.status_code = field::Empty,
        outcome = field::Empty,
        invocation_id = %request.invocation_id,
        account = %account,
        tool = %DisplaySafe(&request.tool),
        session_id = request.session_id.as_ref().map(|s| s.as_str()),
        user_id = request.user_id.as_deref().map(|u| field::display(DisplaySafe(u))),
        agent_id = request.agent_id.as_deref().map(|a| field::display(DisplaySafe(a))),
    );
    // A caller's `traceparent` makes this call part of its trace.
    trace::follow(&span, msg.headers.as_ref());
    async move {
        let ctx = request.context(account);
        let registry = core.tools.snapshot();
        let mut call = Call {
            core: &core,
            registry: &registry,
            reply_to: &reply_to,
            events: RunEvents::new(core.client.clone(), &ctx, &core.config.node.events),
            tool_for_events: request.tool.clone(),
            ctx,
            started: None,
            dispatched: None,
            consumed_approval: None,
            outcome: None,
            audit: None,
            policy: core.config.policy.current(),
            rule: None,
            grant_id: None,
            edited: false,
            reviewed: None,
        };
        let result = call.run(&request).await;
        let body = call.finish(result).await;
        // Counted before the reply goes out: a caller that scrapes after its reply sees it.
        let tool = metric_tool(&registry, call.dispatched.unwrap_or(&request.tool));
        core.metrics
            .call_finished(tool, call.outcome, arrived.elapsed());
        let span = tracing::Span::current();
        match call.outcome {
            None => span.record("outcome", "ok"),
            Some(code) => span
                .record("outcome", code.as_str())
                .record("otel.status_code", "ERROR"),
        };
        if let Some(body) = body {
            respond(&core.client, Some(&reply_to), body).await;
        }
    }
    .instrument(span)
    .await
}

/// One call in flight.
struct Call<'a> {
    core: &'a GatewayCore,
    /// The registry as it was when the call arrived: a provider that goes meanwhile does not
    /// change what this call sees.
    registry: &'a ToolRegistry,
    /// The caller's reply subject.
    reply_to: &'a async_nats::Subject,
    ctx: InvocationContext,
    events: RunEvents,
    tool_for_events: String,
    /// Set once `started` was published (arguments were valid).
    started: Option<Instant>,
    /// The inner tool of a `tool_dispatcher` `call`.
    dispatched: Option<&'a str>,
    /// The id of the approval the gate let this call use (`Proceed`): given back when the call
    /// provably never ran. Only the id, to keep every call's future small.
    consumed_approval: Option<String>,
    /// How the call ended, once [`Call::finish`] ran: its error code, or `None` for success.
    outcome: Option<ErrorCode>,
    /// Set once the arguments were valid and the trail is on (`crate::audit`).
    audit: Option<Box<crate::audit::CallAudit>>,
    /// The policy as it was when the call arrived (a reload meanwhile does not change it).
    policy: Arc<Policy>,
    /// The policy rule that decided the call, if one matched.
    rule: Option<Arc<Rule>>,
    /// The grant that let the call run without an approval.
    grant_id: Option<String>,
    /// The call runs with arguments a reviewer edited before approving.
    edited: bool,
    /// What the pre-reviewer decided, when it let the call run or refused it.
    reviewed: Option<review::Reviewed>,
}

/// The `tool` label of a call: a name of the registry, or [`UNKNOWN_TOOL`] (bounded labels).
fn metric_tool<'t>(registry: &'t ToolRegistry, name: &str) -> &'t str {
    registry
        .get(name)
        .map_or(UNKNOWN_TOOL, |tool| &tool.spec.name)
}

impl<'a> Call<'a> {
    async fn run(&mut self, request: &ToolRequest) -> Result<Answer, ToolError> {
        let registry: &'a ToolRegistry = self.registry;
        let tool = registry
            .get(&request.tool)
            .ok_or_else(|| builtin::unknown_tool(&request.tool))?;
        let (target, mut arguments, pointer_prefix) = if tool.spec.is_dispatcher() {
            match Box::pin(self.dispatch(tool, &request.arguments)).await? {
                Dispatch::Answered(fields) => return Ok(Answer::Fields(fields)),
                Dispatch::Call(inner, arguments) => (inner, arguments, "/arguments"),
            }
        } else {
            (tool, request.arguments.clone(), "")
        };
        if target.spec.needs_session && self.ctx.session_id.is_none() {
            // `needs_session`: a front that names sessions its own way (the MCP front's
            // header) says how to name one there.
            return Err(ToolError::invalid_request(format!(
                "{} works in a session: add \"session_id\" ([A-Za-z0-9_-]{{1,64}}) to the request",
                target.spec.name
            ))
            .with("needs_session", true));
        }
        target.validate(&arguments, pointer_prefix)?;
        self.rule = self
            .policy
            .rules()
            .decide(&Facts {
                tool: &target.spec.name,
                account: self.ctx.account.as_str(),
                session: self.ctx.session_id.as_ref().map(|s| s.as_str()),
                arguments: &arguments,
            })
            .cloned();
        let rule = self.rule.as_deref().map(|rule| (rule, &*self.policy));
        self.audit =
            crate::audit::CallAudit::begin(&self.core.audit, &target.spec, &arguments, rule);
        self.start().await;

        let risk = self.policy.risk_for(&target.spec);
        let mut gated = match &self.rule {
            Some(rule) => match rule.decision {
                Decision::Deny => return Err(self.denied(rule)),
                Decision::Allow => false,
                Decision::Ask => true,
            },
            None => self.policy.mode_for(&self.ctx.account).needs_approval(risk),
        };
        if gated && self.reviewed(request) {
            // Boxed: the reviewer's exchange is rare and must not grow every call's future.
            let after = Box::pin(self.pre_review(target, risk, &arguments)).await?;
            gated = after == review::AfterReview::Gate;
        }
        if gated {
            // Boxed: the gate and park states are large and rare; keeping them out of the
            // common future keeps every spawn of a call cheap to move.
            let gate = Box::pin(self.pass_gate(target, risk, &arguments, request));
            if let Some(edited) = gate.await? {
                arguments = self.take_edit(target, edited)?;
            }
        }
        if let Some(mut audit) = self.audit.take() {
            audit.granted(self.grant_id.as_deref());
            let approval = self.consumed_approval.clone();
            // Boxed: the append's state is large and must not grow every call's future.
            let written = Box::pin(audit.started(&self.core.audit, &self.ctx, approval)).await;
            self.audit = Some(audit);
            if let Err(refusal) = written {
                return Err(match self.consumed_approval.take() {
                    Some(id) => self.give_back(&id, refusal).await,
                    None => refusal,
                });
            }
        }
        self.execute(target, arguments).await
    }

    async fn start(&mut self) {
        self.started = Some(Instant::now());
        let ctx = self.ctx.clone();
        self.events
            .emit(
                &ctx,
                &self.tool_for_events,
                RunEventKind::Started,
                self.dispatched_extra(),
            )
            .await;
    }

    /// What every RunEvent of the call adds: `dispatched_tool_name` for a dispatched call and
    /// what the policy decided ([`Call::policy_extra`]).
    fn dispatched_extra(&self) -> Map<String, Value> {
        let mut extra = self.policy_extra();
        if let Some(name) = self.dispatched {
            extra.insert("dispatched_tool_name".into(), Value::from(name));
        }
        extra
    }

    /// `rule_id` and `policy_revision` of a call a policy rule decided, `grant_id` of one a
    /// grant let run; empty otherwise.
    fn policy_extra(&self) -> Map<String, Value> {
        let mut extra = Map::new();
        if let Some(rule) = &self.rule {
            extra.insert("rule_id".into(), Value::from(rule.id.as_str()));
            let revision = self.policy.revision();
            extra.insert("policy_revision".into(), Value::from(revision));
        }
        if let Some(grant) = &self.grant_id {
            extra.insert("grant_id".into(), Value::from(grant.as_str()));
        }
        if self.edited {
            extra.insert("approval_edited".into(), Value::Bool(true));
        }
        if let Some(reviewed) = &self.reviewed {
            let by = if reviewed.allowed {
                "decided_by"
            } else {
                "reviewed_by"
            };
            extra.insert(by.into(), Value::from(review::REVIEWED_BY));
            if let Some(reason) = &reviewed.reason {
                extra.insert("review_reason".into(), Value::from(reason.as_str()));
            }
            let revision = self.policy.revision();
            extra.insert("policy_revision".into(), Value::from(revision));
        }
        extra
    }

    /// `policy_denied`: the deny rule that matched the call, its reason and the revision.
    fn denied(&self, rule: &Rule) -> ToolError {
        denied(rule, &self.policy)
    }

    async fn emit(&mut self, kind: RunEventKind, mut extra: Map<String, Value>) {
        extra.extend(self.dispatched_extra());
        let ctx = self.ctx.clone();
        self.events
            .emit(&ctx, &self.tool_for_events, kind, extra)
            .await;
    }

    /// Builds the reply body, then publishes `finished` (when `started` was) and returns the
    /// body; `None` when the actor did both ([`Answer::Delivered`]). A body over the server's
    /// `max_payload` becomes `limit_exceeded` (and `finished` says so): never silence.
    async fn finish(&mut self, result: Result<Answer, ToolError>) -> Option<Vec<u8>> {
        if let Ok(Answer::Delivered(error)) = result {
            self.outcome = error;
            return None;
        }
        let mut error = result.as_ref().err().map(|e| e.code);
        let mut body = self.reply_body(result);
        let limit = budget::reply_limit(self.core.client.max_payload());
        if let Some(oversize) = budget::over_limit(body.len(), limit) {
            error = Some(oversize.code);
            body = self.reply_body(Err(oversize));
        }
        self.outcome = error;
        if let Some(started) = self.started {
            let duration_ms = elapsed_ms(started);
            // `emit` adds dispatched_tool_name.
            self.emit(
                RunEventKind::Finished,
                finished_extra(error, duration_ms, None),
            )
            .await;
            if let Some(audit) = self.audit.take() {
                let approval = self.consumed_approval.clone();
                Box::pin(audit.finished(&self.core.audit, &self.ctx, approval, error, duration_ms))
                    .await;
            }
        }
        Some(body)
    }

    /// The public reply: the envelope, the tool's members or the error, and
    /// `dispatched_tool_name` for a dispatched call.
    fn reply_body(&self, result: Result<Answer, ToolError>) -> Vec<u8> {
        let mut reply = ReplyWriter::new(result.is_ok(), Some(&self.ctx.invocation_id));
        match result {
            Ok(Answer::Fields(fields)) => reply.members(&fields),
            Ok(Answer::Prepared(members)) => reply.raw_members(&members),
            Ok(Answer::Delivered(_)) => unreachable!("answered before the body is built"),
            Err(error) => reply.members(&error.into_fields()),
        };
        if let Some(name) = self.dispatched {
            reply.member("dispatched_tool_name", name);
        }
        if let Some(grant) = &self.grant_id {
            reply.member("grant_id", grant.as_str());
        }
        if self.edited {
            reply.member("approval_edited", &true);
        }
        // A refusal carries `reviewed_by` and `reason` among its details.
        if let Some(reviewed) = self.reviewed.as_ref().filter(|r| r.allowed) {
            reply.member("decided_by", review::REVIEWED_BY);
            if let Some(reason) = &reviewed.reason {
                reply.member("review_reason", reason.as_str());
            }
        }
        reply.finish()
    }

    /// `tool_dispatcher`: answers `list`/`describe` here; `call` names the tool to run.
    async fn dispatch(
        &mut self,
        dispatcher: &RegisteredTool,
        arguments: &Value,
    ) -> Result<Dispatch<'a>, ToolError> {
        dispatcher.validate(arguments, "")?;
        let args: ToolDispatcher = registry_tools::parse_args(arguments)?;
        let core: &'a GatewayCore = self.core;
        let registry: &'a ToolRegistry = self.registry;
        let selection = builtin::dispatcher_selection(
            registry,
            args.include.map(|i| i.into_vec()),
            args.profile,
        )?;
        let named = |args_tool: &Option<String>| -> Result<&'a RegisteredTool, ToolError> {
            let name = args_tool.as_deref().ok_or_else(|| {
                ToolError::invalid_argument("/tool_name", "is required for describe and call")
            })?;
            registry
                .get(name)
                .filter(|t| selection.contains(t.spec.name.as_ref()))
                .ok_or_else(|| builtin::unknown_tool(name))
        };
        match args.action {
            DispatcherAction::List => {
                self.start().await;
                let mut fields = builtin::dispatcher_list(registry, &self.policy, &selection);
                let limit = budget::fields_limit(core.client.max_payload());
                budget::fit_list(&mut fields, "tools", limit);
                Ok(Dispatch::Answered(fields))
            }
            DispatcherAction::Describe => {
                let tool = named(&args.tool_name)?;
                self.start().await;
                let risk = self.policy.risk_for(&tool.spec);
                Ok(Dispatch::Answered(builtin::dispatcher_describe(tool, risk)))
            }
            DispatcherAction::Call => {
                let tool = named(&args.tool_name)?;
                let inner = match args.arguments {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(v @ Value::Object(_)) => v,
                    Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
                        Ok(v @ Value::Object(_)) => v,
                        _ => {
                            return Err(ToolError::invalid_argument(
                                "/arguments",
                                "a string here must hold a JSON object",
                            ))
                        }
                    },
                    Some(other) => {
                        return Err(ToolError::invalid_argument(
                            "/arguments",
                            format!("must be an object, got {}", wire::json_kind(&other)),
                        ))
                    }
                };
                self.dispatched = Some(tool.spec.name.as_ref());
                Ok(Dispatch::Call(tool, inner))
            }
        }
    }

    async fn execute(
        &mut self,
        target: &RegisteredTool,
        arguments: Value,
    ) -> Result<Answer, ToolError> {
        let core = self.core;
        match &target.spec.runs {
            // The dispatcher never gets here (`run` takes it before the gate), so every other
            // gateway tool is an entry of the table.
            Runs::Gateway => {
                let tool = registry_tools::find(tools::TOOLS, &target.spec.name)
                    .ok_or_else(|| builtin::unknown_tool(&target.spec.name))?;
                (tool.run)(core, self.registry, &self.ctx, &arguments)
            }
            Runs::Actor(role) => Box::pin(self.route(target, *role, arguments)).await,
            Runs::Provider(route) => Box::pin(self.call_provider(target, route, arguments)).await,
        }
    }
}

/// `policy_denied`: the deny rule that matched a call, its reason and the policy's revision.
fn denied(rule: &Rule, policy: &Policy) -> ToolError {
    let because = rule
        .reason
        .as_deref()
        .map_or_else(String::new, |reason| format!(": {reason}"));
    ToolError::new(
        ErrorCode::PolicyDenied,
        format!("the policy rule {:?} denies this call{because}", rule.id),
    )
    .with("rule_id", rule.id.as_str())
    .with("reason", rule.reason.as_deref())
    .with("policy_revision", policy.revision())
}

enum Dispatch<'r> {
    Answered(Map<String, Value>),
    Call(&'r RegisteredTool, Value),
}

/// The account of `toolmesh.v1.<kind>.<account>`: exactly one well-formed token.
pub(crate) fn subject_account(msg: &Message, kind: &str) -> Result<Account, ToolError> {
    public::account_of(&msg.subject, kind)
        .map_err(|raw| format!("{raw:?} is not one account token"))
        .and_then(|raw| Account::parse(raw).map_err(|e| e.to_string()))
        .map_err(|reason| {
            ToolError::invalid_request(format!(
                "the subject's account is malformed: {reason}; publish on toolmesh.v1.{kind}.<account>"
            ))
        })
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
