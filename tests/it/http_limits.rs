//! PROTOCOL.md "Tenancy and trust" on a real node's HTTP listeners, tried as an attacker would
//! over raw TCP and HTTP: the MCP front, the console and `/metrics` close a connection whose
//! request head is late and serve at most `TOOLMESH_HTTP_MAX_CONNECTIONS` connections at once;
//! the MCP front refuses a browser origin it does not list, and a token bound to a session
//! the header naming another.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use toolmesh_testkit::raw_http::{read_response, read_until_closed};
use toolmesh_testkit::Listener;

use crate::support::{node_refusal, ok, tokens_file, Cluster};

/// An outer bound for what comes within a fraction of it.
const WITHIN: Duration = Duration::from_secs(10);

/// One node with the MCP front, the console and `/metrics`, each on its own loopback port.
struct Listeners {
    _c: Cluster,
    /// `(name, address, path)` of each listener.
    all: Vec<(&'static str, String, &'static str)>,
}

impl Listeners {
    async fn start(env: &[(&str, &str)]) -> Listeners {
        let mut all_env = vec![
            ("TOOLMESH_MCP_LISTEN", "127.0.0.1:0"),
            ("TOOLMESH_CONSOLE_LISTEN", "127.0.0.1:0"),
            ("TOOLMESH_METRICS_LISTEN", "127.0.0.1:0"),
        ];
        all_env.extend_from_slice(env);
        let mut c = Cluster::servers().await;
        let i = c.start_node("mcp,console", &all_env).await;
        let addr = |listener| c.nodes[i].addr(listener).to_string();
        let all = vec![
            ("mcp", addr(Listener::Mcp), "/mcp"),
            ("console", addr(Listener::Console), "/"),
            ("metrics", addr(Listener::Metrics), "/metrics"),
        ];
        Listeners { _c: c, all }
    }
}

/// A whole request for `path`; the connection stays open after its response.
fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n")
}

#[tokio::test]
async fn a_late_request_head_is_closed_on_every_listener() {
    let timeout = Duration::from_secs(1);
    let l = Listeners::start(&[("TOOLMESH_HTTP_HEADER_TIMEOUT_S", "1")]).await;
    for (name, addr, path) in &l.all {
        // The listener serves a whole request.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(get(path).as_bytes()).await.unwrap();
        let status = read_response(&mut stream).await;
        assert!(status.starts_with("HTTP/1.1 "), "{name}: {status}");

        // Half a request head, then nothing: closed once the header timeout has passed.
        for half in [format!("POST {path} HTTP/1.1\r\nHost: te"), String::new()] {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(half.as_bytes()).await.unwrap();
            let began = Instant::now();
            tokio::time::timeout(WITHIN, read_until_closed(&mut stream))
                .await
                .unwrap_or_else(|_| panic!("{name}: {half:?} still open after {WITHIN:?}"));
            let took = began.elapsed();
            assert!(
                took >= timeout - Duration::from_millis(100),
                "{name}: {half:?} closed after {took:?}, before the header timeout"
            );
        }
    }
}

#[tokio::test]
async fn past_the_connection_cap_the_next_client_waits_for_a_free_one() {
    let l = Listeners::start(&[("TOOLMESH_HTTP_MAX_CONNECTIONS", "2")]).await;
    for (name, addr, path) in &l.all {
        // Two clients served, their connections kept open.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(get(path).as_bytes()).await.unwrap();
            read_response(&mut stream).await;
            held.push(stream);
        }
        // A third one's whole request goes unanswered while both stay open. Nothing is to
        // happen, so a bounded wait is all there is to wait on.
        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(get(path).as_bytes()).await.unwrap();
        let early = tokio::time::timeout(Duration::from_secs(1), read_response(&mut third)).await;
        assert!(early.is_err(), "{name}: served past the cap: {early:?}");
        // One closes: the third is served.
        drop(held.pop());
        let status = tokio::time::timeout(WITHIN, read_response(&mut third))
            .await
            .unwrap_or_else(|_| panic!("{name}: not served after a connection closed"));
        assert!(status.starts_with("HTTP/1.1 "), "{name}: {status}");
    }
}

#[test]
fn bad_http_limits_stop_the_node_naming_the_variable() {
    for roles in ["mcp", "console", "gateway"] {
        for (key, bad) in [
            ("TOOLMESH_HTTP_HEADER_TIMEOUT_S", "0"),
            ("TOOLMESH_HTTP_HEADER_TIMEOUT_S", "soon"),
            ("TOOLMESH_HTTP_MAX_CONNECTIONS", "0"),
            ("TOOLMESH_HTTP_MAX_CONNECTIONS", "-3"),
        ] {
            let stderr = node_refusal(
                roles,
                &[
                    ("TOOLMESH_MCP_LISTEN", "127.0.0.1:0"),
                    ("TOOLMESH_CONSOLE_LISTEN", "127.0.0.1:0"),
                    ("TOOLMESH_METRICS_LISTEN", "127.0.0.1:0"),
                    (key, bad),
                ],
            );
            assert!(
                stderr.contains(&format!("{key}={bad:?}")),
                "{roles} with {key}={bad}: {stderr}"
            );
        }
    }
}

/// A node serving MCP with the tokens `tok-bound` (acme, bound to session `attacker`),
/// `tok-any` (acme, session `attacker`, `"sessions": "any"`), and the allowed origin
/// `http://app.example:3000`; the session `victim` holds `notes.md`.
struct Front {
    _c: Cluster,
    url: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// What the victim's file holds.
const SECRET: &str = "the victim's notes";

impl Front {
    async fn start() -> Front {
        let (dir, tokens) = tokens_file(&json!({
            "tok-bound": {"account": "acme", "session": "attacker"},
            "tok-any": {"account": "acme", "session": "attacker", "sessions": "any"},
        }));
        let mut c = Cluster::servers().await;
        let url = c
            .start_mcp_front(
                "gateway,approval,workspace,mcp",
                &tokens,
                &[("TOOLMESH_MCP_ALLOWED_ORIGINS", "http://app.example:3000")],
            )
            .await;
        ok(c.call(
            "acme",
            json!({"tool": "write_workspace_file", "session_id": "victim",
                       "arguments": {"path": "notes.md", "content": SECRET},
                       "approval": {"approved": true}}),
        )
        .await);
        Front {
            _c: c,
            url,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    /// One bare POST of a JSON-RPC `message` with `headers`: its status and body.
    async fn post(&self, message: serde_json::Value, headers: &[(&str, &str)]) -> (u16, String) {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(message.to_string());
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = tokio::time::timeout(WITHIN, request.send())
            .await
            .expect("the front answers in time")
            .expect("the front answers");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    /// A [`read_notes`] call with `token`, the protocol version and the `more` headers: its
    /// status and body.
    async fn read_notes_with(&self, token: &str, more: &[(&str, &str)]) -> (u16, String) {
        let bearer = format!("Bearer {token}");
        let mut headers = vec![
            ("authorization", bearer.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
        ];
        headers.extend_from_slice(more);
        self.post(read_notes(), &headers).await
    }
}

/// An `initialize` request, as a client's first message.
fn initialize() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "attacker", "version": "0"}}})
}

/// A `tools/call` of `read_workspace_file` for `notes.md`.
fn read_notes() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "read_workspace_file", "arguments": {"path": "notes.md"}}})
}

#[tokio::test]
async fn a_token_bound_to_a_session_cannot_name_another() {
    let f = Front::start().await;
    let victim = ("x-toolmesh-session", "victim");
    // The attack: the token bound to `attacker` names the victim's session.
    let (status, body) = f.read_notes_with("tok-bound", &[victim]).await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains(SECRET), "{body}");
    // Its own session, named or not, is served (and holds no notes).
    for session in [Some("attacker"), None] {
        let named = session.map(|s| ("x-toolmesh-session", s));
        let (status, body) = f.read_notes_with("tok-bound", named.as_slice()).await;
        assert_eq!(status, 200, "{session:?}: {body}");
        assert!(body.contains("not_found"), "{session:?}: {body}");
        assert!(!body.contains(SECRET), "{session:?}: {body}");
    }
    // A token with `"sessions": "any"` may name the victim's session: the same request then
    // reads the file, so the 403 above is the binding and nothing else.
    let (status, body) = f.read_notes_with("tok-any", &[victim]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(SECRET), "{body}");
}

#[tokio::test]
async fn an_origin_not_listed_is_refused_before_the_token() {
    let f = Front::start().await;
    let token = ("authorization", "Bearer tok-any");
    for (origin, with_token, expect) in [
        (Some("http://attacker.example"), true, 403),
        // Refused before the token is looked at: no 401 to tell a page which tokens exist.
        (Some("http://attacker.example"), false, 403),
        (Some("http://app.example"), true, 403),
        (Some("https://app.example:3000"), true, 403),
        (Some("null"), true, 403),
        (Some("http://app.example:3000"), true, 200),
        (None, true, 200),
        (None, false, 401),
    ] {
        let mut headers = Vec::new();
        headers.extend(origin.map(|o| ("origin", o)));
        if with_token {
            headers.push(token);
        }
        let (status, body) = f.post(initialize(), &headers).await;
        assert_eq!(
            status, expect,
            "Origin {origin:?}, token {with_token}: {body}"
        );
    }
    // A call from an origin not listed reads nothing.
    let attacker = ("origin", "http://attacker.example");
    let (status, body) = f
        .read_notes_with("tok-any", &[attacker, ("x-toolmesh-session", "victim")])
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains(SECRET), "{body}");
}
