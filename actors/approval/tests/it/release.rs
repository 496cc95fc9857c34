//! Giving back a used approval whose call never ran (`toolmesh.internal.v1.approval.release`):
//! only the invocation that used it, only before its expiry, at most once under races; every
//! other release changes nothing.

use futures::future::join_all;
use serde_json::{json, Value};
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::{ApprovalRequest, ApprovalStatus, ReleaseAck};
use toolmesh_testkit::request_raw;

use crate::support::*;

/// Asks the approval actor to release `id` on behalf of `invocation` in `account`.
async fn release(rig: &Rig, account: &str, id: &str, invocation: &str) -> ReleaseAck {
    let reply = rig.on_behalf(internal::APPROVAL_RELEASE, account, id, invocation);
    wire(reply.await, serde_json::from_value)
}

/// A new approval for `call`, approved by alice, then used by the repeated call (a new
/// invocation presenting its id, as a caller does): the approval and that using call.
async fn approve_and_use(rig: &Rig, call: &Call) -> (ApprovalRequest, Call) {
    let created = rig.create(call).await;
    approval_of(&rig.decide("acme", &created.id, true, Some("alice")).await);
    let user = call.presenting(&created.id);
    let used = proceeded(rig.gate(&user).await);
    assert_eq!(used.status, ApprovalStatus::Used);
    (used, user)
}

/// `get` replies of `ids` in account acme, to compare before and after.
async fn snapshot(rig: &Rig, ids: &[&str]) -> Vec<Value> {
    let mut replies = Vec::with_capacity(ids.len());
    for id in ids {
        replies.push(rig.get("acme", id).await);
    }
    replies
}

/// Asserts that no `decided` event about anything arrives before a fresh marker's
/// `requested`: the releases before it announced nothing.
async fn assert_nothing_announced(rig: &Rig, events: &mut async_nats::Subscriber) {
    let marker = rig.create(&Call::new("acme")).await;
    let (verb, announced) = next_event(events).await;
    assert_eq!(
        (verb.as_str(), announced.id.as_str()),
        ("requested", marker.id.as_str()),
        "a refused release announces nothing"
    );
}

#[actix_rt::test]
async fn a_used_approval_released_by_its_call_is_approved_and_usable_again() {
    let rig = Rig::start().await;
    let (used, call) = approve_and_use(&rig, &Call::new("acme")).await;
    let mut events = rig.events("acme").await;

    let ack = release(&rig, "acme", &used.id, &call.invocation_id).await;
    assert!(ack.released, "{ack:?}");
    assert_eq!(ack.error, None);
    let released = ack.approval.expect("the released approval");
    assert_eq!(released.status, ApprovalStatus::Approved);
    assert_eq!(released.id, used.id);
    assert_eq!(
        released.decided_by.as_deref(),
        Some("alice"),
        "the decision stays on record"
    );
    assert_eq!(
        (released.decided_at.clone(), released.expires_at.clone()),
        (used.decided_at.clone(), used.expires_at.clone())
    );
    let why = "parked calls and watchers learn it is usable again";
    rig.assert_decided_as(&mut events, &released, why).await;

    // Released once: a second release by the same call finds it approved and changes nothing.
    let again = release(&rig, "acme", &used.id, &call.invocation_id).await;
    assert!(!again.released, "{again:?}");
    assert_eq!(again.error, None);
    assert_eq!(again.approval.as_ref(), Some(&released));

    // Usable once more, by a new call presenting the id, and then used for good.
    let retry = call.presenting(&used.id);
    let reused = proceeded(rig.gate(&retry).await);
    assert_eq!(reused.status, ApprovalStatus::Used);
    let (verb, announced) = next_event(&mut events).await;
    assert_eq!(
        (verb.as_str(), announced.status),
        ("decided", ApprovalStatus::Used)
    );
    assert_eq!(
        rig.refused(&call.presenting(&used.id)).await,
        "approval_expired"
    );
    // The first call can no longer give it back: the new one used it.
    let stale = release(&rig, "acme", &used.id, &call.invocation_id).await;
    assert!(!stale.released, "{stale:?}");
    assert_eq!(rig.status("acme", &used.id).await, ApprovalStatus::Used);
    // The new call can.
    assert!(
        release(&rig, "acme", &used.id, &retry.invocation_id)
            .await
            .released
    );
}

#[actix_rt::test]
async fn an_approval_approved_in_band_on_the_first_call_can_be_released_by_that_call() {
    let rig = Rig::start().await;
    let call = Call::new("acme").with_grant(json!({"approved": true}));
    let used = proceeded(rig.gate(&call).await);
    let ack = release(&rig, "acme", &used.id, &call.invocation_id).await;
    assert!(ack.released, "{ack:?}");
    assert_eq!(
        ack.approval.map(|a| (a.status, a.decided_by)),
        Some((ApprovalStatus::Approved, Some("in-band".to_owned())))
    );
    proceeded(rig.gate(&call.presenting(&used.id)).await);
}

#[actix_rt::test]
async fn a_release_changes_nothing_unless_the_using_call_asks() {
    let rig = Rig::start().await;
    let (used, call) = approve_and_use(&rig, &Call::new("acme")).await;

    let approved_call = Call::new("acme");
    let approved = rig.create_decided(&approved_call, true).await;
    let pending_call = Call::new("acme");
    let pending = rig.create(&pending_call).await;
    let rejected_call = Call::new("acme");
    let rejected = rig.create_decided(&rejected_call, false).await;

    let ids = [&*used.id, &*approved.id, &*pending.id, &*rejected.id];
    let before = snapshot(&rig, &ids).await;
    let mut events = rig.events("acme").await;

    for (what, account, id, invocation, exists) in [
        (
            "used by another invocation",
            "acme",
            &used.id,
            "inv-somebody-else",
            true,
        ),
        (
            "used, released from another account",
            "globex",
            &used.id,
            call.invocation_id.as_str(),
            false,
        ),
        (
            "approved but unused, by the call it was requested for",
            "acme",
            &approved.id,
            approved_call.invocation_id.as_str(),
            true,
        ),
        (
            "pending",
            "acme",
            &pending.id,
            pending_call.invocation_id.as_str(),
            true,
        ),
        (
            "rejected",
            "acme",
            &rejected.id,
            rejected_call.invocation_id.as_str(),
            true,
        ),
    ] {
        let ack = release(&rig, account, id, invocation).await;
        assert!(!ack.released, "{what}: {ack:?}");
        assert_eq!(ack.error, None, "{what}: a plain no, not a failure");
        assert_eq!(
            ack.approval.is_some(),
            exists,
            "{what}: another account's approval is not shown"
        );
    }
    let missing = release(
        &rig,
        "acme",
        "appr_ffffffffffffffffffffffffffffffff",
        "inv-1",
    )
    .await;
    assert_eq!(missing, ReleaseAck::judged(false, None));

    assert_eq!(before, snapshot(&rig, &ids).await, "nothing changed");
    assert_eq!(ids_of(&rig.list("acme").await), vec![pending.id.clone()]);
    assert_nothing_announced(&rig, &mut events).await;
    // The used one is still used: its call may not run twice.
    assert_eq!(
        rig.refused(&call.presenting(&used.id)).await,
        "approval_expired"
    );
}

#[actix_rt::test]
async fn an_expired_approval_is_not_released_and_a_released_one_expires_again() {
    let rig = Rig::with_config(config(2, true)).await;
    let mut events = rig.events("acme").await;

    // Released before its time: back in the sweeper's set, so it expires and is announced.
    let (released, call) = approve_and_use(&rig, &Call::new("acme")).await;
    assert!(
        release(&rig, "acme", &released.id, &call.invocation_id)
            .await
            .released
    );
    // Still used when its time passes: it stays used, and its call cannot give it back.
    let (late, late_call) = approve_and_use(&rig, &Call::new("acme")).await;
    // Created after both, so once it shows expired, both are past their time.
    let marker = rig.create(&Call::new("acme")).await;
    assert!(rig.shows_expired("acme", &marker.id).await);
    assert_eq!(
        rig.status("acme", &released.id).await,
        ApprovalStatus::Expired
    );
    let before = rig.get("acme", &late.id).await;
    let ack = release(&rig, "acme", &late.id, &late_call.invocation_id).await;
    assert!(!ack.released, "{ack:?}");
    assert_eq!(ack.approval.map(|a| a.status), Some(ApprovalStatus::Used));
    assert_eq!(rig.get("acme", &late.id).await, before);

    // The sweeper announces the released one's expiry (it was put back into its set).
    let expired = loop {
        let (verb, approval) = next_event(&mut events).await;
        if verb == "decided"
            && approval.id == released.id
            && approval.status == ApprovalStatus::Expired
        {
            break approval;
        }
    };
    assert_eq!(expired.decided_by.as_deref(), Some("alice"));
}

#[actix_rt::test]
async fn racing_releases_have_exactly_one_winner() {
    let rig = Rig::start().await;
    let second_node = rig.another_desk().await;
    let (used, call) = approve_and_use(&rig, &Call::new("acme")).await;
    let mut events = rig.events("acme").await;

    let acks =
        join_all((0..16).map(|_| release(&rig, "acme", &used.id, &call.invocation_id))).await;
    let winners = acks.iter().filter(|a| a.released).count();
    assert_eq!(winners, 1, "{acks:?}");
    assert!(acks.iter().all(|a| a.error.is_none()), "{acks:?}");
    assert_eq!(rig.status("acme", &used.id).await, ApprovalStatus::Approved);

    // Exactly one `decided` for it: a later marker event bounds the wait.
    let (verb, announced) = next_event(&mut events).await;
    assert_eq!(
        (verb.as_str(), announced.id.as_str(), announced.status),
        ("decided", used.id.as_str(), ApprovalStatus::Approved)
    );
    assert_nothing_announced(&rig, &mut events).await;
    second_node.stop().await;
}

#[actix_rt::test]
async fn malformed_releases_are_refused_with_a_reason() {
    let rig = Rig::start().await;
    for body in [
        &b""[..],
        b"nope",
        b"[]",
        br#"{"account":"acme","approval_id":"appr_1"}"#,
        br#"{"account":"a.b","approval_id":"appr_1","invocation_id":"inv-1"}"#,
        br#"{"account":"acme","approval_id":"appr:1","invocation_id":"inv-1"}"#,
        br#"{"account":"acme","approval_id":"appr_1","invocation_id":"a b"}"#,
    ] {
        let reply = request_raw(&rig.client, internal::APPROVAL_RELEASE, body.to_vec()).await;
        let ack: ReleaseAck = wire(reply, serde_json::from_value);
        assert!(!ack.released);
        assert_eq!(
            ack.error.map(|c| c.as_str()),
            Some("invalid_request"),
            "{}",
            String::from_utf8_lossy(body)
        );
        assert!(ack.error_message.is_some_and(|m| !m.is_empty()));
    }
}
