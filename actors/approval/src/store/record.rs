//! An approval record as the scripts return it (`HGETALL`: field → text) and as PROTOCOL.md's
//! ApprovalRequest. A record that does not read is [`Damaged`]: a bug or a hand-edited key.

use std::collections::HashMap;

use toolmesh_kernel::wire::{ApprovalRequest, ApprovalStatus, MemberDecision};
use toolmesh_kernel::{Account, InvocationId, SessionId};

/// A record as the scripts return it (HGETALL).
pub(super) type Record = HashMap<String, String>;

/// A record field that is missing or does not read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Damaged(pub(super) String);

pub(super) fn field<'a>(record: &'a Record, name: &str) -> Result<&'a str, Damaged> {
    record
        .get(name)
        .map(String::as_str)
        .ok_or_else(|| Damaged(format!("an approval record has no {name}")))
}

pub(super) fn number(record: &Record, name: &str) -> Result<u64, Damaged> {
    field(record, name)?
        .parse()
        .map_err(|_| Damaged(format!("an approval record's {name} is not a number")))
}

/// An optional text field; absent or empty means none.
pub(super) fn optional(record: &Record, name: &str) -> Option<String> {
    record.get(name).filter(|v| !v.is_empty()).cloned()
}

pub(super) fn damaged(name: &str, e: impl std::fmt::Display) -> Damaged {
    Damaged(format!("an approval record's {name} is damaged: {e}"))
}

/// A record's `account`.
pub(super) fn account_of(record: &Record) -> Result<Account, Damaged> {
    Account::parse(field(record, "account")?).map_err(|e| damaged("account", e))
}

/// A record's `session_id` (empty: none).
pub(super) fn session_of(record: &Record) -> Result<Option<SessionId>, Damaged> {
    optional(record, "session_id")
        .map(SessionId::parse)
        .transpose()
        .map_err(|e| damaged("session_id", e))
}

/// The record as PROTOCOL.md's ApprovalRequest at Redis time `now_ms`.
pub(super) fn view(record: &Record, now_ms: u64) -> Result<ApprovalRequest, Damaged> {
    let expires_at_ms = number(record, "expires_at_ms")?;
    let stored: ApprovalStatus = serde_json::from_value(field(record, "status")?.into())
        .map_err(|e| damaged("status", e))?;
    // Mirrors `effective` in common.lua: what is not decided for good expires with its time.
    let status = match stored {
        ApprovalStatus::Pending | ApprovalStatus::Approved if now_ms >= expires_at_ms => {
            ApprovalStatus::Expired
        }
        other => other,
    };
    Ok(ApprovalRequest {
        id: field(record, "id")?.to_owned(),
        account: account_of(record)?,
        session_id: session_of(record)?,
        invocation_id: InvocationId::parse(field(record, "invocation_id")?)
            .map_err(|e| damaged("invocation_id", e))?,
        tool_name: field(record, "tool_name")?.to_owned(),
        risk_level: serde_json::from_value(field(record, "risk_level")?.into())
            .map_err(|e| damaged("risk_level", e))?,
        side_effects: serde_json::from_str(field(record, "side_effects")?)
            .map_err(|e| damaged("side_effects", e))?,
        arguments_sha256: field(record, "arguments_sha256")?.to_owned(),
        arguments_preview: field(record, "arguments_preview")?.to_owned(),
        status,
        created_at: toolmesh_kernel::time::ms_to_rfc3339(number(record, "created_at_ms")?),
        expires_at: toolmesh_kernel::time::ms_to_rfc3339(expires_at_ms),
        decided_by: optional(record, "decided_by"),
        decided_at: optional(record, "decided_at_ms")
            .map(|ms| ms.parse().map(toolmesh_kernel::time::ms_to_rfc3339))
            .transpose()
            .map_err(|e| damaged("decided_at_ms", e))?,
        reason: optional(record, "reason"),
        rule_id: optional(record, "rule_id"),
        policy_revision: optional(record, "policy_revision"),
        reviewers: optional(record, "reviewers"),
        quorum: optional(record, "quorum")
            .map(|q| q.parse())
            .transpose()
            .map_err(|e| damaged("quorum", e))?
            .unwrap_or(1),
        decisions: match optional(record, "reviewers") {
            None => None,
            Some(_) => Some(decisions(record)?),
        },
        escalated: optional(record, "escalated").is_some(),
        edited: optional(record, "edited").is_some(),
        grant_id: optional(record, "grant_id"),
        original_arguments_sha256: optional(record, "original_arguments_sha256"),
        grantable: optional(record, "grantable").as_deref() != Some("0"),
    })
}

/// The member decisions of a routed approval, as decide.lua keeps them (JSON, `at_ms` as
/// text, `reason` empty for none).
fn decisions(record: &Record) -> Result<Vec<MemberDecision>, Damaged> {
    let Some(raw) = optional(record, "decisions") else {
        return Ok(Vec::new());
    };
    let kept: serde_json::Value =
        serde_json::from_str(&raw).map_err(|e| damaged("decisions", e))?;
    // cjson writes an empty table as an object.
    let Some(kept) = kept.as_array() else {
        return Ok(Vec::new());
    };
    kept.iter()
        .map(|d| {
            let text = |name: &str| d[name].as_str().unwrap_or_default().to_owned();
            let at: u64 = text("at_ms").parse().map_err(|e| damaged("decisions", e))?;
            let reason = text("reason");
            Ok(MemberDecision {
                approver: text("approver"),
                approved: d["approved"].as_bool().unwrap_or(false),
                at: toolmesh_kernel::time::ms_to_rfc3339(at),
                reason: Some(reason).filter(|r| !r.is_empty()),
            })
        })
        .collect()
}
