//! Grants in Redis (PROTOCOL.md "Approval policy", Grants): a decision that remembers itself.
//!
//! * `toolmesh:grant:<account>:<id>`: hash, the grant (`session_id` empty for account scope,
//!   `tools` and `when` as JSON, `uses_left` empty for no limit, `revoked_at_ms` once revoked),
//!   kept `retention` past its expiry.
//! * `toolmesh:grants:<account>`: zset id → `expires_at_ms`, the account's grants.
//!
//! A use is one script (`grant_use.lua`): revoked, expired and spent grants are refused there,
//! and a limited one counts down there, so gateways racing for the last use get it once.

use std::sync::LazyLock;

use redis::Script;
use toolmesh_kernel::wire::Grant;
use toolmesh_kernel::{Account, SessionId};

use super::record::{account_of, damaged, field, number, optional, session_of, Record};
use super::{confirmed, ApprovalStore, StoreError};

// `script!` is the store's: common.lua, then the script.
struct GrantScripts {
    create: Script,
    use_one: Script,
    revoke: Script,
    list: Script,
}

static SCRIPTS: LazyLock<GrantScripts> = LazyLock::new(|| GrantScripts {
    create: script!("grant_create.lua"),
    use_one: script!("grant_use.lua"),
    revoke: script!("grant_revoke.lua"),
    list: script!("grants_list.lua"),
});

/// A grant as a decision asks for it, checked.
#[derive(Debug, Clone)]
pub struct NewGrant {
    /// Made before the decision, which records it on the approval (`grant_id`).
    pub id: String,
    pub account: Account,
    pub session_id: Option<SessionId>,
    pub tools: Vec<String>,
    pub when: serde_json::Map<String, serde_json::Value>,
    pub created_by: String,
    pub ttl_ms: u64,
    pub uses: Option<u64>,
    pub approval_id: String,
}

/// What [`ApprovalStore::use_grant`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Use {
    /// One use spent; the grant as it is now.
    Used(Box<Grant>),
    /// It covers nothing any more (gone, revoked, expired or out of uses).
    Lapsed,
}

fn grant_key(account: &str, id: &str) -> String {
    format!("{}{id}", grant_prefix(account))
}

fn grant_prefix(account: &str) -> String {
    format!("toolmesh:grant:{account}:")
}

fn index_key(account: &str) -> String {
    format!("toolmesh:grants:{account}")
}

impl ApprovalStore {
    /// Stores a new grant and returns it.
    pub async fn create_grant(&self, new: &NewGrant) -> Result<Grant, StoreError> {
        let id = &new.id;
        let account = new.account.as_str();
        let tools = serde_json::to_string(&new.tools).unwrap_or_default();
        let when = serde_json::to_string(&new.when).unwrap_or_default();
        let mut invocation = SCRIPTS.create.prepare_invoke();
        invocation
            .key(grant_key(account, id))
            .key(index_key(account))
            .arg(id)
            .arg(account)
            .arg(new.session_id.as_ref().map_or("", SessionId::as_str))
            .arg(tools)
            .arg(when)
            .arg(&new.created_by)
            .arg(new.ttl_ms)
            .arg(new.uses.map(|u| u.to_string()).unwrap_or_default())
            .arg(&new.approval_id)
            .arg(self.retention_ms);
        let ((_now, record), replication): ((u64, Record), _) =
            self.run_replicated(&invocation).await?;
        confirmed(replication)?;
        view(&record)
    }

    /// Spends one use of grant `id` of `account` if it still covers calls.
    pub async fn use_grant(&self, account: &Account, id: &str) -> Result<Use, StoreError> {
        let mut invocation = SCRIPTS.use_one.prepare_invoke();
        invocation.key(grant_key(account.as_str(), id));
        // A use spent stays spent on the primary, unconfirmed or not; the call does not run
        // then (never overspent).
        let (outcome, _now, record) = self.run_outcome(&invocation, &["used"]).await?;
        match outcome.as_str() {
            "used" => view(&record).map(|g| Use::Used(Box::new(g))),
            "gone" | "revoked" | "expired" | "spent" => Ok(Use::Lapsed),
            other => Err(super::unexpected("grant_use", other)),
        }
    }

    /// Revokes grant `id` of `account` (a revoked one stays revoked); `None` when there is no
    /// such grant in that account.
    pub async fn revoke_grant(
        &self,
        account: &Account,
        id: &str,
    ) -> Result<Option<Grant>, StoreError> {
        let mut invocation = SCRIPTS.revoke.prepare_invoke();
        invocation.key(grant_key(account.as_str(), id));
        let (outcome, _now, record) = self.run_outcome(&invocation, &["revoked"]).await?;
        match outcome.as_str() {
            "not_found" => Ok(None),
            "revoked" => view(&record).map(Some),
            other => Err(super::unexpected("grant_revoke", other)),
        }
    }

    /// Every grant of `account` still kept, oldest first, each with whether it covers calls
    /// now (by Redis time: not revoked, not expired, uses left).
    pub async fn list_grants(&self, account: &Account) -> Result<Vec<(Grant, bool)>, StoreError> {
        let mut invocation = SCRIPTS.list.prepare_invoke();
        invocation
            .key(index_key(account.as_str()))
            .arg(grant_prefix(account.as_str()));
        let (now, records): (u64, Vec<Record>) = self.run(&invocation).await?;
        records
            .iter()
            .map(|record| {
                let grant = view(record)?;
                let live = grant.revoked_at.is_none()
                    && now < number(record, "expires_at_ms")?
                    && grant.uses_left != Some(0);
                Ok((grant, live))
            })
            .collect()
    }
}

fn view(record: &Record) -> Result<Grant, StoreError> {
    let ms = |name: &str| number(record, name).map(toolmesh_kernel::time::ms_to_rfc3339);
    Ok(Grant {
        id: field(record, "id")?.to_owned(),
        account: account_of(record)?,
        session_id: session_of(record)?,
        tools: serde_json::from_str(field(record, "tools")?).map_err(|e| damaged("tools", e))?,
        when: match optional(record, "when").as_deref() {
            None | Some("{}") => serde_json::Map::new(),
            Some(text) => serde_json::from_str(text).map_err(|e| damaged("when", e))?,
        },
        created_by: field(record, "created_by")?.to_owned(),
        created_at: ms("created_at_ms")?,
        expires_at: ms("expires_at_ms")?,
        uses_left: optional(record, "uses_left")
            .map(|u| u.parse())
            .transpose()
            .map_err(|e| damaged("uses_left", e))?,
        revoked_at: optional(record, "revoked_at_ms")
            .map(|v| v.parse().map(toolmesh_kernel::time::ms_to_rfc3339))
            .transpose()
            .map_err(|e| damaged("revoked_at_ms", e))?,
        approval_id: field(record, "approval_id")?.to_owned(),
    })
}
