//! `list` with more pending approvals than one reply holds: the reply lists what fits and says
//! `truncated: true`, and it is never larger than the server's `max_payload`.

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::Account;

use crate::support::*;

/// Creates `n` pending approvals in `account`, 64 gate requests at a time.
async fn create_many(rig: &Rig, account: &str, n: usize) {
    futures::stream::iter(0..n)
        .for_each_concurrent(64, |_| async {
            rig.create(&Call::new(account)).await;
        })
        .await;
}

/// The raw `list` reply: its size in bytes and its JSON.
async fn list_raw(rig: &Rig, account: &str) -> (usize, Value) {
    let subject = public::approvals(
        &Account::parse(account).unwrap(),
        public::ApprovalVerb::List,
    );
    let reply = tokio::time::timeout(PATIENCE, rig.client.request(subject, "{}".into()))
        .await
        .expect("a list reply within the patience")
        .expect("the list request is answered");
    let value = serde_json::from_slice(&reply.payload).expect("the list reply is JSON");
    (reply.payload.len(), value)
}

#[actix_rt::test]
async fn thousands_pending_are_listed_in_part_with_truncated() {
    // An account may have this many pending when its operator allows it.
    let rig = Rig::with_config(toolmesh_approval::ApprovalConfig {
        max_pending: 2000,
        ..config(3600, true)
    })
    .await;
    create_many(&rig, "acme", 1500).await;
    let (size, reply) = list_raw(&rig, "acme").await;
    let ids = ids_of(&reply);
    assert_eq!(
        reply["truncated"], true,
        "1500 pending do not fit one reply"
    );
    assert!(!ids.is_empty() && ids.len() < 1500, "{}", ids.len());
    assert!(size <= rig.client.server_info().max_payload, "{size} bytes");
    // Every one listed is a pending approval of the account.
    for id in ids.iter().take(20) {
        assert_eq!(rig.status("acme", id).await.as_str(), "pending");
    }
    // A short list is whole, without the flag.
    create_many(&rig, "globex", 3).await;
    let (_, short) = list_raw(&rig, "globex").await;
    assert_eq!(ids_of(&short).len(), 3);
    assert_eq!(short.get("truncated"), None, "{short}");
}

#[actix_rt::test]
async fn a_list_is_cut_to_a_small_max_payload() {
    let max_payload = 16 * 1024;
    let rig = Rig::with_max_payload(max_payload).await;
    assert_eq!(rig.client.server_info().max_payload, max_payload);
    create_many(&rig, "acme", 200).await;
    let (size, reply) = list_raw(&rig, "acme").await;
    assert!(size <= max_payload, "{size} bytes");
    assert_eq!(
        reply["truncated"],
        true,
        "{}",
        json!(reply["approvals"].as_array().map(Vec::len))
    );
    let listed = ids_of(&reply).len();
    assert!((1..200).contains(&listed), "{listed}");
}
