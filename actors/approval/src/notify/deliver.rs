//! One notification to one webhook: signed, posted through the egress policy, retried.
//!
//! An attempt POSTs the body (`Content-Type: application/json`) with
//! `X-Toolmesh-Signature: sha256=<hex HMAC-SHA256 of the body>` when the webhook names
//! `secret_env`, and `X-Toolmesh-Delivery`, the same on every attempt of one delivery, so a
//! receiver can tell a retry from a new event. A 2xx answer delivers it; anything else (another
//! status, a timeout, a connection refused, a name that does not resolve) is retried after 1 s,
//! 2 s, 4 s… up to 60 s apart, until an attempt fails at least [`RETRY_FOR`] after the first.
//! Redirects are not followed (a 3xx fails).
//!
//! Two failures are never retried, since nothing would change: the egress policy refuses the
//! webhook's address, or its `secret_env` is unset or empty in the node's environment. The
//! latter fails closed: nothing is sent unsigned to a webhook that asked for a signature.
//!
//! Logs name a webhook by its origin only: a Slack webhook's path is its credential.

use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use toolmesh_kernel::egress::{Egress, EgressError};
use toolmesh_kernel::policy::NotifyEvent;
use url::Url;

/// The header of the body's signature.
pub const SIGNATURE_HEADER: &str = "X-Toolmesh-Signature";
/// The header naming a delivery, the same on each of its attempts.
pub const DELIVERY_HEADER: &str = "X-Toolmesh-Delivery";
/// The delay before the first retry.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest delay between two attempts.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// How long after its first attempt a failing delivery is still tried.
pub const RETRY_FOR: Duration = Duration::from_secs(600);
/// How long one attempt may take, answer included.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// When a failed delivery is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub first: Duration,
    pub max: Duration,
    pub for_at_least: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            first: FIRST_RETRY,
            max: MAX_RETRY_DELAY,
            for_at_least: RETRY_FOR,
        }
    }
}

/// `sha256=<hex HMAC-SHA256 of body with secret>`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The webhooks' HTTP client: the egress policy's resolver, no redirects, no proxy.
pub(crate) fn client(egress: &std::sync::Arc<Egress>) -> Result<reqwest::Client, reqwest::Error> {
    egress
        .client_builder()
        .timeout(ATTEMPT_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("toolmesh/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// How a webhook is named in logs: its origin, never its path or query.
pub(crate) fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// What became of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Worth trying again: why it failed.
    Failed(String),
    /// Never worth trying again: why not.
    Refused(String),
}

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered { attempts: u32 },
    Refused { why: String },
    GaveUp { attempts: u32, last: String },
}

/// Runs `attempt` until it delivers or refuses, or until one fails at least
/// `retry.for_at_least` after the first began; between failures it waits `retry.first`,
/// doubling up to `retry.max`.
pub async fn with_retries<F, A>(retry: Retry, mut attempt: A) -> Outcome
where
    A: FnMut(u32) -> F,
    F: std::future::Future<Output = Attempt>,
{
    let began = tokio::time::Instant::now();
    let mut delay = retry.first;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt(attempts).await {
            Attempt::Delivered => return Outcome::Delivered { attempts },
            Attempt::Refused(why) => return Outcome::Refused { why },
            Attempt::Failed(last) if began.elapsed() >= retry.for_at_least => {
                return Outcome::GaveUp { attempts, last }
            }
            Attempt::Failed(_) => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(retry.max);
    }
}

/// One notification on its way to one webhook.
pub(crate) struct Delivery {
    pub url: Url,
    pub body: Bytes,
    pub secret_env: Option<String>,
    pub event: NotifyEvent,
    pub approval_id: String,
    pub id: uuid::Uuid,
}

impl Delivery {
    /// Delivers it, retrying, and logs what became of it.
    pub(crate) async fn run(&self, client: &reqwest::Client, egress: &Egress, retry: Retry) {
        let outcome = with_retries(retry, |n| self.attempt(client, egress, n)).await;
        let (webhook, event, id) = (origin(&self.url), self.event.as_str(), &self.approval_id);
        match outcome {
            Outcome::Delivered { attempts } => {
                tracing::info!(webhook, event, id, attempts, "notification delivered")
            }
            Outcome::Refused { why } => {
                tracing::error!(webhook, event, id, why, "notification not sent")
            }
            Outcome::GaveUp { attempts, last } => tracing::error!(
                webhook,
                event,
                id,
                attempts,
                last,
                "notification not delivered; given up after retrying for {} s",
                retry.for_at_least.as_secs()
            ),
        }
    }

    /// What the node's stop makes of a delivery still under way.
    pub(crate) fn abandoned(&self) {
        tracing::error!(
            webhook = origin(&self.url),
            event = self.event.as_str(),
            id = self.approval_id,
            "notification abandoned: the node stopped before it was delivered"
        );
    }

    async fn attempt(&self, client: &reqwest::Client, egress: &Egress, n: u32) -> Attempt {
        let mut request = client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(DELIVERY_HEADER, self.id.to_string());
        if let Some(var) = &self.secret_env {
            // Read when delivering, so the secret is never kept in the policy or a log.
            match std::env::var(var) {
                Ok(secret) if !secret.is_empty() => {
                    request = request.header(SIGNATURE_HEADER, signature(secret.as_bytes(), &self.body));
                }
                _ => {
                    return Attempt::Refused(format!(
                        "its secret_env {var} is unset or empty on this node, and it is not sent unsigned"
                    ))
                }
            }
        }
        // IP literals never reach the client's resolver: checked here, names again there.
        match egress.check_url(&self.url).await {
            Ok(_) => {}
            Err(EgressError::Refused(refusal)) => {
                return Attempt::Refused(format!("the web egress policy refuses it: {refusal}"))
            }
            Err(e) => return self.failed(n, e.to_string()),
        }
        match request.body(self.body.clone()).send().await {
            Ok(response) if response.status().is_success() => Attempt::Delivered,
            Ok(response) => self.failed(n, format!("HTTP {}", response.status())),
            Err(e) => self.failed(n, toolmesh_kernel::egress::chain(&e.without_url())),
        }
    }

    fn failed(&self, n: u32, why: String) -> Attempt {
        let (webhook, event, id) = (origin(&self.url), self.event.as_str(), &self.approval_id);
        if n == 1 {
            tracing::warn!(
                webhook,
                event,
                id,
                why,
                "notification not delivered; retrying"
            );
        } else {
            tracing::debug!(
                webhook,
                event,
                id,
                why,
                attempt = n,
                "notification not delivered; retrying"
            );
        }
        Attempt::Failed(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hex_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_delivery_is_retried_with_backoff_for_at_least_ten_minutes() {
        let began = tokio::time::Instant::now();
        let mut at = Vec::new();
        let outcome = with_retries(Retry::default(), |_| {
            at.push(began.elapsed().as_secs());
            std::future::ready(Attempt::Failed("HTTP 500".into()))
        })
        .await;
        assert_eq!(&at[..8], [0, 1, 3, 7, 15, 31, 63, 123]);
        let last = *at.last().unwrap();
        assert!((600..660).contains(&last), "{at:?}");
        let attempts = at.len() as u32;
        let last = "HTTP 500".to_owned();
        assert_eq!(outcome, Outcome::GaveUp { attempts, last });
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_stops_at_its_first_success_or_refusal() {
        let outcome = with_retries(Retry::default(), |n| {
            std::future::ready(if n < 3 {
                Attempt::Failed("HTTP 500".into())
            } else {
                Attempt::Delivered
            })
        })
        .await;
        assert_eq!(outcome, Outcome::Delivered { attempts: 3 });
        let outcome = with_retries(Retry::default(), |_| {
            std::future::ready(Attempt::Refused("loopback address 127.0.0.1".into()))
        })
        .await;
        assert!(matches!(outcome, Outcome::Refused { .. }));
    }
}
