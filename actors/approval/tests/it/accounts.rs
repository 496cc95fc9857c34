//! The account boundary: another account's approval is indistinguishable from a missing one.

use serde_json::{json, Value};
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

    let mut foreign_call = call.with_grant(json!({"id": created.id, "approved": true}));
    foreign_call.account = "globex".into();
    let (code, _, approval) = refusal(rig.gate(&foreign_call).await);
    assert_eq!(code, "not_found");
    assert_eq!(approval, None);

    assert_eq!(
        status_of(&rig.get("acme", &created.id).await),
        ApprovalStatus::Pending
    );
    assert_eq!(ids_of(&rig.list("acme").await), vec![created.id]);
}
