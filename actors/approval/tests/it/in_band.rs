//! In-band decisions (`approval.approved` on the call itself) and turning them off.

use serde_json::json;
use toolmesh_kernel::wire::{ApprovalStatus, GateOutcome};

use crate::support::*;

#[actix_rt::test]
async fn approved_on_the_first_call_runs_at_once_and_only_once() {
    let rig = Rig::start().await;
    let mut events = rig.events("acme").await;
    let call = Call::new("acme").with_grant(json!({"approved": true}));

    let used = proceeded(rig.gate(&call).await);
    assert_eq!(used.status, ApprovalStatus::Used);
    assert_eq!(used.decided_by.as_deref(), Some("in-band"));
    assert!(used.decided_at.is_some());
    assert_eq!(used.invocation_id.as_str(), call.invocation_id);
    let (verb, announced) = next_event(&mut events).await;
    assert_eq!(
        (verb.as_str(), announced),
        ("decided", used.clone()),
        "decided, never requested"
    );

    assert_eq!(approval_of(&rig.get("acme", &used.id).await), used);
    assert!(ids_of(&rig.list("acme").await).is_empty());
    assert_eq!(
        rig.refused(&call.presenting(&used.id)).await,
        "approval_expired"
    );
}

#[actix_rt::test]
async fn rejected_on_the_first_call_is_refused() {
    let rig = Rig::start().await;
    let mut events = rig.events("acme").await;
    let call = Call::new("acme").with_grant(json!({"approved": false}));

    let (code, _, approval) = refusal(rig.gate(&call).await);
    assert_eq!(code, "approval_rejected");
    let approval = approval.expect("the rejected approval");
    assert_eq!(approval.status, ApprovalStatus::Rejected);
    assert_eq!(approval.decided_by.as_deref(), Some("in-band"));
    assert_eq!(
        next_event(&mut events).await,
        ("decided".into(), approval.clone())
    );
    assert_eq!(approval_of(&rig.get("acme", &approval.id).await), approval);
}

#[actix_rt::test]
async fn approved_with_an_id_decides_and_uses_it() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;
    let mut events = rig.events("acme").await;

    let used = proceeded(rig.gate(&call.deciding(&created.id, true)).await);
    assert_eq!(used.id, created.id);
    assert_eq!(used.status, ApprovalStatus::Used);
    assert_eq!(used.decided_by.as_deref(), Some("in-band"));
    assert_eq!(
        next_event(&mut events).await,
        ("decided".into(), used.clone())
    );

    // Used: repeating the same decision finds it used, the contrary one conflicts.
    for (approved, code) in [(true, "approval_expired"), (false, "conflict")] {
        assert_eq!(
            rig.refused(&call.deciding(&created.id, approved)).await,
            code,
            "approved: {approved}"
        );
    }
}

#[actix_rt::test]
async fn rejected_with_an_id_then_contrary_decisions_conflict() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;

    let (code, _, approval) = refusal(rig.gate(&call.deciding(&created.id, false)).await);
    assert_eq!(code, "approval_rejected");
    assert_eq!(
        approval.as_ref().map(|a| a.status),
        Some(ApprovalStatus::Rejected)
    );
    assert_eq!(
        approval.and_then(|a| a.decided_by).as_deref(),
        Some("in-band")
    );

    let refused = refused_status(rig.gate(&call.deciding(&created.id, true)).await);
    assert_eq!(refused, ("conflict".into(), Some(ApprovalStatus::Rejected)));
    assert_eq!(
        rig.refused(&call.deciding(&created.id, false)).await,
        "approval_rejected",
        "the same decision again is no conflict"
    );
    assert_eq!(rig.approving_refused(&created.id).await, "conflict");
}

#[actix_rt::test]
async fn in_band_contrary_to_an_out_of_band_decision_is_a_conflict() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;
    approval_of(&rig.decide("acme", &created.id, true, Some("alice")).await);

    let (code, message, approval) = refusal(rig.gate(&call.deciding(&created.id, false)).await);
    assert_eq!(code, "conflict");
    assert!(message.contains("alice"), "{message}");
    assert_eq!(approval.map(|a| a.status), Some(ApprovalStatus::Approved));

    let used = proceeded(rig.gate(&call.deciding(&created.id, true)).await);
    assert_eq!(
        used.decided_by.as_deref(),
        Some("alice"),
        "the first decision is the one on record"
    );
}

#[actix_rt::test]
async fn with_in_band_off_an_in_band_decision_counts_for_nothing() {
    let rig = Rig::with_config(config(3600, false)).await;
    let call = Call::new("acme");

    let created = match rig.gate(&call.with_grant(json!({"approved": true}))).await {
        GateOutcome::Required { approval, .. } => approval,
        other => panic!("expected a new pending approval, got {other:?}"),
    };
    assert_eq!(created.status, ApprovalStatus::Pending);

    for approved in [true, false] {
        assert_eq!(
            rig.refused(&call.deciding(&created.id, approved)).await,
            "approval_pending",
            "approved: {approved}"
        );
    }
    assert_eq!(
        rig.status("acme", &created.id).await,
        ApprovalStatus::Pending
    );

    approval_of(&rig.decide("acme", &created.id, true, None).await);
    let used = proceeded(rig.gate(&call.deciding(&created.id, false)).await);
    assert_eq!(used.decided_by.as_deref(), Some("anonymous"));
}
