//! A worker site behind a NATS leaf node ([`LeafSite`]): a `nats-server` of its own whose only
//! way to the hub is one leaf connection, made through a relay the test can cut and restore
//! (a link that drops, not a server that dies: the site's server and its clients stay up).

use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::client::wait_until;
use crate::nats::{monitor_json, start_nats};
use crate::process::{find_binary, temp_dir};

/// How long a leaf connection gets to come up (the leaf retries every second).
const LINK_WAIT: Duration = Duration::from_secs(20);

/// A leaf `nats-server` linked to a hub (a [`NatsServer::start_hub`](crate::NatsServer)) over
/// a relay the test cuts and restores; killed on drop.
#[derive(Debug)]
pub struct LeafSite {
    child: Child,
    port: u16,
    monitor: u16,
    relay: Relay,
    _dir: tempfile::TempDir,
}

impl LeafSite {
    /// Starts the site's server, linked to the hub's leaf port `hub_leaf_port` with no user,
    /// and waits until the link is up.
    pub async fn start(hub_leaf_port: u16) -> LeafSite {
        let relay = Relay::start(hub_leaf_port).await;
        // No JetStream here: the site's clients use the hub's, over the link.
        let text = format!(
            "leafnodes {{\n  reconnect: 1\n  remotes = [ {{ url: \"nats-leaf://127.0.0.1:{}\" }} ]\n}}\n",
            relay.port
        );
        Self::spawn(relay, &text, &[]).await
    }

    /// The compose cluster's site server (`docker/nats-leaf.conf`), linked as the user `site`
    /// to the hub's leaf port `hub_leaf_port` (an [`AuthNats::start_hub`](crate::AuthNats)):
    /// its workers connect as `toolmesh` with the password `node-pw`
    /// ([`LeafSite::node_url`]).
    pub async fn deployed(hub_leaf_port: u16) -> LeafSite {
        let relay = Relay::start(hub_leaf_port).await;
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docker/nats-leaf.conf"
        ))
        .expect("docker/nats-leaf.conf")
        // The flags below say where it listens.
        .replace("listen: 0.0.0.0:4222", "")
        .replace("http: 0.0.0.0:8222", "");
        let hub = format!("nats-leaf://site:site-pw@127.0.0.1:{}", relay.port);
        let env = [
            ("TOOLMESH_NODE_PASSWORD", "node-pw".to_owned()),
            ("SITE_HUB_1", hub.clone()),
            ("SITE_HUB_2", hub.clone()),
            ("SITE_HUB_3", hub),
        ];
        Self::spawn(relay, &text, &env).await
    }

    /// Starts a site server of config `text` (and `env`, for its variables) on a port it
    /// picks, and waits until its link through `relay` is up.
    async fn spawn(relay: Relay, text: &str, env: &[(&str, String)]) -> LeafSite {
        let dir = temp_dir();
        let config = dir.path().join("leaf.conf");
        std::fs::write(&config, text).expect("write leaf.conf");
        let bin = find_binary("nats-server", "nats-server");
        let mut command = Command::new(bin);
        command
            .args(["-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-c"])
            .arg(&config)
            .envs(env.iter().map(|(k, v)| (k, v)));
        let started = start_nats(command.current_dir(dir.path()));
        let site = LeafSite {
            child: started.child,
            port: started.port,
            monitor: started
                .monitor
                .expect("nats-server -m -1 says where it monitors"),
            relay,
            _dir: dir,
        };
        site.wait_linked(true).await;
        site
    }

    /// The site server's URL: the site's workers connect here.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The URL of a [`LeafSite::deployed`] site for its workers, with their user.
    pub fn node_url(&self) -> String {
        format!("nats://toolmesh:node-pw@127.0.0.1:{}", self.port)
    }

    /// Whether the site's server has its leaf connection to the hub now.
    pub async fn linked(&self) -> bool {
        let leafz = monitor_json(self.monitor, "/leafz").await;
        leafz["leafnodes"].as_u64().unwrap_or(0) > 0
    }

    /// Waits until the link is up (`true`) or down (`false`).
    pub async fn wait_linked(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let reached = wait_until(LINK_WAIT, || async { self.linked().await == up }).await;
        assert!(
            reached,
            "the leaf link did not go {state} within {LINK_WAIT:?}"
        );
    }

    /// Drops the link and keeps it down: the relay closes its connections and refuses new
    /// ones until [`LeafSite::restore`].
    pub async fn cut(&self) {
        self.relay.cut();
        self.wait_linked(false).await;
    }

    /// Lets the leaf connect again and waits until it has.
    pub async fn restore(&self) {
        self.relay.restore();
        self.wait_linked(true).await;
    }
}

impl Drop for LeafSite {
    fn drop(&mut self) {
        crate::process::stop(&mut self.child);
    }
}

/// A loopback TCP relay to a port: each accepted connection is joined to a new connection to
/// the target, until [`Relay::cut`] closes them all and refuses more.
#[derive(Debug)]
struct Relay {
    port: u16,
    state: Arc<Mutex<RelayState>>,
    accepting: AbortHandle,
}

#[derive(Debug, Default)]
struct RelayState {
    cut: bool,
    joined: Vec<AbortHandle>,
}

impl Relay {
    async fn start(target: u16) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind the relay");
        let port = listener.local_addr().expect("the relay's port").port();
        let state = Arc::new(Mutex::new(RelayState::default()));
        let accepting = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let mut held = state.lock().unwrap();
                    if held.cut {
                        // Dropped: the leaf sees its connection closed and retries.
                        continue;
                    }
                    held.joined.retain(|j| !j.is_finished());
                    held.joined
                        .push(tokio::spawn(join(inbound, target)).abort_handle());
                }
            }
        })
        .abort_handle();
        Relay {
            port,
            state,
            accepting,
        }
    }

    fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.cut = true;
        for joined in state.joined.drain(..) {
            joined.abort();
        }
    }

    fn restore(&self) {
        self.state.lock().unwrap().cut = false;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.accepting.abort();
    }
}

/// Copies both ways between `inbound` and a new connection to `target` until either ends
/// (or the task is aborted: both sockets close).
async fn join(mut inbound: TcpStream, target: u16) {
    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
}
