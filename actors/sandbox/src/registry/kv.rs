//! The registry in a JetStream key-value bucket (`TOOLMESH_SANDBOX_REGISTRY=jetstream`).
//!
//! Bucket [`BUCKET`], key `<account>.<session>` (ids are letters, digits, `_` and `-`, all
//! valid in a key), value `{"node": …, "sandbox": …}`, one revision kept per key. The bucket's
//! `max_age` is the registry's TTL: a touch writes the entry again, so it outlives its last
//! touch by that long. Every change names the revision it read (`create` for a new entry,
//! `update` and `delete` with the expected revision), so two workers claiming one session
//! cannot both win: the loser reads again and finds the winner. Reads may come from any
//! replica (direct get) and be a moment old; a write on a stale read fails and is read again.
//!
//! The bucket is a stream (`KV_TOOLMESH_SANDBOX_SESSIONS`) the worker ensures at start as the
//! kernel ensures its streams ([`streams::ensure`]): created with `TOOLMESH_STREAM_REPLICAS`
//! copies, raised and never lowered, waited for while a cluster forms. On a cluster it is
//! replicated like the events and the audit trail, so it survives the loss of a server; at a
//! worker site behind a leaf node it is reached over the leaf connection.

use std::time::Duration;

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, Store, UpdateErrorKind};
use async_nats::jetstream::stream::{Config, DiscardPolicy, StorageType};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use toolmesh_kernel::streams::{self, EnsureError};
use toolmesh_kernel::NodeId;

use super::{Claim, Claimant, Placement, RegistryError, RegistryStore};
use crate::pool::SessionKey;

/// The bucket's name.
pub const BUCKET: &str = "TOOLMESH_SANDBOX_SESSIONS";

/// Reads and writes of one claim, touch or release before it counts as
/// [`RegistryError::Contended`]: each lost race means another worker changed the entry, so
/// the next read finds it settled unless several keep racing.
const ATTEMPTS: usize = 5;

/// How long one request to the bucket may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One entry's value.
#[derive(Debug, Serialize, Deserialize)]
struct Holder {
    node: String,
    sandbox: String,
}

#[derive(Debug)]
pub struct KvRegistry {
    store: Store,
}

/// Why the bucket could not be made at start.
#[derive(Debug, thiserror::Error)]
pub enum KvStartError {
    #[error("cannot make the sandbox session registry bucket {BUCKET}: {0}")]
    Ensure(#[source] EnsureError),
    #[error("cannot open the sandbox session registry bucket {BUCKET}: {0}")]
    Open(#[source] async_nats::jetstream::context::KeyValueError),
}

/// The stream behind the bucket, laid out as every NATS client lays out a key-value bucket
/// (ADR-8), so `nats kv` and any client read it.
pub fn bucket_config(ttl: Duration, replicas: usize) -> Config {
    Config {
        name: format!("KV_{BUCKET}"),
        description: Some("toolmesh: which sandbox worker holds each session".to_owned()),
        subjects: vec![format!("$KV.{BUCKET}.>")],
        max_messages_per_subject: 1,
        max_age: ttl,
        storage: StorageType::File,
        num_replicas: replicas.max(1),
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: DiscardPolicy::New,
        // A duplicate window longer than max_age is refused by the server.
        duplicate_window: ttl.min(Duration::from_secs(120)),
        ..Config::default()
    }
}

fn entry_key((account, session): &SessionKey) -> String {
    format!("{account}.{session}")
}

fn unreachable(e: impl std::error::Error + Send + Sync + 'static) -> RegistryError {
    RegistryError::Unreachable {
        store: RegistryStore::JetStream,
        source: Box::new(e),
    }
}

/// `request`'s own outcome, or "not reachable" when it takes longer than [`REQUEST_TIMEOUT`].
async fn bounded<T>(request: impl std::future::Future<Output = T>) -> Result<T, RegistryError> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| {
            unreachable(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from JetStream in time",
            ))
        })
}

/// What one attempt at a change came to.
enum Step<T> {
    Done(T),
    /// Another worker changed the entry since it was read: read again.
    Raced,
}

impl Step<()> {
    /// A change's outcome: done, a lost race (an error `raced` says is one), or a failure.
    fn of<T, E>(outcome: Result<T, E>, raced: impl Fn(&E) -> bool) -> Result<Self, RegistryError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        match outcome {
            Ok(_) => Ok(Step::Done(())),
            Err(e) if raced(&e) => Ok(Step::Raced),
            Err(e) => Err(unreachable(e)),
        }
    }

    /// Done with `value`, or raced still.
    fn then<T>(self, value: T) -> Step<T> {
        match self {
            Step::Done(()) => Step::Done(value),
            Step::Raced => Step::Raced,
        }
    }
}

/// An update or delete that named a revision another worker has replaced.
fn stale(e: &kv::UpdateError) -> bool {
    e.kind() == UpdateErrorKind::WrongLastRevision
}

impl KvRegistry {
    /// Ensures the bucket (`ttl`: how long an entry outlives its last touch) and opens it.
    pub async fn start(
        js: &async_nats::jetstream::Context,
        ttl: Duration,
        replicas: usize,
    ) -> Result<Self, KvStartError> {
        let ensured = streams::ensure(js, bucket_config(ttl, replicas))
            .await
            .map_err(KvStartError::Ensure)?;
        for kept in &ensured.kept {
            tracing::warn!(bucket = BUCKET, "{kept}: kept as it is");
        }
        let store = js.get_key_value(BUCKET).await.map_err(KvStartError::Open)?;
        Ok(Self { store })
    }

    /// The entry of `key`, if one is live (not deleted), with its revision.
    async fn read(&self, key: &str) -> Result<Option<(Holder, u64)>, RegistryError> {
        let entry = bounded(self.store.entry(key)).await?.map_err(unreachable)?;
        let Some(entry) = entry.filter(|e| e.operation == Operation::Put) else {
            return Ok(None);
        };
        let holder = serde_json::from_slice(&entry.value).map_err(RegistryError::MalformedEntry)?;
        Ok(Some((holder, entry.revision)))
    }

    /// A new entry where none is live.
    async fn create(&self, key: &str, value: Bytes) -> Result<Step<()>, RegistryError> {
        let created = bounded(self.store.create(key, value)).await?;
        Step::of(created, |e| e.kind() == CreateErrorKind::AlreadyExists)
    }

    /// `value` in place of revision `revision`.
    async fn update(
        &self,
        key: &str,
        value: Bytes,
        revision: u64,
    ) -> Result<Step<()>, RegistryError> {
        Step::of(
            bounded(self.store.update(key, value, revision)).await?,
            stale,
        )
    }

    /// Runs `attempt` until it is done, for up to [`ATTEMPTS`] lost races.
    async fn settle<T, F, Fut>(&self, mut attempt: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Step<T>, RegistryError>>,
    {
        for _ in 0..ATTEMPTS {
            if let Step::Done(done) = attempt().await? {
                return Ok(done);
            }
        }
        Err(RegistryError::Contended { attempts: ATTEMPTS })
    }

    pub async fn lookup(&self, key: &SessionKey) -> Result<Option<Placement>, RegistryError> {
        let Some((holder, _)) = self.read(&entry_key(key)).await? else {
            return Ok(None);
        };
        Ok(NodeId::parse(holder.node).ok().map(|node| Placement {
            node,
            sandbox_id: holder.sandbox,
        }))
    }

    /// Takes the session for `by.node` unless a holder other than `by.replacing` has it.
    pub async fn claim(&self, key: &SessionKey, by: &Claimant<'_>) -> Result<Claim, RegistryError> {
        let key = entry_key(key);
        let Claimant {
            node,
            sandbox_id,
            replacing,
        } = *by;
        let value = encode(node, sandbox_id)?;
        self.settle(|| async {
            match self.read(&key).await? {
                None => Ok(self.create(&key, value.clone()).await?.then(Claim::Taken)),
                Some((holder, revision))
                    if holder.node == node.as_str()
                        || replacing.is_some_and(|gone| holder.node == gone.as_str()) =>
                {
                    Ok(self
                        .update(&key, value.clone(), revision)
                        .await?
                        .then(Claim::Taken))
                }
                Some((holder, _)) => NodeId::parse(holder.node)
                    .map(|held| Step::Done(Claim::HeldBy(held)))
                    .map_err(RegistryError::MalformedHolder),
            }
        })
        .await
    }

    /// Extends the entry; false when `node` no longer holds the session.
    pub async fn touch(&self, key: &SessionKey, node: &NodeId) -> Result<bool, RegistryError> {
        let key = entry_key(key);
        self.settle(|| async {
            match self.read(&key).await? {
                Some((holder, revision)) if holder.node == node.as_str() => {
                    let value = encode(node, &holder.sandbox)?;
                    Ok(self.update(&key, value, revision).await?.then(true))
                }
                _ => Ok(Step::Done(false)),
            }
        })
        .await
    }

    /// Forgets the session if `node` holds it.
    pub async fn release(&self, key: &SessionKey, node: &NodeId) -> Result<(), RegistryError> {
        let key = entry_key(key);
        self.settle(|| async {
            match self.read(&key).await? {
                Some((holder, revision)) if holder.node == node.as_str() => {
                    let deleted = self.store.delete_expect_revision(&key, Some(revision));
                    // A delete's error is an update's (`DeleteError` is `UpdateError`).
                    Step::of(bounded(deleted).await?, stale)
                }
                _ => Ok(Step::Done(())),
            }
        })
        .await
    }
}

fn encode(node: &NodeId, sandbox_id: &str) -> Result<Bytes, RegistryError> {
    let holder = Holder {
        node: node.as_str().to_owned(),
        sandbox: sandbox_id.to_owned(),
    };
    serde_json::to_vec(&holder)
        .map(Bytes::from)
        .map_err(RegistryError::MalformedEntry)
}
