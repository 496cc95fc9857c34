//! RunEvents of one invocation, numbered without gaps.

use async_nats::Client;
use bytes::Bytes;
use serde_json::{Map, Value};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::wire::{run_event, InvocationContext, RunEventKind};

/// The one owner of an invocation's event numbers in this gateway; `seq` counts from 0. Every
/// `seq` the gateway publishes comes from [`EventSeq::hand_out`]; an actor the call is routed
/// to continues from [`EventSeq::hand_over`] (`ActorCall.event_seq`) and reports how many it
/// used ([`EventSeq::handed_back`]).
#[derive(Debug, Default)]
pub struct EventSeq {
    next: u64,
}

impl EventSeq {
    /// The next number, for an event this gateway publishes.
    pub fn hand_out(&mut self) -> u64 {
        let seq = self.next;
        self.next += 1;
        seq
    }

    /// The first number an actor the call is routed to may use.
    pub fn hand_over(&self) -> u64 {
        self.next
    }

    /// Accounts for events another actor published for this invocation.
    pub fn handed_back(&mut self, published_elsewhere: u64) {
        self.next += published_elsewhere;
    }
}

/// Publishes the events of one invocation, numbered by its [`EventSeq`].
#[derive(Debug)]
pub struct RunEvents {
    client: Client,
    subject: String,
    seq: EventSeq,
}

impl RunEvents {
    pub fn new(client: Client, ctx: &InvocationContext) -> Self {
        Self {
            client,
            subject: public::events(&ctx.account, &ctx.invocation_id),
            seq: EventSeq::default(),
        }
    }

    /// The invocation's numbers, to hand over to an actor and take back.
    pub fn seq(&mut self) -> &mut EventSeq {
        &mut self.seq
    }

    pub async fn emit(
        &mut self,
        ctx: &InvocationContext,
        tool: &str,
        kind: RunEventKind,
        extra: Map<String, Value>,
    ) {
        let body = run_event(ctx, tool, self.seq.hand_out(), kind, &extra);
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

#[cfg(test)]
mod tests {
    use super::EventSeq;

    #[test]
    fn numbers_run_on_without_gaps_across_an_actor() {
        let mut seq = EventSeq::default();
        assert_eq!(seq.hand_out(), 0, "started");
        assert_eq!(seq.hand_over(), 1, "the actor's first event");
        assert_eq!(seq.hand_over(), 1, "handing over takes no number");
        seq.handed_back(2);
        assert_eq!(seq.hand_out(), 3, "finished, after the actor's two");
    }
}
