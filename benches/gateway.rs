//! Gateway overhead against raw NATS, measured in one run on the same server and payload.
//!
//! `cargo bench --bench gateway` starts a nats-server, a redis-server and one
//! `toolmesh node --roles gateway,workspace`, then for two tools — `component_status`
//! (answered by the gateway) and `read_workspace_file` of a 1 KiB file (routed to the workspace
//! actor, which also sends the read-state record to Redis, without waiting for it before the
//! reply) — measures raw async-nats request/reply
//! to a responder answering with the very bytes the tool answers, against the tool through the
//! gateway: sequential p50/p99 and the ratio, then throughput with 64 requests in flight.
//!
//! `BENCH_OTEL=1` runs the node with `OTEL_EXPORTER_OTLP_ENDPOINT` set to an OTLP/HTTP sink in
//! the bench process: the same figures with every call's spans exported.
//!
//! The two are measured in alternating rounds (raw, gateway, raw, …) so that both see the same
//! machine: on a shared 2-core box, noise from outside moves both figures, not one.
#![allow(clippy::print_stdout)]

use bytes::Bytes;
use toolmesh_testkit::{NatsServer, RedisServer};

mod support;
use support::{compare_alternating, node_on, Pace, Side, TOOLMESH};

const PACE: Pace = support::GATEWAY_PACE;
const GATEWAY: &str = "toolmesh.v1.call.bench";

/// Measures `body` on the gateway subject against a raw responder on `raw_subject` that
/// answers with the bytes the gateway answered, and prints one block of figures.
async fn compare(
    client: &async_nats::Client,
    url: &str,
    name: &str,
    raw_subject: &'static str,
    body: Bytes,
) {
    let sample = client
        .request(GATEWAY, body.clone())
        .await
        .expect("the tool answers")
        .payload;
    let parsed: serde_json::Value = serde_json::from_slice(&sample).expect("JSON reply");
    assert_eq!(parsed["ok"], true, "{parsed}");

    support::start_raw_responder(client, url, raw_subject, sample.clone(), &body).await;

    println!(
        "\n{name}: reply {} bytes; {}",
        sample.len(),
        PACE.describe()
    );
    let raw = Side::new("raw async-nats req/reply", raw_subject, &body);
    let gateway = Side::new("through the gateway", GATEWAY, &body);
    compare_alternating(client, &PACE, raw, gateway, "ratio gateway / raw").await;
}

/// An OTLP/HTTP endpoint that takes every export and counts requests and bytes: what the
/// node pays to export its spans, without a collector's own cost on the machine.
async fn otlp_sink() -> (String, std::sync::Arc<[std::sync::atomic::AtomicU64; 2]>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let counts = std::sync::Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let seen = counts.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            seen[0].fetch_add(1, Ordering::Relaxed);
            seen[1].fetch_add(body.len() as u64, Ordering::Relaxed);
            async { [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")] }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the sink");
    let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (endpoint, counts)
}

fn main() {
    support::block_on(async {
        // BENCH_JETSTREAM=1: the same calls with the audit trail on (a JetStream server).
        let audited = std::env::var("BENCH_JETSTREAM").is_ok_and(|v| v == "1");
        // BENCH_OTEL=1: the node exports its spans over OTLP/HTTP to a sink in this process.
        let traced = std::env::var("BENCH_OTEL").is_ok_and(|v| v == "1");
        let sink = if traced {
            Some(otlp_sink().await)
        } else {
            None
        };
        let nats = if audited {
            NatsServer::start_jetstream()
        } else {
            NatsServer::start()
        };
        let redis = RedisServer::start();
        let data = tempfile::tempdir().expect("temp dir");
        let client = nats.client().await;
        let threads = std::env::var("TOOLMESH_WORKER_THREADS").unwrap_or_else(|_| "0".into());
        let mut spec = node_on(
            TOOLMESH,
            "gateway,workspace",
            "bench-node",
            &nats,
            &redis,
            data.path(),
        )
        .env("TOOLMESH_WORKER_THREADS", threads.clone());
        if let Some((endpoint, _)) = &sink {
            spec = spec.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone());
        }
        let _node = spec.start(&client).await;
        println!(
            "toolmesh gateway bench (node worker threads {threads}, audit trail {}, traces {})",
            if audited { "on" } else { "off" },
            if traced { "exported" } else { "off" }
        );
        compare(
            &client,
            &nats.url(),
            "component_status (answered by the gateway)",
            "bench.raw.status",
            Bytes::from_static(br#"{"tool":"component_status"}"#),
        )
        .await;

        // The same hop without Redis or a file read: what routing itself costs.
        compare(
            &client,
            &nats.url(),
            "workspace_status of an empty workspace (routed, no Redis)",
            "bench.raw.ws_status",
            Bytes::from_static(br#"{"tool":"workspace_status","session_id":"s0"}"#),
        )
        .await;

        let root = data.path().join("accounts/bench/sessions/s1/workspace");
        std::fs::create_dir_all(&root).expect("workspace dir");
        let line = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n";
        std::fs::write(root.join("one-kib.txt"), line.repeat(16)).expect("1 KiB file");
        compare(
            &client,
            &nats.url(),
            "read_workspace_file of 1 KiB (routed to the workspace actor)",
            "bench.raw.read",
            Bytes::from_static(
                br#"{"tool":"read_workspace_file","session_id":"s1","arguments":{"path":"one-kib.txt"}}"#,
            ),
        )
        .await;
        if let Some((_, counts)) = &sink {
            use std::sync::atomic::Ordering;
            println!(
                "\nthe sink took {} exports, {} bytes of spans",
                counts[0].load(Ordering::Relaxed),
                counts[1].load(Ordering::Relaxed)
            );
        }
    });
}
