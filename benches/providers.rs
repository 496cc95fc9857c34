//! A provider tool through the gateway against a direct request to the provider's endpoint
//! subject, in one run, on the same server and payload.
//!
//! `cargo bench --bench providers` starts a nats-server, a redis-server and one
//! `toolmesh node --roles gateway,approval` (mode off), and a provider in this process made
//! with async-nats's own `service` (its endpoint `bench_echo` answers `{"ok":true,"echo":…}`
//! with the call's arguments). It prints the time from the provider's start to its first
//! successful call through the gateway (with an announce), then sequential p50/p99 of a direct
//! request with the gateway's envelope against the tool through the gateway, in alternating
//! rounds, and throughput with 64 requests in flight.
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::service::ServiceExt;
use bytes::Bytes;
use futures::StreamExt;
use toolmesh_testkit::{NatsServer, NodeSpec, RedisServer};

mod support;
use support::{block_on, latencies, percentile, throughput, us};

const WARMUP: usize = 2_000;
const ROUNDS: usize = 10;
const SAMPLES_PER_ROUND: usize = 1_000;
const IN_FLIGHT: usize = 64;
const THROUGHPUT_ROUNDS: usize = 5;
const THROUGHPUT_ROUND: Duration = Duration::from_secs(1);
const GATEWAY: &str = "toolmesh.v1.call.bench";
const ENDPOINT: &str = "bench.provider.echo";

/// The provider: one endpoint with `toolmesh.tool` metadata, answering with the arguments.
async fn start_provider(url: &str) -> async_nats::service::Service {
    let client = async_nats::connect(url).await.expect("provider connects");
    let meta = serde_json::json!({
        "description": "Echo the arguments (bench).",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "risk_level": "low",
    });
    let service = client
        .service_builder()
        .description("bench provider")
        .start("bench-provider", "1.0.0")
        .await
        .expect("service starts");
    let mut endpoint = service
        .endpoint_builder()
        .name("bench_echo")
        .metadata(HashMap::from([(
            "toolmesh.tool".to_owned(),
            meta.to_string(),
        )]))
        .add(ENDPOINT)
        .await
        .expect("endpoint");
    tokio::spawn(async move {
        while let Some(request) = endpoint.next().await {
            let call: serde_json::Value =
                serde_json::from_slice(&request.message.payload).unwrap_or_default();
            let reply = serde_json::json!({"ok": true, "echo": call["arguments"]});
            let _ = request
                .respond(Ok(Bytes::from(serde_json::to_vec(&reply).unwrap())))
                .await;
        }
    });
    client.flush().await.expect("flush");
    service
}

fn main() {
    block_on(async {
        let nats = NatsServer::start();
        let redis = RedisServer::start();
        let data = tempfile::tempdir().expect("temp dir");
        let client = nats.client().await;
        let _node = NodeSpec::new(
            env!("CARGO_BIN_EXE_toolmesh"),
            "gateway,approval",
            "bench-node",
        )
        .env("TOOLMESH_NATS_URL", nats.url())
        .env("TOOLMESH_REDIS_URL", redis.url())
        .env("TOOLMESH_DATA_DIR", data.path().display().to_string())
        .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
        .start(&client)
        .await;

        let arguments = serde_json::json!({"text": "x".repeat(200)});
        let gateway_body = Bytes::from(
            serde_json::to_vec(&serde_json::json!({"tool": "bench_echo", "arguments": arguments}))
                .unwrap(),
        );
        let started = Instant::now();
        let _service = start_provider(&nats.url()).await;
        client
            .publish("toolmesh.v1.providers.announce", Bytes::from_static(b"{}"))
            .await
            .unwrap();
        loop {
            let reply = client.request(GATEWAY, gateway_body.clone()).await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
            if v["ok"] == true {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        println!(
            "provider start (with announce) to first successful call: {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );

        // What the gateway sends the provider for that call.
        let direct_body = Bytes::from(
            serde_json::to_vec(&serde_json::json!({
                "tool": "bench_echo", "arguments": arguments, "invocation_id": "inv-bench",
                "account": "bench", "session_id": null, "user_id": null, "agent_id": null,
            }))
            .unwrap(),
        );
        let mut warm = Vec::new();
        latencies(&client, ENDPOINT, &direct_body, WARMUP, &mut warm).await;
        latencies(&client, GATEWAY, &gateway_body, WARMUP, &mut warm).await;
        let (mut direct, mut gw) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            latencies(
                &client,
                ENDPOINT,
                &direct_body,
                SAMPLES_PER_ROUND,
                &mut direct,
            )
            .await;
            latencies(&client, GATEWAY, &gateway_body, SAMPLES_PER_ROUND, &mut gw).await;
        }
        direct.sort();
        gw.sort();
        let (mut dn, mut dt, mut gn, mut gt) = (0, Duration::ZERO, 0, Duration::ZERO);
        for _ in 0..THROUGHPUT_ROUNDS {
            let (n, t) =
                throughput(&client, ENDPOINT, &direct_body, IN_FLIGHT, THROUGHPUT_ROUND).await;
            dn += n;
            dt += t;
            let (n, t) =
                throughput(&client, GATEWAY, &gateway_body, IN_FLIGHT, THROUGHPUT_ROUND).await;
            gn += n;
            gt += t;
        }
        let dtp = dn as f64 / dt.as_secs_f64();
        let gtp = gn as f64 / gt.as_secs_f64();
        println!(
            "\nbench_echo (200-char argument): {} sequential samples each, alternating rounds; {IN_FLIGHT} in flight for {THROUGHPUT_ROUNDS} x {} s each",
            ROUNDS * SAMPLES_PER_ROUND,
            THROUGHPUT_ROUND.as_secs()
        );
        println!(
            "{:<30} {:>10} {:>10} {:>12}",
            "", "p50 µs", "p99 µs", "calls/s"
        );
        let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
        let (g50, g99) = (percentile(&gw, 0.5), percentile(&gw, 0.99));
        println!(
            "{:<30} {:>10.1} {:>10.1} {:>12.0}",
            "direct to the endpoint",
            us(d50),
            us(d99),
            dtp
        );
        println!(
            "{:<30} {:>10.1} {:>10.1} {:>12.0}",
            "through the gateway",
            us(g50),
            us(g99),
            gtp
        );
        println!(
            "{:<30} {:>10.2} {:>10.2} {:>12.2}",
            "ratio gateway / direct",
            us(g50) / us(d50),
            us(g99) / us(d99),
            gtp / dtp
        );
    });
}
