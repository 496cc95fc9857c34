//! The `Gateway` actor: owns the gateway's subscriptions as streams and hands each message to a
//! task of its own, so one slow call never holds up the next.

use std::sync::Arc;

use actix::prelude::*;
use async_nats::Message;
use tokio_util::task::TaskTracker;
use toolmesh_kernel::host::StopNotice;

use toolmesh_kernel::wire::ApprovalRequest;

use crate::call::handle_call;
use crate::cancel::handle_cancel;
use crate::core::GatewayCore;

/// A message on `toolmesh.v1.call.<account>`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallReceived(pub Message);

/// A message on `toolmesh.v1.cancel.<account>`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CancelReceived(pub Message);

/// A message on `toolmesh.v1.audit.<account>.query`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AuditQueried(pub Message);

/// A check of a reviewer's edited arguments (`toolmesh.internal.v1.gateway.check`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ArgumentsChecked(pub Message);

/// An `…decided` event (parked calls wait on these).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ApprovalDecided(pub Message);

pub struct Gateway {
    core: Arc<GatewayCore>,
    tasks: TaskTracker,
    open_streams: usize,
    stopped: StopNotice,
}

impl Gateway {
    pub fn new(core: Arc<GatewayCore>, open_streams: usize, stopped: StopNotice) -> Self {
        Self {
            core,
            tasks: TaskTracker::new(),
            open_streams,
            stopped,
        }
    }

    /// A stream ended (drained); once all have, wait for the calls still running, then stop.
    fn stream_finished(&mut self, ctx: &mut Context<Self>) {
        self.open_streams = self.open_streams.saturating_sub(1);
        if self.open_streams > 0 {
            return;
        }
        self.tasks.close();
        let tasks = self.tasks.clone();
        ctx.wait(
            async move { tasks.wait().await }
                .into_actor(self)
                .map(|_, _, ctx| ctx.stop()),
        );
    }
}

impl Actor for Gateway {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        tracing::info!("gateway drained");
        self.stopped.notify();
    }
}

impl StreamHandler<CallReceived> for Gateway {
    fn handle(&mut self, CallReceived(msg): CallReceived, _ctx: &mut Context<Self>) {
        self.tasks.spawn(handle_call(self.core.clone(), msg));
    }
    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.stream_finished(ctx);
    }
}

impl StreamHandler<CancelReceived> for Gateway {
    fn handle(&mut self, CancelReceived(msg): CancelReceived, _ctx: &mut Context<Self>) {
        self.tasks.spawn(handle_cancel(self.core.clone(), msg));
    }
    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.stream_finished(ctx);
    }
}

impl StreamHandler<ApprovalDecided> for Gateway {
    fn handle(&mut self, ApprovalDecided(msg): ApprovalDecided, _ctx: &mut Context<Self>) {
        match serde_json::from_slice::<ApprovalRequest>(&msg.payload) {
            // No receiver just means no call is parked right now.
            Ok(approval) => {
                let _ = self.core.decided.send(Arc::new(approval));
            }
            Err(e) => tracing::warn!(error = %e, "ignoring a malformed approval event"),
        }
    }
    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.stream_finished(ctx);
    }
}

impl StreamHandler<AuditQueried> for Gateway {
    fn handle(&mut self, AuditQueried(msg): AuditQueried, _ctx: &mut Context<Self>) {
        self.tasks
            .spawn(crate::audit::handle_query(self.core.clone(), msg));
    }
    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.stream_finished(ctx);
    }
}

impl StreamHandler<ArgumentsChecked> for Gateway {
    fn handle(&mut self, ArgumentsChecked(msg): ArgumentsChecked, _ctx: &mut Context<Self>) {
        self.tasks
            .spawn(crate::call::edit::handle_check(self.core.clone(), msg));
    }
    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.stream_finished(ctx);
    }
}
