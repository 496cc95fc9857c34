//! The path of one tool call through the gateway: parse → tool exists → arguments valid →
//! approval gate → run (here or in the actor that owns the tool) → `finished` → reply.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Message;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::broadcast;
use tracing::{field, Instrument};

use toolmesh_kernel::budget;
use toolmesh_kernel::canonical::arguments_sha256;
use toolmesh_kernel::cluster::ClusterView;
use toolmesh_kernel::host::{self, respond, CancelWatch};
use toolmesh_kernel::metrics::UNKNOWN_TOOL;
use toolmesh_kernel::subjects::{internal, public};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::time::elapsed_ms;
use toolmesh_kernel::tools::{
    ProviderRoute, RegisteredTool, Runs, ToolRegistry, ToolTable, TOOL_DISPATCHER,
};
use toolmesh_kernel::trace;
use toolmesh_kernel::wire::{
    self, finished_extra, ActorCall, ActorReply, ApprovalGrant, ApprovalRelease, ApprovalRequest,
    ApprovalStatus, CancelAck, DirectReply, GateOutcome, GateRequest, InvocationContext,
    ReleaseAck, ReplyWriter, RiskLevel, RunEventKind, ToolRequest,
};
use toolmesh_kernel::{Account, ErrorCode, InvocationId, NodeId, Role, ToolError};

use crate::builtin;
use crate::core::{Answer, GatewayCore};
use crate::events::RunEvents;
use crate::providers;
use crate::splice;
use crate::tools::{self, tool_dispatcher::DispatcherAction, tool_dispatcher::ToolDispatcherArgs};

/// How long the gateway waits for an actor when the call names no `timeout` of its own.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(120);
/// Added to a call's own `timeout` so the actor's `timeout` reply arrives before ours.
pub const ROUTE_TIMEOUT_MARGIN: Duration = Duration::from_secs(30);
/// How long the approval gate may take before the call answers `unavailable`.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long giving back an unused approval may hold up the `unavailable` reply.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes a gated call leaves under the reply limit besides its gate request: what the
/// `approvals.<account>.get` reply carries around the arguments (the approval with its
/// `decided_by` and `reason`), so the approver can always get the arguments in full.
pub const APPROVAL_GET_ROOM: usize = 8 * 1024;

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
            events: RunEvents::new(core.client.clone(), &ctx),
            tool_for_events: request.tool.clone(),
            ctx,
            started: None,
            dispatched: None,
            consumed_approval: None,
            outcome: None,
            audit: None,
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
        let (target, arguments, pointer_prefix) = if tool.spec.name == TOOL_DISPATCHER {
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
        self.audit = crate::audit::CallAudit::begin(&self.core.audit, &target.spec, &arguments);
        self.start().await;

        let policy = &self.core.config.policy;
        let risk = policy.risk_for(&target.spec);
        if policy.mode_for(&self.ctx.account).needs_approval(risk) {
            // Boxed: the gate and park states are large and rare; keeping them out of the
            // common future keeps every spawn of a call cheap to move.
            Box::pin(self.pass_gate(target, risk, &arguments, request)).await?;
        }
        if let Some(mut audit) = self.audit.take() {
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

    fn dispatched_extra(&self) -> Map<String, Value> {
        let mut extra = Map::new();
        if let Some(name) = self.dispatched {
            extra.insert("dispatched_tool_name".into(), Value::from(name));
        }
        extra
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
        reply.finish()
    }

    /// What the actor needs to answer the caller itself, when it may: the call used no
    /// approval (no outcome of it gives one back) and the caller's reply subject is under
    /// `_INBOX.`, where every node may publish (README "NATS permissions"). Otherwise `None`,
    /// and the reply comes through here: another prefix of `TOOLMESH_REPLY_PREFIXES` may be one
    /// only the gateways' users may publish to.
    fn direct_reply(&self) -> Option<DirectReply> {
        // With the trail on, the gateway writes `finished` before the caller has the reply.
        if self.consumed_approval.is_some()
            || self.audit.is_some()
            || !self
                .reply_to
                .starts_with(toolmesh_kernel::replies::DEFAULT_REPLY_PREFIX)
        {
            return None;
        }
        let started = self.started?;
        Some(DirectReply {
            reply_to: self.reply_to.to_string(),
            event_tool: self.tool_for_events.clone(),
            dispatched_tool_name: self.dispatched.map(str::to_owned),
            elapsed_ms: elapsed_ms(started),
        })
    }

    /// `tool_dispatcher`: answers `list`/`describe` here; `call` names the tool to run.
    async fn dispatch(
        &mut self,
        dispatcher: &RegisteredTool,
        arguments: &Value,
    ) -> Result<Dispatch<'a>, ToolError> {
        dispatcher.validate(arguments, "")?;
        let args: ToolDispatcherArgs = serde_json::from_value(arguments.clone())
            .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, e.to_string()))?;
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
                let mut fields =
                    builtin::dispatcher_list(registry, &core.config.policy, &selection);
                let limit = budget::fields_limit(core.client.max_payload());
                budget::fit_list(&mut fields, "tools", limit);
                Ok(Dispatch::Answered(fields))
            }
            DispatcherAction::Describe => {
                let tool = named(&args.tool_name)?;
                self.start().await;
                let risk = self.core.config.policy.risk_for(&tool.spec);
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

    /// Runs the call when the approval actor says so; otherwise the refusal is the reply.
    async fn pass_gate(
        &mut self,
        target: &RegisteredTool,
        risk: RiskLevel,
        arguments: &Value,
        request: &ToolRequest,
    ) -> Result<(), ToolError> {
        if let Some(pointer) = toolmesh_kernel::canonical::inexact_number(arguments) {
            return Err(ToolError::invalid_argument(
                &pointer,
                "an integer past ±2^53 cannot be bound to an approval exactly (its hash would be its neighbours'); send a smaller number or a string",
            ));
        }
        let mut gate = GateRequest {
            invocation: self.ctx.clone(),
            tool_name: target.spec.name.to_string(),
            risk_level: risk,
            side_effects: target.spec.side_effects.to_vec(),
            arguments_sha256: arguments_sha256(arguments),
            arguments_preview: None,
            grant: request.approval.clone(),
            arguments: None,
        };
        // A call that may create an approval hands its arguments over, for `get` and for the
        // preview the approval actor makes from them.
        let presents_id = request.approval.as_ref().is_some_and(|g| g.id.is_some());
        if !presents_id {
            gate.arguments = Some(arguments.clone());
        }
        let body = encode_gate(&gate)?;
        if !presents_id {
            let size = body.len() + APPROVAL_GET_ROOM;
            let limit = budget::reply_limit(self.core.client.max_payload());
            if size > limit {
                return Err(ToolError::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "the arguments of this gated call are too large for an approver to get them in full ({size} bytes with the approval, over the {limit} bytes a NATS message may carry here); send smaller arguments (e.g. write a large file in parts)"
                    ),
                )
                .with("reply_bytes", size)
                .with("limit_bytes", limit));
            }
        }
        let outcome = self.ask_gate(body).await?;
        let undecided = match &outcome {
            GateOutcome::Required { approval, .. } => Some(approval.clone()),
            GateOutcome::Refused {
                error: ErrorCode::ApprovalPending,
                approval: Some(approval),
                ..
            } => Some(approval.clone()),
            _ => None,
        };
        if let Some(approval) = undecided {
            self.emit(RunEventKind::ApprovalRequired, approval_extra(&approval))
                .await;
            if request.wait_for_approval_s > 0 {
                gate.grant = Some(ApprovalGrant {
                    id: Some(approval.id.clone()),
                    ..ApprovalGrant::default()
                });
                // Redeeming an id needs only the hash.
                gate.arguments = None;
                let wait = Duration::from_secs(request.wait_for_approval_s);
                return self.park(approval, gate, wait).await;
            }
        }
        // Whether in-band decisions count is the approval role's to say: a new approval says
        // so itself (`in_band`), and the role explains an ignored decision on an existing one.
        let ignored_decision = request
            .approval
            .as_ref()
            .is_some_and(|g| g.approved.is_some())
            && matches!(outcome, GateOutcome::Required { in_band: false, .. });
        self.settle(outcome).await.map_err(|mut e| {
            if ignored_decision {
                e.message
                    .push_str(&wire::in_band_off_note(&self.ctx.account));
            }
            e
        })
    }

    /// Turns the gate's answer into "run" or the refusal the caller gets.
    async fn settle(&mut self, outcome: GateOutcome) -> Result<(), ToolError> {
        match outcome {
            GateOutcome::Proceed { approval } => {
                self.consumed_approval = Some(approval.id.clone());
                self.emit(RunEventKind::Approved, approval_extra(&approval))
                    .await;
                Ok(())
            }
            GateOutcome::Required { approval, in_band } => {
                Err(approval_required(&approval, &self.ctx.account).with("in_band", in_band))
            }
            GateOutcome::Refused {
                error,
                error_message,
                approval,
            } => {
                if let (ErrorCode::ApprovalRejected, Some(a)) = (error, &approval) {
                    self.emit(RunEventKind::Rejected, approval_extra(a)).await;
                }
                let mut refusal = ToolError::new(error, error_message);
                if let Some(a) = approval {
                    refusal = refusal.with("approval_request", to_value(&a));
                }
                Err(refusal)
            }
        }
    }

    /// Sends an encoded [`GateRequest`] ([`encode_gate`]) to the approval actor.
    async fn ask_gate(&self, body: Bytes) -> Result<GateOutcome, ToolError> {
        let request = async_nats::Request::new()
            .payload(body)
            .timeout(Some(GATE_TIMEOUT));
        let sent = self
            .core
            .client
            .send_request(internal::APPROVAL_GATE, trace::request(request));
        let reply = self
            .core
            .refusals
            .guard_publish(internal::APPROVAL_GATE, sent)
            .await
            .map_err(refused)?
            .map_err(|e| request_failed(e, Role::Approval, "the approval gate"))?;
        serde_json::from_slice(&reply.payload).map_err(|e| {
            tracing::error!(error = %e, "malformed reply from the approval actor");
            ToolError::internal("the approval actor sent a malformed reply; see the gateway log for 'malformed reply'")
        })
    }

    /// Holds a call until its approval is decided, the wait runs out, the node drains or the
    /// caller cancels.
    async fn park(
        &mut self,
        approval: ApprovalRequest,
        consume: GateRequest,
        wait: Duration,
    ) -> Result<(), ToolError> {
        let core = self.core;
        let mut decided = core.decided.subscribe();
        let mut cancel =
            CancelWatch::listen(&core.client, &self.ctx.account, &self.ctx.invocation_id).await;
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        // The decision wakes the call: no polling, so a thousand parked calls cost Redis
        // nothing while they wait. One read now covers a decision made before we subscribed;
        // another whenever this gateway fell behind the `decided` events.
        let mut first_read = self.fetch(&approval).await;
        let still_pending = |a: &ApprovalRequest, why: &str| {
            ToolError::new(
                ErrorCode::ApprovalPending,
                format!("approval {} is still pending ({why}); decide it and repeat the call with its id", a.id),
            )
            .with("approval_request", to_value(a))
        };
        loop {
            let seen: Option<ApprovalRequest> = if let Some(read) = first_read.take() {
                Some(read)
            } else {
                tokio::select! {
                    _ = &mut deadline => return Err(still_pending(&approval, "the wait ran out")),
                    _ = core.lifecycle.drain.cancelled() => {
                        return Err(still_pending(&approval, "the gateway node is shutting down"))
                    }
                    _ = cancel.requested() => {
                        return Err(ToolError::new(
                            ErrorCode::Cancelled,
                            "the call was cancelled while it waited for approval",
                        ));
                    }
                    event = decided.recv() => match event {
                        Ok(a) if a.id == approval.id => Some((*a).clone()),
                        Ok(_) => None,
                        Err(broadcast::error::RecvError::Lagged(_)) => self.fetch(&approval).await,
                        Err(broadcast::error::RecvError::Closed) => None,
                    },
                }
            };
            let Some(current) = seen else { continue };
            match current.status {
                ApprovalStatus::Pending => continue,
                ApprovalStatus::Approved => {
                    let outcome = self.ask_gate(encode_gate(&consume)?).await?;
                    return self.settle(outcome).await;
                }
                ApprovalStatus::Rejected => {
                    self.emit(RunEventKind::Rejected, approval_extra(&current))
                        .await;
                    return Err(ToolError::new(
                        ErrorCode::ApprovalRejected,
                        format!(
                            "approval {} was rejected{}",
                            current.id,
                            reason_suffix(&current)
                        ),
                    )
                    .with("approval_request", to_value(&current)));
                }
                ApprovalStatus::Expired | ApprovalStatus::Used => {
                    return Err(ToolError::new(
                        ErrorCode::ApprovalExpired,
                        format!("approval {} expired or was used by another call; repeat the call to request a new one", current.id),
                    )
                    .with("approval_request", to_value(&current)));
                }
            }
        }
    }

    /// Re-reads an approval through the public `get` subject.
    async fn fetch(&self, approval: &ApprovalRequest) -> Option<ApprovalRequest> {
        let subject = public::approvals(&self.ctx.account, public::ApprovalVerb::Get);
        let body = serde_json::to_vec(&json!({ "id": approval.id })).ok()?;
        let request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(GATE_TIMEOUT));
        let reply = self.core.client.send_request(subject, request).await.ok()?;
        let value: Value = serde_json::from_slice(&reply.payload).ok()?;
        serde_json::from_value(value.get("approval")?.clone()).ok()
    }

    async fn execute(
        &mut self,
        target: &RegisteredTool,
        arguments: Value,
    ) -> Result<Answer, ToolError> {
        let core = self.core;
        match &target.spec.runs {
            Runs::Gateway => tools::TOOLS
                .find(&target.spec.name)
                .and_then(|tool| tool.answer(core, self.registry, &self.ctx, arguments))
                .unwrap_or_else(|| {
                    Err(ToolError::internal(format!(
                        "the gateway has no handler for {}; this is a bug, see the gateway log",
                        target.spec.name
                    )))
                }),
            Runs::Actor(role) => Box::pin(self.route(target, *role, arguments)).await,
            Runs::Provider(route) => Box::pin(self.call_provider(target, route, arguments)).await,
        }
    }

    /// Requests the call on the provider's endpoint subject (any instance: they share it as a
    /// queue group) and turns its answer into the reply. While it waits, the call watches
    /// the provider's health ([`LiveTools::gone`](crate::providers::LiveTools::gone), shared by its calls in flight): once every
    /// instance is gone, the caller gets `unavailable` instead of waiting for the deadline. A cancel (or the node stopping) is
    /// passed on to the provider on `toolmesh.v1.providers.cancel.<service>`.
    async fn call_provider(
        &mut self,
        target: &RegisteredTool,
        route: &ProviderRoute,
        arguments: Value,
    ) -> Result<Answer, ToolError> {
        let core = self.core;
        let service = route.service.as_ref();
        let timeout = route_timeout(&arguments);
        let ctx = &self.ctx;
        let envelope = json!({
            "tool": target.spec.name,
            "arguments": arguments,
            "invocation_id": ctx.invocation_id,
            "account": ctx.account,
            "session_id": ctx.session_id,
            "user_id": ctx.user_id,
            "agent_id": ctx.agent_id,
        });
        let body = serde_json::to_vec(&envelope).map_err(|e| ToolError::internal(e.to_string()))?;
        let max_payload = core.client.server_info().max_payload;
        if max_payload > 0 && body.len() > max_payload {
            return Err(ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the call is {} bytes once sent to the provider, over the NATS max_payload of {max_payload}; send smaller arguments",
                    body.len()
                ),
            ));
        }
        let mut cancel = CancelWatch::listen(&core.client, &ctx.account, &ctx.invocation_id).await;
        let request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(timeout));
        let subject = route.subject.to_string();
        let sent = core.refusals.guard_publish(
            &subject,
            core.client
                .send_request(subject.clone(), trace::request(request)),
        );
        let gone = core.tools.gone(&core.client, service);
        let reply = tokio::select! {
            reply = sent => reply.map_err(refused)?,
            () = gone => {
                return Err(ToolError::new(
                    ErrorCode::Unavailable,
                    format!("every instance of the provider {service} went away while the call ran; it may have run in part, repeat it once the provider is back"),
                ));
            }
            () = cancel.requested() => {
                self.cancel_provider(target, route).await;
                return Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled; the provider was told"));
            }
            _ = core.lifecycle.stop.cancelled() => {
                self.cancel_provider(target, route).await;
                return Err(ToolError::new(ErrorCode::Cancelled, "the gateway node shut down before the provider answered; repeat the call"));
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                use async_nats::RequestErrorKind;
                let error = match e.kind() {
                    RequestErrorKind::NoResponders => {
                        let unavailable = ToolError::new(
                            ErrorCode::Unavailable,
                            format!("no instance of the provider {service} is running to serve {}; retry once it is back", target.spec.name),
                        );
                        return Err(match self.consumed_approval.take() {
                            Some(id) => self.give_back(&id, unavailable).await,
                            None => unavailable,
                        });
                    }
                    RequestErrorKind::TimedOut => {
                        self.cancel_provider(target, route).await;
                        ToolError::new(
                            ErrorCode::Timeout,
                            format!(
                                "the provider {service} did not answer {} within {} s",
                                target.spec.name,
                                timeout.as_secs()
                            ),
                        )
                    }
                    _ => ToolError::new(
                        ErrorCode::Unavailable,
                        format!("could not reach the provider {service} ({e}); retry"),
                    ),
                };
                return Err(error);
            }
        };
        let mut fields =
            providers::reply::normalise(service, reply.headers.as_ref(), &reply.payload)?;
        let whole = providers::reply::cut_to_budget(&mut fields, core.config.result_budget_chars);
        if let (false, Some(session)) = (whole.is_empty(), &self.ctx.session_id) {
            self.persist(session, &mut fields, whole).await;
        }
        Ok(Answer::Fields(fields))
    }

    /// Writes each cut field's whole text into the session's workspace under
    /// `.toolmesh/outputs/`, named in `persisted_outputs` (PROTOCOL.md "Large data").
    async fn persist(
        &self,
        session: &toolmesh_kernel::SessionId,
        fields: &mut Map<String, Value>,
        whole: Vec<(String, String)>,
    ) {
        let sync = toolmesh_kernel::sync::WorkspaceSync::new(self.core.client.clone());
        for (field, text) in whole {
            let path = toolmesh_kernel::sync::output_path(&self.ctx.invocation_id, &field);
            match sync
                .put_file(&self.ctx.account, session, &path, Bytes::from(text))
                .await
            {
                Ok(()) => toolmesh_kernel::budget::insert_persisted(
                    fields,
                    &field,
                    json!({"path": path, "mime_type": "text/plain"}),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, field, "cannot persist a provider's over-budget text")
                }
            }
        }
    }

    /// Tells every instance of the provider that this invocation is cancelled.
    async fn cancel_provider(&self, target: &RegisteredTool, route: &ProviderRoute) {
        let body = json!({
            "invocation_id": self.ctx.invocation_id,
            "account": self.ctx.account,
            "tool": target.spec.name,
        });
        let subject = public::provider_cancel(&route.service);
        if let Err(e) = self
            .core
            .client
            .publish(subject, Bytes::from(body.to_string()))
            .await
        {
            tracing::warn!(error = %e, "cannot pass a cancel on to a provider");
        }
    }

    /// Sends the call to the actor of the tool's role (any instance, queue group).
    async fn route(
        &mut self,
        target: &RegisteredTool,
        role: Role,
        arguments: Value,
    ) -> Result<Answer, ToolError> {
        let core = self.core;
        let timeout = route_timeout(&arguments);
        let call = ActorCall {
            invocation: self.ctx.clone(),
            tool: target.spec.name.to_string(),
            arguments,
            event_seq: self.events.next_seq(),
            direct: self.direct_reply(),
        };
        let body = serde_json::to_vec(&call).map_err(|e| ToolError::internal(e.to_string()))?;
        let max_payload = core.client.server_info().max_payload;
        if max_payload > 0 && body.len() > max_payload {
            return Err(ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the call is {} bytes once routed, over the NATS max_payload of {max_payload}; send smaller arguments",
                    body.len()
                ),
            ));
        }
        let reply = if role.is_long_running() {
            self.send_claimed(role, &target.spec.name, Bytes::from(body), timeout)
                .await?
        } else {
            self.send(role, &target.spec.name, Bytes::from(body), timeout)
                .await?
        };
        // The common case, a success, goes to the caller as the actor wrote it.
        if let Some(success) = splice::success(&reply.payload) {
            self.events.skip(success.events_emitted);
            return Ok(Answer::Prepared(success.members));
        }
        let answer: ActorReply = serde_json::from_slice(&reply.payload).map_err(|e| {
            tracing::error!(error = %e, role = %role, "malformed reply from an actor");
            ToolError::internal(format!(
                "the {role} actor sent a malformed reply; see the gateway log for 'malformed reply'"
            ))
        })?;
        self.events.skip(answer.events_emitted);
        if answer.delivered {
            return Ok(Answer::Delivered(answer.delivered_error));
        }
        let mut fields = answer.reply;
        if let Some(error) = ToolError::from_fields(&fields) {
            // Refused before it ran (say, the sandbox image is missing): like no responders,
            // the approval it used is given back, so a retry needs no new decision.
            if answer.not_run && error.code == ErrorCode::Unavailable {
                if let Some(id) = self.consumed_approval.take() {
                    return Err(self.give_back(&id, error).await);
                }
            }
            return Err(error);
        }
        // shift, not swap: the tool's member order is kept.
        fields.shift_remove("ok");
        Ok(Answer::Fields(fields))
    }

    /// One request to the actor of `role`: the first message on the reply subject is the reply.
    async fn send(
        &mut self,
        role: Role,
        what: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Message, ToolError> {
        let core = self.core;
        let request = async_nats::Request::new()
            .payload(body)
            .timeout(Some(timeout));
        let request = trace::request(request);
        let subject = internal::run(role);
        let sent = core
            .refusals
            .guard_publish(&subject, core.client.send_request(subject.clone(), request));
        let reply = tokio::select! {
            reply = sent => reply.map_err(refused)?,
            _ = core.lifecycle.stop.cancelled() => return Err(self.stopped().await),
        };
        match reply {
            Ok(reply) => Ok(reply),
            // No responders: the server had no subscriber for the call, so no actor received
            // it and nothing ran; the approval it used can be given back. Every other failure
            // (a timeout above all) may come after the tool ran, so the approval stays used.
            Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                Err(self.no_responders(role, what).await)
            }
            Err(e) => Err(request_failed(e, role, what)),
        }
    }

    /// A call of a long-running role ([`Role::is_long_running`]): its reply subject takes the
    /// claims of the workers that take it (`Toolmesh-Claimed-By`, the latest wins), then the
    /// reply. While the call runs the latest claimant is watched in the cluster view: if it
    /// drops out (no heartbeat for `HEARTBEAT_EXPIRY`, without a `leaving` goodbye) the caller
    /// gets `unavailable` at once instead of at the deadline. Without a claim the call just
    /// waits for its reply until the deadline, as a short call does.
    async fn send_claimed(
        &mut self,
        role: Role,
        what: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Message, ToolError> {
        let core = self.core;
        let mut waiter = core.replies.register();
        let (subject, reply) = (internal::run(role), waiter.subject().clone());
        let sent = match trace::current_headers() {
            Some(headers) => {
                core.client
                    .publish_with_reply_and_headers(subject, reply, headers, body)
                    .await
            }
            None => core.client.publish_with_reply(subject, reply, body).await,
        };
        if let Err(e) = sent {
            return Err(ToolError::new(
                ErrorCode::Unavailable,
                format!("could not reach the {role} actor for {what} ({e}); retry"),
            ));
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut claimant: Option<(NodeId, Instant)> = None;
        loop {
            let watch = watch_claimant(&core.cluster, claimant.clone());
            tokio::select! {
                msg = waiter.next() => {
                    let Some(msg) = msg else {
                        return Err(ToolError::new(
                            ErrorCode::Unavailable,
                            format!("the gateway lost its reply subscription while waiting for the {role} actor to answer {what}; retry"),
                        ));
                    };
                    if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                        return Err(self.no_responders(role, what).await);
                    }
                    match host::claimant(&msg) {
                        Some(Ok(node)) => {
                            tracing::debug!(node_id = %node, "call claimed");
                            claimant = Some((node, Instant::now()));
                        }
                        Some(Err(raw)) => {
                            tracing::warn!(claimed_by = %raw, "ignoring a claim with a malformed node id");
                        }
                        None if msg.status.is_some() => {
                            tracing::warn!(status = ?msg.status, "ignoring a status message on a call's reply subject");
                        }
                        None => return Ok(msg),
                    }
                }
                _ = &mut deadline => return Err(timed_out(role, what)),
                node = watch => {
                    // Should it still run after all (a partition, not a crash), stop it.
                    self.publish_cancel().await;
                    return Err(worker_lost(role, &node));
                }
                _ = core.lifecycle.stop.cancelled() => return Err(self.stopped().await),
            }
        }
    }

    /// No actor received the call: `unavailable`, with the approval it used given back.
    async fn no_responders(&mut self, role: Role, what: &str) -> ToolError {
        let unavailable = request_failed(
            async_nats::RequestError::from(async_nats::RequestErrorKind::NoResponders),
            role,
            what,
        );
        match self.consumed_approval.take() {
            Some(id) => self.give_back(&id, unavailable).await,
            None => unavailable,
        }
    }

    /// The gateway node stops before the actor answered: tell the actor to stop too (nobody
    /// will read its answer) and answer `cancelled`.
    async fn stopped(&self) -> ToolError {
        self.publish_cancel().await;
        ToolError::new(
            ErrorCode::Cancelled,
            "the gateway node shut down before the call finished; repeat it",
        )
    }

    async fn publish_cancel(&self) {
        let subject = internal::cancel(&self.ctx.account, &self.ctx.invocation_id);
        let _ = self
            .core
            .client
            .publish(subject, Bytes::from_static(b"{}"))
            .await;
    }

    /// Asks the approval actor to give back approval `id`, which this call used but which never
    /// ran, and says in the `unavailable` reply whether it did (`approval_released`). A failed
    /// release is logged and otherwise ignored: the reply is `unavailable` either way.
    async fn give_back(&self, id: &str, unavailable: ToolError) -> ToolError {
        let released = self.release(id).await;
        let next = if released {
            format!(
                "approval {id} was given back unused: repeat the call with \"approval\": {{\"id\": \"{id}\"}} once that actor runs"
            )
        } else {
            format!(
                "approval {id} could not be given back and may stay used: look it up on {} (if it is approved, repeat the call with it once that actor runs; otherwise call without it to request a new one)",
                public::approvals(&self.ctx.account, public::ApprovalVerb::Get)
            )
        };
        let ToolError {
            code,
            message,
            details,
        } = unavailable;
        let mut error = ToolError::new(code, format!("{message}; {next}"));
        error.details = details;
        error.with("approval_released", released)
    }

    /// Sends the release; true only when the approval actor answered that it released it.
    async fn release(&self, id: &str) -> bool {
        let release = ApprovalRelease {
            account: self.ctx.account.clone(),
            approval_id: id.to_owned(),
            invocation_id: self.ctx.invocation_id.clone(),
        };
        let body = match serde_json::to_vec(&release) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, approval_id = id, "an approval release does not serialize");
                return false;
            }
        };
        let request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(RELEASE_TIMEOUT));
        let reply = match self
            .core
            .client
            .send_request(internal::APPROVAL_RELEASE, request)
            .await
        {
            Ok(reply) => reply,
            Err(e) => {
                tracing::warn!(error = %e, approval_id = id, "could not ask the approval actor to give back an unused approval");
                return false;
            }
        };
        match serde_json::from_slice::<ReleaseAck>(&reply.payload) {
            Ok(ack) if ack.released => {
                tracing::info!(
                    approval_id = id,
                    "approval given back: the call never reached an actor"
                );
                true
            }
            Ok(ack) => {
                tracing::warn!(
                    approval_id = id,
                    error = ack.error.map(|c| c.as_str()),
                    error_message = ack.error_message.as_deref(),
                    status = ack.approval.as_ref().map(|a| a.status.as_str()),
                    "the approval actor did not give back an unused approval"
                );
                false
            }
            Err(e) => {
                tracing::error!(error = %e, approval_id = id, "malformed release reply from the approval actor");
                false
            }
        }
    }
}

enum Dispatch<'r> {
    Answered(Map<String, Value>),
    Call(&'r RegisteredTool, Value),
}

/// The body of a gate request, serialized once: what is measured is what is sent.
fn encode_gate(gate: &GateRequest) -> Result<Bytes, ToolError> {
    serde_json::to_vec(gate)
        .map(Bytes::from)
        .map_err(|e| ToolError::internal(format!("the gate request does not serialize: {e}")))
}

fn to_value(approval: &ApprovalRequest) -> Value {
    serde_json::to_value(approval).unwrap_or(Value::Null)
}

fn approval_extra(approval: &ApprovalRequest) -> Map<String, Value> {
    let mut extra = Map::new();
    extra.insert("approval_id".into(), Value::from(approval.id.clone()));
    extra.insert("approval_request".into(), to_value(approval));
    extra
}

fn reason_suffix(approval: &ApprovalRequest) -> String {
    match (&approval.decided_by, &approval.reason) {
        (Some(by), Some(reason)) => format!(" by {by}: {reason}"),
        (Some(by), None) => format!(" by {by}"),
        _ => String::new(),
    }
}

/// PROTOCOL.md's `approval_required` envelope.
fn approval_required(approval: &ApprovalRequest, account: &Account) -> ToolError {
    ToolError::new(
        ErrorCode::ApprovalRequired,
        format!(
            "{} needs approval (risk {}): approve {} on {} (or `toolmesh approvals approve {} --account {account}`), then repeat the call with \"approval\": {{\"id\": \"{}\"}}",
            approval.tool_name,
            approval.risk_level.as_str(),
            approval.id,
            public::approvals(account, public::ApprovalVerb::Decide),
            approval.id,
            approval.id,
        ),
    )
    .with("type", "approval_required")
    .with("approval_required", true)
    .with("approval_request", to_value(approval))
}

/// The call's own `timeout` (seconds) plus a margin, or the default.
fn route_timeout(arguments: &Value) -> Duration {
    arguments
        .get("timeout")
        .and_then(Value::as_u64)
        .map(|s| Duration::from_secs(s) + ROUTE_TIMEOUT_MARGIN)
        .unwrap_or(DEFAULT_ROUTE_TIMEOUT)
}

/// Resolves with the claimant once it is lost; never without one.
async fn watch_claimant(cluster: &ClusterView, claimant: Option<(NodeId, Instant)>) -> NodeId {
    match claimant {
        Some((node, since)) => {
            cluster.lost(&node, since).await;
            node
        }
        None => futures::future::pending().await,
    }
}

/// The worker that claimed a call dropped out of the cluster view before answering. The call
/// may have run (part of it), so an approval it used stays used.
fn worker_lost(role: Role, node: &NodeId) -> ToolError {
    let next = match role {
        Role::Sandbox => "the session's sandbox is re-created on the next call",
        _ => "repeat the call",
    };
    ToolError::new(
        ErrorCode::Unavailable,
        format!("{role} worker {node} was lost while running the call; {next}"),
    )
    .with("details", json!({ "node_id": node.as_str() }))
}

fn timed_out(role: Role, what: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Timeout,
        format!("the {role} actor did not answer {what} in time; it may be overloaded or gone"),
    )
}

/// Maps a failed internal request onto the protocol's codes.
/// A request the NATS server refused this node (its user may not publish there): said in full
/// in the node's log, and to the caller without the node's user.
fn refused(refused: toolmesh_kernel::permissions::Refused) -> ToolError {
    tracing::error!("{refused}");
    ToolError::new(
        ErrorCode::Unavailable,
        format!(
            "the NATS server refused this gateway node permission to publish to {}; the node's log says which user and what to change",
            refused.violation.subject
        ),
    )
}

fn request_failed(error: async_nats::RequestError, role: Role, what: &str) -> ToolError {
    use async_nats::RequestErrorKind;
    match error.kind() {
        RequestErrorKind::NoResponders => ToolError::new(
            ErrorCode::Unavailable,
            format!("no {role} actor is running in the cluster to serve {what}; start a node with --roles {role} and retry"),
        ),
        RequestErrorKind::TimedOut => timed_out(role, what),
        RequestErrorKind::MaxPayloadExceeded => ToolError::new(
            ErrorCode::LimitExceeded,
            format!("the call to {what} is over the NATS max_payload; send smaller arguments"),
        ),
        RequestErrorKind::InvalidSubject => ToolError::internal(format!(
            "an internal subject for {what} is invalid; this is a bug, see the gateway log"
        )),
        RequestErrorKind::Other => ToolError::new(
            ErrorCode::Unavailable,
            format!("could not reach the {role} actor for {what} ({error}); retry"),
        ),
    }
}

/// Handles one message on `toolmesh.v1.cancel.<account>`.
pub async fn handle_cancel(core: Arc<GatewayCore>, msg: Message) {
    let reply_to = msg.reply.clone();
    let body = match cancel_target(&msg) {
        Err(error) => wire::error_body(error),
        Ok((account, invocation)) => {
            let request = async_nats::Request::new()
                .payload(Bytes::from_static(b"{}"))
                .timeout(Some(Duration::from_secs(1)));
            let cancelled = match core
                .client
                .send_request(internal::cancel(&account, &invocation), request)
                .await
            {
                Ok(reply) => serde_json::from_slice::<CancelAck>(&reply.payload)
                    .map(|ack| ack.cancelled)
                    .unwrap_or(false),
                // Nobody runs that invocation (no responders) or its holder is gone.
                Err(_) => false,
            };
            let mut fields = Map::new();
            fields.insert("cancelled".into(), Value::Bool(cancelled));
            wire::ok_body(fields)
        }
    };
    respond(&core.client, reply_to.as_ref(), body).await;
}

/// The account of `toolmesh.v1.<kind>.<account>`: exactly one well-formed token.
fn subject_account(msg: &Message, kind: &str) -> Result<Account, ToolError> {
    public::account_of(&msg.subject, kind)
        .map_err(|raw| format!("{raw:?} is not one account token"))
        .and_then(|raw| Account::parse(raw).map_err(|e| e.to_string()))
        .map_err(|reason| {
            ToolError::invalid_request(format!(
                "the subject's account is malformed: {reason}; publish on toolmesh.v1.{kind}.<account>"
            ))
        })
}

/// The body of `toolmesh.v1.cancel.<account>`: the id and nothing else (PROTOCOL.md "Tenancy
/// and trust"), so that no other message's body (a reply, an event) reads as a cancel.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    invocation_id: String,
}

fn cancel_target(msg: &Message) -> Result<(Account, InvocationId), ToolError> {
    let account = subject_account(msg, "cancel")?;
    let body: CancelBody = serde_json::from_slice(&msg.payload).map_err(|e| {
        ToolError::invalid_request(format!(
            "the body must be exactly {{\"invocation_id\": \"…\"}}: {e}"
        ))
    })?;
    let invocation = InvocationId::parse(body.invocation_id)
        .map_err(|e| ToolError::invalid_request(e.to_string()))?;
    Ok((account, invocation))
}
#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_kernel::config::NodeConfig;
    use toolmesh_kernel::host::ReplyInbox;

    use crate::providers::LiveTools;

    /// Every call is a spawned task, and spawning moves the future: rare, large states (gate,
    /// park, routing) are boxed so the common one stays small.
    #[tokio::test]
    async fn a_call_future_stays_small() {
        fn size_of<F: std::future::Future>(_: &F) -> usize {
            std::mem::size_of::<F>()
        }
        // Never connects (nothing listens on port 1); enough to build the core.
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("nats://127.0.0.1:1")
            .await
            .expect("lazy client");
        let core = Arc::new(GatewayCore {
            client: client.clone(),
            tools: Arc::new(LiveTools::new(Arc::new(
                ToolRegistry::new(tools::TOOLS.definitions()).expect("the gateway's tools"),
            ))),
            config: Arc::new(NodeConfig::from_env(&Default::default()).expect("defaults")),
            cluster: Default::default(),
            decided: broadcast::channel(1).0,
            lifecycle: Default::default(),
            in_flight: Default::default(),
            metrics: Default::default(),
            status_cache: Default::default(),
            replies: ReplyInbox::start(&client).await.expect("lazy inbox"),
            audit: toolmesh_kernel::audit::AuditTrail::off("n", "test"),
            refusals: toolmesh_kernel::permissions::Refusals::none(),
        });
        let msg = Message {
            subject: "toolmesh.v1.call.a".into(),
            reply: None,
            payload: Bytes::new(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        };
        let size = size_of(&handle_call(core, msg));
        assert!(size <= 4096, "handle_call's future is {size} bytes");
    }
}
