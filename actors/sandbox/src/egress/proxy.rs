//! The egress proxy: an HTTP proxy that relays absolute-form `http://` requests and `CONNECT`
//! tunnels for registered sandboxes, each only to the targets of its own [`AllowList`].
//!
//! A sandbox names itself with the credential in its proxy URL (`http://<user>:<secret>@…`,
//! sent as `Proxy-Authorization: Basic …`); a request without a registered credential is
//! `407` and reaches nothing. Every target a known sandbox names is one [`Decision`]:
//! allowed ones are connected to (to the addresses the allow-list check answered, never
//! resolved again), refused ones are `403` with the reason as the body. Bounds: at most
//! [`ProxyLimits::max_connections`] connections (and `per_sandbox` for one sandbox; `503`
//! past them), a request head of at most `max_head` bytes (`431`) read within
//! `head_timeout` (`408`), an upstream connection within `connect_timeout` (`504`), and a
//! relay that ends once no byte moved either way for `idle`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::allow::AllowList;

/// One target a sandbox asked for, and whether the proxy let it through. The sandbox actor
/// turns it into an `egress` RunEvent (`{"host", "port", "allowed"}`, [`Decision::event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// As the request named it: a lower-case name or an IP address.
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// Why it was refused.
    pub reason: Option<String>,
}

impl Decision {
    /// The `egress` RunEvent's data (PROTOCOL.md "Sandbox templates").
    pub fn event(&self) -> serde_json::Value {
        serde_json::json!({"host": self.host, "port": self.port, "allowed": self.allowed})
    }
}

/// Called with every decision of one sandbox's proxy requests.
pub type OnDecision = Arc<dyn Fn(Decision) + Send + Sync>;

/// The proxy's bounds.
#[derive(Debug, Clone)]
pub struct ProxyLimits {
    pub max_connections: usize,
    pub per_sandbox: usize,
    pub max_head: usize,
    pub head_timeout: Duration,
    pub connect_timeout: Duration,
    pub idle: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            per_sandbox: 128,
            max_head: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle: Duration::from_secs(120),
        }
    }
}

/// What a registered sandbox needs to use the proxy: its environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyEnv {
    /// The proxy URL with the sandbox's credential.
    pub url: String,
    /// `HTTP_PROXY`, `HTTPS_PROXY`, `http_proxy`, `https_proxy` (the URL), `NO_PROXY` and
    /// `no_proxy` (empty: everything goes through the proxy).
    pub vars: BTreeMap<String, String>,
}

struct Client {
    key: String,
    secret: String,
    allow: AllowList,
    on_decision: OnDecision,
    open: Arc<Semaphore>,
    /// Cancelled on unregister: the sandbox's open connections end.
    gone: CancellationToken,
}

struct Shared {
    limits: ProxyLimits,
    /// By proxy user name.
    clients: Mutex<HashMap<String, Arc<Client>>>,
    connections: Arc<Semaphore>,
    next_user: AtomicU64,
}

/// A running egress proxy (one per worker). Dropping it stops it; [`Proxy::shutdown`] also
/// waits for its connections to end.
pub struct Proxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("addr", &self.addr).finish()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Proxy {
    /// Listens on `addr` (port 0: any free port) and serves until stopped.
    pub async fn bind(addr: SocketAddr, limits: ProxyLimits) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            clients: Mutex::new(HashMap::new()),
            next_user: AtomicU64::new(1),
        });
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(accept_loop(
            listener,
            shared.clone(),
            stop.clone(),
            tasks.clone(),
        ));
        Ok(Self {
            shared,
            addr,
            stop,
            tasks,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Lets the sandbox `key` use the proxy for the targets of `allow`; a second call for the
    /// same key replaces the first (its credential stops working). The credential is fresh
    /// and random, so no sandbox can guess another's.
    pub fn register(&self, key: &str, allow: AllowList, on_decision: OnDecision) -> ProxyEnv {
        self.unregister(key);
        let n = self.shared.next_user.fetch_add(1, Ordering::Relaxed);
        let user = format!("s{n}");
        let secret = uuid::Uuid::new_v4().simple().to_string();
        let client = Arc::new(Client {
            key: key.to_owned(),
            secret: secret.clone(),
            allow,
            on_decision,
            open: Arc::new(Semaphore::new(self.shared.limits.per_sandbox)),
            gone: self.stop.child_token(),
        });
        self.shared
            .clients
            .lock()
            .expect("proxy clients")
            .insert(user.clone(), client);
        let url = format!("http://{user}:{secret}@{}", self.addr);
        let mut vars = BTreeMap::new();
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            vars.insert(name.to_owned(), url.clone());
        }
        for name in ["NO_PROXY", "no_proxy"] {
            vars.insert(name.to_owned(), String::new());
        }
        ProxyEnv { url, vars }
    }

    /// Ends the sandbox `key`'s use of the proxy: its credential stops working and its open
    /// connections end.
    pub fn unregister(&self, key: &str) {
        let mut clients = self.shared.clients.lock().expect("proxy clients");
        clients.retain(|_, c| {
            let keep = c.key != key;
            if !keep {
                c.gone.cancel();
            }
            keep
        });
    }

    /// Stops listening, ends every connection and waits for them.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                let stop = stop.clone();
                tasks.spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = serve(shared, stream, peer) => {}
                    }
                });
            }
            Err(error) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(%error, "egress proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// An answer the proxy gives itself.
async fn respond<W: AsyncWrite + Unpin>(stream: &mut W, status: u16, text: &str, extra: &str) {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let body = format!("{text}\n");
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
}

enum HeadError {
    Closed,
    TooLarge,
    Io,
}

/// Reads up to the end of the request head; returns the head and what came after it.
async fn read_head<R: AsyncRead + Unpin>(
    stream: &mut R,
    max: usize,
) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|_| HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + at + 4;
            if end > max {
                return Err(HeadError::TooLarge);
            }
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > max {
            return Err(HeadError::TooLarge);
        }
    }
}

/// The target of a request: `CONNECT host:port`, or an absolute `http://` URL.
enum Target {
    Tunnel {
        host: String,
        port: u16,
    },
    Http {
        host: String,
        port: u16,
        head: Vec<u8>,
    },
}

async fn serve(shared: Arc<Shared>, mut stream: TcpStream, peer: SocketAddr) {
    let Ok(_permit) = shared.connections.clone().try_acquire_owned() else {
        respond(
            &mut stream,
            503,
            "the egress proxy has too many connections",
            "",
        )
        .await;
        return;
    };
    let limits = shared.limits.clone();
    let (head, rest) =
        match tokio::time::timeout(limits.head_timeout, read_head(&mut stream, limits.max_head))
            .await
        {
            Err(_) => {
                respond(
                    &mut stream,
                    408,
                    "the request head did not arrive in time",
                    "",
                )
                .await;
                return;
            }
            Ok(Err(HeadError::TooLarge)) => {
                let text = format!("the request head is over {} bytes", limits.max_head);
                respond(&mut stream, 431, &text, "").await;
                return;
            }
            Ok(Err(HeadError::Closed | HeadError::Io)) => return,
            Ok(Ok(read)) => read,
        };
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Err(httparse::Error::TooManyHeaders) => {
            respond(&mut stream, 431, "the request has over 100 headers", "").await;
            return;
        }
        _ => {
            respond(&mut stream, 400, "not an HTTP request", "").await;
            return;
        }
    }
    let Some(client) = authenticate(&shared, &request) else {
        tracing::debug!(%peer, "egress proxy: a request without a registered credential");
        respond(
            &mut stream,
            407,
            "this proxy serves registered sandboxes only",
            "Proxy-Authenticate: Basic realm=\"toolmesh-egress\"\r\n",
        )
        .await;
        return;
    };
    let Ok(_own) = client.open.clone().try_acquire_owned() else {
        respond(
            &mut stream,
            503,
            "this sandbox has too many proxy connections",
            "",
        )
        .await;
        return;
    };
    let target = match target_of(&request) {
        Ok(target) => target,
        Err(text) => {
            respond(&mut stream, 400, &text, "").await;
            return;
        }
    };
    let (host, port) = match &target {
        Target::Tunnel { host, port } | Target::Http { host, port, .. } => (host.clone(), *port),
    };
    let checked = client.allow.check(&host, port).await;
    (client.on_decision)(Decision {
        host: host.clone(),
        port,
        allowed: checked.is_ok(),
        reason: checked.as_ref().err().map(|r| r.0.clone()),
    });
    let addrs = match checked {
        Ok(addrs) => addrs,
        Err(refused) => {
            tracing::debug!(sandbox = %client.key, %host, port, reason = %refused, "egress refused");
            let text = format!("egress to {host}:{port} refused: {refused}");
            respond(&mut stream, 403, &text, "").await;
            return;
        }
    };
    let upstream = match tokio::time::timeout(limits.connect_timeout, connect_any(&addrs)).await {
        Err(_) => {
            let text = format!("connecting to {host}:{port} timed out");
            respond(&mut stream, 504, &text, "").await;
            return;
        }
        Ok(Err(error)) => {
            let text = format!("cannot connect to {host}:{port}: {error}");
            respond(&mut stream, 502, &text, "").await;
            return;
        }
        Ok(Ok(upstream)) => upstream,
    };
    let _ = upstream.set_nodelay(true);
    let mut upstream = upstream;
    let first = match target {
        Target::Tunnel { .. } => {
            let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
            if stream.write_all(established).await.is_err() {
                return;
            }
            rest
        }
        Target::Http { mut head, .. } => {
            head.extend_from_slice(&rest);
            head
        }
    };
    if !first.is_empty() && upstream.write_all(&first).await.is_err() {
        return;
    }
    tokio::select! {
        _ = client.gone.cancelled() => {}
        _ = relay(stream, upstream, limits.idle) => {}
    }
}

fn authenticate(shared: &Shared, request: &httparse::Request<'_, '_>) -> Option<Arc<Client>> {
    use base64::Engine as _;
    let value = request
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))?
        .value;
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, secret) = decoded.split_once(':')?;
    let client = shared
        .clients
        .lock()
        .expect("proxy clients")
        .get(user)
        .cloned()?;
    same(client.secret.as_bytes(), secret.as_bytes()).then_some(client)
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Headers a proxy consumes or that describe the client's connection, not the request.
const HOP_BY_HOP: &[&str] = &[
    "proxy-authorization",
    "proxy-connection",
    "connection",
    "keep-alive",
    "host",
    "te",
    "upgrade",
];

fn target_of(request: &httparse::Request<'_, '_>) -> Result<Target, String> {
    let method = request.method.unwrap_or_default();
    let path = request.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(path)
            .ok_or_else(|| format!("CONNECT names {path:?}, not host:port"))?;
        return Ok(Target::Tunnel { host, port });
    }
    let url = url::Url::parse(path).map_err(|_| {
        format!("{path:?} is not an absolute http:// URL (this is a proxy; use CONNECT for https)")
    })?;
    if url.scheme() != "http" {
        return Err(format!(
            "scheme {}: is not relayed; use CONNECT for https",
            url.scheme()
        ));
    }
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return Err(format!("{path:?} names no host"));
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a URL with credentials is not relayed; send an Authorization header".into());
    }
    let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
    let authority = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_owned(),
    };
    let mut origin = url.path().to_owned();
    if let Some(query) = url.query() {
        origin.push('?');
        origin.push_str(query);
    }
    let version = request.version.unwrap_or(1);
    let mut head =
        format!("{method} {origin} HTTP/1.{version}\r\nHost: {authority}\r\n").into_bytes();
    for header in request.headers.iter() {
        if HOP_BY_HOP
            .iter()
            .any(|h| header.name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        head.extend_from_slice(header.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(header.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Target::Http { host, port, head })
}

/// `host:port`, `[v6]:port`; the host lower-case without brackets.
fn split_authority(authority: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, port) = rest.split_once("]:")?;
        (host, port)
    } else {
        authority.rsplit_once(':')?
    };
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    if host.is_empty() || host.contains(['/', '@', ' ']) {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

async fn connect_any(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// Copies both ways until both ends closed, or until no byte moved for `idle`.
async fn relay(client: TcpStream, upstream: TcpStream, idle: Duration) {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let both = futures::future::join(pump(cr, uw, &last, start), pump(ur, cw, &last, start));
    let watchdog = async {
        loop {
            tokio::time::sleep(idle / 4).await;
            let quiet = start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if quiet >= idle {
                return;
            }
        }
    };
    tokio::select! {
        _ = both => {}
        _ = watchdog => {}
    }
}

async fn pump<R, W>(mut from: R, mut to: W, last: &AtomicU64, start: Instant)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(
            split_authority("Example.com:443"),
            Some(("example.com".into(), 443))
        );
        assert_eq!(split_authority("[::1]:8080"), Some(("::1".into(), 8080)));
        assert_eq!(
            split_authority("127.0.0.1:80"),
            Some(("127.0.0.1".into(), 80))
        );
        for bad in [
            "example.com",
            "example.com:0",
            ":443",
            "a@b:443",
            "x:99999",
            "[::1]",
        ] {
            assert_eq!(split_authority(bad), None, "{bad}");
        }
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
