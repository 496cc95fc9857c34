//! Expiry by Redis time: an expired approval cannot be decided or used, is not listed, and the
//! sweeper announces it once.

use toolmesh_kernel::wire::ApprovalStatus;

use crate::support::*;

#[actix_rt::test]
async fn a_pending_approval_expires_after_its_ttl() {
    let rig = Rig::with_config(config(1, true)).await;
    let mut events = rig.events("acme").await;
    let (call, created) = rig.pending_call().await;
    assert_eq!(next_event(&mut events).await.0, "requested");

    assert!(
        rig.shows_expired("acme", &created.id).await,
        "the approval shows expired once its time is past"
    );
    assert_eq!(rig.approving_refused(&created.id).await, "approval_expired");
    assert!(ids_of(&rig.list("acme").await).is_empty());
    let refused = refused_status(rig.gate(&call.presenting(&created.id)).await);
    assert_eq!(
        refused,
        ("approval_expired".into(), Some(ApprovalStatus::Expired))
    );
    assert_eq!(
        rig.refused(&call.deciding(&created.id, true)).await,
        "approval_expired",
        "an expired approval cannot be decided in band either"
    );

    let (verb, announced) = next_event(&mut events).await;
    assert_eq!(
        (verb.as_str(), announced.id.as_str()),
        ("decided", created.id.as_str())
    );
    assert_eq!(announced.status, ApprovalStatus::Expired);
    assert_eq!(announced.decided_by, None);
    assert_eq!(approval_of(&rig.get("acme", &created.id).await), announced);
}

#[actix_rt::test]
async fn an_approved_but_unused_approval_expires_too() {
    let rig = Rig::with_config(config(1, true)).await;
    let (call, created) = rig.decided_call(true).await;
    let mut events = rig.events("acme").await;

    let (verb, announced) = next_event(&mut events).await;
    assert_eq!(
        (verb.as_str(), announced.status),
        ("decided", ApprovalStatus::Expired)
    );
    assert_eq!(
        announced.decided_by.as_deref(),
        Some("anonymous"),
        "the decision stays on record"
    );
    assert_eq!(
        rig.refused(&call.presenting(&created.id)).await,
        "approval_expired"
    );
    assert_eq!(rig.approving_refused(&created.id).await, "approval_expired");
}

#[actix_rt::test]
async fn rejected_and_used_approvals_keep_their_status_past_the_ttl() {
    let rig = Rig::with_config(config(1, true)).await;
    let call = Call::new("acme");
    let rejected = rig.create_decided(&call, false).await;
    let used = rig.create_decided(&call, true).await;
    proceeded(rig.gate(&call.presenting(&used.id)).await);
    // A third one marks the passing of the TTL for the other two.
    let marker = rig.create(&call).await;
    assert!(rig.shows_expired("acme", &marker.id).await);
    assert_eq!(
        rig.status("acme", &rejected.id).await,
        ApprovalStatus::Rejected
    );
    assert_eq!(rig.status("acme", &used.id).await, ApprovalStatus::Used);
    assert_eq!(
        rig.refused(&call.presenting(&rejected.id)).await,
        "approval_rejected"
    );
    // The first-decision rule still holds for them.
    for (which, id, outcome) in [
        ("rejected", &rejected.id, Ok(ApprovalStatus::Rejected)),
        ("used", &used.id, Err("conflict".to_owned())),
    ] {
        assert_eq!(
            rig.decision("acme", id, false).await,
            outcome,
            "{which}: rejected again"
        );
    }
}
