//! `nats-server` for tests: on a port it picks ([`NatsServer`], JetStream on or off), or with
//! the compose cluster's users and permissions ([`AuthNats`]).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::logs::LogTap;
use crate::net::ClosedPort;
use crate::process::{find_binary, temp_dir, SERVER_START};

/// A `nats-server` on a port it picks itself (`-p -1`, read back from its log): JetStream off
/// ([`NatsServer::start`]) or on, with its store in the server's own temp dir
/// ([`NatsServer::start_jetstream`]), kept across [`NatsServer::restart`]. Its monitoring
/// endpoint (`-m -1`) answers [`NatsServer::interest`].
/// The JetStream domain of a [`NatsServer::start_hub`] server.
pub const HUB_DOMAIN: &str = "toolmesh";

#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    monitor: u16,
    /// Where it takes leaf node connections, when it does ([`NatsServer::start_hub`]).
    leaf_port: Option<u16>,
    /// The leaf port it advertises, held so that nothing listens there.
    advertised: Option<ClosedPort>,
    options: NatsOptions,
    dir: tempfile::TempDir,
}

#[derive(Debug, Clone, Default)]
struct NatsOptions {
    /// A config file's text (the flags' port and address override its `listen`).
    config: Option<String>,
    jetstream: bool,
}

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

    /// Starts with JetStream on, in the domain [`HUB_DOMAIN`], and a port for leaf nodes
    /// ([`NatsServer::leaf_port`]): the hub of a [`LeafSite`](crate::LeafSite), whose clients
    /// reach its JetStream through that domain. The leaf port it tells its leaves of is one
    /// where nothing listens: a leaf reconnects only where it was told to (through its relay),
    /// never straight to the port it learned.
    pub fn start_hub() -> NatsServer {
        let (leafnodes, nowhere) = hub_leafnodes();
        let config = format!("jetstream {{ domain: {HUB_DOMAIN} }}\n{leafnodes}");
        let options = NatsOptions {
            config: Some(config),
            jetstream: true,
        };
        let mut hub = Self::spawn(None, options, temp_dir());
        hub.advertised = Some(nowhere);
        hub
    }

    /// Kills the server (a crash) and starts it again on the same port with the same options
    /// and store: a JetStream server comes back with its streams.
    pub fn restart(&mut self) {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, temp_dir());
        let mut fresh = Self::spawn(Some(self.port), self.options.clone(), dir);
        fresh.advertised = self.advertised.take();
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
        let started = start_nats(command.current_dir(dir.path()));
        let leaf_port = leaf_port(&started.log);
        NatsServer {
            child: started.child,
            port: started.port,
            leaf_port,
            advertised: None,
            monitor: started
                .monitor
                .expect("nats-server -m -1 says where it monitors"),
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

    /// The port leaf nodes connect to (a server of [`NatsServer::start_hub`]).
    pub fn leaf_port(&self) -> u16 {
        self.leaf_port
            .expect("a hub server (NatsServer::start_hub) takes leaf nodes")
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
        let subsz = monitor_json(self.monitor, &format!("/subsz?subs=1&test={subject}")).await;
        subsz["total"].as_u64().unwrap_or(0)
    }

    /// Kills the server now (a crash, not a shutdown).
    pub fn kill(&mut self) {
        crate::process::stop(&mut self.child);
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A started nats-server: the process, its log, and the ports its log names.
pub(crate) struct Started {
    pub child: Child,
    pub log: LogTap,
    /// Where it listens for clients.
    pub port: u16,
    /// Its monitoring endpoint, if it has one (`-m`).
    pub monitor: Option<u16>,
}

/// A hub's `leafnodes` block: a port it picks, and an advertised one where nothing listens
/// (held by the [`ClosedPort`]), so that a leaf reconnects only where it was told to.
fn hub_leafnodes() -> (String, ClosedPort) {
    let nowhere = ClosedPort::new();
    let block = format!(
        "leafnodes {{ listen: \"127.0.0.1:-1\", advertise: \"127.0.0.1:{}\" }}\n",
        nowhere.port()
    );
    (block, nowhere)
}

/// The leaf port a started server's log names, if it takes leaf nodes.
fn leaf_port(log: &LogTap) -> Option<u16> {
    log.find(Duration::ZERO, |l| {
        port_after(l, "Listening for leafnode connections on ")
    })
}

/// The port of `addr` in a log line holding `after` then `host:port`.
pub(crate) fn port_after(line: &str, after: &str) -> Option<u16> {
    let (_, addr) = line.split_once(after)?;
    let addr: std::net::SocketAddr = addr.trim().parse().ok()?;
    Some(addr.port())
}

/// Starts `command` (a nats-server that logs to stderr) and waits until it is ready: the child,
/// its log, the client port its log names and the monitoring port if it has one. Panics with
/// the log when the server stops first (a port in use, a bad config).
pub(crate) fn start_nats(command: &mut Command) -> Started {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nats-server starts");
    let log = LogTap::start(child.stderr.take().expect("stderr"), |_| {});
    let port = log.find(SERVER_START, |l| {
        port_after(l, "Listening for client connections on ")
    });
    let ready = log.find(SERVER_START, |l| {
        l.contains("Server is ready").then_some(())
    });
    let (Some(port), Some(())) = (port, ready) else {
        crate::process::stop(&mut child);
        panic!("nats-server did not start:\n{}", log.text());
    };
    let monitor = log.find(Duration::ZERO, |l| {
        port_after(l, "Starting http monitor on ")
    });
    Started {
        child,
        log,
        port,
        monitor,
    }
}

/// `GET <path>` of a nats-server's monitoring endpoint on `port`, as JSON (`/subsz`, `/connz`,
/// `/jsz`).
pub(crate) async fn monitor_json(port: u16, path: &str) -> serde_json::Value {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the monitoring endpoint");
    // HTTP/1.0: the body ends with the connection, never chunked (a long `/connz` would be).
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("ask {path}: {e}"));
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .unwrap_or_else(|e| panic!("read {path}: {e}"));
    let (_, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path} is not JSON ({e}): {body}"))
}

/// nats-server with the compose cluster's `docker/nats.conf`: its users, their permissions and
/// JetStream, on a port it picks with a temp store. Every password is `<user>-pw`, where
/// `<user>` is `node` (the `toolmesh` user), `provider`, `approver`, a reviewer (`alice`,
/// `bob`) or an account (`acme`, `globex`).
#[derive(Debug)]
pub struct AuthNats {
    child: Child,
    port: u16,
    /// Its leaf port and the one it advertises, held so that nothing listens there
    /// ([`AuthNats::start_hub`]).
    leaf: Option<(u16, ClosedPort)>,
    _dir: tempfile::TempDir,
}

impl AuthNats {
    pub fn start() -> AuthNats {
        Self::start_with("").0
    }

    /// As [`AuthNats::start`], with a port for leaf nodes ([`AuthNats::leaf_port`]) as
    /// `docker/nats-cluster.conf` has: the hub of a [`LeafSite::deployed`](crate::LeafSite).
    /// Like [`NatsServer::start_hub`], it advertises a leaf port where nothing listens.
    pub fn start_hub() -> AuthNats {
        let (leafnodes, nowhere) = hub_leafnodes();
        let (mut hub, port) = Self::start_with(&leafnodes);
        hub.leaf = Some((port.expect("nats-server names its leaf port"), nowhere));
        hub
    }

    /// The port leaf nodes connect to (an [`AuthNats::start_hub`] server).
    pub fn leaf_port(&self) -> u16 {
        self.leaf.as_ref().expect("a hub (AuthNats::start_hub)").0
    }

    /// docker/nats.conf with `extra` appended; and its leaf port, if it has one.
    fn start_with(extra: &str) -> (AuthNats, Option<u16>) {
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
            ("$SITE_PASSWORD", "site-pw"),
            ("$ACME_PASSWORD", "acme-pw"),
            ("$GLOBEX_PASSWORD", "globex-pw"),
            ("$APPROVER_PASSWORD", "approver-pw"),
            ("$ALICE_PASSWORD", "alice-pw"),
            ("$BOB_PASSWORD", "bob-pw"),
        ] {
            text = text.replace(variable, &format!("{password:?}"));
        }
        text.push_str(extra);
        let config = dir.path().join("nats.conf");
        std::fs::write(&config, text).expect("write the config");
        let started = start_nats(
            Command::new(find_binary("nats-server", "nats-server"))
                .args(["-a", "127.0.0.1", "-p", "-1", "-c"])
                .arg(&config),
        );
        let leaf_port = leaf_port(&started.log);
        let nats = AuthNats {
            child: started.child,
            port: started.port,
            leaf: None,
            _dir: dir,
        };
        (nats, leaf_port)
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
        crate::process::stop(&mut self.child);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::client::wait_until;
    use crate::nats::NatsServer;

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
}
