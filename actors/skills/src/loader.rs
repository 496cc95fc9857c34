//! The `SkillLoader` actor: owns the subscriptions on `toolmesh.internal.v1.run.skills` and
//! [`toolmesh_kernel::skills::BUNDLE_SUBJECT`] as one drainable stream and runs each request
//! as a task of its own.

use std::sync::Arc;

use actix::prelude::*;
use async_nats::{Client, Message};
use tokio_util::task::TaskTracker;
use toolmesh_kernel::host::{publish_claim, respond, InFlight, StopNotice};
use toolmesh_kernel::skills as bundles;
use toolmesh_kernel::wire::{ActorCall, ActorReply};
use toolmesh_kernel::{NodeId, ToolError};
use tracing::Instrument;

use crate::tools::SkillsService;

/// A request for the skills actor.
#[derive(Message)]
#[rtype(result = "()")]
pub enum SkillRequested {
    /// A routed tool call (`ActorCall`).
    Run(Message),
    /// A bundle page request from a sandbox worker.
    Bundle(Message),
}

pub struct SkillLoader {
    client: Client,
    node: NodeId,
    service: Arc<SkillsService>,
    in_flight: InFlight,
    tasks: TaskTracker,
    stopped: StopNotice,
}

impl SkillLoader {
    pub fn new(
        client: Client,
        node: NodeId,
        service: Arc<SkillsService>,
        in_flight: InFlight,
        stopped: StopNotice,
    ) -> Self {
        Self {
            client,
            node,
            service,
            in_flight,
            tasks: TaskTracker::new(),
            stopped,
        }
    }
}

impl Actor for SkillLoader {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        tracing::info!("skills actor drained");
        self.stopped.notify();
    }
}

impl StreamHandler<SkillRequested> for SkillLoader {
    fn handle(&mut self, request: SkillRequested, _ctx: &mut Context<Self>) {
        let client = self.client.clone();
        let service = self.service.clone();
        let node = self.node.clone();
        let held = self.in_flight.enter();
        self.tasks.spawn(async move {
            let _held = held;
            match request {
                SkillRequested::Run(msg) => run(&client, &node, &service, msg).await,
                SkillRequested::Bundle(msg) => bundle(&client, &service, msg).await,
            }
        });
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        // Drained: wait for the requests still running, then stop.
        self.tasks.close();
        let tasks = self.tasks.clone();
        ctx.wait(
            async move { tasks.wait().await }
                .into_actor(self)
                .map(|_, _, ctx| ctx.stop()),
        );
    }
}

async fn run(client: &Client, node: &NodeId, service: &SkillsService, msg: Message) {
    let reply = match serde_json::from_slice::<ActorCall>(&msg.payload) {
        Err(e) => ActorReply::error(ToolError::invalid_request(format!(
            "malformed routed call: {e}"
        ))),
        Ok(call) => {
            // A load may download an archive: claim it, so a lost node is noticed at once.
            if call.tool == "load_skill" {
                if let Some(reply) = &msg.reply {
                    if let Err(e) = publish_claim(client, reply, node).await {
                        tracing::debug!(error = %e, "could not publish a claim");
                    }
                }
            }
            let span = tracing::info_span!(
                "skills",
                invocation_id = %call.invocation.invocation_id,
                account = %call.invocation.account,
                tool = %call.tool,
            );
            match service.run(&call).instrument(span).await {
                Ok(fields) => ActorReply::ok(fields),
                Err(error) => ActorReply::error(error),
            }
        }
    };
    let body = serde_json::to_vec(&reply).expect("a reply serializes");
    respond(client, msg.reply.as_ref(), body).await;
}

async fn bundle(client: &Client, service: &SkillsService, msg: Message) {
    let body = match bundles::parse_request(&msg.payload) {
        Err(error) => bundles::encode_error(error),
        Ok(request) => {
            let span = tracing::info_span!("skill_bundle", names = ?request.names);
            match service.bundle(request).instrument(span).await {
                Ok(page) => bundles::encode_page(&page),
                Err(error) => bundles::encode_error(error),
            }
        }
    };
    respond(client, msg.reply.as_ref(), body).await;
}
