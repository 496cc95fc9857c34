//! Real services for tests: `nats-server`, `redis-server` and `toolmesh node` processes on free
//! ports, each killed and cleaned up when its handle drops. A missing binary is a panic that
//! says which Debian package to install.

use std::net::TcpListener;
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

/// A free TCP port on 127.0.0.1 (bound, then released for the child to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
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

fn wait_for_port(port: u16, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on port {port}: {status}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{what} did not listen on port {port} within 10 s");
}

/// A `nats-server` on a random port: JetStream off ([`NatsServer::start`]) or on, with its store
/// in the server's own temp dir ([`NatsServer::start_jetstream`]), kept across
/// [`NatsServer::restart`].
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    options: NatsOptions,
    dir: tempfile::TempDir,
}

#[derive(Debug, Clone, Copy, Default)]
struct NatsOptions {
    max_payload: Option<usize>,
    jetstream: bool,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        Self::start_on(free_port())
    }

    /// Starts on a given port (to restart a server where clients expect it).
    pub fn start_on(port: u16) -> NatsServer {
        Self::spawn(
            port,
            NatsOptions::default(),
            tempfile::tempdir().expect("temp dir"),
        )
    }

    /// Starts with a `max_payload` of `bytes` (the default is 1 MiB), so that tests of replies
    /// too big for one message need little data.
    pub fn start_with_max_payload(bytes: usize) -> NatsServer {
        let options = NatsOptions {
            max_payload: Some(bytes),
            ..NatsOptions::default()
        };
        Self::spawn(free_port(), options, tempfile::tempdir().expect("temp dir"))
    }

    /// Starts with JetStream on; its store lives in this server's temp dir.
    pub fn start_jetstream() -> NatsServer {
        let options = NatsOptions {
            jetstream: true,
            ..NatsOptions::default()
        };
        Self::spawn(free_port(), options, tempfile::tempdir().expect("temp dir"))
    }

    /// Kills the server (a crash) and starts it again on the same port with the same options
    /// and store: a JetStream server comes back with its streams.
    pub fn restart(&mut self) {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        let fresh = Self::spawn(self.port, self.options, dir);
        // The old value's child is dead already; dropping it kills nothing that runs.
        *self = fresh;
    }

    fn spawn(port: u16, options: NatsOptions, dir: tempfile::TempDir) -> NatsServer {
        let bin = find_binary("nats-server", "nats-server");
        let mut command = Command::new(bin);
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        if let Some(bytes) = options.max_payload {
            let config = dir.path().join("nats.conf");
            std::fs::write(&config, format!("max_payload: {bytes}\n")).expect("write nats.conf");
            command.arg("-c").arg(&config);
        }
        if options.jetstream {
            command
                .arg("-js")
                .arg("-sd")
                .arg(dir.path().join("jetstream"));
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .current_dir(dir.path())
            .spawn()
            .expect("nats-server starts");
        wait_for_port(port, "nats-server", &mut child);
        NatsServer {
            child,
            port,
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

/// nats-server with the compose cluster's `docker/nats.conf`: its users, their permissions and
/// JetStream, on a free port with a temp store. Every password is `<user>-pw`, where `<user>` is
/// `node` (the `toolmesh` user), `provider`, `approver` or an account (`acme`, `globex`).
#[derive(Debug)]
pub struct AuthNats {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl AuthNats {
    pub fn start() -> AuthNats {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docker/nats.conf"
        ))
        .expect("docker/nats.conf");
        let mut text = text
            .replace("listen: 0.0.0.0:4222", &format!("listen: 127.0.0.1:{port}"))
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
        let mut child = Command::new(find_binary("nats-server", "nats-server"))
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        wait_for_port(port, "nats-server", &mut child);
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

/// A `redis-server` on a random port, persisting (AOF) into its own temp dir so that a restart
/// on the same dir keeps the data.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_on(free_port())
    }

    /// Starts on a given port (for a client configured before its server exists).
    pub fn start_on(port: u16) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::spawn(port, dir)
    }

    fn spawn(port: u16, dir: tempfile::TempDir) -> RedisServer {
        // `*self = …` in `restart` drops the old value, which kills an already dead child.
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        wait_for_port(port, "redis-server", &mut child);
        RedisServer { child, port, dir }
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

    /// Kills the server (SIGKILL); `restart` brings it back with its data.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        *self = Self::spawn(self.port, dir);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `toolmesh node` process (the real binary), stopped on drop.
#[derive(Debug)]
pub struct Node {
    child: Child,
    pub node_id: String,
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
        let mut cmd = Command::new(&self.binary);
        cmd.args(["node", "--roles", &self.roles])
            .env("TOOLMESH_NODE_ID", &self.node_id)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("toolmesh node starts");
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
        }
    }
}

impl Node {
    pub fn pid(&self) -> u32 {
        self.child.id()
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
