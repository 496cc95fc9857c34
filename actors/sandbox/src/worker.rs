//! The `SandboxWorker` actor: takes sandbox calls from the role's queue group and from this
//! node's own subject, and sends each to the worker that holds the call's session.
//!
//! Placement of a call for session S arriving at worker W:
//! 1. W holds S → run it here (no Redis on this path).
//! 2. The registry names another worker V that is live in W's cluster view → hand the call to
//!    V's own subject, reply subject unchanged (V answers the gateway directly).
//! 3. Nobody holds S, or its holder is gone → W claims S (compare-and-set against the holder
//!    it found gone) and creates the sandbox; a lost claim race hands over to the winner.
//!
//! A tool that creates a sandbox claims at once instead of looking first (the claim answers
//! with the holder when it is someone else), so a new session costs one registry round trip;
//! the other tools only look.
//!
//! Every worker that takes a call first sends a claim (`Toolmesh-Claimed-By`,
//! [`publish_claim`]) to the reply subject, so the gateway can tell the caller as soon as that
//! worker is lost instead of at the call's deadline.

use std::sync::Arc;
use std::time::Instant;

use async_nats::{Client, Message};
use toolmesh_actix_host::Handler;
use toolmesh_kernel::cluster::ClusterView;
use toolmesh_kernel::host::{answer, publish_claim};
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::{ActorCall, ActorReply};
use toolmesh_kernel::{ErrorCode, NodeId, Role, ToolError};
use tracing::Instrument;

use crate::pool::{OpenError, SessionKey, SessionUse};
use crate::tools::{creates_sandbox, Answer, SandboxService};

/// A routed call; `forwarded` when another worker handed it to this one.
pub struct RunRequested {
    pub msg: Message,
    pub forwarded: bool,
}

/// Places each call (hosted by [`toolmesh_actix_host`], a task per call).
pub struct SandboxWorker {
    pub client: Client,
    pub service: Arc<SandboxService>,
    pub cluster: Arc<ClusterView>,
    pub node: NodeId,
    /// Why the backend cannot run here (image missing…), re-checked on every call until fixed.
    pub health: tokio::sync::Mutex<Option<String>>,
}

impl Handler for SandboxWorker {
    type Request = RunRequested;

    async fn handle(&self, RunRequested { msg, forwarded }: RunRequested) {
        self.place_and_run(msg, forwarded).await;
    }

    /// Drained (both subscriptions end together) and every call answered: remove this
    /// worker's sandboxes.
    async fn drained(&self) {
        self.service.pool.shutdown().await;
    }
}

/// Where a call runs. `opened`: this call took a sandbox for a new session, so the warm pool
/// is topped up once it has been answered.
enum Target {
    Here {
        session: Option<SessionUse>,
        opened: bool,
    },
    On(NodeId),
}

impl SandboxWorker {
    async fn place_and_run(&self, msg: Message, forwarded: bool) {
        let started = Instant::now();
        let call = match ActorCall::parse(&msg.payload) {
            Ok(call) => call,
            Err(error) => {
                self.reply(&msg, None, ActorReply::error(error), started)
                    .await;
                return;
            }
        };
        let span = tracing::info_span!(
            "sandbox",
            invocation_id = %call.invocation.invocation_id,
            account = %call.invocation.account,
            tool = %call.tool,
        );
        async {
            self.claim(&msg).await;
            let (answer, opened) = match self.place(&call, forwarded).await {
                Ok(Target::On(node)) => {
                    self.hand_over(&msg, &node).await;
                    return;
                }
                Ok(Target::Here { session, opened }) => {
                    (self.service.run(&call, session).await, opened)
                }
                Err(error) => {
                    // Nothing ran: the gateway may give the call's approval back.
                    self.reply(&msg, Some(&call), ActorReply::refused(error), started)
                        .await;
                    return;
                }
            };
            let Answer { result, events } = answer;
            let mut reply = match result {
                Ok(fields) => ActorReply::ok(fields),
                Err(error) => ActorReply::error(error),
            };
            reply.events_emitted = events;
            self.reply(&msg, Some(&call), reply, started).await;
            if opened {
                // Not before: creating a container beside the first command slows it down
                // (measured by benches/sandbox.rs, section 2).
                let pool = self.service.pool.clone();
                tokio::spawn(async move { pool.fill_warm().await });
            }
        }
        .instrument(span)
        .await
    }

    async fn claim(&self, msg: &Message) {
        let Some(reply) = msg.reply.as_ref() else {
            return;
        };
        if let Err(e) = publish_claim(&self.client, reply, &self.node).await {
            tracing::warn!(error = %e, "cannot send a claim");
        }
    }

    async fn reply(
        &self,
        msg: &Message,
        call: Option<&ActorCall>,
        reply: ActorReply,
        started: Instant,
    ) {
        let finish = call.and_then(ActorCall::direct_finish);
        answer(
            &self.client,
            msg.reply.as_ref(),
            finish.as_ref(),
            reply,
            started,
        )
        .await;
    }

    /// Hands the call to `node`'s own subject; `node` answers the gateway directly.
    async fn hand_over(&self, msg: &Message, node: &NodeId) {
        tracing::debug!(to = %node, "handing the call to the worker holding the session");
        let subject = internal::run_on(Role::Sandbox, node);
        let sent = match msg.reply.clone() {
            Some(reply) => {
                self.client
                    .publish_with_reply(subject, reply, msg.payload.clone())
                    .await
            }
            None => self.client.publish(subject, msg.payload.clone()).await,
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "cannot hand a call over");
        }
    }

    fn live_sandbox_node(&self, node: &NodeId) -> bool {
        self.cluster
            .live()
            .iter()
            .any(|n| &n.node_id == node && n.roles.contains(&Role::Sandbox))
    }

    async fn place(&self, call: &ActorCall, forwarded: bool) -> Result<Target, ToolError> {
        self.service.precheck(call)?;
        self.check_health().await?;
        let session_id = call
            .invocation
            .session_id
            .clone()
            .ok_or_else(|| ToolError::invalid_request("sandbox tools need a session_id"))?;
        let key: SessionKey = (call.invocation.account.clone(), session_id);
        let pool = &self.service.pool;
        if let Some(session) = pool.local(&key) {
            return Ok(Target::Here {
                session: Some(session),
                opened: false,
            });
        }
        if !creates_sandbox(&call.tool) {
            if let Some(holder) = pool.registry().lookup(&key.0, &key.1).await? {
                if holder.node != self.node && !forwarded && self.live_sandbox_node(&holder.node) {
                    return Ok(Target::On(holder.node));
                }
            }
            return Ok(Target::Here {
                session: None,
                opened: false,
            });
        }
        // Claim without looking first: a new session (the usual case here) costs one registry
        // round trip, not two. Held by a live worker: hand the call over; by one that is gone
        // (or that handed the call back to us): take the session over and re-create it here.
        let holder = match pool.open(&key, None).await {
            Err(OpenError::HeldBy(node)) => node,
            opened => return self.opened(opened, forwarded),
        };
        if !forwarded && self.live_sandbox_node(&holder) {
            return Ok(Target::On(holder));
        }
        let opened = pool.open(&key, Some(&holder)).await;
        self.opened(opened, forwarded)
    }

    fn opened(
        &self,
        opened: Result<SessionUse, OpenError>,
        forwarded: bool,
    ) -> Result<Target, ToolError> {
        match opened {
            Ok(session) => Ok(Target::Here {
                session: Some(session),
                opened: true,
            }),
            Err(OpenError::HeldBy(node)) if !forwarded => Ok(Target::On(node)),
            Err(OpenError::HeldBy(node)) => Err(ToolError::new(
                ErrorCode::Unavailable,
                format!("the session's sandbox moved to worker {node} meanwhile; retry"),
            )),
            Err(OpenError::Failed(error)) => Err(error),
        }
    }

    async fn check_health(&self) -> Result<(), ToolError> {
        let mut health = self.health.lock().await;
        if health.is_none() {
            return Ok(());
        }
        match self.service.pool.backend.check().await {
            Ok(()) => {
                *health = None;
                let pool = self.service.pool.clone();
                tokio::spawn(async move { pool.fill_warm().await });
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                *health = Some(message.clone());
                Err(ToolError::new(ErrorCode::Unavailable, message)
                    .with("node_id", self.node.as_str()))
            }
        }
    }
}
