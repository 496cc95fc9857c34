//! toolmesh-actix-host: runs a [`Handler`] of NATS requests as an actix actor, the skeleton the
//! workspace, sync, web, skills and sandbox actors share.
//!
//! The actor owns the role's requests as one stream (drainable subscriptions, see
//! [`toolmesh_kernel::host::drainable`]) and runs each request as a task of its own, counted in
//! [`InFlight`] while it runs, so one slow request never holds up the next. When the stream
//! ends (the node drains), the actor waits for the tasks still running, runs
//! [`Handler::drained`], stops, logs "`<name>` actor drained" and resolves its [`ActorHandle`].
//!
//! actix stays inside this crate and the actor crates: nothing here appears in the kernel, and
//! [`start`] hands out only the kernel's [`ActorHandle`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, StreamHandler, WrapFuture,
};
use async_nats::{Client, Message};
use futures::Stream;
use serde_json::{Map, Value};
use tokio_util::task::TaskTracker;
use toolmesh_kernel::host::{self, ActorHandle, InFlight, StopNotice};
use toolmesh_kernel::trace;
use toolmesh_kernel::wire::{ActorCall, ActorReply};
use toolmesh_kernel::{Role, ToolError};
use tracing::Instrument as _;

/// What an actor does with one request; shared by the tasks of all requests.
pub trait Handler: Send + Sync + 'static {
    /// One item of the actor's stream: a NATS message, or one tagged with where it came from.
    type Request: Send + 'static;

    /// Handles one request, answering it if it wants an answer. Runs as a task of its own.
    fn handle(&self, request: Self::Request) -> impl Future<Output = ()> + Send;

    /// Runs once the stream has ended and every request has been handled, before the actor
    /// stops (the sandbox worker removes its sandboxes here).
    fn drained(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Starts an actor that runs `handler` on every item of `requests` (inside an actix `System`).
/// The returned handle resolves once `requests` ended, the requests in flight were handled and
/// [`Handler::drained`] returned. `name` names the actor in its log ("`<name>` actor drained").
pub fn start<H, S>(
    role: Role,
    name: &'static str,
    handler: H,
    requests: S,
    in_flight: InFlight,
) -> ActorHandle
where
    H: Handler,
    S: Stream<Item = H::Request> + 'static,
{
    let (handle, stopped) = ActorHandle::new(role);
    MessageActor::create(move |ctx| {
        ctx.add_stream(requests);
        MessageActor {
            name,
            handler: Arc::new(handler),
            in_flight,
            tasks: TaskTracker::new(),
            stopped,
        }
    });
    handle
}

/// Answers a routed tool call: the message's body is an [`ActorCall`] (a malformed one is
/// answered `invalid_request`), `run` computes the tool's fields or error in `role`'s span
/// ([`trace::actor_span`], a child of the gateway's), and the answer goes out through
/// [`host::answer`] (to the gateway, or to the caller for a direct reply).
pub async fn answer_call<F, Fut>(client: &Client, role: Role, msg: Message, run: F)
where
    F: FnOnce(ActorCall) -> Fut,
    Fut: Future<Output = Result<Map<String, Value>, ToolError>>,
{
    let started = Instant::now();
    let (reply, finish) = match ActorCall::parse(&msg.payload) {
        Err(error) => (ActorReply::error(error), None),
        Ok(call) => {
            let finish = call.direct_finish();
            let span = trace::actor_span(role, &call, msg.headers.as_ref());
            let reply = match run(call).instrument(span).await {
                Ok(fields) => ActorReply::ok(fields),
                Err(error) => ActorReply::error(error),
            };
            (reply, finish)
        }
    };
    host::answer(client, msg.reply.as_ref(), finish.as_ref(), reply, started).await;
}

/// The actor behind [`start`].
struct MessageActor<H: Handler> {
    name: &'static str,
    handler: Arc<H>,
    in_flight: InFlight,
    tasks: TaskTracker,
    stopped: StopNotice,
}

impl<H: Handler> Actor for MessageActor<H> {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        tracing::info!("{} actor drained", self.name);
        self.stopped.notify();
    }
}

impl<H: Handler> StreamHandler<H::Request> for MessageActor<H> {
    fn handle(&mut self, request: H::Request, _ctx: &mut Context<Self>) {
        let handler = self.handler.clone();
        let held = self.in_flight.enter();
        self.tasks.spawn(async move {
            let _held = held;
            handler.handle(request).await;
        });
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        // Drained: wait for the requests still running, then stop.
        self.tasks.close();
        let tasks = self.tasks.clone();
        let handler = self.handler.clone();
        ctx.wait(
            async move {
                tasks.wait().await;
                handler.drained().await;
            }
            .into_actor(self)
            .map(|_, _, ctx| ctx.stop()),
        );
    }
}
