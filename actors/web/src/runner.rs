//! The `WebRunner` actor: owns the subscription on `toolmesh.internal.v1.run.web`
//! as a drainable stream and runs each call as a task of its own.

use std::sync::Arc;

use actix::prelude::*;
use async_nats::{Client, Message};
use tokio_util::task::TaskTracker;
use toolmesh_kernel::host::{respond, InFlight, StopNotice};
use toolmesh_kernel::wire::{ActorCall, ActorReply};
use toolmesh_kernel::ToolError;
use tracing::Instrument;

use crate::tools::WebService;

/// A routed call for a web tool.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RunRequested(pub Message);

pub struct WebRunner {
    client: Client,
    service: Arc<WebService>,
    in_flight: InFlight,
    tasks: TaskTracker,
    stopped: StopNotice,
}

impl WebRunner {
    pub fn new(
        client: Client,
        service: Arc<WebService>,
        in_flight: InFlight,
        stopped: StopNotice,
    ) -> Self {
        Self {
            client,
            service,
            in_flight,
            tasks: TaskTracker::new(),
            stopped,
        }
    }
}

impl Actor for WebRunner {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        tracing::info!("web actor drained");
        self.stopped.notify();
    }
}

impl StreamHandler<RunRequested> for WebRunner {
    fn handle(&mut self, RunRequested(msg): RunRequested, _ctx: &mut Context<Self>) {
        let client = self.client.clone();
        let service = self.service.clone();
        let held = self.in_flight.enter();
        self.tasks.spawn(async move {
            let _held = held;
            let reply = match serde_json::from_slice::<ActorCall>(&msg.payload) {
                Err(e) => ActorReply::error(ToolError::invalid_request(format!(
                    "malformed routed call: {e}"
                ))),
                Ok(call) => {
                    let span = tracing::info_span!(
                        "web",
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
            respond(&client, msg.reply.as_ref(), body).await;
        });
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        // Drained: wait for the calls still running, then stop.
        self.tasks.close();
        let tasks = self.tasks.clone();
        ctx.wait(
            async move { tasks.wait().await }
                .into_actor(self)
                .map(|_, _, ctx| ctx.stop()),
        );
    }
}
