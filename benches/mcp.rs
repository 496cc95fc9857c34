//! The MCP front against the same call sent directly on NATS, in one run.
//!
//! `cargo bench --bench mcp` starts a nats-server, a redis-server and one
//! `toolmesh node --roles gateway,approval,workspace,mcp` (mode off), writes a 1 KiB file in a
//! session, and times `read_workspace_file` of it four ways in alternating rounds: a direct
//! request on `toolmesh.v1.call.<account>`, `tools/call` over streamable HTTP from a bare
//! kept-alive client, the same from rmcp's client, and `tools/call` over stdio (`toolmesh mcp`,
//! rmcp's client on its pipes). It prints p50/p99 of each and the milliseconds each MCP
//! transport adds; then, in alternating rounds of a second each, the calls/s of 16 concurrent
//! HTTP clients of each kind against 16 direct requests in flight, with their ratios to the
//! direct rate and their p50/p99 under that load.
//!
//! The bare client is to HTTP what the direct path is to NATS: one kept-alive connection, a
//! pre-serialised request, the answer parsed as JSON. It measures the front. rmcp's client opens
//! a new TCP connection for every request (its default reqwest client keeps no idle
//! connection) and costs the shared cores several times what the bare client does; its rows
//! say what an rmcp client sees.
#![allow(clippy::print_stdout)]

use std::future::Future;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use toolmesh_testkit::{Listener, NatsServer, RedisServer};

mod support;
use support::{block_on, ms, node_on, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_toolmesh");
const WARMUP: usize = 200;
const ROUNDS: usize = 5;
const SAMPLES_PER_ROUND: usize = 200;
const CLIENTS: usize = 16;
/// Throughput: alternating rounds of a slot each for the direct, kept-alive and rmcp callers.
const THROUGHPUT_ROUNDS: usize = 5;
const THROUGHPUT_SLOT: Duration = Duration::from_secs(1);
const ACCOUNT: &str = "bench";
const SESSION: &str = "bench";
const TOKEN: &str = "bench-token";

/// One caller of the bench: makes its call, one at a time.
trait Caller: Send + 'static {
    /// One call; how long it took.
    fn call(&mut self) -> impl Future<Output = Duration> + Send;
}

/// rmcp's client (over HTTP or stdio).
struct Rmcp(Arc<RunningService<RoleClient, ()>>);

impl Caller for Rmcp {
    async fn call(&mut self) -> Duration {
        let args = json!({"path": "one-kib.txt"});
        let params = CallToolRequestParams::new("read_workspace_file")
            .with_arguments(args.as_object().unwrap().clone());
        let started = Instant::now();
        let result = self.0.call_tool(params).await.expect("tools/call answers");
        assert_ne!(result.is_error, Some(true), "{result:?}");
        started.elapsed()
    }
}

/// The request on `toolmesh.v1.call.<account>`, pre-serialised.
struct Direct {
    nats: async_nats::Client,
    body: Bytes,
}

impl Caller for Direct {
    async fn call(&mut self) -> Duration {
        let started = Instant::now();
        let reply = self
            .nats
            .request(format!("toolmesh.v1.call.{ACCOUNT}"), self.body.clone())
            .await
            .expect("the gateway answers");
        let v: Value = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(v["ok"], true, "{v}");
        started.elapsed()
    }
}

/// A bare MCP client over HTTP/1.1: one kept-alive connection and one pre-serialised
/// `tools/call` POST (protocol 2025-11-25, as rmcp's client negotiates; the front serves each
/// POST statelessly). The answer must be 200 with a Content-Length; its body is parsed.
struct BareHttp {
    stream: tokio::net::TcpStream,
    request: Vec<u8>,
    read: Vec<u8>,
}

impl BareHttp {
    async fn connect(addr: SocketAddr) -> BareHttp {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("the front accepts");
        stream.set_nodelay(true).unwrap();
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "read_workspace_file", "arguments": {"path": "one-kib.txt"}}})
        .to_string();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\n\
             accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n\
             mcp-protocol-version: {}\r\nx-toolmesh-session: {SESSION}\r\n\
             content-length: {}\r\n\r\n{body}",
            ProtocolVersion::V_2025_11_25.as_str(),
            body.len()
        );
        BareHttp {
            stream,
            request: request.into_bytes(),
            read: Vec::with_capacity(8192),
        }
    }

    /// Reads into `self.read` until it holds `at_least` bytes.
    async fn fill(&mut self, at_least: usize) {
        while self.read.len() < at_least {
            let n = self.stream.read_buf(&mut self.read).await.unwrap();
            assert!(n > 0, "the front closed the connection");
        }
    }
}

impl Caller for BareHttp {
    async fn call(&mut self) -> Duration {
        let started = Instant::now();
        self.stream.write_all(&self.request).await.unwrap();
        self.read.clear();
        let head = loop {
            if let Some(end) = self.read.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let more = self.read.len() + 1;
            self.fill(more).await;
        };
        let text = std::str::from_utf8(&self.read[..head]).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
        let length: usize = text
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().unwrap())
            })
            .expect("a Content-Length");
        self.fill(head + length).await;
        let v: Value = serde_json::from_slice(&self.read[head..head + length]).unwrap();
        assert_eq!(v["result"]["isError"], false, "{v}");
        started.elapsed()
    }
}

async fn http_client(url: &str) -> Rmcp {
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .auth_header(TOKEN)
        .custom_headers(
            [(
                http::HeaderName::from_static("x-toolmesh-session"),
                http::HeaderValue::from_static(SESSION),
            )]
            .into_iter()
            .collect(),
        );
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("the HTTP front answers the handshake");
    Rmcp(Arc::new(client))
}

/// [`SAMPLES_PER_ROUND`] sequential calls of `caller`, their times appended to `out`.
async fn sequential(caller: &mut impl Caller, out: &mut Vec<Duration>) {
    for _ in 0..SAMPLES_PER_ROUND {
        out.push(caller.call().await);
    }
}

/// `callers` for [`THROUGHPUT_SLOT`], each making its call again and again, one at a time;
/// the callers back, to `load` their calls' times and how long the slot took.
async fn burst<C: Caller>(callers: Vec<C>, load: &mut Load) -> Vec<C> {
    let started = Instant::now();
    let until = started + THROUGHPUT_SLOT;
    let tasks: Vec<_> = callers
        .into_iter()
        .map(|mut caller| {
            tokio::spawn(async move {
                let mut times = Vec::new();
                while Instant::now() < until {
                    times.push(caller.call().await);
                }
                (caller, times)
            })
        })
        .collect();
    let mut back = Vec::new();
    for task in tasks {
        let (caller, times) = task.await.unwrap();
        back.push(caller);
        load.times.extend(times);
    }
    load.took += started.elapsed();
    back
}

/// The calls of one kind of caller under load.
#[derive(Default)]
struct Load {
    times: Vec<Duration>,
    took: Duration,
}

impl Load {
    fn rate(&self) -> f64 {
        self.times.len() as f64 / self.took.as_secs_f64()
    }

    fn print(&mut self, name: &str, base: Option<f64>) {
        self.times.sort();
        let ratio = base
            .map(|b| format!(" (ratio {:.2})", self.rate() / b))
            .unwrap_or_default();
        println!(
            "{name:<28} {:>6.0} calls/s{ratio:<13} p50 {:>7.3} ms  p99 {:>7.3} ms",
            self.rate(),
            ms(percentile(&self.times, 0.5)),
            ms(percentile(&self.times, 0.99)),
        );
    }
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
        let addr = node.addr(Listener::Mcp);
        let url = format!("http://{addr}/mcp");
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
        let direct = || Direct {
            nats: client.clone(),
            body: direct_body.clone(),
        };

        let mut http = http_client(&url).await;
        let mut bare = BareHttp::connect(addr).await;
        let mut child = tokio::process::Command::new(BIN)
            .args(["--nats-url", &nats.url(), "mcp", "--account", ACCOUNT])
            .args(["--session", SESSION])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("toolmesh mcp starts");
        let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let mut stdio = Rmcp(Arc::new(
            ().serve(io).await.expect("the stdio front answers"),
        ));
        println!(
            "protocol: http {:?}, stdio {:?}",
            http.0
                .peer()
                .peer_info()
                .map(|i| i.protocol_version.to_string()),
            stdio
                .0
                .peer()
                .peer_info()
                .map(|i| i.protocol_version.to_string())
        );

        let mut one = direct();
        for _ in 0..WARMUP {
            one.call().await;
            bare.call().await;
            http.call().await;
            stdio.call().await;
        }
        let (mut over_nats, mut over_bare) = (Vec::new(), Vec::new());
        let (mut over_http, mut over_stdio) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            sequential(&mut one, &mut over_nats).await;
            sequential(&mut bare, &mut over_bare).await;
            sequential(&mut http, &mut over_http).await;
            sequential(&mut stdio, &mut over_stdio).await;
        }
        println!(
            "read_workspace_file of 1 KiB, {} sequential calls each, {ROUNDS} alternating rounds",
            ROUNDS * SAMPLES_PER_ROUND
        );
        over_nats.sort();
        let base = (percentile(&over_nats, 0.5), percentile(&over_nats, 0.99));
        summary("direct on NATS", &mut over_nats, None);
        summary("MCP HTTP, kept-alive", &mut over_bare, Some(base));
        summary("MCP HTTP, rmcp client", &mut over_http, Some(base));
        summary("MCP stdio (toolmesh mcp)", &mut over_stdio, Some(base));

        // Throughput: 16 HTTP clients of each kind, each one call at a time, against 16 direct
        // requests in flight, in alternating rounds.
        let mut directs: Vec<_> = (0..CLIENTS).map(|_| direct()).collect();
        let mut bares = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            bares.push(BareHttp::connect(addr).await);
            clients.push(http_client(&url).await);
        }
        let handles: Vec<_> = clients.iter().map(|c| c.0.clone()).collect();
        let (mut on_nats, mut on_bare, mut on_rmcp) =
            (Load::default(), Load::default(), Load::default());
        for _ in 0..THROUGHPUT_ROUNDS {
            directs = burst(directs, &mut on_nats).await;
            bares = burst(bares, &mut on_bare).await;
            clients = burst(clients, &mut on_rmcp).await;
        }
        println!(
            "{CLIENTS} concurrent callers, {THROUGHPUT_ROUNDS} alternating rounds of {} s each",
            THROUGHPUT_SLOT.as_secs()
        );
        let base = on_nats.rate();
        on_nats.print("direct on NATS", None);
        on_bare.print("MCP HTTP, kept-alive", Some(base));
        on_rmcp.print("MCP HTTP, rmcp client", Some(base));
        drop(clients);
        for c in handles.into_iter().chain([http.0, stdio.0]) {
            if let Ok(c) = Arc::try_unwrap(c) {
                let _ = c.cancel().await;
            }
        }
        let _ = child.kill().await;
    });
}
