//! The registry in Redis (`TOOLMESH_SANDBOX_REGISTRY=redis`, the default).
//!
//! Key `toolmesh:sandbox:session:<account>:<session>`: hash `node`, `sandbox`, with a
//! `PEXPIRE` of the registry's TTL renewed by each touch; claims, touches and releases are Lua
//! scripts, so each is one atomic step.
//!
//! Redis is reached through the kernel's [`RedisLink`] (through Sentinel, the primary of the
//! moment). Claims wait for no replica: one a failover loses leaves the session unclaimed or
//! with its former holder, and the next call claims it again, as after a worker's death.

use std::time::Duration;

use redis::Script;
use toolmesh_kernel::redis_link::{RedisConfig, RedisConn, RedisLink};
use toolmesh_kernel::NodeId;

use super::{Claim, Claimant, Placement, RegistryError, RegistryStore};
use crate::pool::SessionKey;

const CLAIM: &str = r#"
local cur = redis.call('HGET', KEYS[1], 'node')
if (not cur) or cur == ARGV[1] or cur == ARGV[3] then
  redis.call('HSET', KEYS[1], 'node', ARGV[1], 'sandbox', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return ''
end
return cur
"#;

const TOUCH: &str = r#"
if redis.call('HGET', KEYS[1], 'node') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

const RELEASE: &str = r#"
if redis.call('HGET', KEYS[1], 'node') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

pub struct RedisRegistry {
    link: RedisLink,
    ttl: Duration,
    claim: Script,
    touch: Script,
    release: Script,
}

impl std::fmt::Debug for RedisRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRegistry").finish_non_exhaustive()
    }
}

fn redis_key((account, session): &SessionKey) -> String {
    format!("toolmesh:sandbox:session:{account}:{session}")
}

/// How long to let the connection manager reconnect before the one retry.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Errors after which one more try may succeed: the connection was dropped (Redis restarted)
/// and the manager reconnects on the next command, or the primary moved and the link finds
/// the new one (the retry takes the link's connection again).
fn retryable(e: &redis::RedisError) -> bool {
    toolmesh_kernel::redis_link::primary_moved(e)
}

fn unreachable(e: redis::RedisError) -> RegistryError {
    RegistryError::Unreachable {
        store: RegistryStore::Redis,
        source: Box::new(e),
    }
}

impl RedisRegistry {
    /// `ttl`: how long an entry outlives its last touch. Only a malformed URL fails here;
    /// nothing connects before the first use.
    pub fn new(redis: &RedisConfig, ttl: Duration) -> Result<Self, redis::RedisError> {
        Ok(Self {
            link: RedisLink::new(redis)?,
            ttl,
            claim: Script::new(CLAIM),
            touch: Script::new(TOUCH),
            release: Script::new(RELEASE),
        })
    }

    async fn conn(&self) -> Result<RedisConn, RegistryError> {
        self.link.connection().await.map_err(unreachable)
    }

    /// Runs `command` on the link's connection, and once more on a fresh one after an error
    /// that a reconnect (Redis restarted) or the new primary (a failover) may cure. Only for
    /// commands that may run twice.
    async fn once_more<T, F, Fut>(&self, command: F) -> Result<T, RegistryError>
    where
        F: Fn(RedisConn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        match command(self.conn().await?).await {
            Err(e) if retryable(&e) => {
                tokio::time::sleep(RETRY_PAUSE).await;
                command(self.conn().await?).await.map_err(unreachable)
            }
            done => done.map_err(unreachable),
        }
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis().max(1) as u64
    }

    pub async fn lookup(&self, key: &SessionKey) -> Result<Option<Placement>, RegistryError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(redis_key(key)).arg("node").arg("sandbox");
        let cmd = &cmd;
        let (node, sandbox): (Option<String>, Option<String>) = self
            .once_more(|mut conn| async move { cmd.query_async(&mut conn).await })
            .await?;
        Ok(match (node.and_then(|n| NodeId::parse(n).ok()), sandbox) {
            (Some(node), Some(sandbox_id)) => Some(Placement { node, sandbox_id }),
            _ => None,
        })
    }

    /// Takes the session for `by.node` unless a holder other than `by.replacing` has it.
    pub async fn claim(&self, key: &SessionKey, by: &Claimant<'_>) -> Result<Claim, RegistryError> {
        let mut claim = self.claim.key(redis_key(key));
        claim
            .arg(by.node.as_str())
            .arg(by.sandbox_id)
            .arg(by.replacing.map_or("", |n| n.as_str()))
            .arg(self.ttl_ms());
        // The script is idempotent for this node, so running it again after a dropped
        // connection is safe.
        let claim = &claim;
        let holder: String = self
            .once_more(|mut conn| async move { claim.invoke_async(&mut conn).await })
            .await?;
        if holder.is_empty() {
            return Ok(Claim::Taken);
        }
        NodeId::parse(holder)
            .map(Claim::HeldBy)
            .map_err(RegistryError::MalformedHolder)
    }

    /// Extends the entry; false when `node` no longer holds the session.
    pub async fn touch(&self, key: &SessionKey, node: &NodeId) -> Result<bool, RegistryError> {
        let mut conn = self.conn().await?;
        let held: i64 = self
            .touch
            .key(redis_key(key))
            .arg(node.as_str())
            .arg(self.ttl_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(unreachable)?;
        Ok(held == 1)
    }

    /// Forgets the session if `node` holds it.
    pub async fn release(&self, key: &SessionKey, node: &NodeId) -> Result<(), RegistryError> {
        let mut conn = self.conn().await?;
        let _: i64 = self
            .release
            .key(redis_key(key))
            .arg(node.as_str())
            .invoke_async(&mut conn)
            .await
            .map_err(unreachable)?;
        Ok(())
    }
}
