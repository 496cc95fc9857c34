//! Gateway overhead against raw NATS, measured in one run on the same server and payload.
//!
//! `cargo bench --bench gateway` starts a nats-server and one `toolmesh node --roles gateway`,
//! then measures (1) raw async-nats request/reply to an echo responder answering with the
//! bytes `component_status` answers, and (2) `component_status` through the gateway:
//! sequential p50/p99 and the ratio, then throughput with 64 requests in flight.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use toolmesh_testkit::{NatsServer, NodeSpec};

const WARMUP: usize = 2_000;
const SAMPLES: usize = 20_000;
const IN_FLIGHT: usize = 64;
const THROUGHPUT_FOR: Duration = Duration::from_secs(5);
const BODY: &[u8] = br#"{"tool":"component_status"}"#;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

async fn latencies(client: &async_nats::Client, subject: &str) -> Vec<Duration> {
    for _ in 0..WARMUP {
        client
            .request(subject.to_owned(), Bytes::from_static(BODY))
            .await
            .expect("warmup");
    }
    let mut out = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let reply = client
            .request(subject.to_owned(), Bytes::from_static(BODY))
            .await
            .expect("request");
        out.push(t.elapsed());
        assert!(!reply.payload.is_empty());
    }
    out.sort();
    out
}

async fn throughput(client: &async_nats::Client, subject: &str) -> f64 {
    let deadline = Instant::now() + THROUGHPUT_FOR;
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
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
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    });
    let started = Instant::now();
    futures::future::join_all(workers).await;
    done.load(std::sync::atomic::Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
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
            .request("toolmesh.v1.call.bench", Bytes::from_static(BODY))
            .await
            .expect("component_status")
            .payload;
        let parsed: serde_json::Value = serde_json::from_slice(&sample).expect("JSON reply");
        assert_eq!(parsed["ok"], true, "{parsed}");

        // The raw responder runs in its own process-like setting: a thread with its own
        // connection and runtime, answering with the same bytes the gateway answers with.
        let url = nats.url();
        let reply = sample.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let responder = async_nats::connect(url).await.unwrap();
                let mut sub = responder.subscribe("bench.raw").await.unwrap();
                while let Some(msg) = sub.next().await {
                    if let Some(to) = msg.reply {
                        responder.publish(to, reply.clone()).await.unwrap();
                    }
                }
            });
        });
        client.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;

        let raw = latencies(&client, "bench.raw").await;
        let gw = latencies(&client, "toolmesh.v1.call.bench").await;
        let raw_tp = throughput(&client, "bench.raw").await;
        let gw_tp = throughput(&client, "toolmesh.v1.call.bench").await;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (rp50, rp99) = (percentile(&raw, 0.5), percentile(&raw, 0.99));
        let (gp50, gp99) = (percentile(&gw, 0.5), percentile(&gw, 0.99));
        println!("toolmesh gateway bench (reply {} bytes, {SAMPLES} sequential samples, {IN_FLIGHT} in flight for {}s, node worker threads {threads})", sample.len(), THROUGHPUT_FOR.as_secs());
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
