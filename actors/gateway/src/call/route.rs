//! Routing: which actor gets a call (any instance of its role, a queue group), the claims of
//! long-running roles and the worker that holds a call, direct replies, and what a failed
//! request tells the caller.

use std::time::{Duration, Instant};

use async_nats::Message;
use bytes::Bytes;
use serde_json::{json, Value};

use toolmesh_kernel::cluster::ClusterView;
use toolmesh_kernel::host;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::time::elapsed_ms;
use toolmesh_kernel::tools::RegisteredTool;
use toolmesh_kernel::trace;
use toolmesh_kernel::wire::{ActorCall, ActorReply, DirectReply};
use toolmesh_kernel::{ErrorCode, NodeId, Role, ToolError};

use super::error::{timed_out, CallError};
use super::Call;
use crate::core::Answer;
use crate::splice;

/// How long the gateway waits for an actor when the call names no `timeout` of its own.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(120);
/// Added to a call's own `timeout` so the actor's `timeout` reply arrives before ours.
pub const ROUTE_TIMEOUT_MARGIN: Duration = Duration::from_secs(30);

impl Call<'_> {
    /// What the actor needs to answer the caller itself, when it may: the call used no
    /// approval (no outcome of it gives one back) and the caller's reply subject is under
    /// `_INBOX.`, where every node may publish (README "NATS permissions"). Otherwise `None`,
    /// and the reply comes through here: another prefix of `TOOLMESH_REPLY_PREFIXES` may be one
    /// only the gateways' users may publish to.
    fn direct_reply(&self) -> Option<DirectReply> {
        // With the trail on, the gateway writes `finished` before the caller has the reply.
        if self.consumed_approval.is_some()
            || self.grant_id.is_some()
            || self.reviewed.is_some()
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
            event_extra: self.policy_extra(),
        })
    }

    /// Sends the call to the actor of the tool's role (any instance, queue group).
    pub(super) async fn route(
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
            event_seq: self.events.seq().hand_over(),
            direct: self.direct_reply(),
        };
        let body = serde_json::to_vec(&call).map_err(|source| CallError::Encode {
            what: "the actor call",
            source,
        })?;
        core.check_payload(&body, "routed")?;
        let reply = if role.is_long_running() {
            self.send_claimed(role, &target.spec.name, Bytes::from(body), timeout)
                .await?
        } else {
            self.send(role, &target.spec.name, Bytes::from(body), timeout)
                .await?
        };
        // The common case, a success, goes to the caller as the actor wrote it.
        if let Some(success) = splice::success(&reply.payload) {
            self.events.seq().handed_back(success.events_emitted);
            return Ok(Answer::Prepared(success.members));
        }
        let answer: ActorReply = serde_json::from_slice(&reply.payload)
            .map_err(|source| CallError::MalformedReply { role, source })?;
        self.events.seq().handed_back(answer.events_emitted);
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
}

/// The call's own `timeout` (seconds) plus a margin, or the default.
pub(super) fn route_timeout(arguments: &Value) -> Duration {
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

/// A request the NATS server refused this node (its user may not publish there): said in full
/// in the node's log, and to the caller without the node's user.
pub(super) fn refused(refused: toolmesh_kernel::permissions::Refused) -> ToolError {
    tracing::error!("{refused}");
    ToolError::new(
        ErrorCode::Unavailable,
        format!(
            "the NATS server refused this gateway node permission to publish to {}; the node's log says which user and what to change",
            refused.violation.subject
        ),
    )
}

/// Maps a failed internal request onto the protocol's codes ([`CallError::kind`]).
pub(super) fn request_failed(error: async_nats::RequestError, role: Role, what: &str) -> ToolError {
    CallError::Request {
        role,
        what: what.to_owned(),
        source: error,
    }
    .into()
}
