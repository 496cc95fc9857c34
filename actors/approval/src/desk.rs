//! `ApprovalDesk`: the actor that owns the approval subscriptions, answers each request in its
//! own task, runs the expiry sweep, and drains on `Lifecycle::drain`.
//!
//! Runtime semantics: requests are answered concurrently (Redis scripts, not the actor, make
//! them atomic), in no particular order; each reply is published once (NATS core,
//! at-most-once). On drain the subscriptions are drained (messages already received are still
//! answered), the sweep stops, then the desk waits for its in-flight answers — or for
//! `Lifecycle::stop` — and stops.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use async_nats::Subscriber;
use futures::{FutureExt, StreamExt};
use tokio_util::task::TaskTracker;
use toolmesh_kernel::error::{ErrorCode, ToolError};
use toolmesh_kernel::host::{drainable, respond, InFlight, Lifecycle, StopNotice};
use toolmesh_kernel::replies::ReplyPrefixes;
use toolmesh_kernel::trace;
use toolmesh_kernel::wire::{error_body, GateOutcome, ReleaseAck, WithdrawAck};
use tracing::Instrument as _;

use crate::service::ApprovalService;

/// How often every approval node looks for expired approvals.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A request on a public approvals subject.
pub(crate) struct ApprovalsRequest(async_nats::Message);

/// A request on the internal gate subject.
pub(crate) struct GateCall(async_nats::Message);

/// A request on the internal release subject.
pub(crate) struct ReleaseCall(async_nats::Message);

/// A request on the internal withdraw subject.
pub(crate) struct WithdrawCall(async_nats::Message);

/// The desk's subscriptions, all in the `toolmesh.approval` queue group.
pub(crate) struct Subscriptions {
    /// `toolmesh.v1.approvals.>`
    pub approvals: Subscriber,
    /// `toolmesh.v1.grants.>`, answered as the approvals subjects are.
    pub grants: Subscriber,
    /// `toolmesh.internal.v1.approval.gate`
    pub gate: Subscriber,
    /// `toolmesh.internal.v1.approval.release`
    pub release: Subscriber,
    /// `toolmesh.internal.v1.approval.withdraw`
    pub withdraw: Subscriber,
    /// Where this node answers: public requests asking for another reply subject are dropped.
    pub replies: ReplyPrefixes,
}

pub(crate) struct ApprovalDesk {
    service: ApprovalService,
    lifecycle: Lifecycle,
    in_flight: InFlight,
    /// Answers and sweeps in progress, so drain can wait for them.
    tasks: TaskTracker,
    /// Taken in `started`, where they become streams.
    subscriptions: Option<Subscriptions>,
    open_streams: usize,
    /// At most one sweep per node at a time, however slow Redis is.
    sweeping: Arc<AtomicBool>,
    stopped: StopNotice,
}

impl ApprovalDesk {
    pub fn new(
        service: ApprovalService,
        lifecycle: Lifecycle,
        in_flight: InFlight,
        subscriptions: Subscriptions,
        stopped: StopNotice,
    ) -> Self {
        Self {
            service,
            lifecycle,
            in_flight,
            tasks: TaskTracker::new(),
            subscriptions: Some(subscriptions),
            open_streams: 0,
            sweeping: Arc::new(AtomicBool::new(false)),
            stopped,
        }
    }

    /// Answers `message` in a task of its own: one slow or broken request never holds up the
    /// others, and a panic in it becomes an `internal` reply instead of a silent drop.
    fn answer<F, Fut>(
        &self,
        message: async_nats::Message,
        kind: &'static str,
        work: F,
        on_panic: fn() -> Vec<u8>,
    ) where
        F: FnOnce(ApprovalService, async_nats::Message) -> Fut,
        Fut: Future<Output = Vec<u8>> + Send + 'static,
    {
        let Some(reply) = message.reply.clone() else {
            // Our own `requested` / `decided` events land here too: nobody waits for an answer.
            tracing::trace!(subject = %toolmesh_kernel::text::DisplaySafe(&message.subject), "{kind} message without reply subject ignored");
            return;
        };
        let guard = self.in_flight.enter();
        let service = self.service.clone();
        let nats = service.nats.clone();
        // A child of the span that sent it: the gateway's call, or whoever decides.
        let span = tracing::info_span!(
            "approval",
            otel.name = %format_args!("approval {kind}"),
            otel.kind = "server",
            kind
        );
        trace::follow(&span, message.headers.as_ref());
        let work = work(service, message).instrument(span);
        self.tasks.spawn(async move {
            let body = match AssertUnwindSafe(work).catch_unwind().await {
                Ok(body) => body,
                Err(_) => {
                    tracing::error!(
                        kind,
                        "an approval request handler panicked; answered internal"
                    );
                    on_panic()
                }
            };
            respond(&nats, Some(&reply), body).await;
            drop(guard);
        });
    }

    fn sweep(&mut self) {
        if self.lifecycle.drain.is_cancelled() || self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let service = self.service.clone();
        let sweeping = self.sweeping.clone();
        self.tasks.spawn(async move {
            if AssertUnwindSafe(service.sweep())
                .catch_unwind()
                .await
                .is_err()
            {
                tracing::error!("the approval sweep panicked; it runs again next round");
            }
            sweeping.store(false, Ordering::Release);
        });
    }

    /// Once every subscription has drained, wait for the answers in flight, then stop.
    fn stream_finished(&mut self, ctx: &mut Context<Self>) {
        self.open_streams = self.open_streams.saturating_sub(1);
        if self.open_streams > 0 {
            return;
        }
        tracing::info!("approval subscriptions drained; finishing requests in flight");
        self.tasks.close();
        let tasks = self.tasks.clone();
        let stop = self.lifecycle.stop.clone();
        ctx.wait(
            async move {
                tokio::select! {
                    _ = tasks.wait() => {}
                    _ = stop.cancelled() => tracing::warn!("approval desk stopped before its requests finished"),
                }
            }
            .into_actor(self)
            .map(|_, _, ctx| ctx.stop()),
        );
    }
}

impl Actor for ApprovalDesk {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(Subscriptions {
            approvals,
            grants,
            gate,
            release,
            withdraw,
            replies,
        }) = self.subscriptions.take()
        {
            let drain = self.lifecycle.drain.clone();
            ctx.add_stream(
                replies
                    .screen(futures::stream::select(
                        drainable(approvals, drain.clone()),
                        drainable(grants, drain.clone()),
                    ))
                    .map(ApprovalsRequest),
            );
            ctx.add_stream(drainable(gate, drain.clone()).map(GateCall));
            ctx.add_stream(drainable(release, drain.clone()).map(ReleaseCall));
            ctx.add_stream(drainable(withdraw, drain).map(WithdrawCall));
            self.open_streams = 4;
        }
        ctx.run_interval(SWEEP_EVERY, |desk, _| desk.sweep());
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        tracing::info!("approval desk stopped");
        self.stopped.notify();
    }
}

/// Each stream of the desk is answered by [`ApprovalDesk::answer`] in the same way: `work`
/// makes the reply body, `on_panic` the one sent should it panic. A release or a withdrawal
/// names the service's method and the ack's field that says whether it was done.
macro_rules! answered {
    ($request:ident, $kind:expr, $work:expr, $on_panic:expr) => {
        impl StreamHandler<$request> for ApprovalDesk {
            fn handle(&mut self, $request(message): $request, _: &mut Context<Self>) {
                self.answer(message, $kind, $work, $on_panic);
            }

            fn finished(&mut self, ctx: &mut Context<Self>) {
                self.stream_finished(ctx);
            }
        }
    };
    ($request:ident, $method:ident, $ack:ident.$field:ident) => {
        answered!(
            $request,
            stringify!($method),
            |service, message| async move {
                let ack = service.$method(&message.payload).await;
                ack_body(
                    serde_json::to_vec(&ack),
                    stringify!($method),
                    stringify!($field),
                )
            },
            || {
                let ack = $ack::failed(panicked());
                ack_body(
                    serde_json::to_vec(&ack),
                    stringify!($method),
                    stringify!($field),
                )
            }
        );
    };
}

answered!(
    ApprovalsRequest,
    "approvals",
    |service, message| async move {
        service
            .answer(message.subject.as_str(), &message.payload)
            .await
    },
    || error_body(panicked())
);

answered!(
    GateCall,
    "gate",
    |service, message| async move { gate_body(&service.pass_gate(&message.payload).await) },
    || {
        let error = panicked();
        gate_body(&GateOutcome::Refused {
            error: error.code,
            error_message: error.message,
            approval: None,
        })
    }
);

answered!(ReleaseCall, release, ReleaseAck.released);
answered!(WithdrawCall, withdraw, WithdrawAck.withdrawn);

/// Says that an answer could not be encoded, in place of that answer.
const ENCODE_FAILED: &str = "the approval actor could not encode its answer; see its logs";

/// A release or withdraw ack (`what`) as `encoded` JSON; should it not have serialized, an
/// internal error whose `field` (`released`, `withdrawn`) is false.
fn ack_body(encoded: serde_json::Result<Vec<u8>>, what: &str, field: &str) -> Vec<u8> {
    encoded.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a {what} ack does not serialize");
        format!(r#"{{"{field}":false,"approval":null,"error":"internal","error_message":"{ENCODE_FAILED}"}}"#).into_bytes()
    })
}

fn gate_body(outcome: &GateOutcome) -> Vec<u8> {
    serde_json::to_vec(outcome).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a gate outcome does not serialize");
        format!(r#"{{"outcome":"refused","error":"internal","error_message":"{ENCODE_FAILED}","approval":null}}"#).into_bytes()
    })
}

fn panicked() -> ToolError {
    ToolError::new(
        ErrorCode::Internal,
        "the approval actor failed on this request; look for \"handler panicked\" in the approval node's logs",
    )
}
