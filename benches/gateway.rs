//! Gateway overhead against raw NATS, measured in one run on the same server and payload.
//!
//! `cargo bench --bench gateway` starts a nats-server and one `toolmesh node --roles gateway`,
//! then measures (1) raw async-nats request/reply to an echo responder answering with the
//! bytes `component_status` answers, and (2) `component_status` through the gateway:
//! sequential p50/p99 and the ratio, then throughput with 64 requests in flight.
//!
//! The two are measured in alternating rounds (raw, gateway, raw, …) so that both see the same
//! machine: on a shared 2-core box, noise from outside moves both figures, not one.
#![allow(clippy::print_stdout)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use toolmesh_testkit::{NatsServer, NodeSpec};

const WARMUP: usize = 2_000;
const ROUNDS: usize = 10;
const SAMPLES_PER_ROUND: usize = 2_000;
const IN_FLIGHT: usize = 64;
const THROUGHPUT_ROUNDS: usize = 5;
const THROUGHPUT_ROUND: Duration = Duration::from_secs(1);
const BODY: &[u8] = br#"{"tool":"component_status"}"#;
const RAW: &str = "bench.raw";
const GATEWAY: &str = "toolmesh.v1.call.bench";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// Sequential request/reply round trips, appended to `out`.
async fn latencies(
    client: &async_nats::Client,
    subject: &str,
    samples: usize,
    out: &mut Vec<Duration>,
) {
    for _ in 0..samples {
        let t = Instant::now();
        let reply = client
            .request(subject.to_owned(), Bytes::from_static(BODY))
            .await
            .expect("request");
        out.push(t.elapsed());
        assert!(!reply.payload.is_empty());
    }
}

/// Calls completed with `IN_FLIGHT` requests outstanding during `window`, and the time taken.
async fn throughput(
    client: &async_nats::Client,
    subject: &str,
    window: Duration,
) -> (u64, Duration) {
    let deadline = Instant::now() + window;
    let done = Arc::new(AtomicU64::new(0));
    let workers = (0..IN_FLIGHT).map(|_| {
        let client = client.clone();
        let subject = subject.to_owned();
        let done = done.clone();
        tokio::spawn(async move {
            while Instant::now() < deadline {
                client
                    .request(subject.clone(), Bytes::from_static(BODY))
                    .await
                    .expect("request");
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    let started = Instant::now();
    futures::future::join_all(workers).await;
    (done.load(Ordering::Relaxed), started.elapsed())
}

fn main() {
    // One thread for the load: a multi-thread runtime's cross-thread wakeups halved the raw
    // figure on 2 cores, which would flatter every ratio.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let nats = NatsServer::start();
        let client = nats.client().await;
        let threads = std::env::var("TOOLMESH_WORKER_THREADS").unwrap_or_else(|_| "0".into());
        let _node = NodeSpec::new(env!("CARGO_BIN_EXE_toolmesh"), "gateway", "bench-node")
            .env("TOOLMESH_NATS_URL", nats.url())
            .env("TOOLMESH_WORKER_THREADS", threads.clone())
            .start(&client)
            .await;
        let sample = client
            .request(GATEWAY, Bytes::from_static(BODY))
            .await
            .expect("component_status")
            .payload;
        let parsed: serde_json::Value = serde_json::from_slice(&sample).expect("JSON reply");
        assert_eq!(parsed["ok"], true, "{parsed}");

        // The raw responder: its own thread, connection and runtime, answering with the same
        // bytes the gateway answers with.
        let url = nats.url();
        let reply = sample.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let responder = async_nats::connect(url).await.expect("responder connects");
                let mut sub = responder.subscribe(RAW).await.expect("subscribe");
                while let Some(msg) = sub.next().await {
                    if let Some(to) = msg.reply {
                        let _ = responder.publish(to, reply.clone()).await;
                    }
                }
            });
        });
        let ready = toolmesh_testkit::wait_until(Duration::from_secs(5), || async {
            client.request(RAW, Bytes::from_static(BODY)).await.is_ok()
        })
        .await;
        assert!(ready, "raw responder did not come up");

        let mut warm = Vec::new();
        latencies(&client, RAW, WARMUP, &mut warm).await;
        latencies(&client, GATEWAY, WARMUP, &mut warm).await;
        let (mut raw, mut gw) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            latencies(&client, RAW, SAMPLES_PER_ROUND, &mut raw).await;
            latencies(&client, GATEWAY, SAMPLES_PER_ROUND, &mut gw).await;
        }
        raw.sort();
        gw.sort();
        let (mut raw_calls, mut raw_time) = (0, Duration::ZERO);
        let (mut gw_calls, mut gw_time) = (0, Duration::ZERO);
        for _ in 0..THROUGHPUT_ROUNDS {
            let (n, t) = throughput(&client, RAW, THROUGHPUT_ROUND).await;
            raw_calls += n;
            raw_time += t;
            let (n, t) = throughput(&client, GATEWAY, THROUGHPUT_ROUND).await;
            gw_calls += n;
            gw_time += t;
        }
        let raw_tp = raw_calls as f64 / raw_time.as_secs_f64();
        let gw_tp = gw_calls as f64 / gw_time.as_secs_f64();

        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (rp50, rp99) = (percentile(&raw, 0.5), percentile(&raw, 0.99));
        let (gp50, gp99) = (percentile(&gw, 0.5), percentile(&gw, 0.99));
        println!(
            "toolmesh gateway bench: reply {} bytes; {} sequential samples each; {IN_FLIGHT} in flight for {THROUGHPUT_ROUNDS} x {} s each; alternating rounds; node worker threads {threads}",
            sample.len(),
            ROUNDS * SAMPLES_PER_ROUND,
            THROUGHPUT_ROUND.as_secs()
        );
        println!("{:<28} {:>10} {:>10} {:>14}", "", "p50 µs", "p99 µs", "calls/s");
        println!("{:<28} {:>10.1} {:>10.1} {:>14.0}", "raw async-nats req/reply", us(rp50), us(rp99), raw_tp);
        println!("{:<28} {:>10.1} {:>10.1} {:>14.0}", "component_status (gateway)", us(gp50), us(gp99), gw_tp);
        println!(
            "{:<28} {:>10.2} {:>10.2} {:>14.2}",
            "ratio gateway / raw",
            us(gp50) / us(rp50),
            us(gp99) / us(rp99),
            gw_tp / raw_tp
        );
    });
}
