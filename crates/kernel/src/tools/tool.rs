//! What a built-in tool is: a type implementing [`Tool`] — its fields are the tool's
//! arguments, its doc comment is the description agents read, [`Tool::DEF`] says the rest —
//! listed in its actor's table ([`Table`]) as an [`Entry`].
//!
//! The generic host (`toolmesh-actix-host`) finds the entry by name; the entry parses the
//! arguments into the tool's type and runs it. The registry reads the same entries through
//! [`Listed`] (the definition and the schema derived from the type), so schema and code cannot
//! drift apart and a name no table lists reaches no tool's code.
//!
//! Adding a tool: one file with the type and its impl, one line in its actor's table, one row
//! in PROTOCOL.md's tool table (ARCHITECTURE.md, "Adding a tool").

use std::future::Future;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::spec::{schema_of, ToolDef};
use crate::error::{ErrorCode, ToolError};
use crate::events::EventSink;
use crate::ids::SessionId;
use crate::outputs::Outputs;
use crate::wire::InvocationContext;

/// A tool's fields on success, its error otherwise.
pub type ToolResult = Result<Map<String, Value>, ToolError>;

/// A tool an actor runs with its host `H` (its service, or what a call was placed with). The
/// type is the tool's arguments: it derives `Deserialize` (refusing unknown members,
/// `deny_unknown_fields`) and `JsonSchema` (the registry's schema, whose description is the
/// type's doc comment), see [`super::args`].
pub trait Tool<H>: DeserializeOwned + JsonSchema + Send + 'static {
    /// Name, group, risk, side effects, session need, where it runs, its profiles and how an
    /// approver sees its arguments.
    const DEF: &'static ToolDef;

    /// Runs one call whose arguments parsed into `self`. The generic host checked the session
    /// (a tool whose definition needs one finds it in [`ToolCall::session`]), opened the span
    /// and numbers the events published through [`ToolCall::events`].
    fn run<'a>(
        self,
        host: &'a H,
        call: &'a ToolCall<'a>,
    ) -> impl Future<Output = ToolResult> + Send + 'a;
}

/// A tool as the registry sees it: its definition and its arguments' JSON Schema.
pub trait Listed: Sync {
    fn def(&self) -> &'static ToolDef;
    fn schema(&self) -> Value;
}

impl<T: Listed + ?Sized> Listed for &T {
    fn def(&self) -> &'static ToolDef {
        (**self).def()
    }

    fn schema(&self) -> Value {
        (**self).schema()
    }
}

/// A tool of a table: its definition, its schema and how it runs (`R`: the actor's way of
/// running a tool, [`RunFn`] for a [`Tool`]; `()` for a tool that is listed only, or a tool of
/// the tests).
#[derive(Debug, Clone, Copy)]
pub struct Entry<R = ()> {
    pub def: &'static ToolDef,
    pub schema: fn() -> Value,
    pub run: R,
}

impl<R> Entry<R> {
    /// The entry of a tool of argument type `A`.
    pub const fn new<A: JsonSchema>(def: &'static ToolDef, run: R) -> Self {
        Entry {
            def,
            schema: schema_of::<A>,
            run,
        }
    }
}

impl<R: Sync> Listed for Entry<R> {
    fn def(&self) -> &'static ToolDef {
        self.def
    }

    fn schema(&self) -> Value {
        (self.schema)()
    }
}

/// How a [`Tool`] of host `H` runs from its table: parses the arguments, then runs.
pub type RunFn<H> = for<'a> fn(&'a H, &'a ToolCall<'a>) -> BoxFuture<'a, ToolResult>;

impl<H: Sync + 'static> Entry<RunFn<H>> {
    /// The table entry of tool `T`.
    pub const fn of<T: Tool<H>>() -> Self {
        Entry::new::<T>(T::DEF, run_parsed::<H, T>)
    }
}

fn run_parsed<'a, H: Sync + 'static, T: Tool<H>>(
    host: &'a H,
    call: &'a ToolCall<'a>,
) -> BoxFuture<'a, ToolResult> {
    Box::pin(async move { parse_args::<T>(call.arguments)?.run(host, call).await })
}

/// An entry the generic host runs: a [`Tool`]'s ([`Entry::of`]), or an actor's own entry that
/// holds one (the sandbox worker's, with how a call is placed).
pub trait Runnable<H>: Listed {
    fn run_value<'a>(&'a self, host: &'a H, call: &'a ToolCall<'a>) -> BoxFuture<'a, ToolResult>;
}

impl<H> Runnable<H> for Entry<RunFn<H>> {
    fn run_value<'a>(&'a self, host: &'a H, call: &'a ToolCall<'a>) -> BoxFuture<'a, ToolResult> {
        (self.run)(host, call)
    }
}

/// An actor's tools, in the order of PROTOCOL.md's tool table.
pub type Table<H> = &'static [Entry<RunFn<H>>];

/// The entry of `name` in `table`: a name the table lacks finds nothing, never another tool.
pub fn find<E: Listed>(table: &'static [E], name: &str) -> Option<&'static E> {
    table.iter().find(|tool| tool.def().name == name)
}

/// Arguments parsed into a tool's type: `invalid_arguments` saying why not. The gateway
/// validated them against the same type's schema, so this fails only for a caller that went
/// around it.
pub fn parse_args<A: DeserializeOwned>(arguments: &Value) -> Result<A, ToolError> {
    A::deserialize(arguments)
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, format!("arguments: {e}")))
}

/// What a tool gets of its call besides its arguments.
#[derive(Debug)]
pub struct ToolCall<'a> {
    pub ctx: &'a InvocationContext,
    /// The arguments as sent (already parsed into the tool's `Args`).
    pub arguments: &'a Value,
    /// The most bytes the result fields may take ([`crate::budget::fields_limit`] of the
    /// connection's `max_payload`); list results are cut to it with `truncated: true`.
    pub fields_limit: usize,
    /// Where the call's RunEvents go, numbered on from the gateway's.
    pub events: EventSink<'a>,
    /// The result budget and where over-budget text is kept whole (PROTOCOL.md "Large data").
    pub outputs: Outputs<'a>,
    /// Where a claim of the call goes ([`ToolCall::claim`]); `None` in unit tests.
    pub claim_to: Option<ClaimTo<'a>>,
}

/// The reply subject of a call and the node that took it, for [`ToolCall::claim`].
#[derive(Debug, Clone, Copy)]
pub struct ClaimTo<'a> {
    pub client: &'a async_nats::Client,
    pub reply: &'a async_nats::Subject,
    pub node: &'a crate::ids::NodeId,
}

impl ToolCall<'_> {
    /// Tells the gateway this node took the call ([`crate::host::publish_claim`]), so a lost
    /// node is noticed at once rather than at the call's deadline: for a tool that may run
    /// long (a download).
    pub async fn claim(&self) {
        let Some(to) = self.claim_to else {
            return;
        };
        if let Err(e) = crate::host::publish_claim(to.client, to.reply, to.node).await {
            tracing::debug!(error = %e, "could not publish a claim");
        }
    }

    /// The call's session. The generic host refuses a call without one to a tool whose
    /// definition needs it, so a tool that needs one never sees this fail.
    pub fn session(&self) -> Result<&SessionId, ToolError> {
        self.ctx
            .session_id
            .as_ref()
            .ok_or_else(|| ToolError::invalid_request("this tool works in a session"))
    }
}
