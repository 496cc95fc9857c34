//! What a test does as a client: wait until a condition holds, and send a NATS request and
//! read its JSON reply.

use std::time::{Duration, Instant};

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a JSON request and parses the JSON reply.
pub async fn request_json(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: serde_json::Value,
) -> serde_json::Value {
    request_raw(client, subject, serde_json::to_vec(&body).expect("json")).await
}

/// Sends raw bytes and parses the JSON reply (10 s timeout).
pub async fn request_raw(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: Vec<u8>,
) -> serde_json::Value {
    request_raw_within(client, subject, body, Duration::from_secs(10)).await
}

/// [`request_json`], waiting up to `wait` for the reply: for a call whose own time limit is
/// longer than the default 10 s.
pub async fn request_json_within(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: serde_json::Value,
    wait: Duration,
) -> serde_json::Value {
    request_raw_within(
        client,
        subject,
        serde_json::to_vec(&body).expect("json"),
        wait,
    )
    .await
}

async fn request_raw_within(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: Vec<u8>,
    wait: Duration,
) -> serde_json::Value {
    let subject = subject.into();
    let request = async_nats::Request::new()
        .payload(body.into())
        .timeout(Some(wait));
    let reply = tokio::time::timeout(wait, client.send_request(subject.clone(), request))
        .await
        .unwrap_or_else(|_| panic!("no reply on {subject} within {wait:?}"))
        .unwrap_or_else(|e| panic!("request on {subject} failed: {e}"));
    serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|e| panic!("reply on {subject} is not JSON ({e}): {:?}", reply.payload))
}
