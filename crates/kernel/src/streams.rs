//! JetStream streams the nodes keep: "ensure" a stream (create it, or update its limits) and
//! what a node reports when the server has no JetStream.
//!
//! [`ensure`] is general: any stream of the contract is a
//! [`async_nats::jetstream::stream::Config`] handed to it, and the node's settings win, but
//! for its replicas: a node raises the number of servers keeping a copy, never lowers it.
//! [`ensure_append_only`] is for a record that must only grow (`TOOLMESH_AUDIT`): it creates
//! the stream, and of an existing one it only ever raises what keeps entries
//! ([`append_only_merge`]), never lowers it. [`events_config`] is the RunEvents' stream.
//! Publishers keep publishing on core NATS (but for the gateway's `finished`, which the stream
//! confirms: [`crate::events::publish_kept`]): the stream captures the subjects on the server,
//! so live subscribers see no change.
//!
//! On a NATS cluster the streams are replicated (`TOOLMESH_STREAM_REPLICAS`), and a node that
//! starts while the cluster's JetStream has no leader yet (it is forming) asks again for up to
//! [`FORMING_WAIT`].

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::{
    CreateStreamError, CreateStreamErrorKind, GetStreamError, GetStreamErrorKind,
};
use async_nats::jetstream::stream::{Config, DiscardPolicy, Info, RetentionPolicy, StorageType};
use async_nats::jetstream::{Context, ErrorCode};
use serde_json::{json, Value};

/// The stream of RunEvents (PROTOCOL.md "Durable events, audit, metrics, console").
pub const EVENTS_STREAM: &str = "TOOLMESH_EVENTS";
/// The subjects it keeps: every account's RunEvents.
pub const EVENTS_SUBJECTS: &str = crate::subjects::public::EVENTS_ALL;

/// How long a JetStream API request of [`ensure`] may take before the server counts as
/// without JetStream.
pub const ENSURE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a node asks again while the JetStream of its NATS cluster has no leader (a
/// cluster elects one a few seconds after its servers start): past it, JetStream counts as
/// unavailable.
pub const FORMING_WAIT: Duration = Duration::from_secs(30);

/// The pause between two such questions.
const FORMING_PAUSE: Duration = Duration::from_millis(250);

/// What JetStream answered none of: a server that answers nothing in time.
const NO_ANSWER: &str = "no JetStream answer in time";

/// Why a stream could not be ensured.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    /// The server (or this user's account) has no JetStream: the node goes on without it.
    #[error("the NATS server has no JetStream: {0}")]
    Unavailable(String),
    /// JetStream refused the stream (for instance a limit the server does not allow, or
    /// replicas on a server that is not in a cluster).
    #[error("cannot create or update the stream {stream}: {reason}")]
    Refused { stream: String, reason: String },
    /// The NATS cluster's JetStream has no leader (forming, or without a majority): asked
    /// again for up to [`FORMING_WAIT`], then [`EnsureError::Unavailable`].
    #[error("the NATS cluster's JetStream has no leader: {0}")]
    NoLeader(String),
}

impl EnsureError {
    /// Whether asking again may help: JetStream has no leader yet, or did not answer (a
    /// forming cluster's servers ignore JetStream requests). Whether the server is in a
    /// cluster is not asked: a node that connected while its server was starting may not
    /// know it yet, and a server without JetStream answers at once (no responders).
    fn leaderless(&self) -> bool {
        match self {
            EnsureError::NoLeader(_) => true,
            EnsureError::Unavailable(reason) => reason == NO_ANSWER,
            EnsureError::Refused { .. } => false,
        }
    }
}

/// Runs `attempt` again while JetStream has no leader ([`EnsureError::leaderless`]), for up to
/// [`FORMING_WAIT`].
async fn patiently<T, Fut>(stream: &str, mut attempt: impl FnMut() -> Fut) -> Result<T, EnsureError>
where
    Fut: Future<Output = Result<T, EnsureError>>,
{
    let deadline = Instant::now() + FORMING_WAIT;
    let mut said = false;
    loop {
        match attempt().await {
            Err(e) if e.leaderless() && Instant::now() < deadline => {
                if !said {
                    tracing::info!(stream, error = %e, "JetStream has no leader yet; asking again");
                    said = true;
                }
                tokio::time::sleep(FORMING_PAUSE).await;
            }
            Err(EnsureError::NoLeader(reason)) => return Err(EnsureError::Unavailable(reason)),
            other => return other,
        }
    }
}

fn unanswered() -> EnsureError {
    EnsureError::Unavailable(NO_ANSWER.into())
}

/// The JetStream of `domain` (`TOOLMESH_JETSTREAM_DOMAIN`), or of the server `client` is
/// connected to. Through a leaf node, only a domain reaches the hub's JetStream: a leaf
/// server denies the plain `$JS.API.>` and `$KV.>` across its link.
pub fn context(client: &async_nats::Client, domain: Option<&str>) -> Context {
    match domain {
        Some(domain) => async_nats::jetstream::with_domain(client.clone(), domain),
        None => async_nats::jetstream::new(client.clone()),
    }
}

/// Creates the stream of `config`, or updates the one of that name to it, except its
/// replicas: a stream kept on more servers than `config` asks stays so (answered in
/// [`Ensured::kept`]); one kept on fewer is raised ([`Ensured::raised`]).
pub async fn ensure(js: &Context, config: Config) -> Result<Ensured, EnsureError> {
    let stream = config.name.clone();
    patiently(&stream, || ensure_once(js, &config)).await
}

async fn ensure_once(js: &Context, config: &Config) -> Result<Ensured, EnsureError> {
    let stream = config.name.as_str();
    let existing = match tokio::time::timeout(ENSURE_TIMEOUT, js.get_stream(stream)).await {
        Err(_) => return Err(unanswered()),
        Ok(Ok(found)) => Some(found.cached_info().config.num_replicas.max(1)),
        // Not found, or no JetStream: the create says which.
        Ok(Err(_)) => None,
    };
    let mut config = config.clone();
    let (mut kept, mut raised) = (Vec::new(), Vec::new());
    if let Some(existing) = existing {
        let node = config.num_replicas.max(1);
        let difference = Difference {
            setting: "num_replicas",
            stream: existing.to_string(),
            node: node.to_string(),
        };
        match node.cmp(&existing) {
            std::cmp::Ordering::Less => {
                config.num_replicas = existing;
                kept.push(difference);
            }
            std::cmp::Ordering::Greater => raised.push(difference),
            std::cmp::Ordering::Equal => {}
        }
    }
    let attempt = tokio::time::timeout(ENSURE_TIMEOUT, js.create_or_update_stream(config)).await;
    match attempt {
        Err(_) => Err(unanswered()),
        Ok(Ok(info)) => Ok(Ensured {
            info,
            kept,
            raised,
            not_raised: None,
        }),
        Ok(Err(err)) => Err(classify(stream, &err)),
    }
}

/// A JetStream refusal, a cluster without a leader, or a server (or account) without
/// JetStream.
fn classify(stream: &str, err: &CreateStreamError) -> EnsureError {
    match err.kind() {
        CreateStreamErrorKind::JetStreamUnavailable | CreateStreamErrorKind::TimedOut => {
            EnsureError::Unavailable(err.to_string())
        }
        CreateStreamErrorKind::JetStream(inner)
            if inner.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED
                || inner.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT =>
        {
            EnsureError::Unavailable(err.to_string())
        }
        CreateStreamErrorKind::JetStream(inner)
            if inner.error_code() == ErrorCode::CLUSTER_NOT_AVAILABLE =>
        {
            EnsureError::NoLeader(err.to_string())
        }
        _ => EnsureError::Refused {
            stream: stream.to_owned(),
            reason: err.to_string(),
        },
    }
}

fn has_code(err: &CreateStreamError, code: ErrorCode) -> bool {
    matches!(err.kind(), CreateStreamErrorKind::JetStream(inner) if inner.error_code() == code)
}

/// One setting where an existing stream and a node's configuration differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The stream configuration's field, as `nats stream info` names it.
    pub setting: &'static str,
    /// The stream's value.
    pub stream: String,
    /// The node's value.
    pub node: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {} on the stream, {} in this node's settings",
            self.setting, self.stream, self.node
        )
    }
}

/// Joins differences for one log line.
pub fn describe(differences: &[Difference]) -> String {
    differences
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What [`ensure_append_only`] found and did.
#[derive(Debug, Clone)]
pub struct Ensured {
    /// The stream as the server last answered it.
    pub info: Info,
    /// Settings where the stream keeps entries longer (or protects them more) than the node
    /// asked: left as they are.
    pub kept: Vec<Difference>,
    /// Settings raised to the node's, because the stream kept entries less.
    pub raised: Vec<Difference>,
    /// Why the raise in `raised` was not made (the server, or the NATS user's permissions,
    /// refused it): the stream runs as it is.
    pub not_raised: Option<String>,
}

/// A count or size limit: `None` is no limit (JetStream writes it as -1, or 0 before
/// defaults apply).
fn limit(value: i64) -> Option<i64> {
    (value > 0).then_some(value)
}

fn show_limit(value: Option<i64>) -> String {
    value.map_or_else(|| "unlimited".to_owned(), |v| v.to_string())
}

/// `max_age` 0 is no limit.
fn age(value: Duration) -> Option<Duration> {
    (!value.is_zero()).then_some(value)
}

fn show_age(value: Option<Duration>) -> String {
    value.map_or_else(|| "unlimited".to_owned(), |v| format!("{} s", v.as_secs()))
}

/// Whether `node` keeps entries longer than `stream` (`None`: no limit, the longest).
fn longer<T: Ord>(node: Option<T>, stream: Option<T>) -> std::cmp::Ordering {
    match (node, stream) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(n), Some(s)) => n.cmp(&s),
    }
}

/// How a node's `wanted` policy compares with the stream's `existing` one, where `keeping` is
/// the policy that keeps entries (greater: `wanted` keeps them and `existing` does not), and
/// both as `append_only_merge` shows them (the stream's first).
fn policy<T: Copy + PartialEq + std::fmt::Debug>(
    wanted: T,
    existing: T,
    keeping: T,
) -> (std::cmp::Ordering, String, String) {
    let keeps = |p: T| u8::from(p == keeping);
    let show = |p: T| format!("{p:?}").to_lowercase();
    (
        keeps(wanted).cmp(&keeps(existing)),
        show(existing),
        show(wanted),
    )
}

/// The configuration an append-only stream gets when `existing` is found and a node asks for
/// `wanted`: `existing`, with every setting that lets entries go (or be removed) sooner raised
/// to `wanted`'s. Answers it, the raised settings, and the settings where `existing` is the
/// stronger and stays (the node's weaker value is ignored).
///
/// The settings: `max_age`, `max_bytes`, `max_msgs`, `max_msgs_per_subject` (longer or
/// unlimited is stronger), `num_replicas` (more), `discard` (`new` keeps old entries),
/// `retention` (`limits`: no consumer takes entries away), `deny_delete` and `deny_purge`
/// (on), `allow_rollup` (off: a rollup purges a subject). Every other setting stays as it is.
pub fn append_only_merge(
    existing: &Config,
    wanted: &Config,
) -> (Config, Vec<Difference>, Vec<Difference>) {
    use std::cmp::Ordering;
    let mut merged = existing.clone();
    let (mut raised, mut kept) = (Vec::new(), Vec::new());
    let mut note = |order: Ordering, setting: &'static str, stream: String, node: String| {
        let difference = Difference {
            setting,
            stream,
            node,
        };
        match order {
            Ordering::Greater => {
                raised.push(difference);
                true
            }
            Ordering::Less => {
                kept.push(difference);
                false
            }
            Ordering::Equal => false,
        }
    };
    let (node, stream) = (age(wanted.max_age), age(existing.max_age));
    if note(
        longer(node, stream),
        "max_age",
        show_age(stream),
        show_age(node),
    ) {
        merged.max_age = wanted.max_age;
    }
    for (setting, node, stream, field) in [
        (
            "max_bytes",
            wanted.max_bytes,
            existing.max_bytes,
            &mut merged.max_bytes,
        ),
        (
            "max_msgs",
            wanted.max_messages,
            existing.max_messages,
            &mut merged.max_messages,
        ),
        (
            "max_msgs_per_subject",
            wanted.max_messages_per_subject,
            existing.max_messages_per_subject,
            &mut merged.max_messages_per_subject,
        ),
    ] {
        let (node_limit, stream_limit) = (limit(node), limit(stream));
        let order = longer(node_limit, stream_limit);
        if note(
            order,
            setting,
            show_limit(stream_limit),
            show_limit(node_limit),
        ) {
            *field = node_limit.unwrap_or(-1);
        }
    }
    let (node, stream) = (wanted.num_replicas.max(1), existing.num_replicas.max(1));
    if note(
        node.cmp(&stream),
        "num_replicas",
        stream.to_string(),
        node.to_string(),
    ) {
        merged.num_replicas = node;
    }
    let (order, stream, node) = policy(wanted.discard, existing.discard, DiscardPolicy::New);
    if note(order, "discard", stream, node) {
        merged.discard = wanted.discard;
    }
    let (order, stream, node) = policy(
        wanted.retention,
        existing.retention,
        RetentionPolicy::Limits,
    );
    if note(order, "retention", stream, node) {
        merged.retention = wanted.retention;
    }
    for (setting, node, stream) in [
        ("deny_delete", wanted.deny_delete, existing.deny_delete),
        ("deny_purge", wanted.deny_purge, existing.deny_purge),
        ("allow_rollup", wanted.allow_rollup, existing.allow_rollup),
    ] {
        // Off protects for `allow_rollup`: a rollup message purges its subject.
        let protects = |on: bool| if setting == "allow_rollup" { !on } else { on };
        let order = protects(node).cmp(&protects(stream));
        if note(order, setting, stream.to_string(), node.to_string()) {
            match setting {
                "deny_delete" => merged.deny_delete = node,
                "deny_purge" => merged.deny_purge = node,
                _ => merged.allow_rollup = node,
            }
        }
    }
    (merged, raised, kept)
}

/// Creates the stream of `wanted`, or, when one of that name exists, raises what keeps its
/// entries to `wanted` and never lowers it ([`append_only_merge`]): an existing stream with
/// a longer `max_age` keeps it, and the difference is answered in [`Ensured::kept`].
///
/// The stream is created first (one request when it is new or already as wanted); only a
/// stream that must be raised is updated, so a NATS user without the right to update it
/// (`$JS.API.STREAM.UPDATE.<name>`) can run against a stream an operator set up. A refused
/// raise is no error: the stream exists and runs as it is ([`Ensured::not_raised`]).
pub async fn ensure_append_only(js: &Context, wanted: Config) -> Result<Ensured, EnsureError> {
    let name = wanted.name.clone();
    patiently(&name, || ensure_append_only_once(js, &wanted)).await
}

async fn ensure_append_only_once(js: &Context, wanted: &Config) -> Result<Ensured, EnsureError> {
    let name = wanted.name.clone();
    let mut last = None;
    // Two nodes starting at once may both find no stream: the second's create then finds
    // the first's stream, and it goes on from there.
    for _ in 0..3 {
        let created = tokio::time::timeout(ENSURE_TIMEOUT, js.create_stream(wanted.clone()))
            .await
            .map_err(|_| unanswered())?;
        let err = match created {
            Ok(stream) => {
                return Ok(Ensured {
                    info: stream.cached_info().clone(),
                    kept: Vec::new(),
                    raised: Vec::new(),
                    not_raised: None,
                })
            }
            Err(err) if has_code(&err, ErrorCode::STREAM_NAME_EXIST) => err,
            Err(err) => return Err(classify(&name, &err)),
        };
        last = Some(classify(&name, &err));
        let existing = match tokio::time::timeout(ENSURE_TIMEOUT, js.get_stream(&name)).await {
            Err(_) => return Err(unanswered()),
            Ok(Ok(stream)) => Ok(stream.cached_info().clone()),
            Ok(Err(e)) if is_not_found(&e) => continue,
            Ok(Err(e)) => Err(EnsureError::Refused {
                stream: name.clone(),
                reason: e.to_string(),
            }),
        }?;
        let (merged, raised, kept) = append_only_merge(&existing.config, wanted);
        if raised.is_empty() {
            return Ok(Ensured {
                info: existing,
                kept,
                raised,
                not_raised: None,
            });
        }
        let updated = tokio::time::timeout(ENSURE_TIMEOUT, js.update_stream(&merged)).await;
        let silent = "no answer in time (is this NATS user allowed to update the stream?)";
        let (info, not_raised) = match updated {
            Ok(Ok(info)) => (info, None),
            Ok(Err(e)) if has_code(&e, ErrorCode::STREAM_NOT_FOUND) => continue,
            Ok(Err(e)) if e.kind() == CreateStreamErrorKind::TimedOut => {
                (existing, Some(silent.to_owned()))
            }
            Ok(Err(e)) => (existing, Some(e.to_string())),
            Err(_) => (existing, Some(silent.to_owned())),
        };
        return Ok(Ensured {
            info,
            kept,
            raised,
            not_raised,
        });
    }
    Err(last.unwrap_or_else(unanswered))
}

fn is_not_found(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(inner) if inner.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// The limits of `TOOLMESH_EVENTS` (`TOOLMESH_EVENTS_MAX_AGE_S`, `TOOLMESH_EVENTS_MAX_BYTES`)
/// and its copies (`TOOLMESH_STREAM_REPLICAS`).
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// How long an event is kept.
    pub max_age: Duration,
    /// Bytes the stream keeps at most (the oldest go first); `None`: no size limit.
    pub max_bytes: Option<u64>,
    /// Servers of a NATS cluster keeping a copy (1 on a single server).
    pub replicas: usize,
    /// The JetStream domain the stream lives in (`TOOLMESH_JETSTREAM_DOMAIN`), if not the
    /// connected server's.
    pub domain: Option<String>,
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
        num_replicas: config.replicas,
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
    let js = context(client, config.domain.as_deref());
    let durability = match ensure(&js, events_config(config)).await {
        Ok(ensured) => {
            if !ensured.kept.is_empty() {
                tracing::warn!(
                    stream = EVENTS_STREAM,
                    differences = describe(&ensured.kept),
                    "the RunEvents stream is kept on more servers than TOOLMESH_STREAM_REPLICAS asks: a node never lowers it (an operator can, with `nats stream edit`)"
                );
            }
            if !ensured.raised.is_empty() {
                tracing::info!(
                    stream = EVENTS_STREAM,
                    differences = describe(&ensured.raised),
                    "the RunEvents stream was raised to this node's TOOLMESH_STREAM_REPLICAS"
                );
            }
            Durability::Durable {
                stream: ensured.info.config.name,
            }
        }
        Err(EnsureError::Unavailable(reason)) => Durability::Live { reason },
        Err(other) => return Err(other),
    };
    let _ = config.durability.set(durability.clone());
    Ok(durability)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An audit-like stream: 100 s, no size or count limit, deletes and purges denied.
    fn base() -> Config {
        Config {
            name: "S".into(),
            max_age: Duration::from_secs(100),
            max_bytes: -1,
            max_messages: -1,
            max_messages_per_subject: -1,
            num_replicas: 1,
            deny_delete: true,
            deny_purge: true,
            ..Default::default()
        }
    }

    /// The stream is `base()` changed by `stream`, the node asks for `base()` changed by
    /// `node`: the settings raised and the ones kept, by name.
    fn check(
        stream: impl FnOnce(&mut Config),
        node: impl FnOnce(&mut Config),
        raised: &[&str],
        kept: &[&str],
    ) {
        let (mut existing, mut wanted) = (base(), base());
        stream(&mut existing);
        node(&mut wanted);
        let (merged, got_raised, got_kept) = append_only_merge(&existing, &wanted);
        let names = |d: &[Difference]| d.iter().map(|d| d.setting).collect::<Vec<_>>();
        assert_eq!(names(&got_raised), raised, "raised");
        assert_eq!(names(&got_kept), kept, "kept");
        // The result holds what the node asked where that keeps more: nothing left to raise.
        assert!(append_only_merge(&merged, &wanted).1.is_empty());
        // And it never keeps less than the stream did: the stream's own settings raise nothing.
        assert!(
            append_only_merge(&merged, &existing).1.is_empty(),
            "lowered"
        );
        if raised.is_empty() {
            assert_eq!(merged, existing, "no update needed");
        }
    }

    #[test]
    fn an_append_only_stream_is_raised_and_never_lowered() {
        let nothing = |_: &mut Config| {};
        check(nothing, nothing, &[], &[]);
        check(
            nothing,
            |c| c.max_age = Duration::from_secs(1),
            &[],
            &["max_age"],
        );
        check(
            nothing,
            |c| c.max_age = Duration::from_secs(200),
            &["max_age"],
            &[],
        );
        // 0 is no limit: the longest.
        check(|c| c.max_age = Duration::ZERO, nothing, &[], &["max_age"]);
        check(nothing, |c| c.max_age = Duration::ZERO, &["max_age"], &[]);
        check(|c| c.max_bytes = 1000, nothing, &["max_bytes"], &[]);
        check(nothing, |c| c.max_bytes = 1000, &[], &["max_bytes"]);
        check(
            |c| c.max_bytes = 1000,
            |c| c.max_bytes = 2000,
            &["max_bytes"],
            &[],
        );
        // A default (0) is no limit, like -1.
        check(|c| c.max_messages = 0, nothing, &[], &[]);
        check(|c| c.max_messages = 5, nothing, &["max_msgs"], &[]);
        check(
            |c| c.max_messages_per_subject = 5,
            nothing,
            &["max_msgs_per_subject"],
            &[],
        );
        check(|c| c.num_replicas = 3, nothing, &[], &["num_replicas"]);
        check(|c| c.num_replicas = 0, nothing, &[], &[]);
        check(
            |c| c.discard = DiscardPolicy::New,
            nothing,
            &[],
            &["discard"],
        );
        check(
            |c| c.retention = RetentionPolicy::Interest,
            nothing,
            &["retention"],
            &[],
        );
        check(
            |c| (c.deny_delete, c.deny_purge) = (false, false),
            nothing,
            &["deny_delete", "deny_purge"],
            &[],
        );
        check(
            nothing,
            |c| (c.deny_delete, c.deny_purge) = (false, false),
            &[],
            &["deny_delete", "deny_purge"],
        );
        check(|c| c.allow_rollup = true, nothing, &["allow_rollup"], &[]);
        check(nothing, |c| c.allow_rollup = true, &[], &["allow_rollup"]);
        // Settings that remove nothing are the stream's: a node changes none of them.
        check(
            |c| c.description = Some("an operator's".into()),
            |c| c.max_age = Duration::from_secs(1),
            &[],
            &["max_age"],
        );
    }

    #[test]
    fn a_difference_names_both_values() {
        let (_, _, kept) = append_only_merge(
            &base(),
            &Config {
                max_age: Duration::from_secs(1),
                ..base()
            },
        );
        assert_eq!(
            describe(&kept),
            "max_age is 100 s on the stream, 1 s in this node's settings"
        );
    }

    fn events(replicas: usize) -> EventsConfig {
        EventsConfig {
            max_age: Duration::from_secs(60),
            max_bytes: None,
            replicas,
            domain: None,
            durability: Default::default(),
        }
    }

    /// On a NATS cluster a node raises the RunEvents stream to its replicas and never lowers
    /// them; a single server refuses replicas, and the node hears why.
    #[tokio::test]
    async fn the_events_stream_is_raised_to_its_replicas_and_never_lowered() {
        let cluster = toolmesh_testkit::NatsCluster::start().await;
        let client = crate::host::connect_client(&cluster.urls(), "streams-test")
            .await
            .unwrap();
        let js = async_nats::jetstream::new(client.clone());
        let one = ensure(&js, events_config(&events(1))).await.unwrap();
        assert_eq!(one.info.config.num_replicas, 1);
        assert!(one.kept.is_empty() && one.raised.is_empty());
        let three = ensure(&js, events_config(&events(3))).await.unwrap();
        assert_eq!(three.info.config.num_replicas, 3);
        assert_eq!(
            describe(&three.raised),
            "num_replicas is 1 on the stream, 3 in this node's settings"
        );
        let again = ensure(&js, events_config(&events(1))).await.unwrap();
        assert_eq!(again.info.config.num_replicas, 3);
        assert_eq!(
            describe(&again.kept),
            "num_replicas is 3 on the stream, 1 in this node's settings"
        );
        let durable = ensure_events(&client, &events(1)).await.unwrap();
        assert_eq!(
            durable,
            Durability::Durable {
                stream: EVENTS_STREAM.into()
            }
        );

        let single = toolmesh_testkit::NatsServer::start_jetstream();
        let refused = ensure_events(&single.client().await, &events(3)).await;
        match refused {
            Err(EnsureError::Refused { stream, reason }) => {
                assert_eq!(stream, EVENTS_STREAM);
                assert!(reason.contains("replicas"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
