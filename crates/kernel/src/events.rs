//! RunEvents of one invocation, numbered without gaps: the gateway's ([`RunEvents`]), an actor's
//! ([`EventSink`], from the number the gateway handed over) and the `finished` event an actor
//! publishes in the gateway's place (`host::answer`) all take their numbers from [`EventSeq`].
//!
//! Events go out on core NATS (at most once), but for the gateway's `finished` where the node
//! keeps `TOOLMESH_EVENTS`: that one the stream confirms before the call is answered
//! ([`publish_kept`]), so a call answered is a call whose `finished` the replay has, even when
//! a NATS server dies in between.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::Client;
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::streams::{Durability, EventsConfig};
use crate::subjects::public;
use crate::wire::{run_event, InvocationContext, RunEventKind};

/// How long [`publish_kept`] keeps asking while `TOOLMESH_EVENTS` does not confirm an event
/// (no leader, the server gone): a replicated stream elects a new leader within about 10 s.
pub const KEPT_BUDGET: Duration = Duration::from_secs(15);

/// How long one publish of [`publish_kept`] waits for the stream's answer.
const KEPT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest pause between two publishes of [`publish_kept`].
const KEPT_MAX_PAUSE: Duration = Duration::from_millis(250);

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
    /// The node keeps `TOOLMESH_EVENTS`: `finished` is published through it.
    kept: bool,
}

impl RunEvents {
    /// The events of `ctx`'s call; `events` says whether the node keeps them in a stream.
    pub fn new(client: Client, ctx: &InvocationContext, events: &EventsConfig) -> Self {
        Self {
            client,
            subject: public::events(&ctx.account, &ctx.invocation_id),
            seq: EventSeq::default(),
            kept: matches!(events.durability.get(), Some(Durability::Durable { .. })),
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
        let body = Bytes::from(run_event(ctx, tool, self.seq.hand_out(), kind, &extra));
        if self.kept && kind == RunEventKind::Finished {
            // Boxed: a caller's future (the gateway's call) keeps its size.
            if let Err(e) = Box::pin(publish_kept(&self.client, &self.subject, body)).await {
                tracing::warn!(error = %e, "the stream did not confirm a finished event");
            }
            return;
        }
        // Events are best effort (NATS core): a failed publish must not fail the call.
        if let Err(e) = self.client.publish(self.subject.clone(), body).await {
            tracing::warn!(error = %e, "could not publish a run event");
        }
    }
}

/// Publishes `body` on the events subject `subject` and waits until the stream that keeps it
/// has stored it: its stream sequence. A publish whose answer is lost is sent again with the
/// same `Nats-Msg-Id`, so the stream keeps the event once however many tries it took. Gives
/// up after [`KEPT_BUDGET`] without an answer (the event may then be missing).
pub async fn publish_kept(client: &Client, subject: &str, body: Bytes) -> Result<u64, String> {
    let js = jetstream::new(client.clone());
    let id = nuid::next().to_string();
    let deadline = tokio::time::Instant::now() + KEPT_BUDGET;
    let mut attempt = 0u32;
    loop {
        let message = jetstream::message::PublishMessage::build()
            .payload(body.clone())
            .message_id(&id);
        let acked = tokio::time::timeout(KEPT_PUBLISH_TIMEOUT, async {
            js.send_publish(subject.to_owned(), message).await?.await
        })
        .await;
        let why = match acked {
            // Sequence 0: a duplicate of a publish still being stored; ask again.
            Ok(Ok(ack)) if !(ack.duplicate && ack.sequence == 0) => return Ok(ack.sequence),
            Ok(Ok(_)) => "an earlier publish is still being stored".to_owned(),
            Ok(Err(e)) if e.kind() == PublishErrorKind::StreamNotFound => {
                format!("no stream answered ({e}): it has no leader, or is gone")
            }
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    PublishErrorKind::TimedOut
                        | PublishErrorKind::BrokenPipe
                        | PublishErrorKind::MaxAckPending
                ) =>
            {
                e.to_string()
            }
            // Refused (too large, …): asking again changes nothing.
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => format!("no answer within {KEPT_PUBLISH_TIMEOUT:?}"),
        };
        attempt += 1;
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{why}, for {KEPT_BUDGET:?}"));
        }
        let pause = Duration::from_millis(10u64 << attempt.min(8)).min(KEPT_MAX_PAUSE);
        tokio::time::sleep(pause).await;
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
