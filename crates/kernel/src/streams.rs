//! JetStream streams the nodes keep: "ensure" a stream (create it, or update its limits) and
//! what a node reports when the server has no JetStream.
//!
//! [`ensure`] is general: any stream of the contract (`TOOLMESH_EVENTS`, `TOOLMESH_AUDIT`) is a
//! [`async_nats::jetstream::stream::Config`] handed to it. [`events_config`] is the RunEvents'
//! one. Publishers keep publishing on core NATS: the stream captures the subjects on the
//! server, so live subscribers see no change.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream::context::CreateStreamErrorKind;
use async_nats::jetstream::stream::{Config, Info, StorageType};
use async_nats::jetstream::Context;
use serde_json::{json, Value};

/// The stream of RunEvents (PROTOCOL.md "Durable events, audit, metrics, console").
pub const EVENTS_STREAM: &str = "TOOLMESH_EVENTS";
/// The subjects it keeps: every account's RunEvents.
pub const EVENTS_SUBJECTS: &str = crate::subjects::public::EVENTS_ALL;

/// How long a JetStream API request of [`ensure`] may take before the server counts as
/// without JetStream.
pub const ENSURE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a stream could not be ensured.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    /// The server (or this user's account) has no JetStream: the node goes on without it.
    #[error("the NATS server has no JetStream: {0}")]
    Unavailable(String),
    /// JetStream refused the stream (for instance a limit the server does not allow).
    #[error("cannot create or update the stream {stream}: {reason}")]
    Refused { stream: String, reason: String },
}

/// Creates the stream of `config`, or updates the limits of the one of that name.
pub async fn ensure(js: &Context, config: Config) -> Result<Info, EnsureError> {
    let stream = config.name.clone();
    let attempt = tokio::time::timeout(ENSURE_TIMEOUT, js.create_or_update_stream(config)).await;
    match attempt {
        Err(_) => Err(EnsureError::Unavailable(
            "no JetStream answer in time".into(),
        )),
        Ok(Ok(info)) => Ok(info),
        Ok(Err(err)) => match err.kind() {
            CreateStreamErrorKind::JetStreamUnavailable | CreateStreamErrorKind::TimedOut => {
                Err(EnsureError::Unavailable(err.to_string()))
            }
            CreateStreamErrorKind::JetStream(inner)
                if inner.error_code()
                    == async_nats::jetstream::ErrorCode::JETSTREAM_NOT_ENABLED
                    || inner.error_code()
                        == async_nats::jetstream::ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT =>
            {
                Err(EnsureError::Unavailable(err.to_string()))
            }
            _ => Err(EnsureError::Refused {
                stream,
                reason: err.to_string(),
            }),
        },
    }
}

/// The limits of `TOOLMESH_EVENTS` (`TOOLMESH_EVENTS_MAX_AGE_S`, `TOOLMESH_EVENTS_MAX_BYTES`).
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// How long an event is kept.
    pub max_age: Duration,
    /// Bytes the stream keeps at most (the oldest go first); `None`: no size limit.
    pub max_bytes: Option<u64>,
    /// What the node found at start; read by `component_status`.
    pub durability: Arc<OnceLock<Durability>>,
}

/// The stream configuration of RunEvents: file storage, so it survives a server restart.
pub fn events_config(config: &EventsConfig) -> Config {
    Config {
        name: EVENTS_STREAM.to_owned(),
        subjects: vec![EVENTS_SUBJECTS.to_owned()],
        storage: StorageType::File,
        max_age: config.max_age,
        max_bytes: config
            .max_bytes
            .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
        description: Some("toolmesh RunEvents, replayable per invocation".to_owned()),
        ..Default::default()
    }
}

/// Whether this node's RunEvents are kept in a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Durability {
    /// Kept in the stream of this name.
    Durable { stream: String },
    /// Not kept: live subscribers only, for this reason.
    Live { reason: String },
}

impl Durability {
    /// What `component_status` shows under `events`.
    pub fn to_json(&self) -> Value {
        match self {
            Durability::Durable { stream } => json!({"durable": true, "stream": stream}),
            Durability::Live { reason } => json!({"durable": false, "reason": reason}),
        }
    }
}

impl EventsConfig {
    /// What the node found at start, or "not checked yet" before it.
    pub fn status(&self) -> Value {
        match self.durability.get() {
            Some(d) => d.to_json(),
            None => json!({"durable": false, "reason": "not checked yet"}),
        }
    }
}

/// Ensures `TOOLMESH_EVENTS` on the server of `client` and records the outcome in
/// `config.durability`. A server without JetStream is no error: the node goes on live-only.
pub async fn ensure_events(
    client: &async_nats::Client,
    config: &EventsConfig,
) -> Result<Durability, EnsureError> {
    let js = async_nats::jetstream::new(client.clone());
    let durability = match ensure(&js, events_config(config)).await {
        Ok(info) => Durability::Durable {
            stream: info.config.name,
        },
        Err(EnsureError::Unavailable(reason)) => Durability::Live { reason },
        Err(other) => return Err(other),
    };
    let _ = config.durability.set(durability.clone());
    Ok(durability)
}
