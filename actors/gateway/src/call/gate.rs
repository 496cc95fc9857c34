//! The approval gate: asks the approval actor, says `approval_required` (with in-band
//! decisions when the role allows them), parks a call until its approval is decided, withdraws
//! the approval of a parked call its caller cancelled, and gives back an approval a call used
//! but never ran.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use toolmesh_kernel::budget;
use toolmesh_kernel::canonical::arguments_sha256;
use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::subjects::{internal, public};
use toolmesh_kernel::tools::RegisteredTool;
use toolmesh_kernel::trace;
use toolmesh_kernel::wire::{
    self, ApprovalGrant, ApprovalRelease, ApprovalRequest, ApprovalRoute, ApprovalStatus,
    ApprovalWithdraw, GateOutcome, GateRequest, ReleaseAck, RiskLevel, RunEventKind, ToolRequest,
    WithdrawAck,
};
use toolmesh_kernel::{Account, ErrorCode, Role, ToolError};

use super::error::CallError;
use super::route::{refused, request_failed};
use super::Call;

/// How long the approval gate may take before the call answers `unavailable`.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long giving back an unused approval may hold up the `unavailable` reply.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

impl Call<'_> {
    /// How the approval an `ask` rule makes is routed: its rule and revision, the reviewer
    /// group with its members as the policy lists them now, the quorum and the deadline.
    /// `None` when the mode gates the call.
    fn approval_route(&self) -> Option<ApprovalRoute> {
        let rule = self.rule.as_deref()?;
        let members = |group: &Option<String>| {
            group
                .as_deref()
                .and_then(|group| self.policy.group(group))
                .map(<[String]>::to_vec)
                .unwrap_or_default()
        };
        Some(ApprovalRoute {
            rule_id: rule.id.clone(),
            policy_revision: self.policy.revision().map(str::to_owned),
            reviewers: rule.reviewers.clone(),
            members: members(&rule.reviewers),
            quorum: rule.quorum,
            expires_in_s: rule.expires_in_s,
            escalate_to: rule.escalate_to.clone(),
            escalate_members: members(&rule.escalate_to),
            grantable: rule.grantable,
        })
    }

    /// Runs the call when the approval actor says so; otherwise the refusal is the reply.
    /// `Some`: the arguments a reviewer approved in place of the call's.
    pub(super) async fn pass_gate(
        &mut self,
        target: &RegisteredTool,
        risk: RiskLevel,
        arguments: &Value,
        request: &ToolRequest,
    ) -> Result<Option<Value>, ToolError> {
        toolmesh_kernel::canonical::bindable(arguments)?;
        let mut gate = GateRequest {
            invocation: self.ctx.clone(),
            tool_name: target.spec.name.to_string(),
            risk_level: risk,
            side_effects: target.spec.side_effects.to_vec(),
            arguments_sha256: arguments_sha256(arguments),
            arguments_preview: None,
            grant: request.approval.clone(),
            arguments: None,
            route: self.approval_route(),
        };
        // A call that may create an approval hands its arguments over, for `get` and for the
        // preview the approval actor makes from them.
        let presents_id = request.approval.as_ref().is_some_and(|g| g.id.is_some());
        if !presents_id {
            gate.arguments = Some(arguments.clone());
        }
        let body = encode_gate(&gate)?;
        if !presents_id {
            let size = body.len() + budget::APPROVAL_ROOM;
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

    /// Turns the gate's answer into "run" (with the arguments a reviewer edited, if one did)
    /// or the refusal the caller gets.
    async fn settle(&mut self, outcome: GateOutcome) -> Result<Option<Value>, ToolError> {
        match outcome {
            GateOutcome::Granted { grant } => {
                // Named in the reply, the RunEvents and the audit entries of the call.
                self.grant_id = Some(grant.id);
                Ok(None)
            }
            GateOutcome::Proceed {
                approval,
                arguments,
            } => {
                self.consumed_approval = Some(approval.id.clone());
                if let Some(edited) = &arguments {
                    // The approval binds the edited arguments: anything else must not run.
                    if arguments_sha256(edited) != approval.arguments_sha256 {
                        tracing::error!(approval_id = %approval.id, "the approval actor sent edited arguments its approval is not bound to");
                        return Err(ToolError::internal(format!(
                            "approval {} came back with edited arguments it is not bound to; the call did not run",
                            approval.id
                        )));
                    }
                }
                self.emit(RunEventKind::Approved, approval_extra(&approval))
                    .await;
                Ok(arguments)
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
    ) -> Result<Option<Value>, ToolError> {
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
                        // Nobody waits for the request any more: it is withdrawn (rejected).
                        let withdrawn = self.withdraw(&approval.id).await;
                        return Err(ToolError::new(
                            ErrorCode::Cancelled,
                            "the call was cancelled while it waited for approval",
                        )
                        .with("approval_withdrawn", withdrawn));
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

    /// Asks the approval actor to give back approval `id`, which this call used but which never
    /// ran, and says in the `unavailable` reply whether it did (`approval_released`). A failed
    /// release is logged and otherwise ignored: the reply is `unavailable` either way.
    pub(super) async fn give_back(&self, id: &str, unavailable: ToolError) -> ToolError {
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

    /// Asks the approval actor to withdraw approval `id`, which this call made and which its
    /// caller no longer waits for: it is rejected (reason `withdrawn`) while still pending.
    /// True only when the approval actor answered that it withdrew it; a failure is logged and
    /// otherwise ignored (the approval then stays pending until decided or expired).
    async fn withdraw(&mut self, id: &str) -> bool {
        let withdraw = ApprovalWithdraw {
            account: self.ctx.account.clone(),
            approval_id: id.to_owned(),
            invocation_id: self.ctx.invocation_id.clone(),
        };
        let Ok(body) = serde_json::to_vec(&withdraw) else {
            return false;
        };
        let request = async_nats::Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(RELEASE_TIMEOUT));
        let reply = self
            .core
            .client
            .send_request(internal::APPROVAL_WITHDRAW, trace::request(request))
            .await;
        match reply.map(|r| serde_json::from_slice::<WithdrawAck>(&r.payload)) {
            Ok(Ok(WithdrawAck {
                withdrawn: true,
                approval: Some(approval),
                ..
            })) => {
                self.emit(RunEventKind::Rejected, approval_extra(&approval))
                    .await;
                true
            }
            Ok(Ok(ack)) => {
                tracing::info!(
                    approval_id = id,
                    error_message = ack.error_message.as_deref(),
                    status = ack.approval.as_ref().map(|a| a.status.as_str()),
                    "the approval of a cancelled call was not withdrawn"
                );
                false
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, approval_id = id, "malformed withdraw reply from the approval actor");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, approval_id = id, "could not ask the approval actor to withdraw the approval of a cancelled call");
                false
            }
        }
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

/// The body of a gate request, serialized once: what is measured is what is sent.
fn encode_gate(gate: &GateRequest) -> Result<Bytes, CallError> {
    serde_json::to_vec(gate)
        .map(Bytes::from)
        .map_err(|source| CallError::Encode {
            what: "the gate request",
            source,
        })
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
