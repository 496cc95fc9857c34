//! Redis for the actors that keep state there (approvals, the workspace read state, the
//! sandbox registry): where it is ([`RedisConfig`], from `TOOLMESH_REDIS_*`), a connection to
//! its current primary ([`RedisLink`], [`RedisConn`]), and writes that a replica confirms
//! before they are acknowledged ([`RedisConn::invoke_replicated`]). Each actor keeps its own
//! link, its keys and its scripts; this module knows none of them.
//!
//! **Where.** `TOOLMESH_REDIS_URL` names one server. With `TOOLMESH_REDIS_SENTINELS` the primary
//! is the server the sentinels name for `TOOLMESH_REDIS_MASTER_NAME` (the redis crate's
//! `SentinelClient`, which also checks with `ROLE` that the server it names is a primary); the
//! URL then gives only the user, password and database.
//!
//! **Connecting.** A link connects in a task of its own, started by [`RedisLink::connect`] or
//! the first [`RedisLink::connection`], retrying with backoff (100 ms doubling to 2 s) while
//! Redis is down; a request waits at most [`FIRST_CONNECT_WAIT`] for the first connection, then
//! fails with an I/O error (the actors answer `unavailable`). With a plain URL that is all: the
//! redis crate's `ConnectionManager` reconnects by itself, as before sentinels existed.
//!
//! **Failover.** Every [`RedisConn`] watches what it gets back. An I/O error, a refused, reset
//! or timed-out connection, or `READONLY`, `MASTERDOWN`, `LOADING` mean the primary may have
//! moved, and wake the link's task: it asks the sentinels again, until they name a server that
//! answers as primary (backoff 100 ms doubling to 1 s, each lookup bounded by 5 s). A different
//! address gets a new connection manager, which every later [`RedisLink::connection`] hands
//! out, and a `warn` line with both addresses; the same address changes nothing. Reports that
//! arrive meanwhile are coalesced into one, and every settled lookup is followed by a pause of
//! 500 ms, so failing requests never make it spin. Requests in flight on the old primary fail
//! as they would without sentinels.
//!
//! **Acknowledged writes.** `TOOLMESH_REDIS_WAIT_REPLICAS` (default 0 with a plain URL, 1 with
//! sentinels) and `TOOLMESH_REDIS_WAIT_MS` (default 1000): [`RedisConn::invoke_replicated`]
//! sends the script and `WAIT <replicas> <ms>` as one pipeline, so both travel on the same
//! connection one after the other (`WAIT` counts the replicas that have every write of *its*
//! connection; sent apart, a reconnect in between would have it count a fresh connection's
//! nothing and confirm at once). A reply with fewer replicas is [`Replication::Short`]: the
//! write is on the primary, and visible there, but not yet safe from a failover; the caller
//! answers `unavailable`.
//!
//! **What a failover can still lose.** Replication stays asynchronous: `WAIT` holds the answer
//! back until a replica has the write, it does not make the primary wait. So a write the
//! primary applied and no replica received before it died is lost: one whose `WAIT` fell short
//! (its caller was told `unavailable`) or whose reply died with the primary, never one a caller
//! was told `ok` about. Sentinel promotes the reachable replica with the most of the primary's
//! stream, so an acknowledged write is lost only if every replica that had it (`WAIT <n>`
//! counts at least n) is lost too, or is left out of the election (cut off from the primary
//! longer than Sentinel accepts). Writes without `WAIT` are not covered: the approval sweeper's expiries (the next sweep
//! expires again), and everything of the workspace read state and the sandbox registry. Those
//! two are asked on every read, edit and new session, and what they lose is survivable: a lost
//! read record makes the next edit answer `file_not_read` (read again); a lost file lock lets
//! one edit racing another through the failover's seconds pass without `conflict`; a lost
//! session claim is noticed by its holder at its next touch, which hands the session over, and
//! a call on another worker meanwhile may start a second sandbox for it, as when a worker is
//! presumed dead. A promoted replica also starts without the scripts; the redis crate loads
//! them again (`NOSCRIPT`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, RedisResult, ScriptInvocation, ServerError, ServerErrorKind, Value,
};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, RawEnv, DEFAULT_REDIS_URL};

/// The primary's name in the sentinels' configuration (`TOOLMESH_REDIS_MASTER_NAME`).
pub const DEFAULT_MASTER_NAME: &str = "toolmesh";
/// How long an acknowledged write waits for its replicas (`TOOLMESH_REDIS_WAIT_MS`).
pub const DEFAULT_WAIT_MS: u64 = 1000;
/// The replicas an acknowledged write waits for with sentinels (none with a plain URL).
pub const DEFAULT_SENTINEL_WAIT_REPLICAS: u32 = 1;

/// How long a request waits for the first connection of a starting link before it fails (a
/// request right after startup should not fail for a few ms).
pub const FIRST_CONNECT_WAIT: Duration = Duration::from_secs(1);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// Redis answers a local script in well under a millisecond; past this it is stuck or gone.
/// A link that waits for replicas adds the wait.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnections a manager tries after a dropped connection before the next request tries.
const MANAGER_RETRIES: usize = 2;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest pause between two attempts of the first connection.
const CONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest pause between two lookups while the sentinels name no primary that answers.
const LOOKUP_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// One lookup: the sentinels asked in turn, then `ROLE` on the server they name.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after a lookup that settled, before the next report is looked at.
const RECHECK_GAP: Duration = Duration::from_millis(500);

/// Where Redis is and what an acknowledged write waits for: `TOOLMESH_REDIS_URL`,
/// `TOOLMESH_REDIS_SENTINELS`, `TOOLMESH_REDIS_MASTER_NAME`, `TOOLMESH_REDIS_WAIT_REPLICAS`,
/// `TOOLMESH_REDIS_WAIT_MS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub target: RedisTarget,
    pub wait: ReplicaWait,
}

/// One server, or the primary a set of sentinels names.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `TOOLMESH_REDIS_URL`.
    Url(String),
    Sentinels {
        /// `host:port` each, or a `redis://` URL for a sentinel that needs a password.
        sentinels: Vec<String>,
        master_name: String,
        /// `TOOLMESH_REDIS_URL`, for the primary's user, password and database only.
        primary_url: String,
    },
}

impl std::fmt::Debug for RedisTarget {
    /// URLs may carry a password; they are shown without it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let safe = |url: &str| crate::text::redact_urls(url).into_owned();
        match self {
            RedisTarget::Url(url) => f.debug_tuple("Url").field(&safe(url)).finish(),
            RedisTarget::Sentinels {
                sentinels,
                master_name,
                primary_url,
            } => f
                .debug_struct("Sentinels")
                .field(
                    "sentinels",
                    &sentinels.iter().map(|s| safe(s)).collect::<Vec<_>>(),
                )
                .field("master_name", master_name)
                .field("primary_url", &safe(primary_url))
                .finish(),
        }
    }
}

/// What an acknowledged write waits for: `WAIT <replicas> <timeout>`; no `WAIT` at 0 replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    pub replicas: u32,
    pub timeout: Duration,
}

impl ReplicaWait {
    /// No `WAIT`.
    pub const NONE: ReplicaWait = ReplicaWait {
        replicas: 0,
        timeout: Duration::from_millis(DEFAULT_WAIT_MS),
    };

    fn asked(&self) -> bool {
        self.replicas > 0
    }

    fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }
}

/// What `WAIT` said of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// No replica was asked for.
    NotAsked,
    /// At least the asked replicas have it.
    Confirmed { acked: u32 },
    /// Fewer replicas than asked had it when the wait ran out: applied on the primary, not yet
    /// safe from a failover.
    Short { acked: u32, wanted: u32 },
}

impl RedisConfig {
    /// One server at `url`, no `WAIT` (tests and tools).
    pub fn url(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            target: RedisTarget::Url(url.into()),
            wait: ReplicaWait::NONE,
        }
    }

    pub fn from_env(env: &RawEnv) -> Result<RedisConfig, ConfigError> {
        let url = env
            .get("TOOLMESH_REDIS_URL")
            .unwrap_or(DEFAULT_REDIS_URL)
            .to_owned();
        let sentinels = env.list("TOOLMESH_REDIS_SENTINELS");
        let target = if sentinels.is_empty() {
            RedisTarget::Url(url)
        } else {
            for sentinel in &sentinels {
                sentinel_info(sentinel).map_err(|reason| ConfigError::Invalid {
                    key: "TOOLMESH_REDIS_SENTINELS",
                    value: crate::text::redact_urls(sentinel).into_owned(),
                    reason,
                })?;
            }
            let master_name = env
                .get("TOOLMESH_REDIS_MASTER_NAME")
                .unwrap_or(DEFAULT_MASTER_NAME)
                .trim()
                .to_owned();
            if master_name.chars().any(char::is_whitespace) {
                return Err(ConfigError::Invalid {
                    key: "TOOLMESH_REDIS_MASTER_NAME",
                    value: master_name,
                    reason: "a sentinel master name has no spaces".into(),
                });
            }
            RedisTarget::Sentinels {
                sentinels,
                master_name,
                primary_url: url,
            }
        };
        let replicas = match target {
            RedisTarget::Url(_) => 0,
            RedisTarget::Sentinels { .. } => DEFAULT_SENTINEL_WAIT_REPLICAS,
        };
        let timeout_ms: u64 = env.parse_nonzero(
            "TOOLMESH_REDIS_WAIT_MS",
            DEFAULT_WAIT_MS,
            "a write must be given at least a millisecond to reach its replicas",
        )?;
        Ok(RedisConfig {
            target,
            wait: ReplicaWait {
                replicas: env.parse("TOOLMESH_REDIS_WAIT_REPLICAS", replicas)?,
                timeout: Duration::from_millis(timeout_ms),
            },
        })
    }
}

/// A sentinel as `TOOLMESH_REDIS_SENTINELS` names it: `host:port` (`[v6]:port`), or a URL.
fn sentinel_info(raw: &str) -> Result<ConnectionInfo, String> {
    if raw.contains("://") {
        return raw
            .into_connection_info()
            .map_err(|e| format!("not a Redis URL ({e})"));
    }
    let (host, port) = raw
        .rsplit_once(':')
        .ok_or("not host:port (a sentinel listens on 26379 by default)")?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port:?} is not a port number"))?;
    if host.is_empty() || port == 0 {
        return Err("not host:port".into());
    }
    ConnectionAddr::Tcp(host.to_owned(), port)
        .into_connection_info()
        .map_err(|e| e.to_string())
}

/// Whether `e` says that the server at hand cannot take writes now: gone, unreachable, slow
/// past the response timeout, a replica (`READONLY`), cut off from its primary (`MASTERDOWN`)
/// or loading its data (`LOADING`). Such a request is worth repeating later (`unavailable`);
/// with sentinels it makes the link look for the primary again.
pub fn primary_moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(e.kind(), ErrorKind::Server(kind) if moved_kind(kind))
}

fn moved_kind(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading
    )
}

fn moved_reply(e: &ServerError) -> bool {
    e.kind().is_some_and(moved_kind)
}

/// The error of a request made before the link's first connection, or after it gave up.
fn not_connected() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "not connected to Redis (yet)",
    ))
}

/// The connection to Redis of one actor: cheap to clone, every clone shares one connection
/// manager at a time; see the module docs.
#[derive(Clone)]
pub struct RedisLink(Arc<Shared>);

impl std::fmt::Debug for RedisLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLink")
            .field("wait", &self.0.wait)
            .finish_non_exhaustive()
    }
}

struct Shared {
    wait: ReplicaWait,
    current: watch::Receiver<Option<Primary>>,
    /// Told by a [`RedisConn`] whose request failed as if the primary moved.
    moved: Arc<Notify>,
    /// Until the task starts.
    connector: Mutex<Option<Connector>>,
    /// Ends the task once the last clone of the link is gone.
    stop: CancellationToken,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The primary the link uses now.
#[derive(Clone)]
struct Primary {
    manager: ConnectionManager,
    address: String,
}

impl RedisLink {
    /// A link to `config`'s Redis; only a malformed URL or sentinel address fails here.
    /// Nothing connects before [`RedisLink::connect`] or the first [`RedisLink::connection`].
    pub fn new(config: &RedisConfig) -> Result<RedisLink, RedisError> {
        let source = match &config.target {
            RedisTarget::Url(url) => Source::Url(redis::Client::open(url.as_str())?),
            RedisTarget::Sentinels {
                sentinels,
                master_name,
                primary_url,
            } => {
                let primary = primary_url.as_str().into_connection_info()?;
                let sentinels = sentinels
                    .iter()
                    .map(|s| {
                        sentinel_info(s).map_err(|reason| {
                            RedisError::from((
                                ErrorKind::InvalidClientConfig,
                                "not a sentinel address",
                                reason,
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let node = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(primary.redis_settings().clone());
                Source::Sentinels(SentinelClient::build(
                    sentinels,
                    master_name.clone(),
                    Some(node),
                    SentinelServerType::Master,
                )?)
            }
        };
        // A write followed by `WAIT` may take the wait's time on top.
        let response_timeout = match config.wait.asked() {
            true => config.wait.timeout + RESPONSE_TIMEOUT,
            false => RESPONSE_TIMEOUT,
        };
        let manager_config = ConnectionManagerConfig::new()
            .set_number_of_retries(MANAGER_RETRIES)
            .set_max_delay(Duration::from_secs(1))
            .set_connection_timeout(Some(CONNECTION_TIMEOUT))
            .set_response_timeout(Some(response_timeout));
        let (tx, current) = watch::channel(None);
        let moved = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let connector = Connector {
            source,
            manager_config,
            tx,
            moved: moved.clone(),
            stop: stop.clone(),
        };
        Ok(RedisLink(Arc::new(Shared {
            wait: config.wait,
            current,
            moved,
            connector: Mutex::new(Some(connector)),
            stop,
        })))
    }

    /// Starts connecting in the background, if it has not started yet (inside a tokio
    /// runtime). Actors that want the connection up before their first request call this at
    /// start; [`RedisLink::connection`] does it otherwise.
    pub fn connect(&self) {
        let connector = self
            .0
            .connector
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(connector) = connector {
            tokio::spawn(connector.run());
        }
    }

    /// A connection to the current primary. Before the first connection this waits up to
    /// [`FIRST_CONNECT_WAIT`] for it, then fails with an I/O error.
    pub async fn connection(&self) -> RedisResult<RedisConn> {
        self.connect();
        let mut current = self.0.current.clone();
        let now = current.borrow().clone();
        let primary = match now {
            Some(primary) => primary,
            None => {
                let first =
                    tokio::time::timeout(FIRST_CONNECT_WAIT, current.wait_for(Option::is_some))
                        .await;
                match first {
                    Ok(Ok(primary)) => primary.clone().ok_or_else(not_connected)?,
                    _ => return Err(not_connected()),
                }
            }
        };
        Ok(RedisConn {
            manager: primary.manager,
            moved: self.0.moved.clone(),
        })
    }

    /// What an acknowledged write waits for (`TOOLMESH_REDIS_WAIT_*`).
    pub fn wait(&self) -> ReplicaWait {
        self.0.wait
    }
}

/// Where the connector finds the primary.
enum Source {
    Url(redis::Client),
    Sentinels(SentinelClient),
}

/// The link's task: the first connection, then (with sentinels) the primary again after each
/// report that it moved.
struct Connector {
    source: Source,
    manager_config: ConnectionManagerConfig,
    tx: watch::Sender<Option<Primary>>,
    moved: Arc<Notify>,
    stop: CancellationToken,
}

impl Connector {
    async fn run(mut self) {
        let stop = self.stop.clone();
        let mut backoff = BACKOFF_MIN;
        let mut current = loop {
            let attempt = tokio::select! {
                attempt = self.connect() => attempt,
                _ = stop.cancelled() => return,
            };
            match attempt {
                Ok(primary) => break primary,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "Redis is not reachable yet; what keeps its state there answers unavailable until it is")
                }
            }
            if !self.pause(backoff).await {
                return;
            }
            backoff = (backoff * 2).min(CONNECT_BACKOFF_MAX);
        };
        tracing::info!(primary = %current.address, "connected to Redis");
        self.tx.send_replace(Some(current.clone()));
        if matches!(self.source, Source::Url(_)) {
            // The manager reconnects to the one server by itself.
            return;
        }
        loop {
            tokio::select! {
                _ = self.moved.notified() => {}
                _ = stop.cancelled() => return,
            }
            let mut backoff = BACKOFF_MIN;
            let mut told = false;
            loop {
                let found = tokio::select! {
                    found = self.find() => found,
                    _ = stop.cancelled() => return,
                };
                match found {
                    Ok(client) if address(&client) == current.address => {
                        tracing::debug!(primary = %current.address, "the sentinels still name the same Redis primary");
                        break;
                    }
                    Ok(client) => {
                        let to = address(&client);
                        let made = tokio::select! {
                            made = self.manager(client) => made,
                            _ = stop.cancelled() => return,
                        };
                        match made {
                            Ok(manager) => {
                                tracing::warn!(from = %current.address, to = %to, "the Redis primary moved; switched to the one the sentinels name");
                                current = Primary {
                                    manager,
                                    address: to,
                                };
                                self.tx.send_replace(Some(current.clone()));
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, primary = %to, "cannot connect to the Redis primary the sentinels name")
                            }
                        }
                    }
                    Err(e) if !told => {
                        told = true;
                        tracing::warn!(error = %e, primary = %current.address, "the Redis primary does not answer and the sentinels name no other yet; looking again with backoff");
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "the sentinels name no Redis primary yet")
                    }
                }
                if !self.pause(backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(LOOKUP_BACKOFF_MAX);
            }
            if !self.pause(RECHECK_GAP).await {
                return;
            }
        }
    }

    /// Sleeps `pause`; false when the link is gone meanwhile.
    async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(pause) => true,
            _ = self.stop.cancelled() => false,
        }
    }

    async fn connect(&mut self) -> RedisResult<Primary> {
        let client = match &self.source {
            Source::Url(client) => client.clone(),
            Source::Sentinels(_) => self.find().await?,
        };
        let address = address(&client);
        let manager = self.manager(client).await?;
        Ok(Primary { manager, address })
    }

    /// The primary the sentinels name now, checked to answer `ROLE` as one.
    async fn find(&mut self) -> RedisResult<redis::Client> {
        let Source::Sentinels(sentinels) = &mut self.source else {
            unreachable!("only a link through sentinels looks for its primary")
        };
        tokio::time::timeout(LOOKUP_TIMEOUT, sentinels.async_get_client())
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the sentinels did not name a primary in time",
                )))
            })
    }

    async fn manager(&self, client: redis::Client) -> RedisResult<ConnectionManager> {
        ConnectionManager::new_with_config(client, self.manager_config.clone()).await
    }
}

fn address(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// A connection to the primary as a link handed it out: a redis-crate connection (use it with
/// `query_async`, `invoke_async`, `AsyncCommands`) that tells its link when a reply says the
/// primary may have moved.
#[derive(Clone)]
pub struct RedisConn {
    manager: ConnectionManager,
    moved: Arc<Notify>,
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConn").finish_non_exhaustive()
    }
}

impl RedisConn {
    fn observe(&self, e: &RedisError) {
        if primary_moved(e) {
            self.moved.notify_one();
        }
    }

    fn observe_replies<'v>(&self, replies: impl IntoIterator<Item = &'v Value>) {
        let moved = replies
            .into_iter()
            .any(|v| matches!(v, Value::ServerError(e) if moved_reply(e)));
        if moved {
            self.moved.notify_one();
        }
    }

    /// Runs a script that writes and, when `wait` asks for replicas, `WAIT` right behind it in
    /// one pipeline (see the module docs); the script's reply and what `WAIT` said. A script
    /// Redis does not have yet is loaded and run again, with its `WAIT` again.
    pub async fn invoke_replicated<T: FromRedisValue>(
        &mut self,
        invocation: &ScriptInvocation<'_>,
        wait: ReplicaWait,
    ) -> RedisResult<(T, Replication)> {
        if !wait.asked() {
            let value = invocation.invoke_async(self).await?;
            return Ok((value, Replication::NotAsked));
        }
        let mut waiting = Waiting {
            conn: self,
            wait,
            waited: None,
        };
        let value = invocation.invoke_async(&mut waiting).await?;
        let waited = waiting.waited.take().ok_or_else(|| {
            RedisError::from((ErrorKind::Client, "the script was not followed by WAIT"))
        })?;
        let acked: i64 = FromRedisValue::from_redis_value(waited.extract_error()?)?;
        let acked = u32::try_from(acked).unwrap_or(0);
        Ok((value, replication(acked, wait.replicas)))
    }
}

fn replication(acked: u32, wanted: u32) -> Replication {
    if acked >= wanted {
        Replication::Confirmed { acked }
    } else {
        Replication::Short { acked, wanted }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            // The first poll reaches the manager's queue at once (the workspace's pipelined
            // read record counts on it).
            let reply = self.manager.req_packed_command(cmd).await;
            match &reply {
                Ok(value) => self.observe_replies([value]),
                Err(e) => self.observe(e),
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let replies = self
                .manager
                .req_packed_commands(pipeline, offset, count)
                .await;
            match &replies {
                Ok(values) => self.observe_replies(values),
                Err(e) => self.observe(e),
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

/// A [`RedisConn`] that sends each `EVALSHA` as a pipeline with `WAIT` behind it and keeps what
/// `WAIT` answered; anything else (`SCRIPT LOAD`) goes as it is.
struct Waiting<'c> {
    conn: &'c mut RedisConn,
    wait: ReplicaWait,
    waited: Option<Value>,
}

fn is_evalsha(cmd: &Cmd) -> bool {
    matches!(
        cmd.args_iter().next(),
        Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"EVALSHA")
    )
}

impl ConnectionLike for Waiting<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            if !is_evalsha(cmd) {
                return self.conn.req_packed_command(cmd).await;
            }
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone())
                .cmd("WAIT")
                .arg(self.wait.replicas)
                .arg(self.wait.timeout_ms());
            let mut replies = self.conn.req_packed_commands(&pipe, 0, 2).await?;
            let (Some(waited), Some(script)) = (replies.pop(), replies.pop()) else {
                return Err(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "a script and WAIT got fewer than two replies",
                )));
            };
            self.waited = Some(waited);
            Ok(script)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

#[cfg(test)]
#[path = "redis_link_tests.rs"]
mod tests;
