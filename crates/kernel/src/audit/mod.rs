//! The hash-chained audit trail (PROTOCOL.md "Durable events, audit, metrics, console"): the
//! `TOOLMESH_AUDIT` stream, the entry and its hash rule, the chain writer every gateway and
//! approval node shares, the reader behind `toolmesh.v1.audit.<account>.query`, and the
//! verifier behind `toolmesh audit verify` (`verify.rs`).
//!
//! Chain rule: an entry is a JSON object; its `sha256` is the lowercase hex sha256 of the RFC
//! 8785 (JCS) form of the object without its `sha256` member (so with `prev_sha256`), and its
//! `prev_sha256` is the `sha256` of the entry before it on the same subject (`null` for the
//! first). The writer keeps one order without a central writer: it reads the subject's last
//! entry, publishes with `Nats-Expected-Last-Subject-Sequence` set to that entry's stream
//! sequence (0 when the subject is empty), and on "wrong last sequence" reads again and retries.
//!
//! A publish whose answer is lost (a timeout, the server gone, the stream electing a new
//! leader) may have been stored. Each entry carries `Nats-Msg-Id` = its `sha256`, and the
//! writer sends that very message again until JetStream answers: "duplicate" means the first
//! was stored (JetStream checks the id before the expected sequence), "wrong last sequence"
//! means it was not and another entry came first, so the writer reads the new head and seals
//! again. An entry is never written twice nor lost between two tries, and the chain stays
//! one line through a leader change of the stream. Only an append that gives up (no answer
//! for [`APPEND_BUDGET`]) leaves its entry's fate open: a `started` entry so left shows as a
//! gap in `verify`, which is what it is.
//!
//! On a NATS cluster the subject's expected sequence is not enough: nats-server 2.9 checks it
//! against the messages stored, not against those a replicated stream is still agreeing on,
//! so two writers that read the same head can both be stored (a fork). The stream-wide
//! `Nats-Expected-Last-Sequence` it does check against those too. So where the node's server
//! is in a cluster, every append also names the stream's last sequence, read before the head,
//! and a node's appends take turns (all accounts together): an append then races only other
//! nodes' appends, of any account.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::canonical::sha256_hex;
use crate::config::{ConfigError, RawEnv};
use crate::ids::Account;
use crate::subjects::public;
use crate::wire::{ApprovalRequest, InvocationContext, MemberDecision};

mod verify;
pub use verify::*;

/// The stream's name.
pub const STREAM: &str = "TOOLMESH_AUDIT";
/// `TOOLMESH_AUDIT_MAX_AGE_S` when unset: 90 days.
pub const DEFAULT_MAX_AGE_S: u64 = 90 * 24 * 3600;
/// Races one append may lose to other writers before it counts as failed.
pub const MAX_ATTEMPTS: u32 = 40;
/// How long one append keeps trying while the stream does not answer (no leader, the server
/// gone): a replicated stream elects a new leader within about 10 s of losing one.
pub const APPEND_BUDGET: Duration = Duration::from_secs(15);
/// Longest pause between two attempts after a lost race (the pause grows with the attempt,
/// with jitter).
const MAX_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between two attempts while the stream does not answer.
const MAX_UNANSWERED_BACKOFF: Duration = Duration::from_millis(250);
/// How long one JetStream request of the writer may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the writer waits for one publish's answer before it asks again.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);
/// Entries a query answers when it names no `limit`.
pub const DEFAULT_QUERY_LIMIT: usize = 100;
/// Entries a query answers at most.
pub const MAX_QUERY_LIMIT: usize = 1000;
/// Accounts whose chain head a node remembers; past it the cache starts over.
const MAX_CACHED_HEADS: usize = 10_000;

/// The trail's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// `TOOLMESH_AUDIT_MAX_AGE_S`: entries older than this leave the stream.
    pub max_age: Duration,
    /// `TOOLMESH_STREAM_REPLICAS`: servers of a NATS cluster keeping a copy.
    pub replicas: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(DEFAULT_MAX_AGE_S),
            replicas: crate::config::DEFAULT_STREAM_REPLICAS,
        }
    }
}

impl AuditConfig {
    pub fn from_env(env: &RawEnv) -> Result<Self, ConfigError> {
        let max_age_s: u64 = env.parse_nonzero(
            "TOOLMESH_AUDIT_MAX_AGE_S",
            DEFAULT_MAX_AGE_S,
            "the trail must keep its entries at least one second",
        )?;
        Ok(Self {
            max_age: Duration::from_secs(max_age_s),
            replicas: crate::config::stream_replicas(env)?,
        })
    }

    /// The stream as the nodes create it (and raise an existing one to, never lower:
    /// [`crate::streams::ensure_append_only`]). `deny_delete` and `deny_purge` make it
    /// append-only for every NATS user: no entry is removed before it ages out (JetStream
    /// turns them on by an update but never off again; rollups are off).
    pub fn stream_config(&self) -> stream::Config {
        stream::Config {
            name: STREAM.to_owned(),
            description: Some("toolmesh audit trail: one hash chain per account".to_owned()),
            subjects: vec![public::AUDIT_ENTRIES.to_owned()],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            max_age: self.max_age,
            allow_direct: true,
            deny_delete: true,
            deny_purge: true,
            allow_rollup: false,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }
}

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Call,
    Approval,
}

/// One entry before it is sealed: every member of PROTOCOL.md but `prev_sha256` and
/// `sha256`, which the writer adds. Absent values are `null`, so every entry has every member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: String,
    pub kind: EntryKind,
    pub account: Account,
    pub invocation_id: Option<String>,
    pub tool: Option<String>,
    pub session_id: Option<String>,
    pub user_id: Option<String>,
    pub agent_id: Option<String>,
    pub arguments_sha256: Option<String>,
    pub ok: Option<bool>,
    pub error: Option<String>,
    pub duration_ms: Option<u64>,
    pub approval_id: Option<String>,
    /// `started` / `finished` for a call; `requested`, `approved`, `rejected`, `used`,
    /// `expired`, `released` for an approval.
    pub status: String,
    pub decided_by: Option<String>,
    /// The policy rule that decided the call or approval (PROTOCOL.md "Approval policy").
    pub rule_id: Option<String>,
    /// The revision of the policy file that decided it.
    pub policy_revision: Option<String>,
    /// The grant that let the call run without an approval.
    pub grant_id: Option<String>,
    /// The reviewer group an approval went to.
    pub reviewers: Option<String>,
    /// Each member's decision on an approval routed to reviewers.
    pub decisions: Option<Vec<MemberDecision>>,
    /// A reviewer edited the arguments before approving (an approval's entries), or the call
    /// ran with arguments so edited (a call's).
    pub edited: Option<bool>,
    /// Set by the writer.
    pub node_id: String,
}

impl AuditEntry {
    /// An entry of `kind` in `account` with `status` and nothing else yet.
    fn of(kind: EntryKind, account: &Account, status: &str) -> Self {
        Self {
            at: crate::time::now_rfc3339(),
            kind,
            account: account.clone(),
            invocation_id: None,
            tool: None,
            session_id: None,
            user_id: None,
            agent_id: None,
            arguments_sha256: None,
            ok: None,
            error: None,
            duration_ms: None,
            approval_id: None,
            status: status.to_owned(),
            decided_by: None,
            rule_id: None,
            policy_revision: None,
            grant_id: None,
            reviewers: None,
            decisions: None,
            edited: None,
            node_id: String::new(),
        }
    }

    /// A call entry (`status` `started` or `finished`) of the call `ctx`.
    pub fn call(ctx: &InvocationContext, tool: &str, status: &str) -> Self {
        Self {
            invocation_id: Some(ctx.invocation_id.to_string()),
            tool: Some(tool.to_owned()),
            session_id: ctx.session_id.as_ref().map(|s| s.to_string()),
            user_id: ctx.user_id.clone(),
            agent_id: ctx.agent_id.clone(),
            ..Self::of(EntryKind::Call, &ctx.account, status)
        }
    }

    /// An approval entry: the change `status` of `approval`, made for the call `ctx` when a
    /// call made it (requested, used, in band), else by a person or the sweep; with the rule
    /// and revision that made it.
    pub fn approval(
        approval: &ApprovalRequest,
        status: &str,
        ctx: Option<&InvocationContext>,
    ) -> Self {
        let invocation_id = ctx.map_or_else(
            || approval.invocation_id.to_string(),
            |c| c.invocation_id.to_string(),
        );
        Self {
            invocation_id: Some(invocation_id),
            tool: Some(approval.tool_name.clone()),
            session_id: approval.session_id.as_ref().map(|s| s.to_string()),
            user_id: ctx.and_then(|c| c.user_id.clone()),
            agent_id: ctx.and_then(|c| c.agent_id.clone()),
            arguments_sha256: Some(approval.arguments_sha256.clone()),
            approval_id: Some(approval.id.clone()),
            decided_by: approval.decided_by.clone(),
            rule_id: approval.rule_id.clone(),
            policy_revision: approval.policy_revision.clone(),
            reviewers: approval.reviewers.clone(),
            decisions: approval.decisions.clone(),
            grant_id: approval.grant_id.clone(),
            edited: Some(approval.edited),
            ..Self::of(EntryKind::Approval, &approval.account, status)
        }
    }
}

/// The `sha256` of an entry object: hex sha256 of the JCS form of `entry` without `sha256`.
pub fn entry_sha256(entry: &Map<String, Value>) -> String {
    let mut without = entry.clone();
    without.remove("sha256");
    let canonical = serde_json_canonicalizer::to_vec(&Value::Object(without))
        .expect("a serde_json::Value always canonicalizes");
    sha256_hex(&canonical)
}

/// The entry as stored: its members, `prev_sha256`, then `sha256` over them.
pub fn seal(entry: &AuditEntry, prev_sha256: Option<&str>) -> (Map<String, Value>, String) {
    let mut object = match serde_json::to_value(entry) {
        Ok(Value::Object(object)) => object,
        _ => unreachable!("an AuditEntry serializes to an object"),
    };
    object.insert(
        "prev_sha256".into(),
        prev_sha256.map_or(Value::Null, Value::from),
    );
    let sha = entry_sha256(&object);
    object.insert("sha256".into(), Value::from(sha.clone()));
    (object, sha)
}

/// Why an append or a read failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The node writes no trail (no JetStream, or the stream could not be made).
    #[error("this node keeps no audit trail: {0}")]
    Off(String),
    #[error("the audit stream did not answer: {0}")]
    Stream(String),
    #[error("the audit entry was not written after {attempts} attempts: {last}")]
    GaveUp { attempts: u32, last: String },
}

/// The last entry of an account's subject, as a writer last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    /// Its stream sequence; 0 when the subject is empty.
    seq: u64,
    sha256: Option<String>,
}

/// One stored entry: its stream sequence and the object as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEntry {
    pub seq: u64,
    pub entry: Value,
}

/// A page of entries, oldest first; `more` when the subject holds entries after the last.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Page {
    pub entries: Vec<StoredEntry>,
    pub more: bool,
}

enum Mode {
    On { js: jetstream::Context },
    Off { reason: String },
}

struct TrailState {
    node_id: String,
    mode: Mode,
    /// Per account: the head this node last wrote or read, behind a lock so that this node's
    /// writers of one account take turns (races are then only between nodes).
    heads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Head>>>>>,
    /// On a cluster: the stream's last sequence as this node last wrote or read it, behind the
    /// lock that makes all of this node's appends take turns.
    stream_last: tokio::sync::Mutex<Option<u64>>,
    written: AtomicU64,
    failed: AtomicU64,
    lost_races: AtomicU64,
}

/// The chain writer and reader of one node; cheap to clone.
#[derive(Clone)]
pub struct AuditTrail(Arc<TrailState>);

impl std::fmt::Debug for AuditTrail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditTrail")
            .field("node_id", &self.0.node_id)
            .field("on", &self.is_on())
            .finish()
    }
}

impl AuditTrail {
    /// A trail that writes nothing, saying why in [`AuditTrail::status`].
    pub fn off(node_id: &str, reason: impl Into<String>) -> Self {
        Self::with_mode(
            node_id,
            Mode::Off {
                reason: reason.into(),
            },
        )
    }

    fn with_mode(node_id: &str, mode: Mode) -> Self {
        Self(Arc::new(TrailState {
            node_id: node_id.to_owned(),
            mode,
            heads: Mutex::new(HashMap::new()),
            stream_last: tokio::sync::Mutex::new(None),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            lost_races: AtomicU64::new(0),
        }))
    }

    /// Creates the stream (or raises an existing one's limits, never lowering them) and
    /// answers the trail; without JetStream (or when the stream cannot be made) a trail that
    /// is off, logged once here. A difference between the stream and `config` is logged too.
    pub async fn start(client: &async_nats::Client, node_id: &str, config: &AuditConfig) -> Self {
        use crate::streams::{describe, ensure_append_only, EnsureError};
        let mut js = jetstream::new(client.clone());
        js.set_timeout(REQUEST_TIMEOUT);
        let ensured = match ensure_append_only(&js, config.stream_config()).await {
            Ok(ensured) => ensured,
            Err(e) => {
                let reason = match e {
                    EnsureError::Refused { reason, .. } => {
                        format!("the audit stream could not be created: {reason}")
                    }
                    other => other.to_string(),
                };
                tracing::warn!(
                    stream = STREAM,
                    "{reason}: this node keeps no audit trail (calls still run)"
                );
                return Self::off(node_id, reason);
            }
        };
        if !ensured.kept.is_empty() {
            tracing::warn!(
                stream = STREAM,
                differences = describe(&ensured.kept),
                "the audit stream keeps its entries longer (or guards them more) than this node's settings ask: a node never lowers its limits, so it stays as it is"
            );
        }
        match &ensured.not_raised {
            Some(why) => tracing::warn!(
                stream = STREAM,
                differences = describe(&ensured.raised),
                error = %why,
                "the audit stream keeps its entries shorter (or guards them less) than this node's settings ask, and could not be raised: an operator raises it as a NATS user allowed to update it"
            ),
            None if !ensured.raised.is_empty() => tracing::info!(
                stream = STREAM,
                differences = describe(&ensured.raised),
                "the audit stream was raised to this node's settings"
            ),
            None => {}
        }
        let stream = &ensured.info.config;
        tracing::info!(
            stream = STREAM,
            max_age_s = stream.max_age.as_secs(),
            replicas = stream.num_replicas,
            deny_delete = stream.deny_delete,
            deny_purge = stream.deny_purge,
            "audit trail on"
        );
        Self::with_mode(node_id, Mode::On { js })
    }

    pub fn is_on(&self) -> bool {
        matches!(self.0.mode, Mode::On { .. })
    }

    /// Entries that could not be written after every attempt (a metric: each is logged).
    pub fn failed(&self) -> u64 {
        self.0.failed.load(Ordering::Relaxed)
    }

    /// Entries written by this node.
    pub fn written(&self) -> u64 {
        self.0.written.load(Ordering::Relaxed)
    }

    /// Appends that lost a race to another node and were retried.
    pub fn lost_races(&self) -> u64 {
        self.0.lost_races.load(Ordering::Relaxed)
    }

    /// What `component_status` shows of the trail.
    pub fn status(&self) -> Value {
        let mut status = Map::new();
        status.insert("stream".into(), Value::from(STREAM));
        match &self.0.mode {
            Mode::On { .. } => {
                status.insert("status".into(), Value::from("ok"));
            }
            Mode::Off { reason } => {
                status.insert("status".into(), Value::from("off"));
                status.insert("reason".into(), Value::from(reason.as_str()));
            }
        }
        status.insert("written".into(), Value::from(self.written()));
        status.insert("failed".into(), Value::from(self.failed()));
        status.insert("lost_races".into(), Value::from(self.lost_races()));
        Value::Object(status)
    }

    fn head_cell(&self, account: &Account) -> Arc<tokio::sync::Mutex<Option<Head>>> {
        let mut heads = self.0.heads.lock().unwrap_or_else(|e| e.into_inner());
        if heads.len() >= MAX_CACHED_HEADS && !heads.contains_key(account.as_str()) {
            heads.retain(|_, cell| Arc::strong_count(cell) > 1);
        }
        heads
            .entry(account.as_str().to_owned())
            .or_default()
            .clone()
    }

    /// Appends `entry` to its account's chain and answers its stream sequence; `Ok(None)`
    /// when the trail is off. A failure ([`MAX_ATTEMPTS`] lost races, or no answer from the
    /// stream for [`APPEND_BUDGET`]) is logged and counted ([`AuditTrail::failed`]) before it
    /// is returned: never a silent drop.
    pub async fn append(&self, mut entry: AuditEntry) -> Result<Option<u64>, AuditError> {
        let Mode::On { js } = &self.0.mode else {
            return Ok(None);
        };
        entry.node_id.clone_from(&self.0.node_id);
        let subject = public::audit(&entry.account);
        // On a cluster, the stream-wide sequence too (see the module's notes); taken first, so
        // this node's appends of every account take turns.
        let clustered = js.client().server_info().cluster.is_some();
        let mut stream_last = match clustered {
            true => Some(self.0.stream_last.lock().await),
            false => None,
        };
        let cell = self.head_cell(&entry.account);
        let mut head = cell.lock().await;
        let deadline = tokio::time::Instant::now() + APPEND_BUDGET;
        // The hashes this append published: one of them being the head means an earlier
        // attempt was stored although its answer was lost.
        let mut tried: Vec<String> = Vec::new();
        // A publish whose fate is unknown (no answer): sent again as it was, so JetStream's
        // `Nats-Msg-Id` check says whether it was stored.
        let mut unsettled: Option<Sealed> = None;
        let (mut races, mut unanswered) = (0u32, 0u32);
        let mut last = String::new();
        let gave_up = loop {
            if races >= MAX_ATTEMPTS {
                break AuditError::GaveUp {
                    attempts: races,
                    last,
                };
            }
            if unanswered > 0 && tokio::time::Instant::now() >= deadline {
                break AuditError::GaveUp {
                    attempts: races + unanswered,
                    last: format!("no answer from the audit stream for {APPEND_BUDGET:?}: {last}"),
                };
            }
            let sealed = match unsettled.take() {
                Some(sealed) => sealed,
                None => {
                    let cached = match stream_last.as_deref() {
                        None => head.clone().map(|h| (h, None)),
                        Some(cached) => head.clone().zip(*cached).map(|(h, l)| (h, Some(l))),
                    };
                    let (current, expected_stream) = match cached {
                        Some(known) => known,
                        None => match read_tail(js, &subject, clustered).await {
                            Ok(known) => known,
                            Err(e) => {
                                unanswered += 1;
                                last = e;
                                tokio::time::sleep(unanswered_backoff(unanswered)).await;
                                continue;
                            }
                        },
                    };
                    if let Some(sha) = &current.sha256 {
                        if tried.contains(sha) {
                            self.0.written.fetch_add(1, Ordering::Relaxed);
                            *head = Some(current.clone());
                            if let Some(cached) = stream_last.as_deref_mut() {
                                *cached = expected_stream;
                            }
                            return Ok(Some(current.seq));
                        }
                    }
                    let (object, sha) = seal(&entry, current.sha256.as_deref());
                    let body =
                        Bytes::from(serde_json::to_vec(&object).expect("an entry serializes"));
                    tried.push(sha.clone());
                    Sealed {
                        body,
                        sha,
                        expected: current.seq,
                        expected_stream,
                    }
                }
            };
            match publish(js, &subject, &sealed).await {
                Published::Stored { seq, duplicate } => {
                    self.0.written.fetch_add(1, Ordering::Relaxed);
                    // A duplicate's answer is the entry's own sequence, not the head's (nor
                    // the stream's last).
                    *head = (!duplicate).then_some(Head {
                        seq,
                        sha256: Some(sealed.sha),
                    });
                    if let Some(cached) = stream_last.as_deref_mut() {
                        *cached = (!duplicate).then_some(seq);
                    }
                    return Ok(Some(seq));
                }
                Published::Raced(e) => {
                    races += 1;
                    self.0.lost_races.fetch_add(1, Ordering::Relaxed);
                    *head = None;
                    if let Some(cached) = stream_last.as_deref_mut() {
                        *cached = None;
                    }
                    last = e;
                    tokio::time::sleep(backoff(races)).await;
                }
                Published::Unknown(e) => {
                    unanswered += 1;
                    *head = None;
                    if let Some(cached) = stream_last.as_deref_mut() {
                        *cached = None;
                    }
                    last = e;
                    unsettled = Some(sealed);
                    tokio::time::sleep(unanswered_backoff(unanswered)).await;
                }
            }
        };
        self.0.failed.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            account = %entry.account,
            invocation_id = entry.invocation_id.as_deref(),
            status = %entry.status,
            error = %gave_up,
            "an audit entry could not be written"
        );
        Err(gave_up)
    }

    /// Entries of `account` with a stream sequence above `after`, oldest first, at most
    /// `limit` and at most `max_bytes` of JSON in all (at least one entry when there is one).
    ///
    /// One ordered consumer filtered on the account's subject delivers them in batches: a page
    /// costs a few round trips to the server, not one per entry. The consumer is ephemeral
    /// and is deleted when the page is read.
    pub async fn read(
        &self,
        account: &Account,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, AuditError> {
        use futures::StreamExt as _;
        use jetstream::consumer::{pull, DeliverPolicy};
        let js = match &self.0.mode {
            Mode::On { js } => js,
            Mode::Off { reason } => return Err(AuditError::Off(reason.clone())),
        };
        let failed = |e: &dyn std::fmt::Display| AuditError::Stream(e.to_string());
        let config = pull::OrderedConfig {
            filter_subject: public::audit(account),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: after.saturating_add(1),
            },
            ..Default::default()
        };
        let consumer = js
            .create_consumer_on_stream(config, STREAM)
            .await
            .map_err(|e| failed(&e))?;
        let name = consumer.cached_info().name.clone();
        let mut page = Page::default();
        let read = async {
            // Counted when the consumer was made: entries after it wait for the next page.
            if consumer.cached_info().num_pending == 0 {
                return Ok(());
            }
            let mut messages = consumer.messages().await.map_err(|e| failed(&e))?;
            let mut bytes = 0usize;
            loop {
                let message = match tokio::time::timeout(REQUEST_TIMEOUT, messages.next()).await {
                    Ok(Some(Ok(message))) => message,
                    Ok(Some(Err(e))) => return Err(failed(&e)),
                    Ok(None) => return Err(failed(&"the audit consumer ended")),
                    Err(_) => return Err(failed(&"the audit stream did not deliver in time")),
                };
                let info = message.info().map_err(|e| failed(&e))?;
                let (seq, pending) = (info.stream_sequence, info.pending);
                let size = message.payload.len() + 24;
                if !page.entries.is_empty() && bytes + size > max_bytes {
                    page.more = true;
                    return Ok(());
                }
                bytes += size;
                let entry = serde_json::from_slice(&message.payload).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&message.payload).into())
                });
                page.entries.push(StoredEntry { seq, entry });
                if pending == 0 {
                    return Ok(());
                }
                if page.entries.len() >= limit {
                    page.more = true;
                    return Ok(());
                }
            }
        };
        let result = read.await;
        // Not left for the server's inactivity timer: a busy trail would hold many.
        if let Err(e) = js.delete_consumer_from_stream(&name, STREAM).await {
            tracing::debug!(error = %e, consumer = name, "audit read consumer not deleted");
        }
        result.map(|()| page)
    }
}

/// An entry sealed on a head, ready to publish.
struct Sealed {
    body: Bytes,
    sha: String,
    /// The head's stream sequence (0: the subject was empty).
    expected: u64,
    /// On a cluster, the stream's last sequence when the head was read.
    expected_stream: Option<u64>,
}

/// What became of one publish of a [`Sealed`] entry.
enum Published {
    /// Stored at `seq`; `duplicate` when an earlier publish of it was.
    Stored { seq: u64, duplicate: bool },
    /// Not stored: another entry became the head first.
    Raced(String),
    /// No answer that settles it: stored or not.
    Unknown(String),
}

/// Publishes `sealed` on `subject` after its head, with its `sha256` as `Nats-Msg-Id`, and
/// waits up to [`PUBLISH_TIMEOUT`] for JetStream's answer.
async fn publish(js: &jetstream::Context, subject: &str, sealed: &Sealed) -> Published {
    let mut message = jetstream::message::PublishMessage::build()
        .payload(sealed.body.clone())
        .expected_last_subject_sequence(sealed.expected)
        .message_id(&sealed.sha);
    if let Some(last) = sealed.expected_stream {
        message = message.expected_last_sequence(last);
    }
    let acked = tokio::time::timeout(PUBLISH_TIMEOUT, async {
        js.send_publish(subject.to_owned(), message).await?.await
    })
    .await;
    match acked {
        // A duplicate of a publish the stream has not stored yet (still being replicated)
        // answers sequence 0: ask again until it is settled.
        Ok(Ok(ack)) if ack.duplicate && ack.sequence == 0 => {
            Published::Unknown("an earlier publish of the entry is still being stored".into())
        }
        Ok(Ok(ack)) => Published::Stored {
            seq: ack.sequence,
            duplicate: ack.duplicate,
        },
        Ok(Err(e)) if e.kind() == PublishErrorKind::WrongLastSequence => {
            Published::Raced(e.to_string())
        }
        Ok(Err(e)) => Published::Unknown(e.to_string()),
        Err(_) => Published::Unknown(format!("no answer within {PUBLISH_TIMEOUT:?}")),
    }
}

fn is_no_message(e: &stream::RawMessageError) -> bool {
    match e.kind() {
        stream::RawMessageErrorKind::NoMessageFound => true,
        stream::RawMessageErrorKind::JetStream(js) => {
            js.error_code() == jetstream::ErrorCode::NO_MESSAGE_FOUND
        }
        _ => false,
    }
}

/// The subject's last entry and, on a cluster, the stream's last sequence, read first: a
/// publish naming both is stored only if nothing was stored after either read.
async fn read_tail(
    js: &jetstream::Context,
    subject: &str,
    clustered: bool,
) -> Result<(Head, Option<u64>), String> {
    let stream_last = match clustered {
        false => None,
        true => {
            let stream = js.get_stream(STREAM).await.map_err(|e| e.to_string())?;
            Some(stream.cached_info().state.last_sequence)
        }
    };
    Ok((read_head(js, subject).await?, stream_last))
}

/// The subject's last entry: its sequence and `sha256` (0 and none for an empty subject).
async fn read_head(js: &jetstream::Context, subject: &str) -> Result<Head, String> {
    let stream = js
        .get_stream_no_info(STREAM)
        .await
        .map_err(|e| e.to_string())?;
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => {
            let sha256 = serde_json::from_slice::<Value>(&message.payload)
                .ok()
                .and_then(|v| v.get("sha256")?.as_str().map(str::to_owned));
            if sha256.is_none() {
                tracing::warn!(
                    seq = message.sequence,
                    subject,
                    "the last audit entry has no sha256; the next entry links to null"
                );
            }
            Ok(Head {
                seq: message.sequence,
                sha256,
            })
        }
        Err(e) if is_no_message(&e) => Ok(Head {
            seq: 0,
            sha256: None,
        }),
        Err(e) => Err(e.to_string()),
    }
}

/// A pause that grows with the attempt (1, 2, 4 … ms up to [`MAX_BACKOFF`]), each a random
/// fraction of that, so racing writers spread out.
fn backoff(attempt: u32) -> Duration {
    jittered(Duration::from_millis(1u64 << attempt.min(6)).min(MAX_BACKOFF))
}

/// The pause after the stream did not answer for the `attempt`th time: 10, 20, 40 … ms up to
/// [`MAX_UNANSWERED_BACKOFF`], jittered as [`backoff`].
fn unanswered_backoff(attempt: u32) -> Duration {
    let ceiling = Duration::from_millis(10u64 << attempt.min(8)).min(MAX_UNANSWERED_BACKOFF);
    jittered(ceiling)
}

/// A random fraction (one half to all) of `ceiling`.
fn jittered(ceiling: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // A cheap mix of the clock's low bits; enough to spread writers, not for secrets.
    let mixed = (u64::from(nanos) ^ (u64::from(nanos) >> 7)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let fraction = (mixed >> 11) as f64 / (1u64 << 53) as f64;
    ceiling.mul_f64(0.5 + fraction / 2.0)
}

#[cfg(test)]
mod tests;
