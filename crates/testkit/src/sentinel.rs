//! Redis with Sentinel for tests ([`RedisSentinels`]): a primary, its replicas and three
//! sentinels watching them, each a process of Debian's `redis-server` on a loopback port of its
//! own, killed on drop. The sentinels notice a dead primary after [`DOWN_AFTER_MS`] and promote
//! a replica; tests wait for that by asking the sentinels, never by sleeping.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::logs::LogTap;
use crate::process::{find_binary, temp_dir};
use crate::redis::{on_a_candidate_port, spawn_until, PortTaken, RedisServer};

/// How long a sentinel waits for a silent primary before it calls it down.
pub const DOWN_AFTER_MS: u64 = 1000;
/// The sentinels' `failover-timeout`: also how long before a failed failover is tried again.
const FAILOVER_TIMEOUT_MS: u64 = 5000;
/// How long [`RedisSentinels::start`] gives the set to see itself whole.
const SETTLE: Duration = Duration::from_secs(30);
const SENTINELS: usize = 3;

/// A Redis primary, `replicas` replicas and three sentinels (quorum 2) that watch them under
/// [`RedisSentinels::MASTER_NAME`].
#[derive(Debug)]
pub struct RedisSentinels {
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

/// One `redis-server <conf> --sentinel`, its config file in a temp dir of its own (a sentinel
/// rewrites it).
#[derive(Debug)]
struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
    _log: LogTap,
}

impl RedisSentinels {
    pub const MASTER_NAME: &'static str = "toolmesh";

    /// Starts the set and returns once every replica is in sync and every sentinel knows
    /// every replica and the two other sentinels (so a failover can be agreed on).
    pub fn start(replicas: usize) -> RedisSentinels {
        // A new replica is fed at once, not after the diskless sync's default 5 s delay; the
        // same holds after a failover, for whichever server is primary then.
        let fast_sync = ["--repl-diskless-sync-delay".to_owned(), "0".to_owned()];
        let primary = RedisServer::start_with(&fast_sync);
        let mut servers = vec![primary];
        for _ in 0..replicas {
            let mut args = fast_sync.to_vec();
            args.extend([
                "--replicaof".to_owned(),
                "127.0.0.1".to_owned(),
                servers[0].port().to_string(),
            ]);
            servers.push(RedisServer::start_with(&args));
        }
        let primary_port = servers[0].port();
        let sentinels = (0..SENTINELS)
            .map(|_| Sentinel::start(primary_port))
            .collect();
        let set = RedisSentinels { servers, sentinels };
        let deadline = Instant::now() + SETTLE;
        loop {
            let synced = set.servers[1..].iter().all(|replica| {
                cli(replica.port(), &["INFO", "replication"])
                    .is_some_and(|info| info.contains("master_link_status:up"))
            });
            let seen = set.sentinels.iter().all(|sentinel| {
                let master = fields(sentinel.port, &["SENTINEL", "MASTER", Self::MASTER_NAME]);
                master.get("num-slaves") == Some(&replicas.to_string())
                    && master.get("num-other-sentinels") == Some(&(SENTINELS - 1).to_string())
            });
            if synced && seen {
                return set;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see the primary, {replicas} replicas and each other within {SETTLE:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `TOOLMESH_REDIS_SENTINELS`: the sentinels' `host:port`, comma-separated.
    pub fn sentinels(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The port of the primary the sentinels name now (the first one that answers).
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            let named = cli(
                sentinel.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER_NAME],
            )?;
            named.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// The ports of every data server, primary and replicas, dead or alive.
    pub fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(RedisServer::port).collect()
    }

    /// The data server on `port`, to kill or restart it.
    pub fn server(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no Redis server of this set listens on {port}"))
    }

    /// Kills (SIGKILL) the server the sentinels name as primary; its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port().expect("the sentinels name a primary");
        self.server(port).kill();
        port
    }

    /// Waits until the sentinels name a primary other than the one on `old` and that server
    /// answers `ROLE` as a primary: its port, or `None` after `timeout`.
    pub async fn failed_over_from(&self, old: u16, timeout: Duration) -> Option<u16> {
        let mut promoted = None;
        crate::wait_until(timeout, || {
            promoted = self.primary_port().filter(|port| {
                *port != old
                    && cli(*port, &["ROLE"]).is_some_and(|r| r.lines().next() == Some("master"))
            });
            std::future::ready(promoted.is_some())
        })
        .await;
        promoted
    }

    /// Whether the primary on `port` has `replicas` replicas in sync now.
    pub fn has_replicas(&self, port: u16, replicas: usize) -> bool {
        let info = fields_of(cli(port, &["INFO", "replication"]).unwrap_or_default(), ':');
        info.get("role").map(String::as_str) == Some("master")
            && info.get("connected_slaves") == Some(&replicas.to_string())
            && (0..replicas).all(|i| {
                info.get(&format!("slave{i}"))
                    .is_some_and(|s| s.contains("state=online"))
            })
    }
}

impl Sentinel {
    fn start(primary_port: u16) -> Sentinel {
        on_a_candidate_port("redis-server --sentinel", |port| {
            let dir = temp_dir();
            let (child, log) = Self::spawn(port, primary_port, dir.path())?;
            Ok(Sentinel {
                child,
                port,
                _dir: dir,
                _log: log,
            })
        })
    }

    fn spawn(port: u16, primary_port: u16, dir: &Path) -> Result<(Child, LogTap), PortTaken> {
        let name = RedisSentinels::MASTER_NAME;
        let conf = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             dir {dir}\n\
             sentinel monitor {name} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {name} 1\n",
            dir = dir.display(),
        );
        std::fs::write(&conf, text).expect("write a sentinel's config");
        let mut command = Command::new(find_binary("redis-server", "redis-server"));
        command.arg(&conf).arg("--sentinel");
        spawn_until(command, "redis-server --sentinel", port, "+monitor master")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        crate::process::stop(&mut self.child);
    }
}

/// What `redis-cli -h 127.0.0.1 -p <port> --raw <args>` prints, or `None` when it cannot
/// connect: for a test that looks at a server of its own (`CLIENT PAUSE`, `INFO`, `HGET`).
pub fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    cli(port, args)
}

fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new(find_binary("redis-cli", "redis-tools"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--raw"])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

/// A reply of alternating names and values (`SENTINEL MASTER`), as a map.
fn fields(port: u16, args: &[&str]) -> HashMap<String, String> {
    let text = cli(port, args).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter_map(|pair| Some((pair[0].to_owned(), pair.get(1)?.to_string())))
        .collect()
}

/// `name<sep>value` lines (`INFO`), as a map.
fn fields_of(text: String, sep: char) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(sep))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}
