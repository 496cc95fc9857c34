//! The account boundary: another account's approval is indistinguishable from a missing one.

use serde_json::{json, Value};
use toolmesh_approval::ApprovalConfig;
use toolmesh_kernel::wire::ApprovalStatus;

use crate::support::*;

/// The failure reply with the id taken out, to compare two not_found answers.
fn without_id(reply: &Value, id: &str) -> String {
    reply.to_string().replace(id, "<id>")
}

#[actix_rt::test]
async fn another_account_cannot_see_decide_list_or_use_an_approval() {
    let rig = Rig::start().await;
    let call = Call::new("acme");
    let created = rig.create(&call).await;
    let missing = "appr_ffffffffffffffffffffffffffffffff";

    let foreign_get = rig.get("globex", &created.id).await;
    assert_eq!(error_of(&foreign_get), "not_found");
    assert_eq!(
        without_id(&foreign_get, &created.id),
        without_id(&rig.get("globex", missing).await, missing),
        "another account's id answers exactly as a missing one"
    );
    let foreign_decide = rig.decide("globex", &created.id, true, None).await;
    assert_eq!(error_of(&foreign_decide), "not_found");
    assert_eq!(
        without_id(&foreign_decide, &created.id),
        without_id(&rig.decide("globex", missing, true, None).await, missing)
    );
    assert!(ids_of(&rig.list("globex").await).is_empty());

    let mut foreign_call = call.deciding(&created.id, true);
    foreign_call.account = "globex".into();
    let refused = refused_status(rig.gate(&foreign_call).await);
    assert_eq!(refused, ("not_found".into(), None));

    assert_eq!(
        rig.status("acme", &created.id).await,
        ApprovalStatus::Pending
    );
    assert_eq!(ids_of(&rig.list("acme").await), vec![created.id]);
}

/// One account cannot bury the approvers or fill Redis for every tenant: past
/// `max_pending` a gated call creates nothing and is `limit_exceeded`; other accounts and
/// decided approvals are unaffected.
#[actix_rt::test]
async fn an_accounts_waiting_room_is_bounded() {
    let rig = Rig::with_config(ApprovalConfig {
        max_pending: 3,
        ..config(3600, true)
    })
    .await;
    let mut pending = Vec::new();
    for _ in 0..3 {
        pending.push(rig.create(&Call::new("acme")).await.id);
    }
    let (code, message, approval) = refusal(rig.gate(&Call::new("acme")).await);
    assert_eq!(code, "limit_exceeded", "{message}");
    assert!(
        message.contains("TOOLMESH_APPROVAL_MAX_PENDING"),
        "{message}"
    );
    assert_eq!(approval, None);
    assert_eq!(
        ids_of(&rig.list("acme").await).len(),
        3,
        "nothing was created"
    );

    // An in-band decision on a first call never waits: it is not held to the cap.
    let decided = call_with_in_band_approval("acme");
    proceeded(rig.gate(&decided).await);
    // Another account's room is its own.
    rig.create(&Call::new("globex")).await;
    // A decision makes room.
    let reply = rig.decide("acme", &pending[0], false, None).await;
    assert_eq!(reply["ok"], true, "{reply}");
    rig.create(&Call::new("acme")).await;
}

fn call_with_in_band_approval(account: &str) -> Call {
    let mut call = Call::new(account);
    call.grant = Some(json!({"approved": true}));
    call
}
