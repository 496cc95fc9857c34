//! The session registry in Redis: which worker holds the sandbox of each `(account, session)`,
//! so that a call that lands on any worker reaches the one holding the session's sandbox.
//!
//! Key `toolmesh:sandbox:session:<account>:<session>`: hash `node`, `sandbox`, expiring after
//! twice the idle TTL unless its holder touches it. Claims are compare-and-set (a Lua script):
//! a worker takes a session only when nobody holds it, it already does, or the holder it
//! found is the one it believes gone. The warm path (the session is local) never asks Redis.
//!
//! Redis is reached through the kernel's [`RedisLink`] (through Sentinel, the primary of the
//! moment). Claims wait for no replica: one a failover loses leaves the session unclaimed or
//! with its former holder, and the next call claims it again, as after a worker's death.

use std::time::Duration;

use redis::Script;
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::ids::InvalidId;
use toolmesh_kernel::redis_link::{RedisConfig, RedisConn, RedisLink};
use toolmesh_kernel::{Account, ErrorCode, NodeId, SessionId, ToolError};

use crate::pool::OpenError;

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

/// Who holds a session's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: NodeId,
    pub sandbox_id: String,
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Taken,
    /// Another live holder has it.
    HeldBy(NodeId),
}

pub struct SessionRegistry {
    link: RedisLink,
    ttl: Duration,
    claim: Script,
    touch: Script,
    release: Script,
}

impl std::fmt::Debug for SessionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRegistry").finish_non_exhaustive()
    }
}

fn key(account: &Account, session: &SessionId) -> String {
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

/// Why the registry could not answer.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Redis could not be reached, or failed the command.
    #[error("the sandbox session registry (Redis) is not reachable: {0}")]
    Unreachable(#[source] redis::RedisError),
    /// An entry names a holder that is not a node id (a damaged entry, or a bug).
    #[error("a malformed holder in the registry: {0}")]
    MalformedHolder(#[source] InvalidId),
}

/// What kind of [`RegistryError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryErrorKind {
    /// Redis is not reachable: `unavailable`, safe to retry.
    Unavailable,
    /// The registry holds what this code never writes: `internal`.
    Internal,
}

impl RegistryError {
    pub fn kind(&self) -> RegistryErrorKind {
        match self {
            RegistryError::Unreachable(_) => RegistryErrorKind::Unavailable,
            RegistryError::MalformedHolder(_) => RegistryErrorKind::Internal,
        }
    }
}

/// PROTOCOL.md's code and sentence; the log line keeps the cause (Redis' own words are for
/// the log, not the caller).
impl From<RegistryError> for ToolError {
    fn from(e: RegistryError) -> Self {
        match e.kind() {
            RegistryErrorKind::Unavailable => {
                tracing::warn!(error = %DisplayChain(&e), "sandbox session registry unreachable");
                ToolError::new(
                    ErrorCode::Unavailable,
                    "the sandbox session registry (Redis) is not reachable; retry in a moment",
                )
            }
            RegistryErrorKind::Internal => {
                ToolError::internal_logged(&e, "sandbox session registry unusable")
            }
        }
    }
}

/// A session that cannot be opened because the registry could not answer.
impl From<RegistryError> for OpenError {
    fn from(e: RegistryError) -> Self {
        OpenError::Failed(e.into())
    }
}

impl SessionRegistry {
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
        self.link
            .connection()
            .await
            .map_err(RegistryError::Unreachable)
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis().max(1) as u64
    }

    pub async fn lookup(
        &self,
        account: &Account,
        session: &SessionId,
    ) -> Result<Option<Placement>, RegistryError> {
        let mut conn = self.conn().await?;
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(key(account, session)).arg("node").arg("sandbox");
        let (node, sandbox): (Option<String>, Option<String>) =
            match cmd.query_async(&mut conn).await {
                Ok(found) => found,
                // A connection Redis dropped (a restart) fails once, then reconnects.
                Err(e) if retryable(&e) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    let mut conn = self.conn().await?;
                    cmd.query_async(&mut conn)
                        .await
                        .map_err(RegistryError::Unreachable)?
                }
                Err(e) => return Err(RegistryError::Unreachable(e)),
            };
        Ok(match (node.and_then(|n| NodeId::parse(n).ok()), sandbox) {
            (Some(node), Some(sandbox_id)) => Some(Placement { node, sandbox_id }),
            _ => None,
        })
    }

    /// Takes the session for `node` unless a holder other than `replacing` has it.
    pub async fn claim(
        &self,
        account: &Account,
        session: &SessionId,
        node: &NodeId,
        sandbox_id: &str,
        replacing: Option<&NodeId>,
    ) -> Result<Claim, RegistryError> {
        let mut conn = self.conn().await?;
        let mut claim = self.claim.key(key(account, session));
        claim
            .arg(node.as_str())
            .arg(sandbox_id)
            .arg(replacing.map_or("", |n| n.as_str()))
            .arg(self.ttl_ms());
        // The script is idempotent for this node, so running it again after a dropped
        // connection is safe.
        let holder: String = match claim.invoke_async(&mut conn).await {
            Ok(holder) => holder,
            Err(e) if retryable(&e) => {
                tokio::time::sleep(RETRY_PAUSE).await;
                let mut conn = self.conn().await?;
                claim
                    .invoke_async(&mut conn)
                    .await
                    .map_err(RegistryError::Unreachable)?
            }
            Err(e) => return Err(RegistryError::Unreachable(e)),
        };
        if holder.is_empty() {
            return Ok(Claim::Taken);
        }
        NodeId::parse(holder)
            .map(Claim::HeldBy)
            .map_err(RegistryError::MalformedHolder)
    }

    /// Extends the entry; false when `node` no longer holds the session.
    pub async fn touch(
        &self,
        account: &Account,
        session: &SessionId,
        node: &NodeId,
    ) -> Result<bool, RegistryError> {
        let mut conn = self.conn().await?;
        let held: i64 = self
            .touch
            .key(key(account, session))
            .arg(node.as_str())
            .arg(self.ttl_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(RegistryError::Unreachable)?;
        Ok(held == 1)
    }

    /// Forgets the session if `node` holds it.
    pub async fn release(
        &self,
        account: &Account,
        session: &SessionId,
        node: &NodeId,
    ) -> Result<(), RegistryError> {
        let mut conn = self.conn().await?;
        let _: i64 = self
            .release
            .key(key(account, session))
            .arg(node.as_str())
            .invoke_async(&mut conn)
            .await
            .map_err(RegistryError::Unreachable)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_store_is_unavailable_and_a_bad_holder_internal() {
        let down = RegistryError::Unreachable(redis::RedisError::from((
            redis::ErrorKind::Io,
            "connection refused",
        )));
        assert_eq!(down.kind(), RegistryErrorKind::Unavailable);
        let down = ToolError::from(down);
        assert_eq!(down.code, ErrorCode::Unavailable);
        assert!(
            !down.message.contains("refused"),
            "Redis' words stay in the log"
        );

        let holder = NodeId::parse("a b").unwrap_err();
        let bad = ToolError::from(RegistryError::MalformedHolder(holder));
        assert_eq!(bad.code, ErrorCode::Internal);
        assert!(bad
            .message
            .starts_with("a malformed holder in the registry: "));
        match OpenError::from(RegistryError::MalformedHolder(
            NodeId::parse("").unwrap_err(),
        )) {
            OpenError::Failed(e) => assert_eq!(e.code, ErrorCode::Internal),
            other => panic!("{other:?}"),
        }
    }
}
