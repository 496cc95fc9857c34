//! What the egress proxy (`egress::proxy`) costs: a 100 MB download from an HTTP server on
//! this host, direct against through the proxy (absolute-form HTTP relay and a `CONNECT`
//! tunnel), interleaved in the same run; and a small request's round trip, direct against
//! through the proxy (its added latency: a head parse, the allow-list check and a second
//! connection). Prints p50 / p99, throughput and the ratio to direct.
//!
//! `cargo bench -p toolmesh-sandbox --bench egress`; `BENCH_MB` (default 100),
//! `BENCH_DOWNLOADS` (default 10 per path), `BENCH_ITERATIONS` (small requests per path,
//! default 500). Everything runs on loopback, so the proxy's copy competes with the client
//! and the server for the same two cores.
//!
//! `BENCH_URL` (an `https://` file of at least `BENCH_MB` MB) adds a real download: its
//! first `BENCH_MB` MB (a `Range` request) direct and through a `CONNECT` tunnel of the proxy,
//! interleaved, with reqwest and the system's roots. The proxy's allow-list names the URL's
//! host and, where it resolves to a non-public address (a local mirror), that address.
#![allow(clippy::print_stderr)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolmesh_sandbox::egress::{AllowList, OnDecision, Proxy, ProxyLimits};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Answers every request with `size` bytes (`/small`: 2 bytes), one request per connection.
async fn server(size: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body: Arc<Vec<u8>> = Arc::new(vec![b'x'; size]);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let small = head.windows(6).any(|w| w == b"/small");
                let body: &[u8] = if small { b"ok" } else { &body };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.write_all(body).await;
            });
        }
    });
    addr
}

#[derive(Clone, Copy)]
enum Path {
    Direct,
    Relay,
    Tunnel,
}

/// One GET to its last byte; the bytes read (head included).
async fn fetch(path: Path, target: SocketAddr, proxy: SocketAddr, auth: &str, what: &str) -> usize {
    let get = format!("GET /{what} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let mut s = match path {
        Path::Direct => {
            let mut s = TcpStream::connect(target).await.unwrap();
            s.write_all(get.as_bytes()).await.unwrap();
            s
        }
        Path::Relay => {
            let mut s = TcpStream::connect(proxy).await.unwrap();
            let req = format!(
                "GET http://{target}/{what} HTTP/1.1\r\nHost: {target}\r\n\
                 Proxy-Authorization: Basic {auth}\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await.unwrap();
            s
        }
        Path::Tunnel => {
            let mut s = TcpStream::connect(proxy).await.unwrap();
            let req =
                format!("CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            assert!(head.starts_with(b"HTTP/1.1 200"));
            s.write_all(get.as_bytes()).await.unwrap();
            s
        }
    };
    let _ = s.set_nodelay(true);
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match s.read(&mut buf).await.unwrap() {
            0 => return total,
            n => total += n,
        }
    }
}

/// One row a path, `kind` first: p50 and p99 of its download `times` (sorted here), MB/s of
/// `mb` MB at p50, and that rate over the first path's.
fn print_rates(kind: &str, names: &[&str], times: &mut [Vec<Duration>], mb: usize) {
    let mut first = 0.0;
    for (i, (name, times)) in names.iter().zip(times.iter_mut()).enumerate() {
        times.sort();
        let p50 = pct(times, 0.5);
        let rate = mb as f64 / p50.as_secs_f64();
        if i == 0 {
            first = rate;
        }
        eprintln!(
            "{kind:<8} {name:<22} p50 {:>8.1} ms  p99 {:>8.1} ms  {:>7.0} MB/s  ratio {:.2}",
            p50.as_secs_f64() * 1e3,
            pct(times, 0.99).as_secs_f64() * 1e3,
            rate,
            rate / first
        );
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let mb = env_num("BENCH_MB", 100);
    let downloads = env_num("BENCH_DOWNLOADS", 10);
    let iterations = env_num("BENCH_ITERATIONS", 500);
    // The proxy and the server on a runtime of their own (two workers, as a worker node's),
    // the client on this thread.
    let serving = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (target, proxy, auth) = serving.block_on(async {
        let target = server(mb * 1_000_000).await;
        let proxy = Proxy::bind("127.0.0.1:0".parse().unwrap(), ProxyLimits::default())
            .await
            .unwrap();
        let on: OnDecision = Arc::new(|_| {});
        let env = proxy.register(
            "bench",
            AllowList::parse(&[format!("127.0.0.1/32:{}", target.port())]).unwrap(),
            on,
        );
        use base64::Engine as _;
        let userinfo = env.url[7..].split('@').next().unwrap().to_owned();
        let auth = base64::engine::general_purpose::STANDARD.encode(userinfo);
        (target, proxy, auth)
    });
    let addr = proxy.local_addr();
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let paths = [
        ("direct", Path::Direct),
        ("proxy, HTTP relay", Path::Relay),
        ("proxy, CONNECT tunnel", Path::Tunnel),
    ];
    eprintln!(
        "egress bench: {mb} MB × {downloads} per path, {iterations} small requests per path, load {}",
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    client.block_on(async {
        // Warm up every path once.
        for (_, p) in paths {
            fetch(p, target, addr, &auth, "big").await;
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); paths.len()];
        for _ in 0..downloads {
            for (i, (_, p)) in paths.iter().enumerate() {
                let t = Instant::now();
                let n = fetch(*p, target, addr, &auth, "big").await;
                times[i].push(t.elapsed());
                assert!(n >= mb * 1_000_000);
            }
        }
        let names: Vec<&str> = paths.iter().map(|(name, _)| *name).collect();
        print_rates("download", &names, &mut times, mb);
        let mut small: Vec<Vec<Duration>> = vec![Vec::new(); paths.len()];
        for _ in 0..iterations {
            for (i, (_, p)) in paths.iter().enumerate() {
                let t = Instant::now();
                fetch(*p, target, addr, &auth, "small").await;
                small[i].push(t.elapsed());
            }
        }
        let mut direct = Duration::ZERO;
        for (i, (name, _)) in paths.iter().enumerate() {
            small[i].sort();
            let p50 = pct(&small[i], 0.5);
            if i == 0 {
                direct = p50;
            }
            let total: Duration = small[i].iter().sum();
            eprintln!(
                "small    {name:<22} p50 {:>8.1} µs  p99 {:>8.1} µs  {:>7.0} req/s  +{:.1} µs ({:.2}×)",
                p50.as_secs_f64() * 1e6,
                pct(&small[i], 0.99).as_secs_f64() * 1e6,
                iterations as f64 / total.as_secs_f64(),
                (p50.as_secs_f64() - direct.as_secs_f64()) * 1e6,
                p50.as_secs_f64() / direct.as_secs_f64()
            );
        }
    });
    if let Ok(url) = std::env::var("BENCH_URL") {
        let allow = serving.block_on(allow_for(&url));
        let on: OnDecision = Arc::new(|_| {});
        let env = proxy.register("bench-url", AllowList::parse(&allow).unwrap(), on);
        client.block_on(real_download(&url, &env.url, mb, downloads));
    }
    serving.block_on(proxy.shutdown());
}

/// The allow-list for `url`: its host, plus each address it resolves to that is not public.
async fn allow_for(url: &str) -> Vec<String> {
    let parsed = url::Url::parse(url).expect("BENCH_URL is a URL");
    let host = parsed
        .host_str()
        .expect("BENCH_URL names a host")
        .to_owned();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let mut allow = vec![format!("{host}:{port}")];
    for addr in tokio::net::lookup_host((host.as_str(), port))
        .await
        .unwrap()
    {
        if toolmesh_kernel::egress::Egress::default()
            .check_host(&addr.ip().to_string(), port)
            .await
            .is_err()
        {
            allow.push(format!("{}:{port}", addr.ip()));
        }
    }
    allow
}

/// `BENCH_URL`'s first `mb` MB, direct and through the proxy's `CONNECT` tunnel.
async fn real_download(url: &str, proxy_url: &str, mb: usize, downloads: usize) {
    use futures::StreamExt as _;
    let direct = reqwest::Client::builder().no_proxy().build().unwrap();
    let proxied = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy_url).unwrap())
        .build()
        .unwrap();
    let range = format!("bytes=0-{}", mb * 1_000_000 - 1);
    let get = |client: reqwest::Client| {
        let range = range.clone();
        async move {
            let t = Instant::now();
            let response = client
                .get(url)
                .header("Range", range)
                .send()
                .await
                .expect("BENCH_URL answers");
            assert!(response.status().is_success(), "{}", response.status());
            let mut body = response.bytes_stream();
            let mut n = 0;
            while let Some(chunk) = body.next().await {
                n += chunk.expect("the body arrives").len();
            }
            assert_eq!(n, mb * 1_000_000, "a range of {mb} MB");
            t.elapsed()
        }
    };
    eprintln!("real download: {url}, {mb} MB × {downloads} per path");
    get(direct.clone()).await;
    get(proxied.clone()).await;
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..downloads {
        times[0].push(get(direct.clone()).await);
        times[1].push(get(proxied.clone()).await);
    }
    print_rates("real", &["direct", "proxy, CONNECT tunnel"], &mut times, mb);
}
