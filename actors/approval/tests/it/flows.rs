//! The out-of-band life of an approval: created by the gate, announced, listed, decided, used.

use serde_json::{json, Value};
use toolmesh_kernel::wire::{ApprovalStatus, GateOutcome};
use toolmesh_kernel::ErrorCode;

use crate::support::*;

#[actix_rt::test]
async fn the_gate_creates_a_pending_approval_that_is_announced_listed_and_gettable() {
    let rig = Rig::start().await;
    let mut events = rig.events("acme").await;
    let call = Call::new("acme");

    let approval = rig.create(&call).await;
    assert!(approval.id.starts_with("appr_"), "{}", approval.id);
    assert_eq!(approval.status, ApprovalStatus::Pending);
    assert_eq!(approval.account.as_str(), "acme");
    assert_eq!(approval.invocation_id.as_str(), call.invocation_id);
    assert_eq!(
        approval.session_id.as_ref().map(|s| s.as_str()),
        Some("s-1")
    );
    assert_eq!(approval.tool_name, "run_command");
    assert_eq!(approval.arguments_sha256, call.sha);
    assert_eq!(approval.arguments_preview, "{\"command\":\"ls\"}");
    assert_eq!(
        (
            approval.decided_by.clone(),
            approval.decided_at.clone(),
            approval.reason.clone()
        ),
        (None, None, None)
    );
    assert!(approval.created_at.ends_with('Z') && approval.expires_at.ends_with('Z'));
    assert!(approval.expires_at > approval.created_at);

    let (verb, announced) = next_event(&mut events).await;
    assert_eq!(verb, "requested");
    assert_eq!(announced, approval);

    assert_eq!(ids_of(&rig.list("acme").await), vec![approval.id.clone()]);
    assert_eq!(approval_of(&rig.get("acme", &approval.id).await), approval);
    let desk = rig.desk.as_ref().unwrap();
    assert!(
        toolmesh_testkit::wait_until(PATIENCE, || async { desk.in_flight.get() == 0 }).await,
        "every request leaves the in-flight count"
    );
}

#[actix_rt::test]
async fn list_is_pending_only_and_oldest_first() {
    let rig = Rig::start().await;
    let first = rig.create(&Call::new("acme")).await;
    let second = rig.create(&Call::new("acme")).await;
    let third = rig.create(&Call::new("acme")).await;
    assert_eq!(
        ids_of(&rig.list("acme").await),
        vec![first.id.clone(), second.id.clone(), third.id.clone()]
    );
    approval_of(&rig.decide("acme", &second.id, true, None).await);
    approval_of(&rig.decide("acme", &third.id, false, None).await);
    assert_eq!(ids_of(&rig.list("acme").await), vec![first.id]);
}

#[actix_rt::test]
async fn an_approved_approval_runs_exactly_one_call() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;
    let mut events = rig.events("acme").await;

    let reply = rig
        .ask(
            "acme",
            toolmesh_kernel::subjects::public::ApprovalVerb::Decide,
            json!({"id": created.id, "approved": true, "approver": "alice", "reason": "looks fine"}),
        )
        .await;
    let decided = approval_of(&reply);
    assert_eq!(decided.status, ApprovalStatus::Approved);
    assert_eq!(decided.decided_by.as_deref(), Some("alice"));
    assert_eq!(decided.reason.as_deref(), Some("looks fine"));
    assert!(decided
        .decided_at
        .as_deref()
        .is_some_and(|at| at.ends_with('Z')));
    assert_eq!(
        next_event(&mut events).await,
        ("decided".into(), decided.clone())
    );
    assert!(
        ids_of(&rig.list("acme").await).is_empty(),
        "an approved one is no longer pending"
    );

    let used = proceeded(rig.gate(&call.presenting(&created.id)).await);
    assert_eq!(used.status, ApprovalStatus::Used);
    assert_eq!(used.id, created.id);
    let (verb, announced) = next_event(&mut events).await;
    assert_eq!(
        (verb.as_str(), announced.status),
        ("decided", ApprovalStatus::Used)
    );

    let (code, message, approval) = refusal(rig.gate(&call.presenting(&created.id)).await);
    assert_eq!(code, "approval_expired");
    assert!(message.contains("already used"), "{message}");
    assert_eq!(approval.map(|a| a.status), Some(ApprovalStatus::Used));
    assert_eq!(rig.status("acme", &created.id).await, ApprovalStatus::Used);

    // A used approval was approved first: the same decision is ok, the contrary one a conflict.
    for (approved, outcome) in [
        (true, Ok(ApprovalStatus::Used)),
        (false, Err("conflict".to_owned())),
    ] {
        assert_eq!(
            rig.decision("acme", &created.id, approved).await,
            outcome,
            "approved: {approved}"
        );
    }
}

#[actix_rt::test]
async fn a_pending_approval_answers_pending_and_says_where_to_decide() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;
    let (code, message, approval) = refusal(rig.gate(&call.presenting(&created.id)).await);
    assert_eq!(code, "approval_pending");
    assert!(
        message.contains("toolmesh.v1.approvals.acme.decide"),
        "{message}"
    );
    assert_eq!(approval.map(|a| a.status), Some(ApprovalStatus::Pending));
}

#[actix_rt::test]
async fn a_rejection_refuses_and_the_first_decision_wins() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;

    let rejected = approval_of(&rig.decide("acme", &created.id, false, None).await);
    assert_eq!(rejected.status, ApprovalStatus::Rejected);
    assert_eq!(rejected.decided_by.as_deref(), Some("anonymous"));

    let refused = refused_status(rig.gate(&call.presenting(&created.id)).await);
    assert_eq!(
        refused,
        ("approval_rejected".into(), Some(ApprovalStatus::Rejected))
    );

    let again = rig.decide("acme", &created.id, false, Some("bob")).await;
    assert_eq!(
        approval_of(&again),
        rejected,
        "the same decision is ok and changes nothing"
    );
    assert_eq!(
        error_of(&rig.decide("acme", &created.id, true, Some("bob")).await),
        "conflict"
    );
    assert_eq!(approval_of(&rig.get("acme", &created.id).await), rejected);
}

#[actix_rt::test]
async fn a_mismatched_call_is_refused_and_the_approval_stays_usable() {
    let rig = Rig::start().await;
    let (call, created) = rig.decided_call(true).await;
    let grant = json!({"id": created.id});

    let mut other_session = call.with_grant(grant.clone());
    other_session.session_id = Some("s-2".into());
    let mut no_session = call.with_grant(grant.clone());
    no_session.session_id = None;
    let mut other_tool = call.with_grant(grant.clone());
    other_tool.tool = "delete_workspace_file".into();
    let mut other_arguments = call.with_grant(grant.clone());
    other_arguments.sha = "b".repeat(64);
    for (what, wrong) in [
        ("session", other_session),
        ("session", no_session),
        ("tool", other_tool),
        ("arguments", other_arguments),
    ] {
        let (code, message, approval) = refusal(rig.gate(&wrong).await);
        assert_eq!(code, "approval_mismatch", "{what}");
        assert!(message.contains(what), "{what}: {message}");
        assert_eq!(
            approval.map(|a| a.status),
            Some(ApprovalStatus::Approved),
            "{what}"
        );
    }
    // In-band decisions on a mismatched call decide nothing either.
    let mut wrong = call.deciding(&created.id, false);
    wrong.tool = "other".into();
    assert_eq!(refusal(rig.gate(&wrong).await).0, "approval_mismatch");

    assert_eq!(
        rig.status("acme", &created.id).await,
        ApprovalStatus::Approved
    );
    assert_eq!(
        proceeded(rig.gate(&call.with_grant(grant)).await).status,
        ApprovalStatus::Used
    );
}

#[actix_rt::test]
async fn a_call_without_a_session_binds_to_no_session() {
    let rig = Rig::start().await;
    let mut call = Call::new("acme");
    call.session_id = None;
    let created = rig.create(&call).await;
    assert_eq!(created.session_id, None);
    approval_of(&rig.decide("acme", &created.id, true, None).await);
    let mut with_session = call.presenting(&created.id);
    with_session.session_id = Some("s-1".into());
    assert_eq!(
        refusal(rig.gate(&with_session).await).0,
        "approval_mismatch"
    );
    proceeded(rig.gate(&call.presenting(&created.id)).await);
}

#[actix_rt::test]
async fn unknown_ids_are_not_found_everywhere() {
    let rig = Rig::start().await;
    let id = "appr_00000000000000000000000000000000";
    assert_eq!(error_of(&rig.get("acme", id).await), "not_found");
    assert_eq!(rig.approving_refused(id).await, "not_found");
    let refused = refused_status(rig.gate(&Call::new("acme").presenting(id)).await);
    assert_eq!(refused, ("not_found".into(), None));
    assert_eq!(
        rig.refused(&Call::new("acme").deciding(id, true)).await,
        "not_found"
    );
}

/// `get` answers the arguments the approval is bound to, as the gateway sent them; the gate
/// stores them only when they hash to `arguments_sha256`, and makes the preview from them.
#[actix_rt::test]
async fn get_answers_the_arguments_that_hash_to_the_approval() {
    let rig = Rig::start().await;
    let arguments = json!({"command": "ls\u{202e}", "env": {"A": "b"}});
    let call = Call {
        sha: toolmesh_kernel::canonical::arguments_sha256(&arguments),
        ..Call::new("acme")
    };
    let mut body = call.body();
    body["arguments"] = arguments.clone();
    let GateOutcome::Required { approval, .. } =
        rig.gate_raw(&serde_json::to_vec(&body).unwrap()).await
    else {
        panic!("expected a pending approval");
    };
    assert_eq!(
        approval.arguments_preview,
        r#"{"command":"ls\u202e","env":{"A":"b"}}"#
    );
    let got = rig.get("acme", &approval.id).await;
    assert_eq!(got["arguments"], arguments, "{got}");
    assert!(got.get("arguments_truncated").is_none(), "{got}");

    // Arguments that are not what the hash covers are refused; nothing is created.
    let mut forged = Call::new("acme").body();
    forged["arguments"] = json!({"command": "rm -rf /"});
    match rig.gate_raw(&serde_json::to_vec(&forged).unwrap()).await {
        GateOutcome::Refused { error, .. } => assert_eq!(error, ErrorCode::InvalidRequest),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // An approval made without arguments (an older gateway) says it has none to show.
    let old = rig.create(&Call::new("acme")).await;
    let got = rig.get("acme", &old.id).await;
    assert_eq!(got["arguments"], Value::Null, "{got}");
    assert_eq!(got["arguments_truncated"], true, "{got}");
}
