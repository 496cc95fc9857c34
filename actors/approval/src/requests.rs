//! The public approvals subjects (`toolmesh.v1.approvals.<account>.list|get|decide`): parse
//! the subject and body, ask the store, build the reply body.

use serde_json::{Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::error::{ErrorCode, ToolError};
use toolmesh_kernel::metrics::ApprovalOutcome;
use toolmesh_kernel::subjects::public::{approvals, approvals_parts, ApprovalVerb};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::wire::{
    error_body, is_approval_id, json_kind, ok_body, ApprovalRequest, ApprovalStatus,
};
use toolmesh_kernel::Account;

use crate::grants::{may_grant, parse_ask, GrantAsk};
use crate::service::{store_error, ApprovalService};
use crate::store::{Decided, Decision, Requester};

/// Longest `approver`, in characters.
pub const MAX_APPROVER_CHARS: usize = 256;
/// Longest `reason`, in characters.
pub const MAX_REASON_CHARS: usize = 1024;
/// Most approvals one `list` reply holds; with more pending, or with a reply that would pass
/// the server's `max_payload` (cut further), it says `truncated: true`.
pub const MAX_LIST: usize = 500;
/// What `decided_by` records when `approver` is absent.
const ANONYMOUS: &str = "anonymous";

/// A parsed request on a public approvals subject.
#[derive(Debug, Clone, PartialEq)]
enum Query {
    List,
    Get { id: String },
    Decide { id: String, decision: DecideBody },
}

#[derive(Debug, Clone, PartialEq)]
struct DecideBody {
    approved: bool,
    approver: Option<String>,
    reason: Option<String>,
    /// The approver `…decide.<approver>` names; it is who decides, whatever the body says.
    member: Option<String>,
    /// `grant`: the decision remembers itself (an approval only).
    grant: Option<Box<GrantAsk>>,
    /// `arguments`: approved in place of the call's (an approval only).
    arguments: Option<Value>,
}

impl ApprovalService {
    /// Answers one request on `toolmesh.v1.approvals.>`; the reply body, success or failure.
    #[tracing::instrument(skip(self, body))]
    pub async fn answer(&self, subject: &str, body: &[u8]) -> Vec<u8> {
        match self.answer_fields(subject, body).await {
            Ok(fields) => ok_body(fields),
            Err(e) => error_body(e),
        }
    }

    async fn answer_fields(
        &self,
        subject: &str,
        body: &[u8],
    ) -> Result<Map<String, Value>, ToolError> {
        if subject.starts_with("toolmesh.v1.grants.") {
            return self.answer_grants(subject, body).await;
        }
        let (account, query) = parse(subject, body)?;
        match query {
            Query::List => self.list(&account).await,
            Query::Get { id } => match self.store.get(&account, &id).await.map_err(store_error)? {
                Some((approval, requester, arguments)) => {
                    Ok(self.with_arguments(approval, requester, arguments))
                }
                None => Err(not_found(&account, &id)),
            },
            Query::Decide { id, decision } => self.decide(&account, &id, decision).await,
        }
    }

    async fn list(&self, account: &Account) -> Result<Map<String, Value>, ToolError> {
        // One more than a reply holds: its presence says the list goes on.
        let mut approvals = self
            .store
            .list_pending(account, MAX_LIST + 1)
            .await
            .map_err(store_error)?;
        let more = approvals.len() > MAX_LIST;
        approvals.truncate(MAX_LIST);
        let items = approvals
            .iter()
            .map(to_value)
            .collect::<Result<Vec<_>, _>>()?;
        let mut fields = Map::new();
        fields.insert("approvals".into(), Value::Array(items));
        if more {
            fields.insert("truncated".into(), Value::Bool(true));
        }
        let limit = budget::listing_limit(self.nats.max_payload());
        budget::fit_list(&mut fields, "approvals", limit);
        Ok(fields)
    }

    /// `get`'s answer: the approval, who asked (`user_id`, `agent_id`, null when the call named
    /// none) and the exact arguments it is bound to. When they were
    /// not stored (an approval made by an older gateway) or the reply would pass the server's
    /// `max_payload` (the gateway refuses gated calls that could), `arguments` is null and
    /// `arguments_truncated: true`: the preview is all there is.
    fn with_arguments(
        &self,
        approval: ApprovalRequest,
        requester: Requester,
        arguments: Option<String>,
    ) -> Map<String, Value> {
        let mut fields = one(approval);
        fields.insert("user_id".into(), requester.user_id.into());
        fields.insert("agent_id".into(), requester.agent_id.into());
        let parsed = arguments.as_deref().map(serde_json::from_str::<Value>);
        let bytes = arguments.as_ref().map(String::len);
        match parsed {
            Some(Ok(value)) => {
                fields.insert("arguments".into(), value);
            }
            Some(Err(e)) => {
                tracing::error!(error = %e, "stored approval arguments are not JSON");
                fields.insert("arguments".into(), Value::Null);
            }
            None => {
                fields.insert("arguments".into(), Value::Null);
            }
        }
        let limit = budget::listing_limit(self.nats.max_payload());
        let complete = fields.get("arguments").is_some_and(|a| !a.is_null());
        if !complete || budget::json_len(&fields) > limit {
            fields.insert("arguments".into(), Value::Null);
            fields.insert("arguments_truncated".into(), Value::Bool(true));
            if let Some(bytes) = bytes {
                fields.insert("arguments_bytes".into(), Value::from(bytes));
            }
        }
        fields
    }

    async fn decide(
        &self,
        account: &Account,
        id: &str,
        mut body: DecideBody,
    ) -> Result<Map<String, Value>, ToolError> {
        let grant = body.grant.take();
        let mut edit = None;
        if grant.is_some() || body.arguments.is_some() {
            // Checked before deciding: a decision that may not remember itself, or whose
            // edited arguments a call could not run with, changes nothing.
            let found = self.store.get(account, id).await.map_err(store_error)?;
            let Some((approval, _, _)) = found else {
                return Err(not_found(account, id));
            };
            if let Some(ask) = &grant {
                may_grant(&approval, ask)?;
            }
            if let Some(arguments) = body.arguments.take() {
                edit = Some(self.check_edit(&approval, arguments).await?);
            }
        }
        let decision = Decision {
            approved: body.approved,
            decided_by: body
                .member
                .clone()
                .or(body.approver)
                .unwrap_or_else(|| ANONYMOUS.to_owned()),
            reason: body.reason,
            member: body.member,
            edit,
            grant_id: grant
                .as_ref()
                .filter(|_| body.approved)
                .map(|_| toolmesh_kernel::ids::generate_grant_id()),
        };
        let decided = self
            .store
            .decide(account, id, &decision)
            .await
            .map_err(store_error)?;
        match decided {
            Decided::NotFound => Err(not_found(account, id)),
            Decided::Forbidden(approval) => Err(ToolError::new(
                ErrorCode::Forbidden,
                match (&approval.reviewers, &decision.member) {
                    (Some(group), Some(member)) => format!(
                        "{member} is not among the reviewers {group} of approval {id}; nothing changed"
                    ),
                    (Some(group), None) => format!(
                        "approval {id} goes to the reviewers {group}: decide it on {} as one of them",
                        approvals(account, ApprovalVerb::Decide) + ".<approver>"
                    ),
                    (None, _) => format!("approval {id} may not be decided here"),
                },
            )),
            Decided::Counted(approval) => {
                tracing::info!(id, account = %account, by = %DisplaySafe(&decision.decided_by), "a reviewer's approval counted towards the quorum");
                Ok(one(approval))
            }
            Decided::Expired(approval) => Err(ToolError::new(
                ErrorCode::ApprovalExpired,
                format!(
                    "approval {id} expired at {} and can no longer be decided; the caller must request a new one",
                    approval.expires_at
                ),
            )),
            Decided::Conflict(approval) => Err(ToolError::new(
                ErrorCode::Conflict,
                format!(
                    "approval {id} was already {} by {}; the first decision stands",
                    if body.approved { "rejected" } else { "approved" },
                    approval.decided_by.as_deref().unwrap_or("someone")
                ),
            )
            .with("approval", to_value(&approval)?)),
            Decided::Unchanged(approval) => {
                // With replicas to wait for, a decision answered `unavailable` (no replica
                // confirmed it in time) is in Redis all the same, unannounced: its decider's
                // retry lands here, and must still reach the audit trail and wake the calls
                // parked on it. (A decider who only repeats a decision announces it twice.)
                let retried = self.store.waits_for_replicas()
                    && approval.decided_by.as_deref() == Some(decision.decided_by.as_str());
                let status = match approval.status {
                    ApprovalStatus::Approved => Some("approved"),
                    ApprovalStatus::Rejected => Some("rejected"),
                    _ => None,
                };
                if let (true, Some(status)) = (retried, status) {
                    self.record(&approval, status, None).await;
                    self.announce_decided(&approval).await;
                }
                Ok(one(approval))
            }
            Decided::EditNeedsOne(approval) => Err(crate::edit::needs_one(&approval)),
            Decided::Changed(approval) => {
                self.metrics.approval_decided(if body.approved {
                    ApprovalOutcome::Approved
                } else {
                    ApprovalOutcome::Rejected
                });
                tracing::info!(id, account = %account, approved = body.approved, by = %DisplaySafe(&decision.decided_by), "approval decided");
                let status = if body.approved { "approved" } else { "rejected" };
                self.record(&approval, status, None).await;
                self.announce_decided(&approval).await;
                let made = match (grant, decision.grant_id) {
                    (Some(ask), Some(id)) => {
                        Some(self.remember(id, &approval, *ask, &decision.decided_by).await?)
                    }
                    _ => None,
                };
                let mut fields = one(approval);
                if let Some(made) = made {
                    fields.insert(
                        "grant".into(),
                        serde_json::to_value(made).unwrap_or(Value::Null),
                    );
                }
                Ok(fields)
            }
        }
    }
}

/// An approval that does not serialize (a bug): `internal`.
#[derive(Debug, thiserror::Error)]
#[error("an approval does not serialize: {0}")]
struct EncodeError(#[source] serde_json::Error);

/// `internal` with the sentence of the error; the log line keeps its cause.
impl From<EncodeError> for ToolError {
    fn from(e: EncodeError) -> Self {
        ToolError::internal_logged(&e, "cannot write an approval")
    }
}

fn to_value(approval: &ApprovalRequest) -> Result<Value, EncodeError> {
    serde_json::to_value(approval).map_err(EncodeError)
}

fn one(approval: ApprovalRequest) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert(
        "approval".into(),
        serde_json::to_value(approval).unwrap_or(Value::Null),
    );
    fields
}

/// The same answer whether the id exists in another account or nowhere.
fn not_found(account: &Account, id: &str) -> ToolError {
    ToolError::new(
        ErrorCode::NotFound,
        format!("no approval {id} in account {account}; check the id and the account"),
    )
}

/// Subject and body → account and query; everything malformed is `invalid_request`.
fn parse(subject: &str, body: &[u8]) -> Result<(Account, Query), ToolError> {
    let (account, verb, member) = approvals_parts(subject).map_err(|rest| {
        ToolError::invalid_request(format!(
            "{:?} is not an approvals subject; use toolmesh.v1.approvals.<account>.list, .get or .decide",
            rest.chars().take(80).collect::<String>()
        ))
    })?;
    let account = Account::parse(account).map_err(|e| ToolError::invalid_request(e.to_string()))?;
    let mut map = object(body)?;
    let query = match verb {
        ApprovalVerb::List => Query::List,
        ApprovalVerb::Get => Query::Get { id: id(&mut map)? },
        ApprovalVerb::Decide => {
            let id = id(&mut map)?;
            let approved =
                match map.remove("approved") {
                    Some(Value::Bool(b)) => b,
                    None | Some(Value::Null) => return Err(ToolError::invalid_request(
                        "the decision has no \"approved\"; send true to approve or false to reject",
                    )),
                    Some(other) => {
                        return Err(ToolError::invalid_request(format!(
                            "approved must be true or false, got {}",
                            json_kind(&other)
                        )))
                    }
                };
            let approver = text(&mut map, "approver", MAX_APPROVER_CHARS)?;
            let reason = text(&mut map, "reason", MAX_REASON_CHARS)?;
            let grant =
                match map.remove("grant") {
                    None | Some(Value::Null) => None,
                    Some(_) if !approved => return Err(ToolError::invalid_request(
                        "only an approval remembers itself: send \"grant\" with \"approved\": true",
                    )),
                    Some(ask) => Some(Box::new(parse_ask(ask)?)),
                };
            let arguments = match map.remove("arguments") {
                    None | Some(Value::Null) => None,
                    Some(_) if !approved => return Err(ToolError::invalid_request(
                        "only an approval carries edited arguments: send \"arguments\" with \"approved\": true",
                    )),
                    Some(edited @ Value::Object(_)) => Some(edited),
                    Some(other) => {
                        return Err(ToolError::invalid_request(format!(
                            "arguments must be an object (the tool's arguments, edited), got {}",
                            json_kind(&other)
                        )))
                    }
                };
            Query::Decide {
                id,
                decision: DecideBody {
                    approved,
                    approver,
                    reason,
                    member: member.map(str::to_owned),
                    grant,
                    arguments,
                },
            }
        }
        ApprovalVerb::Requested | ApprovalVerb::Decided => {
            return Err(ToolError::invalid_request(format!(
                "{} is an event subject, not a request; use list, get or decide",
                verb.as_str()
            )))
        }
    };
    Ok((account, query))
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ToolError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ToolError::invalid_request(
            "the request body is empty; send a JSON object (at least {})",
        ));
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ToolError::invalid_request(format!(
            "the request body must be a JSON object, got {}",
            json_kind(&other)
        ))),
        Err(e) => Err(ToolError::invalid_request(format!(
            "the request body is not valid JSON ({e})"
        ))),
    }
}

fn id(map: &mut Map<String, Value>) -> Result<String, ToolError> {
    match map.remove("id") {
        Some(Value::String(s)) if is_approval_id(&s) => Ok(s),
        Some(Value::String(s)) => Err(ToolError::invalid_request(format!(
            "id {:?} is not an approval id (appr_…)",
            s.chars().take(70).collect::<String>()
        ))),
        None | Some(Value::Null) => Err(ToolError::invalid_request(
            "the request has no \"id\"; name the approval (appr_…)",
        )),
        Some(other) => Err(ToolError::invalid_request(format!(
            "id must be a string, got {}",
            json_kind(&other)
        ))),
    }
}

/// An optional string member of at most `max` characters; empty counts as absent.
fn text(map: &mut Map<String, Value>, name: &str, max: usize) -> Result<Option<String>, ToolError> {
    match map.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.chars().count() > max => Err(ToolError::invalid_request(
            format!("{name} must be at most {max} characters"),
        )),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ToolError::invalid_request(format!(
            "{name} must be a string, got {}",
            json_kind(&other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "toolmesh.v1.approvals.acme.";

    fn check(verb: &str, body: &str, expect: Result<Query, &str>) {
        let subject = format!("{BASE}{verb}");
        match (parse(&subject, body.as_bytes()), expect) {
            (Ok((account, query)), Ok(want)) => {
                assert_eq!(account.as_str(), "acme");
                assert_eq!(query, want, "{verb} {body}");
            }
            (Err(e), Err(fragment)) => {
                assert_eq!(e.code, ErrorCode::InvalidRequest, "{verb} {body}");
                assert!(e.message.contains(fragment), "{verb} {body}: {}", e.message);
            }
            (got, want) => panic!("{verb} {body}: got {got:?}, want {want:?}"),
        }
    }

    fn decide(id: &str, approved: bool, approver: Option<&str>, reason: Option<&str>) -> Query {
        Query::Decide {
            id: id.into(),
            decision: DecideBody {
                approved,
                approver: approver.map(Into::into),
                reason: reason.map(Into::into),
                member: None,
                grant: None,
                arguments: None,
            },
        }
    }

    #[test]
    fn list_bodies() {
        check("list", "{}", Ok(Query::List));
        check("list", r#"{"anything": 1}"#, Ok(Query::List));
        check("list", "", Err("empty"));
        check("list", "[]", Err("an array"));
        check("list", "nope", Err("not valid JSON"));
        check("list", "42", Err("a number"));
    }

    #[test]
    fn get_bodies() {
        check(
            "get",
            r#"{"id":"appr_1"}"#,
            Ok(Query::Get {
                id: "appr_1".into(),
            }),
        );
        check("get", "{}", Err("no \"id\""));
        check("get", r#"{"id":5}"#, Err("a number"));
        check("get", r#"{"id":"a:b"}"#, Err("not an approval id"));
        check("get", r#"{"id":""}"#, Err("not an approval id"));
    }

    #[test]
    fn decide_bodies() {
        check(
            "decide",
            r#"{"id":"appr_1","approved":true}"#,
            Ok(decide("appr_1", true, None, None)),
        );
        check(
            "decide",
            r#"{"id":"appr_1","approved":false,"approver":"bob","reason":"no"}"#,
            Ok(decide("appr_1", false, Some("bob"), Some("no"))),
        );
        check(
            "decide",
            r#"{"id":"appr_1","approved":true,"approver":"","reason":null}"#,
            Ok(decide("appr_1", true, None, None)),
        );
        check("decide", r#"{"id":"appr_1"}"#, Err("approved"));
        let Query::Decide { decision, .. } = parse(
            "toolmesh.v1.approvals.acme.decide",
            br#"{"id":"appr_1","approved":true,"arguments":{"path":"b"}}"#,
        )
        .unwrap()
        .1
        else {
            panic!("a decision")
        };
        assert_eq!(decision.arguments, Some(serde_json::json!({"path": "b"})));
        check(
            "decide",
            r#"{"id":"appr_1","approved":false,"arguments":{"path":"b"}}"#,
            Err("only an approval carries edited arguments"),
        );
        check(
            "decide",
            r#"{"id":"appr_1","approved":true,"arguments":"{}"}"#,
            Err("must be an object"),
        );
        check(
            "decide",
            r#"{"id":"appr_1","approved":"yes"}"#,
            Err("true or false"),
        );
        check("decide", r#"{"approved":true}"#, Err("id"));
        check(
            "decide",
            r#"{"id":"appr_1","approved":true,"approver":7}"#,
            Err("approver"),
        );
        let long = "x".repeat(MAX_APPROVER_CHARS + 1);
        check(
            "decide",
            &format!(r#"{{"id":"appr_1","approved":true,"approver":"{long}"}}"#),
            Err("approver must be at most"),
        );
        let long = "é".repeat(MAX_REASON_CHARS + 1);
        check(
            "decide",
            &format!(r#"{{"id":"appr_1","approved":true,"reason":"{long}"}}"#),
            Err("reason must be at most"),
        );
    }

    #[test]
    fn subjects() {
        assert!(parse("toolmesh.v1.approvals.a.b.list", b"{}").is_err());
        assert!(parse("toolmesh.v1.approvals.acme.frob", b"{}").is_err());
        assert!(parse(
            &format!("toolmesh.v1.approvals.{}.list", "a".repeat(65)),
            b"{}"
        )
        .is_err());
        assert!(parse("toolmesh.v1.approvals.a$b.list", b"{}").is_err());
        check("requested", "{}", Err("event subject"));
        check("decided", "{}", Err("event subject"));
    }
}
