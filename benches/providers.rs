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
use toolmesh_testkit::{NatsServer, RedisServer};

mod support;
use support::{block_on, compare_alternating, node_on, Pace, Side, TOOLMESH};

const PACE: Pace = Pace {
    warmup: 2_000,
    rounds: 10,
    samples_per_round: 1_000,
    in_flight: 64,
    throughput_rounds: 5,
    throughput_round: Duration::from_secs(1),
};
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
        let roles = "gateway,approval";
        let _node = node_on(TOOLMESH, roles, "bench-node", &nats, &redis, data.path())
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
        println!("\nbench_echo (200-char argument): {}", PACE.describe());
        let direct = Side::new("direct to the endpoint", ENDPOINT, &direct_body);
        let gateway = Side::new("through the gateway", GATEWAY, &gateway_body);
        compare_alternating(&client, &PACE, direct, gateway, "ratio gateway / direct").await;
    });
}
