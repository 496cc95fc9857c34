//! `ApprovalStore`: the only code that speaks Redis. Every read-then-write is one Lua script
//! (`src/lua/`), atomic in Redis and timed by Redis `TIME`, so nodes never race each other
//! through check-then-set and never disagree about expiry because of their clocks.
//!
//! The connection is the kernel's [`RedisLink`] (one server, or the primary Sentinel names);
//! a write acknowledged to a caller (a new approval, a decision, a use, a release, a grant
//! created, used or revoked) runs with `WAIT` behind it ([`ApprovalStore::run_replicated`]),
//! and one that fewer replicas than `TOOLMESH_REDIS_WAIT_REPLICAS` confirmed in time is
//! [`StoreError::Unconfirmed`].
//!
//! Layout (one Redis, or one primary; the scripts touch several keys, so Redis Cluster is not
//! supported):
//! * `toolmesh:approval:<account>:<id>`: hash, the record (`status`, `session_id`, …,
//!   `created_at_ms`, `expires_at_ms`, `decided_*`, `used_*`), expiring `retention` after
//!   `expires_at_ms`.
//! * `toolmesh:approval:<account>:<id>:arguments`: string, the arguments the approval is bound
//!   to (compact JSON, whose JCS hash is the record's `arguments_sha256`), expiring with the
//!   record; kept apart so the scripts that answer with the record never carry them.
//! * `toolmesh:approvals:pending:<account>`: zset id → `expires_at_ms`, the undecided ones.
//! * `toolmesh:approvals:expiry`: zset `<account>:<id>` → `expires_at_ms`, every approval that
//!   can still expire (pending or approved-not-used), for the sweeper.
//! * `toolmesh:audit:<account>`: stream, one entry per create / decide / use / expire /
//!   release (`released`: a used approval given back because its call never ran).
//! * Grants: [`grants`].

use std::sync::Arc;

use redis::{RedisError, Script};
use toolmesh_kernel::redis_link::{RedisConn, RedisLink, Replication};
use toolmesh_kernel::wire::{
    ApprovalRequest, ApprovalRoute, ApprovalStatus, RiskLevel, SideEffect,
};
use toolmesh_kernel::{Account, InvocationId, SessionId};

use crate::config::ApprovalConfig;

/// Due members the sweeper takes per round; the rest wait for the next round.
pub const SWEEP_BATCH: usize = 256;

const PENDING_PREFIX: &str = "toolmesh:approvals:pending:";
const EXPIRY_KEY: &str = "toolmesh:approvals:expiry";

/// Why the store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not connected, connection lost, or Redis busy loading: safe to retry.
    #[error("approval store (Redis) is not reachable")]
    Unavailable,
    /// Redis answered something this code did not expect (a bug or a damaged record).
    #[error("approval store failed: {0}")]
    Failed(String),
    /// The account already has this many approvals pending: nothing was created.
    #[error("the account has {0} approvals pending already")]
    TooManyPending(u64),
    /// The write is on the primary, but fewer replicas than asked had it when `WAIT` ran out:
    /// not yet safe from a failover, so not acknowledged. Safe to retry.
    #[error("{acked} of the {wanted} Redis replicas asked for confirmed the write in time")]
    Unconfirmed { acked: u32, wanted: u32 },
}

impl From<Damaged> for StoreError {
    fn from(damaged: Damaged) -> Self {
        StoreError::Failed(damaged.to_string())
    }
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> Self {
        use redis::RetryMethod;
        let transient = toolmesh_kernel::redis_link::primary_moved(&e)
            || matches!(
                e.retry_method(),
                RetryMethod::Reconnect
                    | RetryMethod::ReconnectFromInitialConnections
                    | RetryMethod::WaitAndRetry
                    | RetryMethod::RetryImmediately
            );
        if transient {
            tracing::warn!(error = %e, "approval store unreachable");
            StoreError::Unavailable
        } else {
            StoreError::Failed(e.to_string())
        }
    }
}

/// A new approval as the gate hands it over.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub account: Account,
    pub session_id: Option<SessionId>,
    pub invocation_id: InvocationId,
    pub user_id: Option<String>,
    pub agent_id: Option<String>,
    pub tool_name: String,
    pub risk_level: RiskLevel,
    pub side_effects: Vec<SideEffect>,
    pub arguments_sha256: String,
    pub arguments_preview: String,
    /// The arguments as compact JSON; `None` when the gateway did not send them.
    pub arguments: Option<String>,
    /// Who decides it in band at birth (`in-band` when `None`): see [`Birth`].
    pub decided_by: Option<String>,
    /// The rule that made it, its reviewers and deadline (an `ask` rule's approval).
    pub route: Option<ApprovalRoute>,
}

/// Who asked for an approval: the `user_id` and `agent_id` of the call that made it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    pub user_id: Option<String>,
    pub agent_id: Option<String>,
}

/// How a new approval starts its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Birth {
    /// Waits for a decision.
    Pending,
    /// Approved in band on the first call, and used by that call at once.
    ApprovedAndUsed,
    /// Rejected in band on the first call.
    Rejected,
}

/// A decision as `…decide` carries it (or `in-band`).
#[derive(Debug, Clone)]
pub struct Decision {
    pub approved: bool,
    pub decided_by: String,
    pub reason: Option<String>,
    /// The approver `…decide.<approver>` names: only such a decision counts on an approval
    /// routed to reviewers, and only when they are a member.
    pub member: Option<String>,
    /// Arguments a reviewer edited, approved in their place.
    pub edit: Option<Edit>,
    /// The grant the decision remembers itself as (made once it is recorded).
    pub grant_id: Option<String>,
}

/// Edited arguments as an approval keeps them: their hash, preview and compact JSON text.
#[derive(Debug, Clone)]
pub struct Edit {
    pub arguments_sha256: String,
    pub preview: String,
    pub text: String,
}

/// The result of [`ApprovalStore::decide`].
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    NotFound,
    Expired(ApprovalRequest),
    /// The decider may not decide it: not a member of its reviewers (or not named by the
    /// subject).
    Forbidden(ApprovalRequest),
    /// A member's approval, counted; the quorum is not reached yet.
    Counted(ApprovalRequest),
    /// The same decision had already been made: nothing changed.
    Unchanged(ApprovalRequest),
    /// Edited arguments on an approval that needs more than one approval: nothing changed.
    EditNeedsOne(ApprovalRequest),
    /// The contrary decision had already been made.
    Conflict(ApprovalRequest),
    /// This decision was the first.
    Changed(ApprovalRequest),
}

/// What a call presents: its binding, and an in-band decision when allowed.
#[derive(Debug, Clone)]
pub struct Redemption {
    pub session_id: Option<SessionId>,
    pub tool_name: String,
    pub arguments_sha256: String,
    pub invocation_id: InvocationId,
    pub decision: Option<bool>,
    /// What the decision records as `decided_by` (`in-band`, or the client that made it).
    pub decided_by: String,
}

/// The result of [`ApprovalStore::redeem`].
#[derive(Debug, Clone, PartialEq)]
pub enum Redeemed {
    NotFound,
    /// An in-band decision on an approval routed to reviewers; untouched.
    Forbidden(ApprovalRequest),
    /// Granted for another session, tool or arguments; untouched.
    Mismatch(ApprovalRequest),
    Expired(ApprovalRequest),
    /// The in-band decision contradicts the first one.
    Conflict(ApprovalRequest),
    Pending(ApprovalRequest),
    /// `changed` when this call's in-band decision was the rejection.
    Rejected {
        approval: ApprovalRequest,
        changed: bool,
    },
    /// Already used by another call.
    Used(ApprovalRequest),
    /// This call may run; the approval is now `used` by it. With the arguments a reviewer
    /// edited it to (compact JSON), which the call runs instead of its own.
    Proceed(ApprovalRequest, Option<String>),
}

/// What happened to an approval whose deadline passed undecided.
#[derive(Debug, Clone, PartialEq)]
pub enum Lapsed {
    Expired(ApprovalRequest),
    /// Routed, once, to its rule's `escalate_to` group with a new deadline of the same length.
    Escalated(ApprovalRequest),
}

/// The result of [`ApprovalStore::release`]. Only `GivenBack` changed anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Released {
    NotFound,
    /// Not `used` (pending, approved, rejected, expired): nothing to give back.
    NotUsed(ApprovalRequest),
    /// Used by another invocation than the one asking.
    OtherCall(ApprovalRequest),
    /// Used by this invocation, but past its expiry: it stays used.
    Expired(ApprovalRequest),
    /// `approved` again, usable by the next call that presents it.
    GivenBack(ApprovalRequest),
}

/// The result of [`ApprovalStore::withdraw`]. Only `Rejected` changed anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Withdrawn {
    NotFound,
    /// Made by another invocation than the one asking.
    OtherCall(ApprovalRequest),
    /// Decided, used or expired already: a withdrawal comes too late.
    NotPending(ApprovalRequest),
    /// Rejected now, with the reason `withdrawn`.
    Rejected(ApprovalRequest),
}

/// The compiled scripts, shared by every clone of the store.
struct Scripts {
    create: Script,
    decide: Script,
    redeem: Script,
    release: Script,
    withdraw: Script,
    expire: Script,
    get: Script,
    pending_ids: Script,
    pending_counts: Script,
    due: Script,
}

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../lua/common.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

mod grants;
mod record;

pub use grants::{NewGrant, Use};
use record::{number, optional, view, Damaged, Record};

impl Scripts {
    fn new() -> Self {
        Self {
            create: script!("create.lua"),
            decide: script!("decide.lua"),
            redeem: script!("redeem.lua"),
            release: script!("release.lua"),
            withdraw: script!("withdraw.lua"),
            expire: script!("expire.lua"),
            get: script!("get.lua"),
            pending_ids: script!("pending_ids.lua"),
            pending_counts: script!("pending_counts.lua"),
            due: script!("due.lua"),
        }
    }
}

/// Approvals in Redis. Cheap to clone; every clone shares one connection.
#[derive(Clone)]
pub struct ApprovalStore {
    link: RedisLink,
    scripts: Arc<Scripts>,
    ttl_ms: u64,
    retention_ms: u64,
    max_pending: u64,
}

/// The keys one record script works on, in the order the scripts expect them.
struct RecordKeys {
    record: String,
    /// The arguments beside the record.
    arguments: String,
    pending: String,
    expiry: &'static str,
    audit: String,
    /// The record's member in the expiry set.
    member: String,
}

impl RecordKeys {
    fn new(account: &str, id: &str) -> Self {
        Self {
            record: format!("toolmesh:approval:{account}:{id}"),
            arguments: format!("toolmesh:approval:{account}:{id}:arguments"),
            pending: format!("{PENDING_PREFIX}{account}"),
            expiry: EXPIRY_KEY,
            audit: format!("toolmesh:audit:{account}"),
            member: format!("{account}:{id}"),
        }
    }

    fn invocation<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        invocation
            .key(&self.record)
            .key(&self.pending)
            .key(self.expiry)
            .key(&self.audit);
        invocation
    }
}

impl ApprovalStore {
    /// The store over `link`, which connects it (see [`RedisLink::connect`]). Until it has
    /// connected, requests answer `unavailable`.
    pub fn new(link: RedisLink, config: &ApprovalConfig) -> Self {
        Self {
            link,
            scripts: Arc::new(Scripts::new()),
            ttl_ms: config.ttl.as_millis() as u64,
            retention_ms: config.retention.as_millis() as u64,
            max_pending: config.max_pending,
        }
    }

    /// Whether acknowledged writes wait for replicas (`TOOLMESH_REDIS_WAIT_REPLICAS` > 0), so
    /// that one may be in Redis though its caller was told `unavailable`.
    pub fn waits_for_replicas(&self) -> bool {
        self.link.wait().replicas > 0
    }

    /// The connection to the primary, once there is one. After the first connection the link
    /// reconnects by itself (and, through Sentinel, follows the primary); commands sent while it
    /// cannot fail with an I/O error (→ `Unavailable`).
    async fn connection(&self) -> Result<RedisConn, StoreError> {
        Ok(self.link.connection().await?)
    }

    /// Runs a script, once more after a dropped connection: every script is idempotent under
    /// a retry (ids and `op` tokens are fresh per call), so a reply lost with the connection
    /// is safe to ask for again.
    async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.connection().await?;
        match invocation.invoke_async(&mut conn).await {
            Ok(v) => Ok(v),
            Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                tracing::debug!(error = %e, "Redis connection dropped; retrying once");
                Ok(invocation.invoke_async(&mut conn).await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// [`ApprovalStore::run`] for a script whose write is acknowledged to a caller: with
    /// `TOOLMESH_REDIS_WAIT_REPLICAS`, `WAIT` follows it in the same pipeline (so on the same
    /// connection); the reply and what `WAIT` said, for [`confirmed`] once the caller knows
    /// whether the script wrote anything. The retry after a dropped connection takes the link's
    /// connection again (through Sentinel, maybe a new primary's) and repeats the same `op`, so
    /// the script answers as the first time.
    async fn run_replicated<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<(T, Replication), StoreError> {
        let wait = self.link.wait();
        let mut conn = self.connection().await?;
        match conn.invoke_replicated(invocation, wait).await {
            Ok(v) => Ok(v),
            Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                tracing::debug!(error = %e, "Redis connection dropped; retrying once");
                let mut conn = self.connection().await?;
                Ok(conn.invoke_replicated(invocation, wait).await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// [`ApprovalStore::run_replicated`] for a script answering `(outcome, now, record)`: waits
    /// for the replicas ([`confirmed`]) only when the outcome is one of `wrote`, the ones that
    /// changed something (one that changed nothing need not wait for anyone).
    async fn run_outcome(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        wrote: &[&str],
    ) -> Result<(String, u64, Record), StoreError> {
        let ((outcome, now, record), replication): ((String, u64, Record), _) =
            self.run_replicated(invocation).await?;
        if wrote.contains(&outcome.as_str()) {
            confirmed(replication)?;
        }
        Ok((outcome, now, record))
    }

    /// [`ApprovalStore::run_outcome`] for a script on one approval: `None` when there is no such
    /// approval (`not_found`), else the outcome and the approval as it is now.
    async fn run_on_approval(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        wrote: &[&str],
    ) -> Result<Option<(String, ApprovalRequest)>, StoreError> {
        let (outcome, now, record) = self.run_outcome(invocation, wrote).await?;
        if outcome == "not_found" {
            return Ok(None);
        }
        let approval = view(&record, now)?;
        Ok(Some((outcome, approval)))
    }

    /// Stores a new approval and returns it as stored.
    pub async fn create(
        &self,
        new: &NewApproval,
        birth: Birth,
    ) -> Result<ApprovalRequest, StoreError> {
        let id = toolmesh_kernel::ids::generate_approval_id();
        let keys = RecordKeys::new(new.account.as_str(), &id);
        let side_effects = serde_json::to_string(&new.side_effects)
            .map_err(|e| StoreError::Failed(format!("side effects do not serialize: {e}")))?;
        let mut invocation = keys.invocation(&self.scripts.create);
        invocation.key(&keys.arguments);
        invocation
            .arg(&id)
            .arg(new.account.as_str())
            .arg(new.session_id.as_ref().map_or("", SessionId::as_str))
            .arg(new.invocation_id.as_str())
            .arg(&new.tool_name)
            .arg(new.risk_level.as_str())
            .arg(side_effects)
            .arg(&new.arguments_sha256)
            .arg(&new.arguments_preview)
            .arg(
                new.route
                    .as_ref()
                    .and_then(|r| r.expires_in_s)
                    .map_or(self.ttl_ms, |s| s.saturating_mul(1000)),
            )
            .arg(self.retention_ms)
            .arg(match birth {
                Birth::Pending => "pending",
                Birth::ApprovedAndUsed => "used",
                Birth::Rejected => "rejected",
            })
            .arg(new.user_id.as_deref().unwrap_or(""))
            .arg(new.agent_id.as_deref().unwrap_or(""))
            .arg(new.arguments.as_deref().unwrap_or(""))
            .arg(
                new.decided_by
                    .as_deref()
                    .unwrap_or(toolmesh_kernel::wire::IN_BAND_DECIDER),
            )
            .arg(self.max_pending);
        if let Some(route) = &new.route {
            invocation.arg("rule_id").arg(&route.rule_id);
            if let Some(revision) = &route.policy_revision {
                invocation.arg("policy_revision").arg(revision);
            }
            if let Some(group) = &route.reviewers {
                invocation
                    .arg("reviewers")
                    .arg(group)
                    .arg("members")
                    .arg(route.members.join(","));
            }
            invocation.arg("quorum").arg(route.quorum);
            if !route.grantable {
                invocation.arg("grantable").arg("0");
            }
            if let Some(group) = &route.escalate_to {
                invocation
                    .arg("escalate_to")
                    .arg(group)
                    .arg("escalate_members")
                    .arg(route.escalate_members.join(","));
            }
        }
        let ((outcome, now, record), replication): ((String, u64, Record), _) =
            self.run_replicated(&invocation).await?;
        if outcome == "full" {
            return Err(StoreError::TooManyPending(self.max_pending));
        }
        // Unconfirmed, the approval stays on the primary, pending and unannounced, until it
        // expires; the caller's retry asks for a new one.
        confirmed(replication)?;
        Ok(view(&record, now)?)
    }

    /// One approval of one account, any status, with who asked for it and its arguments
    /// (compact JSON; `None` when they were not stored); `None` when there is none in that
    /// account.
    pub async fn get(
        &self,
        account: &Account,
        id: &str,
    ) -> Result<Option<(ApprovalRequest, Requester, Option<String>)>, StoreError> {
        let keys = RecordKeys::new(account.as_str(), id);
        let mut invocation = self.scripts.get.prepare_invoke();
        invocation.key(&keys.record).key(&keys.arguments);
        let (now, record, arguments): (u64, Record, Option<String>) = self.run(&invocation).await?;
        if record.is_empty() {
            return Ok(None);
        }
        let requester = Requester {
            user_id: optional(&record, "user_id"),
            agent_id: optional(&record, "agent_id"),
        };
        Ok(Some((view(&record, now)?, requester, arguments)))
    }

    /// Pending, unexpired approvals of an account, oldest first, at most `limit`.
    pub async fn list_pending(
        &self,
        account: &Account,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let pending = format!("{PENDING_PREFIX}{account}");
        let mut invocation = self.scripts.pending_ids.prepare_invoke();
        invocation.key(&pending).arg(limit);
        let (now, ids): (u64, Vec<String>) = self.run(&invocation).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Plain reads: a record decided between the two round trips is filtered out below.
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HGETALL")
                .arg(RecordKeys::new(account.as_str(), id).record);
        }
        let mut conn = self.connection().await?;
        let records: Vec<Record> = pipe.query_async(&mut conn).await?;
        let mut approvals = Vec::with_capacity(records.len());
        for record in records.iter().filter(|r| !r.is_empty()) {
            let approval = view(record, now)?;
            if approval.status == ApprovalStatus::Pending {
                approvals.push((number(record, "created_at_ms")?, approval));
            }
        }
        approvals.sort_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.id.cmp(&y.id)));
        Ok(approvals.into_iter().map(|(_, a)| a).collect())
    }

    /// Pending, unexpired approvals per account (`toolmesh_approvals_pending`): the accounts'
    /// pending sets found by `SCAN` (read-only, in batches), then one script counting each
    /// set's unexpired members by Redis time. Accounts with none pending are left out.
    pub async fn pending_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut conn = self.connection().await?;
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{PENDING_PREFIX}*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        // SCAN may return a key twice.
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.scripts.pending_counts.prepare_invoke();
        for key in &keys {
            invocation.key(key);
        }
        let counts: Vec<u64> = self.run(&invocation).await?;
        Ok(keys
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .filter_map(|(key, n)| Some((key.strip_prefix(PENDING_PREFIX)?.to_owned(), n)))
            .collect())
    }

    /// An out-of-band (or any) decision under the first-decision rule.
    pub async fn decide(
        &self,
        account: &Account,
        id: &str,
        decision: &Decision,
    ) -> Result<Decided, StoreError> {
        let keys = RecordKeys::new(account.as_str(), id);
        let mut invocation = keys.invocation(&self.scripts.decide);
        invocation.key(&keys.arguments);
        invocation
            .arg(if decision.approved { "1" } else { "0" })
            .arg(&decision.decided_by)
            .arg(decision.reason.as_deref().unwrap_or(""))
            .arg(op_token())
            .arg(&keys.member)
            .arg(id)
            .arg(decision.member.as_deref().unwrap_or(""));
        match &decision.edit {
            Some(edit) => invocation
                .arg(&edit.arguments_sha256)
                .arg(&edit.preview)
                .arg(&edit.text),
            None => invocation.arg("").arg("").arg(""),
        };
        invocation.arg(decision.grant_id.as_deref().unwrap_or(""));
        // A decision changed or counted stands on the primary, unconfirmed or not; a retry finds
        // it and answers `Unchanged`.
        let wrote = ["changed", "counted"];
        let Some((outcome, approval)) = self.run_on_approval(&invocation, &wrote).await? else {
            return Ok(Decided::NotFound);
        };
        Ok(match outcome.as_str() {
            "forbidden" => Decided::Forbidden(approval),
            "counted" => Decided::Counted(approval),
            "expired" => Decided::Expired(approval),
            "same" => Decided::Unchanged(approval),
            "quorum" => Decided::EditNeedsOne(approval),
            "conflict" => Decided::Conflict(approval),
            "changed" => Decided::Changed(approval),
            other => return Err(unexpected("decide", other)),
        })
    }

    /// A call presents approval `id`: binding check, in-band decision, and use, atomically.
    pub async fn redeem(
        &self,
        account: &Account,
        id: &str,
        call: &Redemption,
    ) -> Result<Redeemed, StoreError> {
        let keys = RecordKeys::new(account.as_str(), id);
        let mut invocation = keys.invocation(&self.scripts.redeem);
        invocation.key(&keys.arguments);
        invocation
            .arg(call.session_id.as_ref().map_or("", SessionId::as_str))
            .arg(&call.tool_name)
            .arg(&call.arguments_sha256)
            .arg(call.invocation_id.as_str())
            .arg(match call.decision {
                None => "",
                Some(true) => "1",
                Some(false) => "0",
            })
            .arg(op_token())
            .arg(&keys.member)
            .arg(id)
            .arg(&call.decided_by);
        let ((outcome, now, changed, record, edited), replication): (
            (String, u64, String, Record, String),
            _,
        ) = self.run_replicated(&invocation).await?;
        if changed == "1" {
            if let Err(unconfirmed) = confirmed(replication) {
                if outcome == "proceed" {
                    // The call will not run: the use goes back, so that the call may present
                    // the approval again (a failover may still lose the release and keep it
                    // used; the record then says which invocation used it).
                    match self.release(account, id, &call.invocation_id).await {
                        Ok(_) | Err(StoreError::Unconfirmed { .. }) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, id, "an unconfirmed use of an approval was not given back")
                        }
                    }
                }
                return Err(unconfirmed);
            }
        }
        if outcome == "not_found" {
            return Ok(Redeemed::NotFound);
        }
        let approval = view(&record, now)?;
        Ok(match outcome.as_str() {
            "mismatch" => Redeemed::Mismatch(approval),
            "forbidden" => Redeemed::Forbidden(approval),
            "expired" => Redeemed::Expired(approval),
            "conflict" => Redeemed::Conflict(approval),
            "pending" => Redeemed::Pending(approval),
            "rejected" => Redeemed::Rejected {
                approval,
                changed: changed == "1",
            },
            "used" => Redeemed::Used(approval),
            "proceed" => Redeemed::Proceed(approval, Some(edited).filter(|e| !e.is_empty())),
            other => return Err(unexpected("redeem", other)),
        })
    }

    /// Gives approval `id` back to `approved` when `used_by` used it and it has not expired
    /// (its call never ran); anything else changes nothing.
    pub async fn release(
        &self,
        account: &Account,
        id: &str,
        used_by: &InvocationId,
    ) -> Result<Released, StoreError> {
        let keys = RecordKeys::new(account.as_str(), id);
        let mut invocation = keys.invocation(&self.scripts.release);
        invocation
            .arg(used_by.as_str())
            .arg(op_token())
            .arg(&keys.member)
            .arg(id);
        let Some((outcome, approval)) = self.run_on_approval(&invocation, &["released"]).await?
        else {
            return Ok(Released::NotFound);
        };
        Ok(match outcome.as_str() {
            "not_used" => Released::NotUsed(approval),
            "other_call" => Released::OtherCall(approval),
            "expired" => Released::Expired(approval),
            "released" => Released::GivenBack(approval),
            other => return Err(unexpected("release", other)),
        })
    }

    /// Rejects approval `id`, by `decided_by` with the reason `withdrawn`, when `made_by` made
    /// it and it is still pending (its caller cancelled the call waiting for it); anything else
    /// changes nothing.
    pub async fn withdraw(
        &self,
        account: &Account,
        id: &str,
        made_by: &InvocationId,
        decided_by: &str,
    ) -> Result<Withdrawn, StoreError> {
        let keys = RecordKeys::new(account.as_str(), id);
        let mut invocation = keys.invocation(&self.scripts.withdraw);
        invocation
            .arg(made_by.as_str())
            .arg(op_token())
            .arg(&keys.member)
            .arg(id)
            .arg(decided_by);
        let Some((outcome, approval)) = self.run_on_approval(&invocation, &["withdrawn"]).await?
        else {
            return Ok(Withdrawn::NotFound);
        };
        Ok(match outcome.as_str() {
            "other_call" => Withdrawn::OtherCall(approval),
            "not_pending" => Withdrawn::NotPending(approval),
            "withdrawn" => Withdrawn::Rejected(approval),
            other => return Err(unexpected("withdraw", other)),
        })
    }

    /// Members of the expiry set whose time has come (`<account>:<id>`).
    pub async fn due(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let mut invocation = self.scripts.due.prepare_invoke();
        invocation.key(EXPIRY_KEY).arg(limit);
        self.run(&invocation).await
    }

    /// Expires (or escalates) one due member; `Some` only for the one sweeper that won it and
    /// found it still pending or approved.
    pub async fn expire(&self, member: &str) -> Result<Option<Lapsed>, StoreError> {
        let parsed = member.split_once(':').filter(|(account, id)| {
            Account::parse(*account).is_ok() && toolmesh_kernel::wire::is_approval_id(id)
        });
        let Some((account, id)) = parsed else {
            // Nothing of ours writes such a member; drop it so it is not looked at every round.
            tracing::warn!(
                member,
                "dropping a malformed member of the approval expiry set"
            );
            let mut conn = self.connection().await?;
            let _: i64 = redis::cmd("ZREM")
                .arg(EXPIRY_KEY)
                .arg(member)
                .query_async(&mut conn)
                .await?;
            return Ok(None);
        };
        let keys = RecordKeys::new(account, id);
        let mut invocation = keys.invocation(&self.scripts.expire);
        invocation.key(&keys.arguments);
        invocation.arg(member).arg(id).arg(self.retention_ms);
        let (outcome, now, record): (String, u64, Record) = self.run(&invocation).await?;
        match outcome.as_str() {
            "expired" => Ok(Some(Lapsed::Expired(view(&record, now)?))),
            "escalated" => Ok(Some(Lapsed::Escalated(view(&record, now)?))),
            "lost" | "gone" | "not_due" | "settled" => Ok(None),
            other => Err(unexpected("expire", other)),
        }
    }
}

/// `Err(Unconfirmed)` when fewer replicas than asked confirmed a write: call it only for an
/// outcome that wrote something (one that changed nothing need not wait for anyone).
fn confirmed(replication: Replication) -> Result<(), StoreError> {
    match replication {
        Replication::Short { acked, wanted } => Err(StoreError::Unconfirmed { acked, wanted }),
        Replication::NotAsked | Replication::Confirmed { .. } => Ok(()),
    }
}

/// A fresh token naming one attempt of one operation (see [`ApprovalStore::run`]).
fn op_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn unexpected(script: &str, outcome: &str) -> StoreError {
    StoreError::Failed(format!("the {script} script answered {outcome:?}"))
}

#[cfg(test)]
mod tests;
