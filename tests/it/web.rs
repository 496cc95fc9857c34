//! The web tools end to end: gateway → web actor, real NATS and Redis, and local HTTP
//! fixtures. The "allowed" fixture listens on 127.0.0.2, the only network the nodes open
//! (`TOOLMESH_WEB_ALLOWED_NETWORKS=127.0.0.2/32`); the "trap" fixture listens on 127.0.0.1 (and
//! ::1), which the egress policy must refuse in every spelling: it must never see a request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{self, assert_error, assert_holds, Aborting, Cluster};

const ALLOWED: &str = "127.0.0.2/32";

/// One request as the fixture saw it: the request line and the headers, lowercased names.
#[derive(Debug, Clone)]
struct Seen {
    target: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A tiny HTTP/1.1 server: one response per connection, then close.
struct Fixture {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    _task: Aborting,
}

struct Response {
    status: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    delay: Option<Duration>,
}

fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Response {
    Response {
        status: "200 OK",
        headers: vec![("Content-Type", content_type.to_owned())],
        body: body.into(),
        delay: None,
    }
}

fn redirect(location: String) -> Response {
    Response {
        status: "302 Found",
        headers: vec![("Location", location)],
        body: Vec::new(),
        delay: None,
    }
}

const PAGE: &str = "<!DOCTYPE html><html><head><title>Fixture page</title>\
<style>.hidden { color: red } /* STYLE-MARKER */</style>\
<script>var s = 'SCRIPT-MARKER';</script></head>\
<body><h1>Welcome</h1><p>Visible   text\n\n with   spaces.</p>\
<noscript>NOSCRIPT-MARKER</noscript>\
<ul><li>first</li><li>second</li></ul>\
<script type=\"module\">document.write('</p>SCRIPT2-MARKER')</script>\
<p>The end.</p></body></html>";

/// The routes of the allowed fixture.
fn route(target: &str) -> Response {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/page" => ok("text/html; charset=utf-8", PAGE),
        "/plain" => ok("text/plain", "line one\r\nline two\n"),
        "/json" => ok("application/json", r#"{"a": [1, 2], "b": "x"}"#),
        "/redirect" => redirect("/page".into()),
        // `/goto?<url>`: a redirect to exactly <url>.
        "/goto" => redirect(query.to_owned()),
        "/long" => {
            let words: String = (0..600).map(|i| format!("word{i} ")).collect();
            ok(
                "text/html",
                format!("<html><body><p>{words}</p><p>LAST-MARKER</p></body></html>"),
            )
        }
        "/huge" => ok("text/plain", "x".repeat(50_000)),
        "/missing" => Response {
            status: "404 Not Found",
            headers: vec![("Content-Type", "text/plain".into())],
            body: b"no such page".to_vec(),
            delay: None,
        },
        "/image" => ok("image/png", b"\x89PNG\r\n\x1a\n\0\0\0binary".to_vec()),
        "/slow" => Response {
            delay: Some(Duration::from_secs(20)),
            ..ok("text/plain", "too late")
        },
        "/search" => ok(
            "application/json",
            json!({"results": [
                {"title": "One", "url": "https://one.example/", "snippet": "first", "date": "2025-01-02"},
                {"title": "Two", "url": "https://two.example/"},
                {"title": "Three", "url": "https://three.example/", "snippet": "third"},
            ]})
            .to_string(),
        ),
        p => match p.strip_prefix("/chain/").and_then(|n| n.parse::<u32>().ok()) {
            Some(0) => ok("text/plain", "end of chain"),
            Some(n) => redirect(format!("/chain/{}", n - 1)),
            None => Response {
                status: "404 Not Found",
                headers: vec![],
                body: Vec::new(),
                delay: None,
            },
        },
    }
}

async fn serve_one(mut stream: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 64 * 1024 {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let headers = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    seen.lock().unwrap().push(Seen {
        target: target.clone(),
        headers,
    });
    let response = route(&target);
    if let Some(delay) = response.delay {
        tokio::time::sleep(delay).await;
    }
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        response.status,
        response.body.len()
    );
    for (name, value) in &response.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.write_all(&response.body).await;
    let _ = stream.shutdown().await;
}

impl Fixture {
    async fn start(addr: &str) -> Option<Fixture> {
        let listener = TcpListener::bind(addr).await.ok()?;
        let addr = listener.local_addr().ok()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task_seen = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_one(stream, task_seen.clone()));
            }
        });
        Some(Fixture {
            addr,
            seen,
            _task: Aborting(task),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn allowed_fixture() -> Fixture {
    Fixture::start("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2 (Linux routes 127.0.0.0/8 to loopback)")
}

/// Gateway, approval, workspace and web on one node, approval off, 127.0.0.2 allowed.
async fn cluster(extra: &[(&str, &str)]) -> Cluster {
    let mut env = vec![
        ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
        ("TOOLMESH_WEB_ALLOWED_NETWORKS", ALLOWED),
    ];
    env.extend_from_slice(extra);
    Cluster::with_node("gateway,approval,workspace,web", &env).await
}

/// The [`allowed_fixture`] site, then a [`cluster`] with `extra`.
async fn site_and_cluster(extra: &[(&str, &str)]) -> (Fixture, Cluster) {
    (allowed_fixture().await, cluster(extra).await)
}

async fn fetch(c: &Cluster, args: Value) -> Value {
    c.session_call("acme", "s1", "web_fetch", args).await
}

#[tokio::test]
async fn fetch_strips_scripts_styles_and_noscript_and_follows_a_redirect() {
    let (site, c) = site_and_cluster(&[]).await;
    let r = support::ok(fetch(&c, json!({"url": site.url("/redirect")})).await);
    assert_eq!(r["url"], site.url("/redirect"));
    assert_eq!(r["final_url"], site.url("/page"));
    assert_eq!(r["status_code"], 200);
    assert_eq!(r["content_type"], "text/html; charset=utf-8");
    assert_eq!(
        r["text"],
        "Fixture page\n\nWelcome\n\nVisible text with spaces.\n\nfirst\nsecond\n\nThe end."
    );
    let text = r["text"].as_str().unwrap();
    for marker in [
        "SCRIPT-MARKER",
        "SCRIPT2-MARKER",
        "STYLE-MARKER",
        "NOSCRIPT-MARKER",
    ] {
        assert!(!text.contains(marker), "{marker} in {text:?}");
    }
    assert_eq!(r["truncated"], false);
    assert_eq!(r["body_truncated"], false);
    assert_eq!(r["original_chars"], text.chars().count());
    assert_eq!(r["preview_chars"], text.chars().count());
    assert!(r.get("persisted").is_none(), "{r}");

    // Plain text and JSON pass through as they are.
    let r = fetch(&c, json!({"url": site.url("/plain")})).await;
    assert_eq!(r["text"], "line one\nline two\n", "{r}");
    assert_eq!(r["content_type"], "text/plain");
    let r = fetch(&c, json!({"url": site.url("/json")})).await;
    assert_eq!(r["text"], r#"{"a": [1, 2], "b": "x"}"#, "{r}");

    // The fixture saw the redirect and the page, nothing else.
    let targets: Vec<String> = site.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(targets, ["/redirect", "/page", "/plain", "/json"]);
}

#[tokio::test]
async fn text_over_the_budget_is_persisted_and_readable() {
    let (site, c) = site_and_cluster(&[]).await;
    let r = support::ok(fetch(&c, json!({"url": site.url("/long"), "max_chars": 100})).await);
    assert_eq!(r["truncated"], true);
    assert_eq!(r["body_truncated"], false);
    assert_eq!(r["preview_chars"], 100);
    assert_eq!(r["text"].as_str().unwrap().chars().count(), 100);
    let original = r["original_chars"].as_u64().unwrap();
    assert!(original > 4000, "{r}");
    let path = r["persisted"]["path"].as_str().expect("persisted path");
    assert!(
        path.starts_with(".toolmesh/outputs/") && path.ends_with("-text.txt"),
        "{path}"
    );
    assert_eq!(r["persisted"]["mime_type"], "text/plain");
    let read = support::ok(c.read_persisted(path).await);
    // read_workspace_file ends the last line with a newline; the file has none.
    let whole = read["content"].as_str().unwrap().trim_end_matches('\n');
    assert_eq!(whole.chars().count() as u64, original, "{read}");
    assert!(whole.starts_with(r["text"].as_str().unwrap()));
    assert!(whole.ends_with("LAST-MARKER"), "{whole}");

    // Without a session the text is cut and nothing is persisted.
    let r = support::ok(
        c.tool_call(
            "acme",
            "web_fetch",
            json!({"url": site.url("/long"), "max_chars": 100}),
        )
        .await,
    );
    assert_eq!(r["truncated"], true);
    assert_eq!(r["original_chars"], original);
    assert!(r.get("persisted").is_none(), "{r}");
}

#[tokio::test]
async fn the_body_is_capped_by_decoded_bytes() {
    let (site, c) = site_and_cluster(&[("TOOLMESH_WEB_MAX_BYTES", "10000")]).await;
    let r = support::ok(fetch(&c, json!({"url": site.url("/huge"), "max_chars": 100000})).await);
    assert_eq!(r["truncated"], true);
    assert_eq!(r["body_truncated"], true);
    assert_eq!(r["original_chars"], 10_000);
    assert_eq!(r["text"].as_str().unwrap().len(), 10_000);
    // Under the cap nothing is cut.
    let r = fetch(&c, json!({"url": site.url("/plain")})).await;
    assert_eq!(r["body_truncated"], false, "{r}");
}

#[tokio::test]
async fn refused_targets_in_every_spelling_never_reach_the_target() {
    let site = allowed_fixture().await;
    let trap = Fixture::start("127.0.0.1:0").await.expect("bind 127.0.0.1");
    let port = trap.port();
    // The same port on ::1 when this machine has IPv6 loopback.
    let trap6 = Fixture::start(&format!("[::1]:{port}")).await;
    let c = cluster(&[]).await;
    // Hosts that all mean the trap, each with (part of) the reason expected.
    const LOOPBACK: &str = "loopback address 127.0.0.1";
    const MAPPED: &str = "IPv4-mapped address ::ffff:127.0.0.1 embeds loopback address 127.0.0.1";
    let hosts: &[(&str, &str)] = &[
        ("127.0.0.1", LOOPBACK),
        ("2130706433", LOOPBACK),
        ("0x7f000001", LOOPBACK),
        ("0x7f.0.0.1", LOOPBACK),
        ("0177.0.0.1", LOOPBACK),
        ("0177.0.0.01", LOOPBACK),
        ("127.1", LOOPBACK),
        ("127.0.1", LOOPBACK),
        ("127.0.0.1.", LOOPBACK),
        ("user:pw@127.0.0.1", LOOPBACK),
        ("127.0.0.3", "loopback address 127.0.0.3"), // 127.0.0.2 is allowed, not its neighbour
        ("[::1]", "loopback address ::1"),
        ("[::ffff:127.0.0.1]", MAPPED),
        ("[::ffff:7f00:1]", MAPPED),
        (
            "[64:ff9b::7f00:1]",
            "NAT64 address 64:ff9b::7f00:1 embeds loopback address 127.0.0.1",
        ),
        (
            "[2002:7f00:1::]",
            "6to4 address 2002:7f00:1:: embeds loopback address 127.0.0.1",
        ),
        (
            "[::127.0.0.1]",
            "IPv4-compatible address ::7f00:1 embeds loopback address 127.0.0.1",
        ),
        ("localhost", "localhost resolves to loopback address"),
        ("LOCALHOST", "localhost resolves to loopback address"),
        ("0.0.0.0", "unspecified address 0.0.0.0"),
        ("0", "unspecified address 0.0.0.0"),
    ];
    let mut cases: Vec<(String, String)> = hosts
        .iter()
        .map(|(host, reason)| (format!("http://{host}:{port}/"), reason.to_string()))
        .collect();
    // A redirect from the allowed site is checked again.
    for (target, reason) in [
        (format!("http://127.0.0.1:{port}/secret"), LOOPBACK),
        (format!("http://[::ffff:127.0.0.1]:{port}/secret"), MAPPED),
        (
            format!("http://localhost:{port}/secret"),
            "localhost resolves to loopback address",
        ),
        (
            "file:///etc/passwd".to_owned(),
            "scheme file: is not allowed",
        ),
    ] {
        cases.push((
            site.url(&format!("/goto?{target}")),
            format!("redirect 1 leads to {reason}"),
        ));
    }
    // Schemes other than http and https.
    for (url, scheme) in [
        ("file:///etc/passwd".to_owned(), "file"),
        (format!("ftp://127.0.0.2:{port}/"), "ftp"),
        ("gopher://127.0.0.2/".to_owned(), "gopher"),
        ("data:text/plain,hello".to_owned(), "data"),
        ("javascript:alert(1)".to_owned(), "javascript"),
    ] {
        cases.push((url, format!("scheme {scheme}: is not allowed")));
    }
    for (url, reason) in &cases {
        let r = fetch(&c, json!({"url": url})).await;
        assert_eq!(r["ok"], false, "{url}: {r}");
        assert_eq!(r["error"], "blocked_url", "{url}: {r}");
        let got = r["reason"].as_str().unwrap_or_default();
        assert!(
            got.contains(reason.as_str()),
            "{url}: reason {got:?} lacks {reason:?}"
        );
    }
    assert!(
        trap.seen().is_empty(),
        "the loopback target was reached: {:?}",
        trap.seen()
    );
    if let Some(trap6) = trap6 {
        assert!(trap6.seen().is_empty(), "{:?}", trap6.seen());
    }
    // The allowed site saw only the redirects, never a second hop.
    assert!(
        site.seen().iter().all(|s| s.target.starts_with("/goto?")),
        "{:?}",
        site.seen()
    );
}

#[tokio::test]
async fn redirects_are_followed_five_times_at_most() {
    let (site, c) = site_and_cluster(&[]).await;
    let r = support::ok(fetch(&c, json!({"url": site.url("/chain/5")})).await);
    assert_eq!(r["final_url"], site.url("/chain/0"));
    assert_eq!(r["text"], "end of chain");
    let r = fetch(&c, json!({"url": site.url("/chain/6")})).await;
    assert_eq!(r["error"], "fetch_failed", "{r}");
    assert_eq!(r["final_url"], site.url("/chain/1"), "{r}");
    assert_holds(&r, "error_message", "at most 5");
    // /chain/6 … /chain/1: six requests, the sixth redirect not followed.
    assert_eq!(
        site.seen()
            .iter()
            .filter(|s| s.target.starts_with("/chain/"))
            .count(),
        6 + 6
    );
}

#[tokio::test]
async fn failures_have_their_codes() {
    let (site, c) = site_and_cluster(&[]).await;
    let r = fetch(&c, json!({"url": site.url("/missing")})).await;
    assert_eq!(r["error"], "fetch_failed", "{r}");
    assert_eq!(r["status_code"], 404);
    let r = fetch(&c, json!({"url": site.url("/image")})).await;
    assert_error(&r, "fetch_failed", "image/png");
    let started = std::time::Instant::now();
    let r = fetch(&c, json!({"url": site.url("/slow"), "timeout": 1})).await;
    assert_eq!(r["error"], "timeout", "{r}");
    assert!(started.elapsed() < Duration::from_secs(8), "{r}");
    let r = fetch(&c, json!({"url": "not a url"})).await;
    assert_eq!(r["error"], "invalid_arguments", "{r}");
    // Nothing listens on port 1 of the allowed address.
    let r = fetch(&c, json!({"url": "http://127.0.0.2:1/"})).await;
    assert_eq!(r["error"], "fetch_failed", "{r}");
    // An unknown argument is refused by the gateway's schema.
    let r = fetch(&c, json!({"url": site.url("/page"), "follow": false})).await;
    assert_eq!(r["error"], "invalid_arguments", "{r}");
    // No provider configured on this node.
    let r = c
        .tool_call("acme", "web_search", json!({"query": "x"}))
        .await;
    assert_eq!(r["error"], "provider_not_configured", "{r}");
}

#[tokio::test]
async fn the_fake_search_provider_is_deterministic() {
    let c = cluster(&[("TOOLMESH_WEB_SEARCH_PROVIDER", "fake")]).await;
    let search = |max: u64| {
        c.call(
            "acme",
            json!({"tool": "web_search", "arguments": {"query": "nats tools", "max_results": max}}),
        )
    };
    let a = support::ok(search(3).await);
    assert_eq!(a["query"], "nats tools");
    assert_eq!(a["provider"], "fake");
    let results = a["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (i, item) in results.iter().enumerate() {
        assert_eq!(item["rank"], i + 1, "{item}");
        assert_eq!(item["provider"], "fake");
        for field in ["title", "url", "snippet"] {
            assert!(
                !item[field].as_str().unwrap_or_default().is_empty(),
                "{item}"
            );
        }
    }
    let b = search(3).await;
    assert_eq!(a["results"], b["results"]);
    let default = c
        .tool_call("acme", "web_search", json!({"query": "nats tools"}))
        .await;
    assert_eq!(default["results"].as_array().unwrap().len(), 5, "{default}");
    assert_eq!(default["results"][2], a["results"][2]);
}

#[tokio::test]
async fn the_http_search_provider_speaks_its_documented_contract() {
    let provider = allowed_fixture().await;
    let endpoint = provider.url("/search");
    let c = cluster(&[
        ("TOOLMESH_WEB_SEARCH_PROVIDER", "http"),
        ("TOOLMESH_WEB_SEARCH_URL", endpoint.as_str()),
        ("TOOLMESH_WEB_SEARCH_API_KEY", "k3y"),
    ])
    .await;
    let r = support::ok(
        c.call(
            "acme",
            json!({"tool": "web_search",
                   "arguments": {"query": "agent sdk", "max_results": 2, "recency_days": 7}}),
        )
        .await,
    );
    assert_eq!(r["provider"], "http");
    assert_eq!(
        r["results"],
        json!([
            {"title": "One", "url": "https://one.example/", "snippet": "first", "rank": 1,
             "provider": "http", "date": "2025-01-02"},
            {"title": "Two", "url": "https://two.example/", "snippet": "", "rank": 2,
             "provider": "http"},
        ])
    );
    let seen = provider.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].target, "/search?q=agent+sdk&count=2&recency_days=7");
    assert_eq!(seen[0].header("authorization"), Some("Bearer k3y"));
}
