//! Three `nats-server`s in one cluster with JetStream on, on loopback ([`NatsCluster`]): each
//! with its server name, its store dir, and client, route and monitoring ports it picks
//! itself (read back from its log, as [`NatsServer`](crate::NatsServer) does), killed and
//! restarted one at a time.
//!
//! How the routes come about without a port chosen in advance: the first server starts with
//! one configured route to a port where nothing listens ([`ClosedPort`]: JetStream in a
//! cluster refuses to start without a configured route), the other two route to the first
//! server's cluster port, and gossip completes the mesh. A restarted server keeps its ports
//! and routes to the cluster ports of the other two.

use std::process::{Child, Command};
use std::time::Duration;

use crate::client::wait_until;
use crate::logs::LogTap;
use crate::nats::{monitor_json, port_after, start_nats};
use crate::net::ClosedPort;
use crate::process::{find_binary, temp_dir, SERVER_START};

/// The number of servers of a [`NatsCluster`].
pub const CLUSTER_SIZE: usize = 3;

/// How long a cluster gets to elect its JetStream meta leader once every server runs.
const JETSTREAM_READY: Duration = Duration::from_secs(30);

/// Three nats-servers routed to each other, JetStream on each; killed on drop.
#[derive(Debug)]
pub struct NatsCluster {
    name: String,
    members: Vec<Member>,
    /// The first server's first route, where nothing listens.
    _nowhere: ClosedPort,
}

#[derive(Debug)]
struct Member {
    server_name: String,
    /// `None` while killed.
    child: Option<Child>,
    log: LogTap,
    port: u16,
    cluster_port: u16,
    monitor: u16,
    dir: tempfile::TempDir,
}

/// What a server is started with: its ports (`None`: one it picks) and routes.
struct Launch<'a> {
    cluster: &'a str,
    server_name: &'a str,
    port: Option<u16>,
    cluster_port: Option<u16>,
    routes: Vec<u16>,
}

impl NatsCluster {
    /// Starts the three servers and waits until their JetStream has a meta leader that
    /// every server knows (streams can be made).
    pub async fn start() -> NatsCluster {
        let name = "toolmesh-test".to_owned();
        let nowhere = ClosedPort::new();
        let mut members: Vec<Member> = Vec::with_capacity(CLUSTER_SIZE);
        for i in 0..CLUSTER_SIZE {
            let routes = match members.first() {
                None => vec![nowhere.port()],
                Some(first) => vec![first.cluster_port],
            };
            let server_name = format!("{name}-{}", i + 1);
            members.push(spawn(
                Launch {
                    cluster: &name,
                    server_name: &server_name,
                    port: None,
                    cluster_port: None,
                    routes,
                },
                temp_dir(),
            ));
        }
        let cluster = NatsCluster {
            name,
            members,
            _nowhere: nowhere,
        };
        cluster.wait_for_jetstream().await;
        cluster
    }

    /// The cluster's name (`cluster_name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every server's client URL, comma-separated: what `TOOLMESH_NATS_URL` takes.
    pub fn urls(&self) -> String {
        (0..self.members.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Server `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.members[i].port)
    }

    /// Server `i`'s client port.
    pub fn port(&self, i: usize) -> u16 {
        self.members[i].port
    }

    /// Server `i`'s name (`server_name`; JetStream's `cluster.leader` names servers so).
    pub fn server_name(&self, i: usize) -> &str {
        &self.members[i].server_name
    }

    /// The index of the server named `server_name`.
    pub fn index_of(&self, server_name: &str) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.server_name == server_name)
    }

    /// Whether server `i` runs (was not killed, or was restarted since).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// A client connected with every server's URL, reconnecting to another server within a
    /// moment of losing its own: a test's client that outlives a killed server.
    pub async fn client(&self) -> async_nats::Client {
        let urls: Vec<String> = (0..self.members.len()).map(|i| self.url(i)).collect();
        async_nats::ConnectOptions::new()
            .max_reconnects(None)
            .reconnect_delay_callback(|attempt| {
                Duration::from_millis((attempt as u64).saturating_mul(50).min(500))
            })
            .connect(urls)
            .await
            .expect("connect to the test NATS cluster")
    }

    /// The server a client connection named `connection_name` (`ConnectOptions::name`) is
    /// connected to now, as the servers' `/connz` list it; `None` when no running server has
    /// it.
    pub async fn serving(&self, connection_name: &str) -> Option<usize> {
        for (i, member) in self.members.iter().enumerate() {
            if member.child.is_none() {
                continue;
            }
            let connz = monitor_json(member.monitor, "/connz?limit=100000").await;
            let named = connz["connections"]
                .as_array()
                .is_some_and(|all| all.iter().any(|c| c["name"] == connection_name));
            if named {
                return Some(i);
            }
        }
        None
    }

    /// Server `i`'s `/jsz` (JetStream: its view of the meta group among the rest).
    pub async fn jsz(&self, i: usize) -> serde_json::Value {
        monitor_json(self.members[i].monitor, "/jsz").await
    }

    /// Waits until every running server names one and the same JetStream meta leader, which
    /// counts every running server as a current peer. Panics after 30 s.
    pub async fn wait_for_jetstream(&self) {
        let running: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.is_running(i))
            .collect();
        let ready = wait_until(JETSTREAM_READY, || {
            let running = running.clone();
            async move {
                let mut leaders = Vec::new();
                for &i in &running {
                    let jsz = self.jsz(i).await;
                    leaders.push(jsz["meta_cluster"]["leader"].as_str().map(str::to_owned));
                }
                let Some(Some(leader)) = leaders.first().cloned() else {
                    return false;
                };
                if leaders
                    .iter()
                    .any(|l| l.as_deref() != Some(leader.as_str()))
                {
                    return false;
                }
                let Some(at) = self.index_of(&leader).filter(|&i| self.is_running(i)) else {
                    return false;
                };
                let jsz = self.jsz(at).await;
                let current = jsz["meta_cluster"]["replicas"]
                    .as_array()
                    .map_or(0, |peers| {
                        peers
                            .iter()
                            .filter(|p| {
                                p["current"] == true
                                    && p["name"]
                                        .as_str()
                                        .and_then(|n| self.index_of(n))
                                        .is_some_and(|n| self.is_running(n))
                            })
                            .count()
                    });
                current + 1 >= running.len()
            }
        })
        .await;
        assert!(
            ready,
            "the NATS cluster elected no JetStream meta leader within {JETSTREAM_READY:?}:\n{}",
            self.logs()
        );
    }

    /// Kills server `i` now (a crash: no lame-duck mode, no leadership handed over).
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Starts server `i` again (killing it first if it runs), on its ports, with its store,
    /// routed to the other two.
    pub fn restart(&mut self, i: usize) {
        self.members[i].kill();
        let routes = self
            .members
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != i)
            .map(|(_, m)| m.cluster_port)
            .collect();
        let member = &mut self.members[i];
        let dir = std::mem::replace(&mut member.dir, temp_dir());
        let fresh = spawn(
            Launch {
                cluster: &self.name,
                server_name: &member.server_name,
                port: Some(member.port),
                cluster_port: Some(member.cluster_port),
                routes,
            },
            dir,
        );
        *member = fresh;
    }

    /// Every server's log so far, for a failure message.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("--- {} ---\n{}", m.server_name, m.log.text()))
            .collect()
    }
}

impl Member {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::process::stop(&mut child);
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
    }
}

/// Starts one server of the cluster with its store in `dir`, and reads back its ports.
fn spawn(launch: Launch<'_>, dir: tempfile::TempDir) -> Member {
    let port = launch.port.map_or("-1".to_owned(), |p| p.to_string());
    let cluster = format!(
        "nats://127.0.0.1:{}",
        launch
            .cluster_port
            .map_or("-1".to_owned(), |p| p.to_string())
    );
    let routes = launch
        .routes
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut command = Command::new(find_binary("nats-server", "nats-server"));
    command
        .args(["-a", "127.0.0.1", "-p", &port, "-m", "-1"])
        .args(["--server_name", launch.server_name])
        .args(["--cluster_name", launch.cluster])
        .args(["--cluster", &cluster, "--routes", &routes])
        .arg("-js")
        .arg("-sd")
        .arg(dir.path().join("jetstream"))
        .current_dir(dir.path());
    let started = start_nats(&mut command);
    let cluster_port = started.log.find(SERVER_START, |l| {
        port_after(l, "Listening for route connections on ")
    });
    let (Some(cluster_port), Some(monitor)) = (cluster_port, started.monitor) else {
        panic!(
            "nats-server {} named no route or monitoring port:\n{}",
            launch.server_name,
            started.log.text()
        );
    };
    Member {
        server_name: launch.server_name.to_owned(),
        child: Some(started.child),
        log: started.log,
        port: started.port,
        cluster_port,
        monitor,
        dir,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt as _;

    use crate::nats_cluster::{NatsCluster, CLUSTER_SIZE};

    /// Three servers, one mesh, one JetStream meta group; a killed server's clients move to
    /// another, and a restarted server rejoins on its ports.
    #[tokio::test]
    async fn three_servers_form_one_cluster_and_survive_a_kill() {
        let mut cluster = NatsCluster::start().await;
        let jsz = cluster.jsz(0).await;
        assert_eq!(jsz["meta_cluster"]["name"], cluster.name(), "{jsz}");
        let client = async_nats::ConnectOptions::new()
            .name("survivor")
            .connect(cluster.url(1))
            .await
            .unwrap();
        let watcher = cluster.client().await;
        let mut sub = watcher.subscribe("hello").await.unwrap();
        watcher.flush().await.unwrap();
        let at = cluster.serving("survivor").await;
        assert_eq!(at, Some(1));
        // Interest crosses the routes whichever server each client is on (once the
        // subscription has reached server 1: a message before that is nobody's).
        let mut heard = false;
        for _ in 0..25 {
            client.publish("hello", "1".into()).await.unwrap();
            client.flush().await.unwrap();
            let next = tokio::time::timeout(Duration::from_millis(200), sub.next());
            if let Ok(Some(_)) = next.await {
                heard = true;
                break;
            }
        }
        assert!(heard, "a message did not cross the routes");
        // The watcher's server dies: it goes on through another.
        let own = cluster
            .index_of(&watcher.server_info().server_name)
            .unwrap();
        let port = cluster.port(own);
        cluster.kill(own);
        assert!(!cluster.is_running(own));
        let moved = crate::client::wait_until(Duration::from_secs(5), || async {
            watcher.connection_state() == async_nats::connection::State::Connected
                && watcher.server_info().server_name != cluster.server_name(own)
        })
        .await;
        assert!(moved, "the watcher did not reconnect to another server");
        watcher.flush().await.unwrap();
        cluster.restart(own);
        assert_eq!(cluster.port(own), port);
        cluster.wait_for_jetstream().await;
        for i in 0..CLUSTER_SIZE {
            assert!(cluster.is_running(i));
        }
    }
}
