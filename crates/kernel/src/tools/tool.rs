//! What a built-in tool is: a type implementing [`Define`] (its [`ToolDef`] and argument type)
//! and [`Tool`] (how it runs), listed in its actor's table ([`Table`]).
//!
//! A table holds `&dyn` [`Runnable`] entries; the blanket implementations here turn a typed
//! tool into one: the generic host (`toolmesh-actix-host`) finds the entry by name, and the
//! entry parses the arguments into [`Define::Args`] before [`Tool::run`] sees them. The
//! registry reads the same entries through [`Listed`] (the definition and the schema derived
//! from `Args`), so schema and code cannot drift apart and a name no table lists reaches no
//! tool's code.
//!
//! Adding a tool: one file with the type and both impls, one line in its actor's table, one
//! row in PROTOCOL.md's tool table (ARCHITECTURE.md, "Adding a tool").

use std::future::Future;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::spec::{schema_of, ToolDef};
use crate::error::{ErrorCode, ToolError};
use crate::events::EventSink;
use crate::ids::SessionId;
use crate::wire::InvocationContext;

/// A tool's fields on success, its error otherwise.
pub type ToolResult = Result<Map<String, Value>, ToolError>;

/// A tool's definition and the type its arguments parse into.
pub trait Define: Sync + 'static {
    /// Its arguments. Derives `JsonSchema` (the registry's schema) and refuses unknown
    /// members (`deny_unknown_fields`), see [`super::args`].
    type Args: DeserializeOwned + JsonSchema + Send + 'static;
    /// Name, group, risk, side effects, session need, where it runs, its profiles and how an
    /// approver sees its arguments.
    const DEF: &'static ToolDef;
}

/// How a tool of an actor runs.
pub trait Tool: Define {
    /// What the actor hands every tool of its table (its service, or what a call was placed
    /// with).
    type Host: Sync + 'static;

    /// Runs one call whose arguments parsed. The generic host checked the session (a tool
    /// whose definition needs one finds it in [`ToolCall::session`]), opened the span and
    /// numbers the events published through [`ToolCall::events`].
    fn run<'a>(
        &'a self,
        host: &'a Self::Host,
        call: &'a ToolCall<'a>,
        args: Self::Args,
    ) -> impl Future<Output = ToolResult> + Send + 'a;
}

/// A tool as the registry sees it: its definition and its arguments' JSON Schema.
pub trait Listed: Sync {
    fn def(&self) -> &'static ToolDef;
    fn schema(&self) -> Value;
}

impl<T: Define> Listed for T {
    fn def(&self) -> &'static ToolDef {
        T::DEF
    }

    fn schema(&self) -> Value {
        schema_of::<T::Args>()
    }
}

/// A definition with its schema given as a function: a tool as data (tests list such
/// neighbours beside a table).
#[derive(Debug, Clone, Copy)]
pub struct DefWithSchema {
    pub def: &'static ToolDef,
    pub schema: fn() -> Value,
}

impl Listed for DefWithSchema {
    fn def(&self) -> &'static ToolDef {
        self.def
    }

    fn schema(&self) -> Value {
        (self.schema)()
    }
}

/// A tool of a table: parses its arguments, then runs. Implemented for every [`Tool`].
pub trait Runnable<H>: Listed {
    fn run_value<'a>(&'a self, host: &'a H, call: &'a ToolCall<'a>) -> BoxFuture<'a, ToolResult>;
}

impl<T: Tool> Runnable<T::Host> for T {
    fn run_value<'a>(
        &'a self,
        host: &'a T::Host,
        call: &'a ToolCall<'a>,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let args = parse_args::<T::Args>(call.arguments)?;
            self.run(host, call, args).await
        })
    }
}

/// An actor's tools, in the order of PROTOCOL.md's tool table.
pub type Table<H> = &'static [&'static dyn Runnable<H>];

/// The entry of `name` in `table`: a name the table lacks finds nothing, never another tool.
pub fn find<E: ?Sized + Listed>(table: &[&'static E], name: &str) -> Option<&'static E> {
    table.iter().copied().find(|tool| tool.def().name == name)
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
