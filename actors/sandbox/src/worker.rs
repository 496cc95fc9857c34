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
//! the other tools only look. With a warm sandbox at hand that round trip runs beside the
//! first command's preparation (see [`crate::pool`]); when it finds the session held after
//! all, nothing has run and the call is placed as in steps 2 and 3.
//!
//! Every worker that takes a call first sends a claim (`Toolmesh-Claimed-By`,
//! [`publish_claim`]) to the reply subject, so the gateway can tell the caller as soon as that
//! worker is lost instead of at the call's deadline.

use std::sync::Arc;

use async_nats::{Client, Message};
use toolmesh_actix_host::{Handler, Routed, ToolServer};
use toolmesh_kernel::cluster::ClusterView;
use toolmesh_kernel::host::publish_claim;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::{ActorCall, ActorReply};
use toolmesh_kernel::{ErrorCode, NodeId, Role, ToolError};
use tracing::Instrument;

use crate::pool::{OpenError, SessionKey, SessionUse};
use crate::service::{Placed, Placement, SandboxEntry, SandboxService};
use crate::templates::{bound_elsewhere, Template};

/// A routed call; `forwarded` when another worker handed it to this one.
pub struct RunRequested {
    pub msg: Message,
    pub forwarded: bool,
}

/// Places each call (hosted by [`toolmesh_actix_host`], a task per call).
pub struct SandboxWorker {
    pub client: Client,
    /// Runs the calls placed here ([`crate::tools::TOOLS`]).
    pub server: ToolServer<Placed, SandboxEntry>,
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
/// is topped up once it has been answered (and the session's claim may still be on its way).
enum Target {
    Here {
        session: Option<SessionUse>,
        opened: bool,
    },
    On(NodeId),
}

/// Where a call goes whose claim of its session was refused (nothing ran).
enum Next {
    On(NodeId),
    /// The holder is gone: claim the session in its place and run the call here.
    TakeOver(NodeId),
    Refused(ToolError),
}

impl Target {
    fn opened(session: SessionUse) -> Self {
        Target::Here {
            session: Some(session),
            opened: true,
        }
    }
}

/// A claim taking a session over from a holder that was gone lost to `winner`, another worker
/// doing the same: hand the call to it, unless it came from there.
fn raced(winner: NodeId, forwarded: bool) -> Result<NodeId, ToolError> {
    if forwarded {
        return Err(ToolError::new(
            ErrorCode::Unavailable,
            format!("the session's sandbox moved to worker {winner} meanwhile; retry"),
        ));
    }
    Ok(winner)
}

impl SandboxWorker {
    async fn place_and_run(&self, msg: Message, forwarded: bool) {
        let Some(routed) = Routed::take(&self.client, Role::Sandbox, msg).await else {
            return;
        };
        let call = &routed.call;
        async {
            self.claim(&routed.msg).await;
            let tool = match self.server.find(call) {
                Ok(tool) => tool,
                Err(unknown) => {
                    return routed
                        .answer(&self.client, ActorReply::error(unknown))
                        .await
                }
            };
            let placement = tool.placement;
            let mut taking_over: Option<NodeId> = None;
            let (reply, opened) = loop {
                let target = match &taking_over {
                    None => self.place(call, placement, forwarded).await,
                    Some(gone) => self.take_over(call, placement, gone).await,
                };
                let placed = match target {
                    Ok(Target::Here { session, opened }) => {
                        let fresh = session.as_ref().filter(|_| opened).map(|s| Arc::clone(s));
                        let host = Placed {
                            service: self.service.clone(),
                            session,
                        };
                        let reply = self.server.run_tool(tool, &host, &routed).await;
                        // A session opened here may have been handed its sandbox before its
                        // claim came back; the tool ran nothing unless the claim held.
                        let Some(fresh) = fresh else {
                            break (reply, opened);
                        };
                        match fresh.claimed().await {
                            Ok(()) => break (reply, true),
                            Err(refused) => {
                                self.place_refused(refused, forwarded, taking_over.is_some())
                            }
                        }
                    }
                    Ok(Target::On(node)) => Next::On(node),
                    Err(refused) => self.place_refused(refused, forwarded, taking_over.is_some()),
                };
                match placed {
                    Next::On(node) => {
                        self.hand_over(&routed.msg, &node).await;
                        return;
                    }
                    Next::Refused(error) => {
                        // Nothing ran: the gateway may give the call's approval back.
                        routed
                            .answer(&self.client, ActorReply::refused(error))
                            .await;
                        return;
                    }
                    Next::TakeOver(gone) => taking_over = Some(gone),
                }
            };
            routed.answer(&self.client, reply).await;
            if opened {
                // Not before: creating a container beside the first command slows it down
                // (measured by benches/sandbox.rs, section 2).
                let pool = self.service.pool.clone();
                tokio::spawn(async move { pool.fill_warm().await });
            }
        }
        .instrument(routed.span())
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

    /// Hands the call to `node`'s own subject; `node` answers the gateway directly.
    async fn hand_over(&self, msg: &Message, node: &NodeId) {
        tracing::debug!(to = %node, "handing the call to the worker holding the session");
        let subject = internal::run_on(Role::Sandbox, node);
        // The call's trace context goes along: the next worker's span is the gateway's child.
        let (headers, payload) = (msg.headers.clone().unwrap_or_default(), msg.payload.clone());
        let sent = match msg.reply.clone() {
            Some(reply) => {
                self.client
                    .publish_with_reply_and_headers(subject, reply, headers, payload)
                    .await
            }
            None => {
                self.client
                    .publish_with_headers(subject, headers, payload)
                    .await
            }
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "cannot hand a call over");
        }
    }

    /// Whether the sandbox worker `node` holds its sessions still: live, or not heard of yet
    /// by this worker's young view ([`ClusterView::gone`]). A holder taken for live that is
    /// gone after all answers nothing: the call handed to it is `unavailable` at once.
    fn live_sandbox_node(&self, node: &NodeId) -> bool {
        match self.cluster.live().into_iter().find(|n| &n.node_id == node) {
            Some(status) => status.roles.contains(&Role::Sandbox),
            None => !self.cluster.gone(node),
        }
    }

    /// Where the call runs; `Err` when it cannot run here, a claim refused among them (see
    /// [`Self::place_refused`]).
    async fn place(
        &self,
        call: &ActorCall,
        placement: &Placement,
        forwarded: bool,
    ) -> Result<Target, OpenError> {
        if let Some(precheck) = placement.precheck {
            precheck(&self.service)?;
        }
        self.check_health().await?;
        let key = session_key(call)?;
        let named = self.service.template_of(placement, &call.arguments).await?;
        let pool = &self.service.pool;
        if let Some(session) = pool.local(&key) {
            if let Some(named) = named.as_ref().filter(|t| t.name != session.template.name) {
                return Err(bound_elsewhere(&session.template.name, &named.name).into());
            }
            // A session whose claim is still on its way (its first call is running) is used
            // once the claim holds; a lost one has left the pool, so look again.
            if session.claimed().await.is_ok() {
                return Ok(Target::Here {
                    session: Some(session),
                    opened: false,
                });
            }
        }
        if !placement.creates_sandbox {
            if let Some(holder) = pool.registry().lookup(&key).await? {
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
        // round trip, not two; a claim that finds the session held goes to `place_refused`.
        let template = self.template_or_default(named);
        pool.open(&key, None, &template).await.map(Target::opened)
    }

    /// The template a new sandbox of the call is made from.
    fn template_or_default(&self, named: Option<Arc<Template>>) -> Arc<Template> {
        named.unwrap_or_else(|| {
            self.service
                .pool
                .settings
                .templates
                .default_template()
                .clone()
        })
    }

    /// Opens the call's session here in place of `gone`, its holder that is no longer live.
    async fn take_over(
        &self,
        call: &ActorCall,
        placement: &Placement,
        gone: &NodeId,
    ) -> Result<Target, OpenError> {
        let key = session_key(call)?;
        let named = (self.service)
            .template_of(placement, &call.arguments)
            .await?;
        let template = self.template_or_default(named);
        self.service
            .pool
            .open(&key, Some(gone), &template)
            .await
            .map(Target::opened)
    }

    /// Where a call goes whose claim of its session was refused, at once or (a warm sandbox's
    /// claim) after the tool waited for it; nothing ran. Held by a live worker: hand the call
    /// over; by one that is gone (or that handed the call back to us): take the session over.
    /// `took_over`: the refused claim already replaced a holder that was gone.
    fn place_refused(&self, refused: OpenError, forwarded: bool, took_over: bool) -> Next {
        let holder = match refused {
            OpenError::Failed(error) => return Next::Refused(error),
            OpenError::HeldBy(holder) => holder,
        };
        if took_over {
            return match raced(holder, forwarded) {
                Ok(node) => Next::On(node),
                Err(error) => Next::Refused(error),
            };
        }
        match self.live_holder(holder, forwarded) {
            Ok(node) => Next::On(node),
            Err(gone) => Next::TakeOver(gone),
        }
    }

    /// A claim found the session held by `holder`: `Ok` to hand the call to it (live, and the
    /// call was not handed here by it), `Err` with it when this worker takes its place.
    fn live_holder(&self, holder: NodeId, forwarded: bool) -> Result<NodeId, NodeId> {
        if !forwarded && self.live_sandbox_node(&holder) {
            Ok(holder)
        } else {
            Err(holder)
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

fn session_key(call: &ActorCall) -> Result<SessionKey, ToolError> {
    let session_id = call
        .invocation
        .session_id
        .clone()
        .ok_or_else(|| ToolError::invalid_request("sandbox tools need a session_id"))?;
    Ok((call.invocation.account.clone(), session_id))
}
