//! toolmesh-actix-host: runs a [`Handler`] of NATS requests as an actix actor, the skeleton the
//! workspace, sync, web, skills and sandbox actors share, and the one generic host of their
//! tools ([`ToolServer`], [`Routed`]).
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
use tokio_util::task::TaskTracker;
use toolmesh_kernel::events::EventSink;
use toolmesh_kernel::host::{self, ActorHandle, InFlight, StopNotice};
use toolmesh_kernel::outputs::Keeper;
use toolmesh_kernel::tools::{self, ClaimTo, Entry, RunFn, Runnable, ToolCall};
use toolmesh_kernel::wire::{ActorCall, ActorReply};
use toolmesh_kernel::{budget, trace};
use toolmesh_kernel::{ErrorCode, NodeId, Role, ToolError};
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

/// A routed tool call as an actor took it: parsed, with its span (a child of the gateway's,
/// [`trace::actor_span`]) and what answering it needs.
pub struct Routed {
    pub msg: Message,
    pub call: ActorCall,
    span: tracing::Span,
    started: Instant,
}

impl Routed {
    /// Reads the call in `msg`; a malformed one is answered `invalid_request` here (`None`).
    pub async fn take(client: &Client, role: Role, msg: Message) -> Option<Routed> {
        let started = Instant::now();
        match ActorCall::parse(&msg.payload) {
            Ok(call) => Some(Routed {
                span: trace::actor_span(role, &call, msg.headers.as_ref()),
                msg,
                call,
                started,
            }),
            Err(error) => {
                let reply = ActorReply::error(error);
                host::answer(client, msg.reply.as_ref(), None, reply, started).await;
                None
            }
        }
    }

    /// The call's span; the actor's work on it runs inside.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    /// Answers the call: to the gateway, or to the caller when it asked for a direct reply
    /// ([`host::answer`]).
    pub async fn answer(&self, client: &Client, reply: ActorReply) {
        let finish = self.call.direct_finish();
        let to = self.msg.reply.as_ref();
        host::answer(client, to, finish.as_ref(), reply, self.started).await;
    }
}

/// The generic host of an actor's tools: finds the call's tool in the actor's table
/// (`unknown_tool` for a name it lacks), refuses a call without the session its definition
/// needs, parses the arguments into the tool's type, runs it with the call's event numbering,
/// fields limit, result budget and the actor's store for over-budget text ([`Keeper`]), and
/// answers. `E` is the table's entry type: a [`Tool`]'s [`Entry`], or an
/// actor's own entry holding one with facts of its own (the sandbox's placement).
///
/// [`Tool`]: toolmesh_kernel::tools::Tool
pub struct ToolServer<H: 'static, E: Runnable<H> + 'static = Entry<RunFn<H>>> {
    pub client: Client,
    pub role: Role,
    pub table: &'static [E],
    /// The node named in claims ([`toolmesh_kernel::tools::ToolCall::claim`]); `None` for an
    /// actor whose tools claim nothing.
    pub node: Option<NodeId>,
    /// The node's result budget and where over-budget text is kept ([`ToolCall::outputs`]).
    pub outputs: Keeper,
    host: std::marker::PhantomData<fn(&H)>,
}

impl<H: Sync + 'static, E: Runnable<H> + 'static> ToolServer<H, E> {
    pub fn new(client: Client, role: Role, table: &'static [E], outputs: Keeper) -> Self {
        Self {
            client,
            role,
            table,
            node: None,
            outputs,
            host: std::marker::PhantomData,
        }
    }

    /// This server's tools may claim their calls as `node`.
    pub fn claiming_as(mut self, node: NodeId) -> Self {
        self.node = Some(node);
        self
    }

    /// Answers the routed call in `msg` with `host`.
    pub async fn answer(&self, host: &H, msg: Message) {
        let Some(routed) = Routed::take(&self.client, self.role, msg).await else {
            return;
        };
        async {
            let reply = self.run(host, &routed).await;
            routed.answer(&self.client, reply).await;
        }
        .instrument(routed.span())
        .await
    }

    /// The entry of the call's tool: `unknown_tool` when the table lacks it.
    pub fn find(&self, call: &ActorCall) -> Result<&'static E, ToolError> {
        tools::find(self.table, &call.tool).ok_or_else(|| {
            ToolError::new(
                ErrorCode::UnknownTool,
                format!("the {} actor does not serve {:?}", self.role, call.tool),
            )
        })
    }

    /// Runs the routed call's tool with `host`; the reply counts the events it published.
    pub async fn run(&self, host: &H, routed: &Routed) -> ActorReply {
        match self.find(&routed.call) {
            Ok(tool) => self.run_tool(tool, host, routed).await,
            Err(unknown) => ActorReply::error(unknown),
        }
    }

    /// Runs `tool`, the call's entry ([`Self::find`]), with `host`: for an actor that looked
    /// the tool up already (the sandbox worker, for its placement).
    pub async fn run_tool(&self, tool: &'static E, host: &H, routed: &Routed) -> ActorReply {
        let call = &routed.call;
        if tool.def().needs_session && call.invocation.session_id.is_none() {
            return ActorReply::error(ToolError::invalid_request(format!(
                "{} works in a session: add \"session_id\"",
                call.tool
            )));
        }
        let events = EventSink::new(&self.client, &call.invocation, &call.tool, call.event_seq);
        let tool_call = ToolCall {
            ctx: &call.invocation,
            arguments: &call.arguments,
            fields_limit: budget::fields_limit(self.client.max_payload()),
            events,
            outputs: self.outputs.of(&call.invocation),
            claim_to: routed
                .msg
                .reply
                .as_ref()
                .zip(self.node.as_ref())
                .map(|(reply, node)| ClaimTo {
                    client: &self.client,
                    reply,
                    node,
                }),
        };
        let mut reply = match tool.run_value(host, &tool_call).await {
            Ok(fields) => ActorReply::ok(fields),
            Err(error) => ActorReply::error(error),
        };
        reply.events_emitted = tool_call.events.emitted();
        reply
    }
}

/// The actor behind [`start`].
/// The [`Handler`] of an actor whose every message is a call of its table: its
/// [`ToolServer`] and the host its tools run with (the workspace's and the web's).
pub struct Serving<H: 'static> {
    pub server: ToolServer<H>,
    pub host: Arc<H>,
}

impl<H: Send + Sync + 'static> Handler for Serving<H> {
    type Request = Message;

    async fn handle(&self, msg: Message) {
        self.server.answer(&self.host, msg).await;
    }
}

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
