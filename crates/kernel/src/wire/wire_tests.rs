//! Unit tests of `wire/`.

use serde_json::{Map, Value};

use super::*;
use crate::error::{ErrorCode, ToolError};
use crate::ids::{Account, InvocationId};

fn refused(body: &str) -> (String, String) {
    let err = ToolRequest::parse(body.as_bytes()).unwrap_err();
    (err.error.code.to_string(), err.error.message)
}

#[test]
fn bad_bodies_are_invalid_requests() {
    for body in [
        "",
        "  ",
        "nope",
        "[]",
        "42",
        "\"tool\"",
        "{}",
        r#"{"tool": 5}"#,
        r#"{"tool": ""}"#,
        r#"{"tool":"x","arguments":[1]}"#,
        r#"{"tool":"x","arguments":"{}"}"#,
        r#"{"tool":"x","session_id":"a b"}"#,
        r#"{"tool":"x","session_id":7}"#,
        r#"{"tool":"x","wait_for_approval_s":3601}"#,
        r#"{"tool":"x","wait_for_approval_s":-1}"#,
        r#"{"tool":"x","wait_for_approval_s":1.5}"#,
        r#"{"tool":"x","approval":true}"#,
        r#"{"tool":"x","approval":{"approved":"yes"}}"#,
        r#"{"tool":"x","approval":{"id":"a.b"}}"#,
        r#"{"tool":"x","approval":{"approved":true,"decided_by":"alice"}}"#,
        r#"{"tool":"x","approval":{"approved":true,"decided_by":"mcp:a b"}}"#,
        r#"{"tool":"x","approval":{"approved":true,"decided_by":7}}"#,
        r#"{"tool":"x","invocation_id":"has space"}"#,
    ] {
        let (code, message) = refused(body);
        assert_eq!(code, "invalid_request", "{body}: {message}");
        assert!(!message.is_empty());
    }
}

#[test]
fn session_error_names_session_id() {
    let (_, message) = refused(r#"{"tool":"x","session_id":"a.b"}"#);
    assert!(message.contains("session_id"), "{message}");
}

#[test]
fn invocation_id_is_echoed_even_when_the_rest_is_wrong() {
    let err = ToolRequest::parse(br#"{"tool":5,"invocation_id":"inv-1"}"#).unwrap_err();
    assert_eq!(err.invocation_id.as_str(), "inv-1");
}

#[test]
fn a_good_request_parses_with_defaults() {
    let req = ToolRequest::parse(
        br#"{"tool":"t","account":"other","approval":{"id":"appr_1","approved":true}}"#,
    )
    .unwrap();
    assert_eq!(req.tool, "t");
    assert_eq!(req.arguments, serde_json::json!({}));
    assert_eq!(req.wait_for_approval_s, 0);
    assert_eq!(
        req.approval,
        Some(ApprovalGrant {
            id: Some("appr_1".into()),
            approved: Some(true),
            decided_by: None,
        })
    );
    assert!(req.invocation_id.as_str().starts_with("inv_"));
    let by_mcp = ToolRequest::parse(
        br#"{"tool":"t","approval":{"id":"appr_1","approved":true,"decided_by":"mcp:ci-bot"}}"#,
    )
    .unwrap();
    assert_eq!(by_mcp.approval.unwrap().decider(), "mcp:ci-bot");
}

#[test]
fn replies_put_ok_and_the_invocation_id_first() {
    let id = InvocationId::parse("inv-1").unwrap();
    let mut fields = Map::new();
    fields.insert("b".into(), Value::from(1));
    fields.insert("ok".into(), Value::Bool(false));
    fields.insert("a".into(), Value::from("x"));
    let body = String::from_utf8(reply_body(&id, fields)).unwrap();
    assert_eq!(
        body,
        r#"{"ok":false,"invocation_id":"inv-1","b":1,"a":"x"}"#
    );
    let mut writer = ReplyWriter::new(true, None);
    writer.raw_members(br#""k":[1]"#).member("z", &2);
    assert_eq!(writer.finish(), br#"{"ok":true,"k":[1],"z":2}"#);
}

#[test]
fn run_events_carry_the_context_and_extras() {
    let ctx = InvocationContext {
        account: Account::parse("acme").unwrap(),
        invocation_id: InvocationId::parse("inv-1").unwrap(),
        session_id: None,
        user_id: Some("u".into()),
        agent_id: None,
    };
    let mut extra = Map::new();
    extra.insert("ok".into(), Value::Bool(true));
    let event: Value =
        serde_json::from_slice(&run_event(&ctx, "t", 3, RunEventKind::Finished, &extra)).unwrap();
    assert_eq!(event["seq"], 3);
    assert_eq!(event["kind"], "finished");
    assert_eq!(event["session_id"], Value::Null);
    assert_eq!(event["user_id"], "u");
    assert_eq!(event["ok"], true);
}

#[test]
fn gate_outcome_is_tagged() {
    let v = serde_json::to_value(GateOutcome::Refused {
        error: ErrorCode::ApprovalMismatch,
        error_message: "m".into(),
        approval: None,
    })
    .unwrap();
    assert_eq!(v["outcome"], "refused");
    assert_eq!(v["error"], "approval_mismatch");
}

#[test]
fn release_messages_round_trip_and_errors_are_optional() {
    let release: ApprovalRelease = serde_json::from_str(
        r#"{"account":"acme","approval_id":"appr_1","invocation_id":"inv-1"}"#,
    )
    .unwrap();
    assert_eq!(release.account.as_str(), "acme");
    assert_eq!(release.invocation_id.as_str(), "inv-1");
    // The kernel's id types guard the account and the invocation id.
    for bad in [
        r#"{"account":"a.b","approval_id":"appr_1","invocation_id":"inv-1"}"#,
        r#"{"account":"acme","approval_id":"appr_1","invocation_id":"a b"}"#,
        r#"{"account":"acme","invocation_id":"inv-1"}"#,
    ] {
        assert!(
            serde_json::from_str::<ApprovalRelease>(bad).is_err(),
            "{bad}"
        );
    }

    let plain = serde_json::to_value(ReleaseAck::judged(false, None)).unwrap();
    assert_eq!(
        plain,
        serde_json::json!({"released": false, "approval": null})
    );
    let failed = ReleaseAck::failed(ToolError::new(ErrorCode::Unavailable, "down"));
    let v = serde_json::to_value(&failed).unwrap();
    assert_eq!(v["error"], "unavailable");
    assert_eq!(v["error_message"], "down");
    assert_eq!(serde_json::from_value::<ReleaseAck>(v).unwrap(), failed);
    let minimal: ReleaseAck = serde_json::from_str(r#"{"released":true}"#).unwrap();
    assert_eq!(minimal, ReleaseAck::judged(true, None));
}
