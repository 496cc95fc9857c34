//! Real services for tests: `nats-server`, `redis-server` and `toolmesh node` processes, each
//! killed and cleaned up when its handle drops. A missing binary is a panic that says which
//! Debian package to install.
//!
//! No port is bound, released and handed on (another process could take it in between): a
//! server picks its own port and the test reads it back from its log (`nats-server -p -1`, a
//! node's listeners on port 0); redis-server, which cannot, retries another port when its
//! candidate is taken.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What `log` writes through `tracing` while it runs on this thread, every level, as a node
/// writes it (`src/cli.rs`: the text format, or JSON lines with `json`), ANSI colours off.
pub fn captured_logs(json: bool, log: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone());
    if json {
        tracing::subscriber::with_default(builder.json().finish(), log);
    } else {
        tracing::subscriber::with_default(builder.finish(), log);
    }
    let bytes = buffer.0.lock().unwrap().clone();
    String::from_utf8(bytes).expect("logs are UTF-8")
}

fn find_binary(name: &str, package: &str) -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")]);
    for dir in candidates {
        let path = dir.join(name);
        if path.is_file() {
            return path;
        }
    }
    panic!("`{name}` is not installed; install it with `apt-get install -y {package}` (scripts/test does this)")
}

/// A program of the tests' Python venv (`scripts/python-venv` makes `target/venv` from
/// `tests/python/requirements.txt`): `venv_bin("python")`, `venv_bin("mcp-server-time")`.
/// `TOOLMESH_TEST_VENV` names another venv. A missing venv is a panic that says how to make it.
pub fn venv_bin(name: &str) -> PathBuf {
    let venv = std::env::var_os("TOOLMESH_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/venv"));
    let path = venv.join("bin").join(name);
    if !path.exists() {
        panic!(
            "{} is missing; run `scripts/python-venv` (scripts/test does this)",
            path.display()
        );
    }
    path
}

/// The lines a child process writes to one of its pipes, read on a thread of their own as they
/// come (the pipe never fills), kept, and each handed to `forward` first: to read what a
/// server says (where it listens) while its log goes on.
#[derive(Debug, Clone)]
pub struct LogTap(std::sync::Arc<TapState>);

#[derive(Debug, Default)]
struct TapState {
    /// The lines so far, and whether the pipe has closed (the process ended).
    lines: std::sync::Mutex<(Vec<String>, bool)>,
    changed: std::sync::Condvar,
}

impl LogTap {
    pub fn start(
        stream: impl std::io::Read + Send + 'static,
        mut forward: impl FnMut(&str) + Send + 'static,
    ) -> LogTap {
        use std::io::BufRead as _;
        let tap = LogTap(Default::default());
        let state = tap.0.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                forward(&line);
                state.lines.lock().unwrap().0.push(line);
                state.changed.notify_all();
            }
            state.lines.lock().unwrap().1 = true;
            state.changed.notify_all();
        });
        tap
    }

    /// The first answer of `find` for a line, written already or to come; `None` when the pipe
    /// closes or `timeout` passes first.
    pub fn find<T>(&self, timeout: Duration, mut find: impl FnMut(&str) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut lines = self.0.lines.lock().unwrap();
        let mut next = 0;
        loop {
            while next < lines.0.len() {
                if let Some(found) = find(&lines.0[next]) {
                    return Some(found);
                }
                next += 1;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if lines.1 || left.is_zero() {
                return None;
            }
            lines = self.0.changed.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        let lines = self.0.lines.lock().unwrap();
        lines.0.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// A loopback port held bound but not listening, for "nothing listens there": a connection to
/// it is refused at once, and no other process can listen on it while this value lives (a
/// port bound and released could be taken by anyone).
#[derive(Debug)]
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl ClosedPort {
    #[allow(clippy::new_without_default)]
    pub fn new() -> ClosedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(([127, 0, 0, 1], 0).into())
            .expect("bind a loopback port");
        let port = socket.local_addr().expect("a bound port").port();
        ClosedPort {
            _socket: socket,
            port,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// A `nats-server` on a port it picks itself (`-p -1`, read back from its log): JetStream off
/// ([`NatsServer::start`]) or on, with its store in the server's own temp dir
/// ([`NatsServer::start_jetstream`]), kept across [`NatsServer::restart`]. Its monitoring
/// endpoint (`-m -1`) answers [`NatsServer::interest`].
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    monitor: u16,
    options: NatsOptions,
    dir: tempfile::TempDir,
}

#[derive(Debug, Clone, Default)]
struct NatsOptions {
    /// A config file's text (the flags' port and address override its `listen`).
    config: Option<String>,
    jetstream: bool,
}

/// How long a server gets to say it listens.
const SERVER_START: Duration = Duration::from_secs(10);

impl NatsServer {
    pub fn start() -> NatsServer {
        Self::spawn(None, NatsOptions::default(), temp_dir())
    }

    /// Starts with a `max_payload` of `bytes` (the default is 1 MiB), so that tests of replies
    /// too big for one message need little data.
    pub fn start_with_max_payload(bytes: usize) -> NatsServer {
        Self::start_with_config(&format!("max_payload: {bytes}\n"))
    }

    /// Starts with a config file of `text` (users and permissions, limits); whatever `listen`
    /// it names, the server listens on 127.0.0.1 on a port it picks.
    pub fn start_with_config(text: &str) -> NatsServer {
        let options = NatsOptions {
            config: Some(text.to_owned()),
            ..NatsOptions::default()
        };
        Self::spawn(None, options, temp_dir())
    }

    /// Starts with JetStream on; its store lives in this server's temp dir.
    pub fn start_jetstream() -> NatsServer {
        let options = NatsOptions {
            jetstream: true,
            ..NatsOptions::default()
        };
        Self::spawn(None, options, temp_dir())
    }

    /// Kills the server (a crash) and starts it again on the same port with the same options
    /// and store: a JetStream server comes back with its streams.
    pub fn restart(&mut self) {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, temp_dir());
        let fresh = Self::spawn(Some(self.port), self.options.clone(), dir);
        // The old value's child is dead already; dropping it kills nothing that runs.
        *self = fresh;
    }

    /// `port`: the one to listen on (a restart), or `None` for one the server picks.
    fn spawn(port: Option<u16>, options: NatsOptions, dir: tempfile::TempDir) -> NatsServer {
        let bin = find_binary("nats-server", "nats-server");
        let mut command = Command::new(bin);
        let port_arg = port.map_or("-1".to_owned(), |p| p.to_string());
        command.args(["-a", "127.0.0.1", "-p", &port_arg, "-m", "-1"]);
        if let Some(text) = &options.config {
            let config = dir.path().join("nats.conf");
            std::fs::write(&config, text).expect("write nats.conf");
            command.arg("-c").arg(&config);
        }
        if options.jetstream {
            command
                .arg("-js")
                .arg("-sd")
                .arg(dir.path().join("jetstream"));
        }
        let (child, port, monitor) = start_nats(command.current_dir(dir.path()));
        NatsServer {
            child,
            port,
            monitor: monitor.expect("nats-server -m -1 says where it monitors"),
            options,
            dir,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A client connection to this server.
    pub async fn client(&self) -> async_nats::Client {
        async_nats::connect(self.url())
            .await
            .expect("connect to test nats-server")
    }

    /// How many subscriptions, of every client, a message published on `subject` (a literal
    /// subject) would reach now, as the server's monitoring endpoint (`/subsz`) counts them:
    /// to wait until another process has subscribed.
    pub async fn interest(&self, subject: &str) -> u64 {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.monitor))
            .await
            .expect("connect to the monitoring endpoint");
        let request = format!(
            "GET /subsz?subs=1&test={subject} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("ask /subsz");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("read /subsz");
        let (_, body) = response
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
        let subsz: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("/subsz is not JSON ({e}): {body}"));
        subsz["total"].as_u64().unwrap_or(0)
    }

    /// Kills the server now (a crash, not a shutdown).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// Starts `command` (a nats-server that logs to stderr) and waits until it is ready: the child,
/// the client port its log names and the monitoring port if it has one. Panics with the log
/// when the server stops first (a port in use, a bad config).
fn start_nats(command: &mut Command) -> (Child, u16, Option<u16>) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nats-server starts");
    let log = LogTap::start(child.stderr.take().expect("stderr"), |_| {});
    let port_of = |line: &str, after: &str| {
        let (_, addr) = line.split_once(after)?;
        let addr: std::net::SocketAddr = addr.trim().parse().ok()?;
        Some(addr.port())
    };
    let port = log.find(SERVER_START, |l| {
        port_of(l, "Listening for client connections on ")
    });
    let ready = log.find(SERVER_START, |l| {
        l.contains("Server is ready").then_some(())
    });
    let (Some(port), Some(())) = (port, ready) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("nats-server did not start:\n{}", log.text());
    };
    let monitor = log.find(Duration::ZERO, |l| port_of(l, "Starting http monitor on "));
    (child, port, monitor)
}

/// nats-server with the compose cluster's `docker/nats.conf`: its users, their permissions and
/// JetStream, on a port it picks with a temp store. Every password is `<user>-pw`, where
/// `<user>` is `node` (the `toolmesh` user), `provider`, `approver` or an account (`acme`,
/// `globex`).
#[derive(Debug)]
pub struct AuthNats {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl AuthNats {
    pub fn start() -> AuthNats {
        let dir = temp_dir();
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docker/nats.conf"
        ))
        .expect("docker/nats.conf");
        let mut text = text
            // The flags below say where it listens.
            .replace("listen: 0.0.0.0:4222", "")
            .replace("http: 0.0.0.0:8222", "")
            .replace(
                "store_dir: /data",
                &format!("store_dir: {:?}", dir.path().join("js")),
            );
        for (variable, password) in [
            ("$TOOLMESH_NODE_PASSWORD", "node-pw"),
            ("$PROVIDER_PASSWORD", "provider-pw"),
            ("$ACME_PASSWORD", "acme-pw"),
            ("$GLOBEX_PASSWORD", "globex-pw"),
            ("$APPROVER_PASSWORD", "approver-pw"),
        ] {
            text = text.replace(variable, &format!("{password:?}"));
        }
        let config = dir.path().join("nats.conf");
        std::fs::write(&config, text).expect("write the config");
        let (child, port, _) = start_nats(
            Command::new(find_binary("nats-server", "nats-server"))
                .args(["-a", "127.0.0.1", "-p", "-1", "-c"])
                .arg(&config),
        );
        AuthNats {
            child,
            port,
            _dir: dir,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The NATS user name of `user` (`node` is the `toolmesh` user).
    pub fn user_name(user: &str) -> &str {
        match user {
            "node" => "toolmesh",
            other => other,
        }
    }

    /// The URL with `user`'s name and password.
    pub fn url(&self, user: &str) -> String {
        format!(
            "nats://{}:{user}-pw@127.0.0.1:{}",
            Self::user_name(user),
            self.port
        )
    }

    /// The inbox prefix `user` must connect with: `_INBOX` for nodes, `_INBOX.<user>` for the
    /// others (their permissions allow no other).
    pub fn inbox_prefix(user: &str) -> String {
        match user {
            "node" => "_INBOX".to_owned(),
            other => format!("_INBOX.{other}"),
        }
    }

    /// A client connected as `user`, with that user's inbox prefix.
    pub async fn client(&self, user: &str) -> async_nats::Client {
        async_nats::ConnectOptions::new()
            .user_and_password(Self::user_name(user).to_owned(), format!("{user}-pw"))
            .custom_inbox_prefix(Self::inbox_prefix(user))
            .connect(format!("127.0.0.1:{}", self.port))
            .await
            .unwrap_or_else(|e| panic!("connect to the test nats-server as {user}: {e}"))
    }
}

impl Drop for AuthNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Raw HTTP/1.1 over a TCP stream, for tests of what a listener does with a client that is
/// slow, silent or one too many.
pub mod raw_http {
    use tokio::io::AsyncReadExt as _;
    use tokio::net::TcpStream;

    /// Reads one response (its head and a `Content-Length` body; the connection stays open)
    /// and answers its status line. Panics when the server closes the connection first.
    pub async fn read_response(stream: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().unwrap())
                    })
                    .unwrap_or_else(|| panic!("a response with a Content-Length: {head}"));
                if got.len() >= end + 4 + length {
                    return head.lines().next().unwrap_or_default().to_owned();
                }
            }
            let n = stream.read(&mut buf).await.expect("the response arrives");
            assert!(n > 0, "closed before the response: {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
    }

    /// Reads until the server closes the connection (end of stream or reset).
    pub async fn read_until_closed(stream: &mut TcpStream) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    }
}

/// A `redis-server` on a port of its own, persisting (AOF) into its own temp dir so that a
/// restart on the same dir keeps the data.
///
/// redis-server cannot pick its port (`--port 0` means no TCP at all), so it starts on a
/// random candidate below the range the kernel hands out for port 0 and, when that port is
/// taken (its log says "Address already in use" and it exits), again on another: the port is
/// never bound and released before the server takes it.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// How many taken candidate ports [`RedisServer::start`] tries past.
const REDIS_TRIES: usize = 50;

impl RedisServer {
    pub fn start() -> RedisServer {
        let dir = temp_dir();
        for _ in 0..REDIS_TRIES {
            match Self::spawn(candidate_port(), &dir) {
                Ok((child, port)) => return RedisServer { child, port, dir },
                Err(PortTaken) => continue,
            }
        }
        panic!("redis-server found no free port in {REDIS_TRIES} tries");
    }

    /// Starts redis-server on `port`: `Err` when the port is taken; a panic with its log when
    /// it stops for another reason.
    fn spawn(port: u16, dir: &tempfile::TempDir) -> Result<(Child, u16), PortTaken> {
        let bin = find_binary("redis-server", "redis-server");
        let mut child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
            ])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        // It logs to stdout; "Ready" comes once it listens and has loaded its AOF.
        let log = LogTap::start(child.stdout.take().expect("stdout"), |_| {});
        let ready = log.find(SERVER_START, |l| {
            l.contains("Ready to accept connections").then_some(())
        });
        if ready.is_some() {
            return Ok((child, port));
        }
        let _ = child.kill();
        let _ = child.wait();
        let text = log.text();
        if text.contains("Address already in use") {
            return Err(PortTaken);
        }
        panic!("redis-server did not start on port {port}:\n{text}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server (SIGKILL); `restart` brings it back with its data, on its port.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server (SIGKILL) if it runs and starts it again on the same port and data
    /// directory (clients expect it there: a port taken meanwhile is a panic).
    pub fn restart(&mut self) {
        self.kill();
        let (child, _) = Self::spawn(self.port, &self.dir).unwrap_or_else(|PortTaken| {
            panic!("port {} was taken while redis-server was down", self.port)
        });
        self.child = child;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// redis-server reported its port in use.
#[derive(Debug)]
struct PortTaken;

/// A random port below the kernel's ephemeral range (`ip_local_port_range`), where no port-0
/// listener or outgoing connection of this machine lands; anything else there is a retry.
fn candidate_port() -> u16 {
    use std::hash::BuildHasher as _;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32_768);
    let (from, to) = if low > 11_000 {
        (10_000, low)
    } else {
        (10_000, 65_536)
    };
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    u16::try_from(from + random % (to - from)).expect("a port number")
}

/// A `toolmesh node` process (the real binary), stopped on drop. Its log (stderr) goes on to
/// this process's stderr as before, and is read for the addresses its listeners bound: give a
/// listener port 0 (`TOOLMESH_MCP_LISTEN=127.0.0.1:0`) and ask [`Node::addr`].
#[derive(Debug)]
pub struct Node {
    child: Child,
    pub node_id: String,
    log: LogTap,
}

/// A listener of a node, which logs the address it bound at `info` (the node's log
/// level is raised to `info` for these lines only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `TOOLMESH_MCP_LISTEN` (role `mcp`).
    Mcp,
    /// `TOOLMESH_CONSOLE_LISTEN` (role `console`).
    Console,
    /// `TOOLMESH_METRICS_LISTEN`.
    Metrics,
}

impl Listener {
    const ALL: [Listener; 3] = [Listener::Mcp, Listener::Console, Listener::Metrics];

    /// The log target and the start of the message of the line that names the address.
    fn line(self) -> (&'static str, &'static str) {
        match self {
            Listener::Mcp => ("toolmesh_mcp", "MCP over streamable HTTP at /mcp"),
            Listener::Console => ("toolmesh_console", "approvals console at "),
            Listener::Metrics => ("toolmesh::metrics", "serving metrics at /metrics"),
        }
    }

    /// The address in `line` when it is this listener's line, in the text or the JSON format.
    fn addr_in(self, line: &str) -> Option<std::net::SocketAddr> {
        let (target, message) = self.line();
        if let Ok(json) = serde_json::from_str::<serde_json::Value>(line) {
            let fields = &json["fields"];
            if json["target"] != target || !fields["message"].as_str()?.starts_with(message) {
                return None;
            }
            return fields["addr"].as_str()?.parse().ok();
        }
        let (_, rest) = line.split_once(&format!(" {target}: {message}"))?;
        let (_, addr) = rest.split_once(" addr=")?;
        addr.split_whitespace().next()?.parse().ok()
    }

    /// Whether `line` is an `info` line of this listener's target (shown only because the
    /// level was raised for it).
    fn is_info_of(self, line: &str) -> bool {
        let (target, _) = self.line();
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(json) => json["level"] == "INFO" && json["target"] == target,
            Err(_) => line.contains(&format!(" INFO {target}: ")),
        }
    }
}

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub binary: PathBuf,
    pub roles: String,
    pub node_id: String,
    pub env: Vec<(String, String)>,
}

impl NodeSpec {
    pub fn new(binary: impl Into<PathBuf>, roles: &str, node_id: &str) -> NodeSpec {
        NodeSpec {
            binary: binary.into(),
            roles: roles.into(),
            node_id: node_id.into(),
            env: Vec::new(),
        }
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> NodeSpec {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the node and waits until it answers `toolmesh.v1.status.<node_id>`.
    pub async fn start(&self, nats: &async_nats::Client) -> Node {
        let chosen = self
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "RUST_LOG")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var("RUST_LOG").ok());
        // The listeners' address lines at `info` first, so that a level the caller sets for
        // one of their targets wins.
        let raised: Vec<String> = Listener::ALL
            .iter()
            .map(|l| format!("{}=info", l.line().0))
            .collect();
        let filter = format!(
            "{},{}",
            raised.join(","),
            chosen.as_deref().unwrap_or("warn")
        );
        let mut cmd = Command::new(&self.binary);
        cmd.args(["node", "--roles", &self.roles])
            .env("TOOLMESH_NODE_ID", &self.node_id)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.env("RUST_LOG", filter);
        let mut child = cmd.spawn().expect("toolmesh node starts");
        // Passed on as an inherited stderr would show it (past the test harness's capture),
        // without the lines only the raised level let through.
        let hide_raised = chosen.is_none();
        let log = LogTap::start(child.stderr.take().expect("stderr"), move |line| {
            if hide_raised && Listener::ALL.iter().any(|l| l.is_info_of(line)) {
                return;
            }
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        });
        let subject = format!("toolmesh.v1.status.{}", self.node_id);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("node {} exited during startup: {status}", self.node_id);
            }
            let ask = nats.request(subject.clone(), "{}".into());
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), ask).await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not answer status within 15 s",
                self.node_id
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Node {
            child,
            node_id: self.node_id.clone(),
            log,
        }
    }
}

impl Node {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address `listener` bound, as the node logged it (before it answered status, so
    /// this waits only for the log's reader). Panics when the node has no such listener.
    pub fn addr(&self, listener: Listener) -> std::net::SocketAddr {
        self.log
            .find(Duration::from_secs(10), |line| listener.addr_in(line))
            .unwrap_or_else(|| {
                panic!(
                    "node {} logged no address of its {listener:?} listener:\n{}",
                    self.node_id,
                    self.log.text()
                )
            })
    }

    /// SIGKILL: the node dies without draining.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (the node drains).
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// SIGTERM, then waits (blocking the thread) up to `timeout` for the drained node to exit,
    /// then SIGKILL if it has not. True when it exited by itself (or was gone already). For
    /// `Drop`s that must clean up after a node.
    pub fn stop_blocking(&mut self, timeout: Duration) -> bool {
        if let Ok(Some(_)) = self.child.try_wait() {
            return true;
        }
        self.terminate();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// Waits for the process to exit; `None` if it is still running after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a JSON request and parses the JSON reply.
pub async fn request_json(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: serde_json::Value,
) -> serde_json::Value {
    request_raw(client, subject, serde_json::to_vec(&body).expect("json")).await
}

/// Sends raw bytes and parses the JSON reply (10 s timeout).
pub async fn request_raw(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: Vec<u8>,
) -> serde_json::Value {
    request_raw_within(client, subject, body, Duration::from_secs(10)).await
}

/// [`request_json`], waiting up to `wait` for the reply: for a call whose own time limit is
/// longer than the default 10 s.
pub async fn request_json_within(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: serde_json::Value,
    wait: Duration,
) -> serde_json::Value {
    request_raw_within(
        client,
        subject,
        serde_json::to_vec(&body).expect("json"),
        wait,
    )
    .await
}

async fn request_raw_within(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: Vec<u8>,
    wait: Duration,
) -> serde_json::Value {
    let subject = subject.into();
    let request = async_nats::Request::new()
        .payload(body.into())
        .timeout(Some(wait));
    let reply = tokio::time::timeout(wait, client.send_request(subject.clone(), request))
        .await
        .unwrap_or_else(|_| panic!("no reply on {subject} within {wait:?}"))
        .unwrap_or_else(|e| panic!("request on {subject} failed: {e}"));
    serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|e| panic!("reply on {subject} is not JSON ({e}): {:?}", reply.payload))
}

/// An HTTP/1.1 server the tests run on every host address, so a sandbox container can be
/// pointed at it: `/bytes/<n>` answers n bytes `x`, any other path `hello from <path>`; one
/// request per connection. Answers its port.
pub async fn http_target() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind the HTTP target");
    let port = listener.local_addr().expect("a bound port").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                let body = match path.strip_prefix("/bytes/") {
                    Some(n) => vec![b'x'; n.parse().unwrap_or(0)],
                    None => format!("hello from {path}").into_bytes(),
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    port
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `line` is `listener`'s line naming `addr`, or no line of it (`None`).
    fn check(listener: Listener, line: &str, addr: Option<&str>) {
        let expected = addr.map(|a| a.parse().unwrap());
        assert_eq!(listener.addr_in(line), expected, "{listener:?} in {line}");
    }

    #[test]
    fn a_nodes_listener_lines_name_their_addresses() {
        let text = "2026-12-04T22:46:40.583768Z  INFO";
        check(
            Listener::Metrics,
            &format!("{text} toolmesh::metrics: serving metrics at /metrics addr=127.0.0.1:34447"),
            Some("127.0.0.1:34447"),
        );
        check(
            Listener::Mcp,
            &format!("{text} toolmesh_mcp: MCP over streamable HTTP at /mcp addr=127.0.0.1:37989"),
            Some("127.0.0.1:37989"),
        );
        check(
            Listener::Console,
            &format!("{text} toolmesh_console: approvals console at http://127.0.0.1:46327/ addr=127.0.0.1:46327"),
            Some("127.0.0.1:46327"),
        );
        check(
            Listener::Mcp,
            r#"{"timestamp":"2026-12-04T22:46:44.616294Z","level":"INFO","fields":{"message":"MCP over streamable HTTP at /mcp","addr":"127.0.0.1:43449"},"target":"toolmesh_mcp"}"#,
            Some("127.0.0.1:43449"),
        );
        // Another listener's line, another line of the target, another target.
        check(
            Listener::Console,
            &format!("{text} toolmesh_mcp: MCP over streamable HTTP at /mcp addr=127.0.0.1:1"),
            None,
        );
        check(
            Listener::Console,
            &format!("{text} toolmesh_console: TOOLMESH_CONSOLE_TOKENS is not set"),
            None,
        );
        check(
            Listener::Metrics,
            r#"{"level":"INFO","fields":{"message":"serving metrics at /metrics","addr":"127.0.0.1:2"},"target":"other"}"#,
            None,
        );
    }

    #[test]
    fn only_the_raised_info_lines_are_hidden() {
        let raised = |line: &str| Listener::ALL.iter().any(|l| l.is_info_of(line));
        assert!(raised(
            "2026-12-04T22:46:40Z  INFO toolmesh_mcp: MCP over streamable HTTP"
        ));
        assert!(raised(r#"{"level":"INFO","target":"toolmesh::metrics"}"#));
        assert!(!raised(
            "2026-12-04T22:46:40Z  WARN toolmesh_console: no tokens"
        ));
        assert!(!raised(
            "2026-12-04T22:46:40Z  INFO toolmesh::node: started"
        ));
    }

    #[tokio::test]
    async fn nats_picks_its_port_keeps_it_across_a_restart_and_counts_interest() {
        let mut nats = NatsServer::start();
        let port = nats.port();
        let client = nats.client().await;
        assert_eq!(nats.interest("a.b").await, 0);
        let _sub = client.subscribe("a.*").await.unwrap();
        // The server has the subscription a moment after the client sent it.
        assert!(
            wait_until(Duration::from_secs(5), || async {
                nats.interest("a.b").await == 1
            })
            .await
        );
        nats.restart();
        assert_eq!(nats.port(), port);
        nats.client().await.flush().await.unwrap();
    }

    #[tokio::test]
    async fn two_redis_servers_get_two_ports_and_one_comes_back_on_its_own() {
        let first = RedisServer::start();
        let mut second = RedisServer::start();
        assert_ne!(first.port(), second.port());
        let port = second.port();
        second.restart();
        assert_eq!(second.port(), port);
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("redis-server listens again");
    }

    #[test]
    fn a_taken_candidate_port_is_retried() {
        let dir = temp_dir();
        let first = RedisServer::start();
        assert!(matches!(
            RedisServer::spawn(first.port(), &dir),
            Err(PortTaken)
        ));
    }

    #[tokio::test]
    async fn a_closed_port_refuses_connections() {
        let closed = ClosedPort::new();
        let refused = tokio::net::TcpStream::connect(("127.0.0.1", closed.port()))
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
