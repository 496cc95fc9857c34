//! Decisions and uses racing each other, through two approval nodes on one Redis: the scripts,
//! not the actors, make them atomic.

use futures::future::join_all;
use toolmesh_kernel::wire::{ApprovalStatus, GateOutcome};

use crate::support::*;

/// A rig and a second approval node on its NATS and Redis.
async fn two_nodes() -> (Rig, Desk) {
    let rig = Rig::start().await;
    let second_node = rig.another_desk().await;
    (rig, second_node)
}

#[actix_rt::test]
async fn racing_decisions_have_exactly_one_winner() {
    let (rig, second_node) = two_nodes().await;
    let created = rig.create(&Call::new("acme")).await;
    let mut events = rig.events("acme").await;

    let replies = join_all((0..20).map(|i| {
        let approver = format!("approver-{i}");
        let id = created.id.clone();
        let rig = &rig;
        async move {
            (
                i % 2 == 0,
                rig.decide("acme", &id, i % 2 == 0, Some(&approver)).await,
            )
        }
    }))
    .await;

    let winner = approval_of(&rig.get("acme", &created.id).await);
    let approved = winner.status == ApprovalStatus::Approved;
    assert!(
        approved || winner.status == ApprovalStatus::Rejected,
        "{winner:?}"
    );
    for (wanted, reply) in &replies {
        if *wanted == approved {
            assert_eq!(
                approval_of(reply),
                winner,
                "same-side decisions see the winner"
            );
        } else {
            assert_eq!(error_of(reply), "conflict", "{reply}");
        }
    }

    // Exactly one `decided` for it: a later marker event bounds the wait.
    let marker = rig.create(&Call::new("acme")).await;
    let mut decided = Vec::new();
    loop {
        let (verb, approval) = next_event(&mut events).await;
        if approval.id == marker.id {
            break;
        }
        assert_eq!(verb, "decided");
        decided.push(approval);
    }
    assert_eq!(decided, vec![winner]);
    second_node.stop().await;
}

#[actix_rt::test]
async fn racing_uses_have_exactly_one_proceed() {
    let (rig, second_node) = two_nodes().await;
    let (call, created) = rig.decided_call(true).await;

    let outcomes = rig
        .gate_all((0..12).map(|_| call.presenting(&created.id)))
        .await;
    let mut proceeds = 0;
    for outcome in outcomes {
        match outcome {
            GateOutcome::Proceed { approval, .. } => {
                proceeds += 1;
                assert_eq!(approval.status, ApprovalStatus::Used);
            }
            other => assert_eq!(refusal(other).0, "approval_expired"),
        }
    }
    assert_eq!(proceeds, 1);
    second_node.stop().await;
}

#[actix_rt::test]
async fn racing_in_band_decisions_run_at_most_one_call_and_never_both_ways() {
    let (rig, second_node) = two_nodes().await;
    let (call, created) = rig.pending_call().await;

    let outcomes = rig
        .gate_all((0..16).map(|i| call.deciding(&created.id, i % 2 == 0)))
        .await;
    let mut codes = Vec::new();
    let mut proceeds = 0;
    for outcome in outcomes {
        match outcome {
            GateOutcome::Proceed { .. } => proceeds += 1,
            other => codes.push(refusal(other).0),
        }
    }
    let count = |code: &str| codes.iter().filter(|c| *c == code).count();
    let final_status = rig.status("acme", &created.id).await;
    if final_status == ApprovalStatus::Used {
        // Approval won: one call ran, the other approvers found it used, rejecters conflict.
        assert_eq!(
            (proceeds, count("approval_expired"), count("conflict")),
            (1, 7, 8),
            "{codes:?}"
        );
    } else {
        assert_eq!(final_status, ApprovalStatus::Rejected);
        assert_eq!(
            (proceeds, count("approval_rejected"), count("conflict")),
            (0, 8, 8),
            "{codes:?}"
        );
    }
    second_node.stop().await;
}
