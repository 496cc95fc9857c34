//! RunEvents of one invocation, numbered without gaps: the gateway's ([`RunEvents`]), an actor's
//! ([`EventSink`], from the number the gateway handed over) and the `finished` event an actor
//! publishes in the gateway's place (`host::answer`) all take their numbers from [`EventSeq`].

use std::sync::{Mutex, OnceLock};

use async_nats::Client;
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::subjects::public;
use crate::wire::{run_event, InvocationContext, RunEventKind};

/// The numbers of an invocation's events; the gateway's count from 0. Every `seq` the gateway
/// publishes comes from [`EventSeq::hand_out`]; an actor the call is routed to continues from
/// [`EventSeq::hand_over`] (`ActorCall.event_seq`, [`EventSeq::from`]) and reports how many it
/// used ([`EventSeq::handed_back`], `ActorReply.events_emitted`).
#[derive(Debug, Default, Clone, Copy)]
pub struct EventSeq {
    next: u64,
}

impl From<u64> for EventSeq {
    /// The numbers from `first` on (an actor's, from `ActorCall.event_seq`).
    fn from(first: u64) -> Self {
        Self { next: first }
    }
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
        self.next = self.next.saturating_add(published_elsewhere);
    }
}

/// Publishes the gateway's events of one invocation, numbered by its [`EventSeq`].
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

/// Publishes a call's RunEvents from the actor, numbering them on from the gateway's
/// (`ActorCall.event_seq`) without gaps, and counts them for `events_emitted`.
#[derive(Debug)]
pub struct EventSink<'a> {
    client: &'a async_nats::Client,
    ctx: &'a InvocationContext,
    tool: &'a str,
    /// The events subject, made at the first event: most tools publish none.
    subject: OnceLock<String>,
    first_seq: u64,
    seq: Mutex<EventSeq>,
}

impl<'a> EventSink<'a> {
    /// Events of `ctx`'s call from `first_seq` on.
    pub fn new(
        client: &'a async_nats::Client,
        ctx: &'a InvocationContext,
        tool: &'a str,
        first_seq: u64,
    ) -> Self {
        Self {
            client,
            ctx,
            tool,
            subject: OnceLock::new(),
            first_seq,
            seq: Mutex::new(EventSeq::from(first_seq)),
        }
    }

    /// Publishes one event of `kind` with `extra` members; a failed publish is logged, and
    /// its `seq` still counts (the gateway's numbering stays gap-free from its side).
    pub async fn publish(&self, kind: RunEventKind, extra: &Map<String, Value>) {
        let seq = self.seq.lock().expect("the event numbers").hand_out();
        let body = run_event(self.ctx, self.tool, seq, kind, extra);
        let subject = (self.subject)
            .get_or_init(|| public::events(&self.ctx.account, &self.ctx.invocation_id));
        let sent = self.client.publish(subject.clone(), Bytes::from(body));
        if let Err(e) = sent.await {
            tracing::warn!(error = %e, "cannot publish a run event");
        }
    }

    /// How many events this call published.
    pub fn emitted(&self) -> u64 {
        let next = self.seq.lock().expect("the event numbers").hand_over();
        next - self.first_seq
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
