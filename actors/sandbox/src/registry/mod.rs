//! The session registry: which worker holds the sandbox of each `(account, session)`, so that
//! a call that lands on any worker reaches the one holding the session's sandbox.
//!
//! One entry per session, `node` and `sandbox`, expiring after twice the idle TTL unless its
//! holder touches it. Claims are compare-and-set: a worker takes a session only when nobody
//! holds it, it already does, or the holder it found is the one it believes gone. The warm
//! path (the session is local) never asks the registry.
//!
//! Two stores keep it, one per cluster (`TOOLMESH_SANDBOX_REGISTRY`, the same on every worker:
//! two workers on different stores would each take the same session):
//! - [`redis`]: a hash per session in Redis, claims by Lua script (the default);
//! - [`kv`]: the JetStream key-value bucket `TOOLMESH_SANDBOX_SESSIONS`, claims by expected
//!   revision. A worker then needs nothing but NATS, so it can run at a site that reaches the
//!   cluster only through a NATS leaf node (docs/operations.md "Worker sites").

pub mod kv;
pub mod redis;

use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::ids::InvalidId;
use toolmesh_kernel::{ErrorCode, NodeId, ToolError};

use crate::pool::{OpenError, SessionKey};

pub use self::kv::KvRegistry;
pub use self::redis::RedisRegistry;

/// Where the registry lives (`TOOLMESH_SANDBOX_REGISTRY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryStore {
    Redis,
    JetStream,
}

impl RegistryStore {
    /// How errors and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            RegistryStore::Redis => "Redis",
            RegistryStore::JetStream => "JetStream",
        }
    }
}

impl std::str::FromStr for RegistryStore {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "redis" => Ok(RegistryStore::Redis),
            "jetstream" => Ok(RegistryStore::JetStream),
            other => Err(format!(
                "unknown sandbox session registry {other:?}; use redis or jetstream"
            )),
        }
    }
}

/// Who holds a session's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: NodeId,
    pub sandbox_id: String,
}

/// Who claims a session: this worker, for its sandbox, in place of the holder it found gone
/// (if it found one).
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    pub node: &'a NodeId,
    pub sandbox_id: &'a str,
    pub replacing: Option<&'a NodeId>,
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Taken,
    /// Another live holder has it.
    HeldBy(NodeId),
}

/// The registry of this worker's cluster, in the store it names.
#[derive(Debug)]
pub enum SessionRegistry {
    Redis(RedisRegistry),
    JetStream(Box<KvRegistry>),
}

impl SessionRegistry {
    pub async fn lookup(&self, key: &SessionKey) -> Result<Option<Placement>, RegistryError> {
        match self {
            SessionRegistry::Redis(r) => r.lookup(key).await,
            SessionRegistry::JetStream(r) => r.lookup(key).await,
        }
    }

    /// Takes the session for `by.node` unless a holder other than `by.replacing` has it.
    pub async fn claim(&self, key: &SessionKey, by: &Claimant<'_>) -> Result<Claim, RegistryError> {
        match self {
            SessionRegistry::Redis(r) => r.claim(key, by).await,
            SessionRegistry::JetStream(r) => r.claim(key, by).await,
        }
    }

    /// Extends the entry; false when `node` no longer holds the session.
    pub async fn touch(&self, key: &SessionKey, node: &NodeId) -> Result<bool, RegistryError> {
        match self {
            SessionRegistry::Redis(r) => r.touch(key, node).await,
            SessionRegistry::JetStream(r) => r.touch(key, node).await,
        }
    }

    /// Forgets the session if `node` holds it.
    pub async fn release(&self, key: &SessionKey, node: &NodeId) -> Result<(), RegistryError> {
        match self {
            SessionRegistry::Redis(r) => r.release(key, node).await,
            SessionRegistry::JetStream(r) => r.release(key, node).await,
        }
    }
}

/// A store's own error, kept as the source.
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// Why the registry could not answer.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The store could not be reached, or failed the command.
    #[error("the sandbox session registry ({}) is not reachable: {source}", store.name())]
    Unreachable {
        store: RegistryStore,
        #[source]
        source: StoreError,
    },
    /// Claims of other workers kept changing the entry under this one's (a bug, or a storm).
    #[error("the sandbox session registry entry kept changing under {attempts} claims")]
    Contended { attempts: usize },
    /// An entry names a holder that is not a node id (a damaged entry, or a bug).
    #[error("a malformed holder in the registry: {0}")]
    MalformedHolder(#[source] InvalidId),
    /// An entry that is not what this code writes.
    #[error("a malformed entry in the registry: {0}")]
    MalformedEntry(#[source] serde_json::Error),
}

/// What kind of [`RegistryError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryErrorKind {
    /// The store is not reachable, or busy: `unavailable`, safe to retry.
    Unavailable,
    /// The registry holds what this code never writes: `internal`.
    Internal,
}

impl RegistryError {
    pub fn kind(&self) -> RegistryErrorKind {
        match self {
            RegistryError::Unreachable { .. } | RegistryError::Contended { .. } => {
                RegistryErrorKind::Unavailable
            }
            RegistryError::MalformedHolder(_) | RegistryError::MalformedEntry(_) => {
                RegistryErrorKind::Internal
            }
        }
    }

    fn store(&self) -> Option<RegistryStore> {
        match self {
            RegistryError::Unreachable { store, .. } => Some(*store),
            _ => None,
        }
    }
}

/// PROTOCOL.md's code and sentence; the log line keeps the cause (the store's own words are
/// for the log, not the caller).
impl From<RegistryError> for ToolError {
    fn from(e: RegistryError) -> Self {
        match e.kind() {
            RegistryErrorKind::Unavailable => {
                tracing::warn!(error = %DisplayChain(&e), "sandbox session registry unreachable");
                let message = match e.store() {
                    Some(store) => format!(
                        "the sandbox session registry ({}) is not reachable; retry in a moment",
                        store.name()
                    ),
                    None => "the sandbox session registry is busy; retry in a moment".to_owned(),
                };
                ToolError::new(ErrorCode::Unavailable, message)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_store_is_unavailable_and_a_bad_holder_internal() {
        for store in [RegistryStore::Redis, RegistryStore::JetStream] {
            let down = RegistryError::Unreachable {
                store,
                source: "connection refused".into(),
            };
            assert_eq!(down.kind(), RegistryErrorKind::Unavailable);
            let down = ToolError::from(down);
            assert_eq!(down.code, ErrorCode::Unavailable);
            assert!(down.message.contains(store.name()), "{}", down.message);
            assert!(
                !down.message.contains("refused"),
                "the store's words stay in the log"
            );
        }
        let busy = ToolError::from(RegistryError::Contended { attempts: 5 });
        assert_eq!(busy.code, ErrorCode::Unavailable);

        let holder = NodeId::parse("a b").unwrap_err();
        let bad = ToolError::from(RegistryError::MalformedHolder(holder));
        assert_eq!(bad.code, ErrorCode::Internal);
        assert!(bad
            .message
            .starts_with("a malformed holder in the registry: "));
        let entry = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let bad = ToolError::from(RegistryError::MalformedEntry(entry));
        assert_eq!(bad.code, ErrorCode::Internal);
        match OpenError::from(RegistryError::MalformedHolder(
            NodeId::parse("").unwrap_err(),
        )) {
            OpenError::Failed(e) => assert_eq!(e.code, ErrorCode::Internal),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_store_is_named_redis_or_jetstream() {
        assert_eq!("redis".parse(), Ok(RegistryStore::Redis));
        assert_eq!("jetstream".parse(), Ok(RegistryStore::JetStream));
        let err = "etcd".parse::<RegistryStore>().unwrap_err();
        assert!(err.contains("use redis or jetstream"), "{err}");
    }
}
