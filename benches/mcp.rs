//! The MCP front against the same call sent directly on NATS, in one run.
//!
//! `cargo bench --bench mcp` starts a nats-server, a redis-server and one
//! `toolmesh node --roles gateway,approval,workspace,mcp` (mode off), writes a 1 KiB file in a
//! session, and times `read_workspace_file` of it three ways in alternating rounds: a direct
//! request on `toolmesh.v1.call.<account>`, `tools/call` over streamable HTTP (rmcp's client),
//! and `tools/call` over stdio (`toolmesh mcp`, rmcp's client on its pipes). It prints p50/p99
//! of each and the milliseconds each MCP transport adds, then calls/s with 16 concurrent HTTP
//! clients against 16 direct requests in flight.
#![allow(clippy::print_stdout)]

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{json, Value};
use toolmesh_testkit::{Listener, NatsServer, RedisServer};

mod support;
use support::{block_on, ms, node_on, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_toolmesh");
const WARMUP: usize = 200;
const ROUNDS: usize = 5;
const SAMPLES_PER_ROUND: usize = 200;
const CLIENTS: usize = 16;
const THROUGHPUT_FOR: Duration = Duration::from_secs(5);
const ACCOUNT: &str = "bench";
const SESSION: &str = "bench";

type Client = RunningService<RoleClient, ()>;

fn read_params() -> CallToolRequestParams {
    let args = json!({"path": "one-kib.txt"});
    CallToolRequestParams::new("read_workspace_file")
        .with_arguments(args.as_object().unwrap().clone())
}

async fn mcp_call(client: &Client) -> Duration {
    let started = Instant::now();
    let result = client
        .call_tool(read_params())
        .await
        .expect("tools/call answers");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    started.elapsed()
}

async fn direct_call(nats: &async_nats::Client, body: &Bytes) -> Duration {
    let started = Instant::now();
    let reply = nats
        .request(format!("toolmesh.v1.call.{ACCOUNT}"), body.clone())
        .await
        .expect("the gateway answers");
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    started.elapsed()
}

async fn http_client(url: &str) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .auth_header("bench-token")
        .custom_headers(
            [(
                http::HeaderName::from_static("x-toolmesh-session"),
                http::HeaderValue::from_static(SESSION),
            )]
            .into_iter()
            .collect(),
        );
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("the HTTP front answers the handshake")
}

fn summary(name: &str, samples: &mut [Duration], base: Option<(Duration, Duration)>) {
    samples.sort();
    let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
    let added = base
        .map(|(b50, b99)| {
            format!(
                "  added p50 {:+.3} ms, p99 {:+.3} ms",
                ms(p50) - ms(b50),
                ms(p99) - ms(b99)
            )
        })
        .unwrap_or_default();
    println!(
        "{name:<28} p50 {:>7.3} ms  p99 {:>7.3} ms{added}",
        ms(p50),
        ms(p99)
    );
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    std::fs::write(
        &tokens,
        json!({"bench-token": {"account": ACCOUNT}}).to_string(),
    )
    .unwrap();
    block_on(async {
        let client = nats.client().await;
        let roles = "gateway,approval,workspace,mcp";
        let node = node_on(BIN, roles, "bench-mcp-1", &nats, &redis, dir.path())
            .env("TOOLMESH_TOOL_APPROVAL_MODE", "off")
            .env("TOOLMESH_MCP_LISTEN", "127.0.0.1:0")
            .env("TOOLMESH_MCP_TOKENS", tokens.display().to_string())
            .start(&client)
            .await;
        let url = format!("http://{}/mcp", node.addr(Listener::Mcp));
        let write = json!({"tool": "write_workspace_file", "session_id": SESSION,
            "arguments": {"path": "one-kib.txt", "content": "x".repeat(1023) + "\n"}});
        let reply = client
            .request(
                format!("toolmesh.v1.call.{ACCOUNT}"),
                Bytes::from(write.to_string()),
            )
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&reply.payload).contains("\"ok\":true"));
        let direct_body = Bytes::from(
            json!({"tool": "read_workspace_file", "session_id": SESSION,
                   "arguments": {"path": "one-kib.txt"}})
            .to_string(),
        );

        let http = http_client(&url).await;
        let mut child = tokio::process::Command::new(BIN)
            .args(["--nats-url", &nats.url(), "mcp", "--account", ACCOUNT])
            .args(["--session", SESSION])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("toolmesh mcp starts");
        let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let stdio: Client = ().serve(io).await.expect("the stdio front answers");
        println!(
            "protocol: http {:?}, stdio {:?}",
            http.peer()
                .peer_info()
                .map(|i| i.protocol_version.to_string()),
            stdio
                .peer()
                .peer_info()
                .map(|i| i.protocol_version.to_string())
        );

        for _ in 0..WARMUP {
            direct_call(&client, &direct_body).await;
            mcp_call(&http).await;
            mcp_call(&stdio).await;
        }
        let (mut direct, mut over_http, mut over_stdio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            for _ in 0..SAMPLES_PER_ROUND {
                direct.push(direct_call(&client, &direct_body).await);
            }
            for _ in 0..SAMPLES_PER_ROUND {
                over_http.push(mcp_call(&http).await);
            }
            for _ in 0..SAMPLES_PER_ROUND {
                over_stdio.push(mcp_call(&stdio).await);
            }
        }
        println!(
            "read_workspace_file of 1 KiB, {} sequential calls each, {ROUNDS} alternating rounds",
            ROUNDS * SAMPLES_PER_ROUND
        );
        direct.sort();
        let base = (percentile(&direct, 0.5), percentile(&direct, 0.99));
        summary("direct on NATS", &mut direct, None);
        summary("MCP streamable HTTP", &mut over_http, Some(base));
        summary("MCP stdio (toolmesh mcp)", &mut over_stdio, Some(base));

        // Throughput: 16 HTTP clients, each one call at a time, against 16 direct requests
        // in flight.
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            clients.push(Arc::new(http_client(&url).await));
        }
        let count = Arc::new(AtomicU64::new(0));
        let until = Instant::now() + THROUGHPUT_FOR;
        let tasks: Vec<_> = clients
            .iter()
            .map(|c| {
                let (c, count) = (c.clone(), count.clone());
                tokio::spawn(async move {
                    while Instant::now() < until {
                        mcp_call(&c).await;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let http_rate = count.load(Ordering::Relaxed) as f64 / THROUGHPUT_FOR.as_secs_f64();
        let count = Arc::new(AtomicU64::new(0));
        let until = Instant::now() + THROUGHPUT_FOR;
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (nats, body, count) = (client.clone(), direct_body.clone(), count.clone());
                tokio::spawn(async move {
                    while Instant::now() < until {
                        direct_call(&nats, &body).await;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let direct_rate = count.load(Ordering::Relaxed) as f64 / THROUGHPUT_FOR.as_secs_f64();
        println!(
            "{CLIENTS} concurrent callers, {} s: MCP HTTP {http_rate:.0} calls/s, direct {direct_rate:.0} calls/s (ratio {:.2})",
            THROUGHPUT_FOR.as_secs(),
            http_rate / direct_rate
        );
        for c in clients {
            if let Ok(c) = Arc::try_unwrap(c) {
                let _ = c.cancel().await;
            }
        }
        let _ = http.cancel().await;
        let _ = stdio.cancel().await;
        let _ = child.kill().await;
    });
}
