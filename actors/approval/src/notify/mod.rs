//! The notifier: posts approval events to the policy file's `[[notify]]` webhooks (PROTOCOL.md
//! "Approval policy", "Notifications").
//!
//! It hears what the approval actor announces (`toolmesh.v1.approvals.*.requested|decided`) in
//! a queue group of its own, [`QUEUE`], so each event reaches one approval node of the cluster,
//! and that node posts it to each webhook that wants it. The events:
//!
//! | announced | notification |
//! |---|---|
//! | `…requested`, `escalated: false` | `requested` |
//! | `…requested`, `escalated: true` | `escalated` |
//! | `…decided`, status `approved` or `rejected` | `decided` |
//! | `…decided`, status `expired` | `expired` |
//! | `…decided`, status `used` | none |
//!
//! `used` is skipped, and so an approval approved in band by its own first call (announced only
//! as `used`) is never posted as `decided`. An approval given back to `approved` after its call
//! reached no actor is announced again and posted as `decided` a second time.
//!
//! Delivery ([`deliver`]): through the web egress policy (`TOOLMESH_WEB_ALLOWED_NETWORKS`), signed
//! when the webhook names `secret_env`, retried with backoff for at least
//! [`deliver::RETRY_FOR`]. NATS core is at most once: an event lost on the bus (or on a node
//! that stops with deliveries outstanding) is a notification lost; the approval itself is in
//! Redis.
//!
//! Bounds: each webhook (by URL) has at most [`MAX_IN_FLIGHT`] deliveries outstanding, retries
//! included; past that an event for it is dropped with an error, so a webhook that is down
//! holds up neither the others nor the intake.
//!
//! Drain: the subscription ends at once (other approval nodes take the events); outstanding
//! deliveries go on until the drain deadline, then are abandoned, each logged.

mod body;
pub mod deliver;

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::Message;
use futures::{Stream, StreamExt};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use toolmesh_kernel::egress::Egress;
use toolmesh_kernel::host::Lifecycle;
use toolmesh_kernel::policy::{LivePolicy, NotifyEvent, NotifyFormat};
use toolmesh_kernel::subjects::public::{approvals_parts, ApprovalVerb};
use toolmesh_kernel::wire::{ApprovalRequest, ApprovalStatus};
use url::Url;

pub use body::{json_body, slack_body};
pub use deliver::{signature, Retry, SIGNATURE_HEADER};

use crate::config::NotifyConfig;
use deliver::Delivery;

/// The notifier's queue group: its own, not the approval role's, whose subscription to
/// `toolmesh.v1.approvals.>` would otherwise compete with it for the same events.
pub const QUEUE: &str = "toolmesh-notify";

/// Deliveries one webhook may have outstanding at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// The notification an announced change makes, if any (see the module's table).
pub fn event_of(verb: ApprovalVerb, approval: &ApprovalRequest) -> Option<NotifyEvent> {
    match (verb, approval.status) {
        (ApprovalVerb::Requested, _) if approval.escalated => Some(NotifyEvent::Escalated),
        (ApprovalVerb::Requested, _) => Some(NotifyEvent::Requested),
        (ApprovalVerb::Decided, ApprovalStatus::Approved | ApprovalStatus::Rejected) => {
            Some(NotifyEvent::Decided)
        }
        (ApprovalVerb::Decided, ApprovalStatus::Expired) => Some(NotifyEvent::Expired),
        _ => None,
    }
}

/// The notifier of one approval node.
pub(crate) struct Notifier {
    policy: LivePolicy,
    console_url: Option<Url>,
    client: reqwest::Client,
    egress: Arc<Egress>,
    retry: Retry,
    /// Per webhook URL: its outstanding deliveries.
    room: HashMap<String, Arc<Semaphore>>,
}

impl Notifier {
    pub(crate) fn new(config: NotifyConfig, retry: Retry) -> Result<Notifier, reqwest::Error> {
        let egress = Arc::new(config.egress);
        let client = deliver::client(&egress)?;
        Ok(Notifier {
            policy: config.policy,
            console_url: config.console_url,
            client,
            egress,
            retry,
            room: HashMap::new(),
        })
    }

    /// Takes events until the drain, then waits for outstanding deliveries (each of which ends
    /// at the drain deadline by itself).
    pub(crate) async fn run(mut self, events: impl Stream<Item = Message>, lifecycle: Lifecycle) {
        let deliveries = TaskTracker::new();
        let mut events = Box::pin(events);
        loop {
            let msg = tokio::select! {
                biased;
                _ = lifecycle.drain.cancelled() => break,
                msg = events.next() => match msg {
                    Some(msg) => msg,
                    None => break,
                },
            };
            self.take(&msg, &deliveries, &lifecycle);
        }
        // Unsubscribes: from now on the other approval nodes take the events.
        drop(events);
        deliveries.close();
        if !deliveries.is_empty() {
            tracing::info!(
                outstanding = deliveries.len(),
                "waiting for notifications still being delivered"
            );
        }
        deliveries.wait().await;
    }

    /// Starts a delivery of `msg` to each webhook that wants its event.
    fn take(&mut self, msg: &Message, deliveries: &TaskTracker, lifecycle: &Lifecycle) {
        let Ok((account, verb, None)) = approvals_parts(msg.subject.as_str()) else {
            return;
        };
        let approval = match serde_json::from_slice::<ApprovalRequest>(&msg.payload) {
            Ok(approval) if approval.account.as_str() == account => approval,
            Ok(approval) => {
                tracing::warn!(subject = %msg.subject, id = %approval.id, "an approval event names another account than its subject; not notified");
                return;
            }
            Err(e) => {
                tracing::warn!(subject = %msg.subject, error = %e, "an approval event is not an ApprovalRequest; not notified");
                return;
            }
        };
        let Some(event) = event_of(verb, &approval) else {
            return;
        };
        let policy = self.policy.current();
        for hook in policy.notify().iter().filter(|hook| hook.wants(event)) {
            let room = self
                .room
                .entry(hook.url.as_str().to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(MAX_IN_FLIGHT)));
            let Ok(permit) = room.clone().try_acquire_owned() else {
                tracing::error!(webhook = %deliver::origin(&hook.url), event = event.as_str(), id = %approval.id, max = MAX_IN_FLIGHT, "a webhook has too many notifications outstanding; this one is dropped");
                continue;
            };
            let body = match hook.format {
                NotifyFormat::Json => json_body(event, &approval),
                NotifyFormat::Slack => slack_body(event, &approval, self.console_url.as_ref()),
            };
            let delivery = Delivery {
                url: hook.url.clone(),
                body: body.into(),
                secret_env: hook.secret_env.clone(),
                event,
                approval_id: approval.id.clone(),
                id: uuid::Uuid::new_v4(),
            };
            let (client, egress, retry) = (self.client.clone(), self.egress.clone(), self.retry);
            let stop = lifecycle.stop.clone();
            deliveries.spawn(async move {
                let _permit = permit;
                tokio::select! {
                    _ = stop.cancelled() => delivery.abandoned(),
                    _ = delivery.run(&client, &egress, retry) => {}
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn approval() -> ApprovalRequest {
        serde_json::from_value(serde_json::json!({
            "id": "appr_1", "account": "acme", "session_id": "s1", "invocation_id": "inv-1",
            "tool_name": "run_command", "risk_level": "high", "side_effects": [],
            "arguments_sha256": "00", "arguments_preview": "{\"command\": \"rm -rf /tmp/x\"}",
            "status": "pending", "created_at": "2030-01-01T00:00:00Z",
            "expires_at": "2030-01-01T01:00:00Z", "decided_by": null, "decided_at": null,
            "reason": null, "reviewers": "ops"
        }))
        .unwrap()
    }

    #[test]
    fn each_announcement_makes_its_event_and_used_makes_none() {
        let check = |verb, status, escalated, want: Option<NotifyEvent>| {
            let mut a = approval();
            a.status = status;
            a.escalated = escalated;
            assert_eq!(event_of(verb, &a), want, "{verb:?} {status:?} {escalated}");
        };
        use ApprovalStatus::*;
        use ApprovalVerb::{Decided, Requested};
        check(Requested, Pending, false, Some(NotifyEvent::Requested));
        check(Requested, Pending, true, Some(NotifyEvent::Escalated));
        check(Decided, Approved, false, Some(NotifyEvent::Decided));
        check(Decided, Rejected, true, Some(NotifyEvent::Decided));
        check(Decided, Expired, true, Some(NotifyEvent::Expired));
        check(Decided, Used, false, None);
        check(Decided, Pending, false, None);
        check(ApprovalVerb::Decide, Approved, false, None);
    }
}
