//! RunEvents of one invocation, numbered without gaps.

use async_nats::Client;
use bytes::Bytes;
use serde_json::{Map, Value};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::wire::{run_event, InvocationContext, RunEventKind};

/// Publishes the events of one invocation; `seq` counts from 0. An actor the call is routed to
/// continues the count from [`RunEvents::next_seq`] and reports how many it used.
#[derive(Debug)]
pub struct RunEvents {
    client: Client,
    subject: String,
    next: u64,
}

impl RunEvents {
    pub fn new(client: Client, ctx: &InvocationContext) -> Self {
        Self {
            client,
            subject: public::events(&ctx.account, &ctx.invocation_id),
            next: 0,
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Accounts for events another actor published for this invocation.
    pub fn skip(&mut self, published_elsewhere: u64) {
        self.next += published_elsewhere;
    }

    pub async fn emit(
        &mut self,
        ctx: &InvocationContext,
        tool: &str,
        kind: RunEventKind,
        extra: Map<String, Value>,
    ) {
        let body = run_event(ctx, tool, self.next, kind, &extra);
        self.next += 1;
        // Events are best effort (NATS core): a failed publish must not fail the call.
        if let Err(e) = self
            .client
            .publish(self.subject.clone(), Bytes::from(body))
            .await
        {
            tracing::warn!(error = %e, "could not publish a run event");
        }
    }
}
