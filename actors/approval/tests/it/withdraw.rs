//! Withdrawing a pending approval whose caller cancelled the call waiting for it
//! (`toolmesh.internal.v1.approval.withdraw`): only the invocation that made it, only while it
//! is pending; every other withdrawal changes nothing.

use serde_json::json;
use toolmesh_approval::{WITHDRAWN_BY, WITHDRAWN_REASON};
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::{ApprovalStatus, WithdrawAck};
use toolmesh_testkit::{request_json, request_raw};

use crate::support::*;

/// Asks the approval actor to withdraw `id` on behalf of `invocation` in `account`.
async fn withdraw(rig: &Rig, account: &str, id: &str, invocation: &str) -> WithdrawAck {
    let reply = rig.on_behalf(internal::APPROVAL_WITHDRAW, account, id, invocation);
    wire(reply.await, serde_json::from_value)
}

#[actix_rt::test]
async fn a_pending_approval_withdrawn_by_the_call_that_made_it_is_rejected_and_announced() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;
    let mut events = rig.events("acme").await;

    // Another invocation (the same call repeated, presenting the id) cannot withdraw it, nor
    // can the call itself in another account.
    let other = call.presenting(&created.id);
    let refused = withdraw(&rig, "acme", &created.id, &other.invocation_id).await;
    assert!(!refused.withdrawn, "{refused:?}");
    assert_eq!(refused.error, None);
    assert_eq!(
        refused.approval.map(|a| a.status),
        Some(ApprovalStatus::Pending)
    );
    let elsewhere = withdraw(&rig, "other", &created.id, &call.invocation_id).await;
    assert_eq!((elsewhere.withdrawn, elsewhere.approval), (false, None));
    assert_eq!(
        rig.status("acme", &created.id).await,
        ApprovalStatus::Pending
    );

    let ack = withdraw(&rig, "acme", &created.id, &call.invocation_id).await;
    assert!(ack.withdrawn, "{ack:?}");
    let withdrawn = ack.approval.expect("the withdrawn approval");
    assert_eq!(withdrawn.status, ApprovalStatus::Rejected);
    assert_eq!(withdrawn.decided_by.as_deref(), Some(WITHDRAWN_BY));
    assert_eq!(withdrawn.reason.as_deref(), Some(WITHDRAWN_REASON));
    let why = "approvers and watchers learn it is gone";
    rig.assert_decided_as(&mut events, &withdrawn, why).await;
    // Decided now: approving it later is a conflict, and a call presenting it is rejected.
    assert_eq!(rig.approving_refused(&created.id).await, "conflict");
    assert_eq!(
        rig.refused(&call.presenting(&created.id)).await,
        "approval_rejected"
    );

    // Withdrawn once: again, it is no longer pending and nothing changes.
    let again = withdraw(&rig, "acme", &created.id, &call.invocation_id).await;
    assert!(!again.withdrawn, "{again:?}");
    assert_eq!(again.approval.as_ref(), Some(&withdrawn));
}

#[actix_rt::test]
async fn a_decision_that_came_first_stands() {
    let rig = Rig::start().await;
    for approved in [true, false] {
        let (call, created) = rig.decided_call(approved).await;
        let ack = withdraw(&rig, "acme", &created.id, &call.invocation_id).await;
        assert!(!ack.withdrawn, "{ack:?}");
        let approval = ack.approval.expect("the approval as it is");
        let expect = if approved {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Rejected
        };
        assert_eq!(approval.status, expect);
        assert_ne!(approval.reason.as_deref(), Some(WITHDRAWN_REASON));
    }
}

#[actix_rt::test]
async fn malformed_withdrawals_are_refused_without_a_change() {
    let rig = Rig::start().await;
    let (call, created) = rig.pending_call().await;
    for body in [
        json!({"account": "acme", "approval_id": "appr:1", "invocation_id": call.invocation_id}),
        json!({"account": "a.b", "approval_id": created.id, "invocation_id": call.invocation_id}),
        json!({"account": "acme", "approval_id": created.id}),
    ] {
        let reply = request_json(&rig.client, internal::APPROVAL_WITHDRAW, body).await;
        let refused: WithdrawAck = wire(reply, serde_json::from_value);
        assert_eq!((refused.withdrawn, refused.approval), (false, None));
        assert_eq!(
            refused.error.map(|c| c.as_str()),
            Some("invalid_request"),
            "{:?}",
            refused.error_message
        );
    }
    let reply = request_raw(&rig.client, internal::APPROVAL_WITHDRAW, b"[]".to_vec()).await;
    let refused: WithdrawAck = wire(reply, serde_json::from_value);
    assert!(!refused.withdrawn);
    assert_eq!(
        rig.status("acme", &created.id).await,
        ApprovalStatus::Pending
    );
}
