//! What the root benchmarks share: percentiles, units, the machine's load, sequential
//! request/reply timing, and a raw NATS responder to measure the tools against. Each bench
//! compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;

/// The `p` quantile (0..=1) of durations sorted ascending.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Sequential request/reply round trips, appended to `out`.
pub async fn latencies(
    client: &async_nats::Client,
    subject: &str,
    body: &Bytes,
    samples: usize,
    out: &mut Vec<Duration>,
) {
    for _ in 0..samples {
        let t = Instant::now();
        let reply = client
            .request(subject.to_owned(), body.clone())
            .await
            .expect("request");
        out.push(t.elapsed());
        assert!(!reply.payload.is_empty());
    }
}

/// Starts a raw responder on `subject` answering every request with `reply` (its own thread,
/// connection and runtime, like a node), and returns once `client` gets answers from it.
pub async fn start_raw_responder(
    client: &async_nats::Client,
    url: &str,
    subject: &'static str,
    reply: Bytes,
    body: &Bytes,
) {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let responder = async_nats::connect(url).await.expect("responder connects");
            let mut sub = responder.subscribe(subject).await.expect("subscribe");
            while let Some(msg) = sub.next().await {
                if let Some(to) = msg.reply {
                    let _ = responder.publish(to, reply.clone()).await;
                }
            }
        });
    });
    let ready = toolmesh_testkit::wait_until(Duration::from_secs(5), || async {
        client.request(subject, body.clone()).await.is_ok()
    })
    .await;
    assert!(ready, "raw responder did not come up");
}
