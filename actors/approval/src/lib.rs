//! toolmesh-approval: the approval actor. It keeps approvals durably and atomically in Redis,
//! answers the gateway's gate (`toolmesh.internal.v1.approval.gate`), its release
//! (`toolmesh.internal.v1.approval.release`: a used approval whose call never ran goes back to
//! approved), its withdrawal (`toolmesh.internal.v1.approval.withdraw`: a pending approval
//! whose caller cancelled the call that made it is rejected, reason `withdrawn`), the public
//! `toolmesh.v1.approvals.<account>.list|get|decide` and
//! `toolmesh.v1.grants.<account>.list|revoke` subjects, and announces every new and changed
//! approval on `…requested` / `…decided` (PROTOCOL.md, "Risk and approval", "Approval
//! policy").
//!
//! Architecture invariant: `store/` is the only code that speaks Redis, and every
//! read-then-write there is one Lua script timed by Redis `TIME`; the actor itself holds no
//! approval state, so any number of approval nodes can share one Redis.

pub mod config;
mod desk;
mod edit;
mod gate;
mod grants;
pub mod notify;
mod release;
mod requests;
mod service;
mod store;
pub mod variables;
mod withdraw;

use actix::Actor;
use toolmesh_kernel::host::{ActorHandle, InFlight, Lifecycle};
use toolmesh_kernel::metrics::Metrics;
use toolmesh_kernel::subjects;
use toolmesh_kernel::Role;

pub use config::{ApprovalConfig, NotifyConfig};
pub use desk::SWEEP_EVERY;
pub use gate::MAX_PREVIEW_CHARS;
pub use requests::{MAX_APPROVER_CHARS, MAX_LIST, MAX_REASON_CHARS};
pub use withdraw::{WITHDRAWN_BY, WITHDRAWN_REASON};

use crate::desk::{ApprovalDesk, Subscriptions};
use crate::service::ApprovalService;
use crate::store::ApprovalStore;

/// What the approval actor needs besides NATS.
#[derive(Clone)]
pub struct ApprovalSettings {
    /// `TOOLMESH_REDIS_*`: the server, or the sentinels, and what a decision waits for.
    pub redis: toolmesh_kernel::redis_link::RedisConfig,
    pub config: ApprovalConfig,
    /// The node's metrics: approvals pending (read from Redis on each scrape) and settled.
    pub metrics: Metrics,
    /// The audit trail every approval change is appended to (off without JetStream).
    pub audit: toolmesh_kernel::audit::AuditTrail,
    /// Where the node answers (`TOOLMESH_REPLY_PREFIXES`).
    pub replies: toolmesh_kernel::replies::ReplyPrefixes,
}

impl std::fmt::Debug for ApprovalSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config's `Debug` keeps passwords out of logs.
        f.debug_struct("ApprovalSettings")
            .field("redis", &self.redis)
            .field("config", &self.config)
            .finish()
    }
}

/// Why the approval actor could not start. Redis being down is not one of them: the actor
/// starts anyway, keeps connecting in the background and answers `unavailable` meanwhile.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalStartError {
    /// The URL is malformed (not echoed: it may hold a password).
    #[error("TOOLMESH_REDIS_URL is not a valid Redis URL: {0}")]
    RedisUrl(#[source] redis::RedisError),
    #[error("could not subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    #[error("could not confirm the approval subscriptions with the NATS server: {0}")]
    Confirm(#[source] toolmesh_kernel::host::ConfirmError),
    #[error("could not make the notifications' HTTP client: {0}")]
    NotifyClient(#[source] reqwest::Error),
}

/// Starts the approval actor; call inside an actix `System`. Returns once its subscriptions
/// are live on the server, so a request sent afterwards is answered.
pub async fn spawn(
    nats: async_nats::Client,
    settings: ApprovalSettings,
    lifecycle: Lifecycle,
    in_flight: InFlight,
) -> Result<ActorHandle, ApprovalStartError> {
    let link = toolmesh_kernel::redis_link::RedisLink::new(&settings.redis)
        .map_err(ApprovalStartError::RedisUrl)?;
    // Redis being down must not keep the node from starting: connect behind its back, from
    // now on so the connection is usually up by the time the first request arrives. If
    // subscribing fails below, the connect task ends with the store.
    link.connect();
    let store = ApprovalStore::new(link, &settings.config);
    let queue = subjects::queue::of(Role::Approval);
    let subscribe = |subject: &'static str| {
        let nats = nats.clone();
        let queue = queue.clone();
        async move {
            nats.queue_subscribe(subject, queue)
                .await
                .map_err(|source| ApprovalStartError::Subscribe {
                    subject: subject.to_owned(),
                    source,
                })
        }
    };
    let approvals = subscribe(subjects::public::APPROVALS_ANY).await?;
    let grants = subscribe(subjects::public::GRANTS_ANY).await?;
    let gate = subscribe(subjects::internal::APPROVAL_GATE).await?;
    let release = subscribe(subjects::internal::APPROVAL_RELEASE).await?;
    let withdraw = subscribe(subjects::internal::APPROVAL_WITHDRAW).await?;
    toolmesh_kernel::host::confirm_subscriptions(&nats)
        .await
        .map_err(ApprovalStartError::Confirm)?;
    let (handle, stop_notice) = ActorHandle::new(Role::Approval);
    // Every approval node reports the one store's counts (docs/metrics-and-traces.md: take the max).
    settings.metrics.on_scrape({
        let (store, metrics) = (store.clone(), settings.metrics.clone());
        move || {
            let (store, metrics) = (store.clone(), metrics.clone());
            Box::pin(async move {
                match store.pending_counts().await {
                    Ok(counts) => {
                        metrics.set_approvals_pending(counts.iter().map(|(a, n)| (a.as_str(), *n)))
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "approvals pending not refreshed")
                    }
                }
            })
        }
    });
    let service = ApprovalService {
        nats,
        store,
        config: settings.config,
        metrics: settings.metrics,
        audit: settings.audit,
    };
    let subscriptions = Subscriptions {
        approvals,
        grants,
        gate,
        release,
        withdraw,
        replies: settings.replies,
    };
    ApprovalDesk::new(service, lifecycle, in_flight, subscriptions, stop_notice).start();
    tracing::info!("approval actor subscribed");
    Ok(handle)
}

/// Starts the notifier of an approval node (`notify/`); call inside a tokio runtime. Returns
/// once its subscriptions are live on the server; its handle resolves once it has drained.
pub async fn spawn_notifier(
    nats: async_nats::Client,
    config: NotifyConfig,
    lifecycle: Lifecycle,
) -> Result<ActorHandle, ApprovalStartError> {
    let notifier = notify::Notifier::new(config, notify::Retry::default())
        .map_err(ApprovalStartError::NotifyClient)?;
    let mut events = Vec::new();
    for subject in subjects::public::approvals_events(None) {
        let sub = nats
            .queue_subscribe(subject.clone(), notify::QUEUE.to_owned())
            .await
            .map_err(|source| ApprovalStartError::Subscribe { subject, source })?;
        events.push(sub);
    }
    toolmesh_kernel::host::confirm_subscriptions(&nats)
        .await
        .map_err(ApprovalStartError::Confirm)?;
    let events = futures::stream::select_all(events);
    tracing::info!("approval notifier subscribed");
    Ok(ActorHandle::spawn(
        Role::Approval,
        notifier.run(events, lifecycle),
    ))
}
