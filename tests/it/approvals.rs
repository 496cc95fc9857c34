//! Risk and approval, end to end: envelope, out-of-band and in-band decisions, parking,
//! binding, single use, races, expiry, account isolation, durability.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::wait_until;

use crate::support::{assert_error, collect, ok, policy_file, Cluster, GATED_STATUS};

/// A cluster whose `component_status` needs approval (strict mode, risk high).
async fn gated(extra: &[(&str, &str)]) -> (Cluster, tempfile::TempDir) {
    let (dir, path) = policy_file(GATED_STATUS);
    let mut env = vec![("TOOLMESH_POLICY_FILE", path.as_str())];
    env.extend_from_slice(extra);
    (Cluster::with_env(&env).await, dir)
}

fn status_call(session: &str) -> Value {
    json!({"tool": "component_status", "session_id": session})
}

fn with_approval(mut body: Value, approval: Value) -> Value {
    body["approval"] = approval;
    body
}

/// `component_status` in `session` of `account` with `approval`.
async fn status_with(c: &Cluster, account: &str, session: &str, approval: Value) -> Value {
    c.call(account, with_approval(status_call(session), approval))
        .await
}

async fn request_approval(c: &Cluster, account: &str, body: Value) -> Value {
    let reply = c.call(account, body).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    reply["approval_request"].clone()
}

/// The id of the approval that `body` (a gated call of `account`, made without one) requests.
async fn approval_id(c: &Cluster, account: &str, body: Value) -> String {
    let requested = request_approval(c, account, body).await;
    requested["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_envelope_is_exact_and_the_request_is_announced() {
    let (c, _policy) = gated(&[]).await;
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let reply = c
        .call(
            "acme",
            json!({"tool": "component_status", "session_id": "s1", "invocation_id": "inv-a1"}),
        )
        .await;
    assert_eq!(reply["ok"], false);
    assert_eq!(reply["type"], "approval_required");
    assert_eq!(reply["approval_required"], true);
    assert_eq!(reply["error"], "approval_required");
    assert_eq!(reply["invocation_id"], "inv-a1");
    assert!(reply["error_message"].as_str().unwrap().contains("approve"));
    let a = &reply["approval_request"];
    assert!(a["id"].as_str().unwrap().starts_with("appr_"));
    assert_eq!(a["account"], "acme");
    assert_eq!(a["session_id"], "s1");
    assert_eq!(a["invocation_id"], "inv-a1");
    assert_eq!(a["tool_name"], "component_status");
    assert_eq!(a["risk_level"], "high");
    assert_eq!(a["side_effects"], json!([]));
    // sha256 of the JCS form of {} (the arguments as sent: defaulted to an empty object)
    assert_eq!(
        a["arguments_sha256"],
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    assert_eq!(a["status"], "pending");
    for key in ["decided_by", "decided_at", "reason"] {
        assert_eq!(a[key], Value::Null, "{key}");
    }
    assert!(a["created_at"].as_str().unwrap().ends_with('Z'));
    assert!(a["expires_at"].as_str().unwrap() > a["created_at"].as_str().unwrap());
    let announced = collect(&mut requested, 1, Duration::from_secs(5)).await;
    assert_eq!(announced[0]["id"], a["id"]);

    let listed = c.approvals("acme", "list", json!({})).await;
    assert_eq!(listed["approvals"][0]["id"], a["id"]);
}

#[tokio::test]
async fn approve_out_of_band_then_the_call_runs_once() {
    let (c, _policy) = gated(&[]).await;
    let id = &approval_id(&c, "acme", status_call("s1")).await;

    let pending = status_with(&c, "acme", "s1", json!({"id": id})).await;
    assert_eq!(pending["error"], "approval_pending", "{pending}");

    let mut decided = c.watch("toolmesh.v1.approvals.acme.decided").await;
    let d = ok(c.decide("acme", id, true).await);
    assert_eq!(d["approval"]["status"], "approved");
    assert_eq!(d["approval"]["decided_by"], "alice");
    assert_eq!(d["approval"]["reason"], "test");
    assert!(d["approval"]["decided_at"].as_str().unwrap().ends_with('Z'));
    let events = collect(&mut decided, 1, Duration::from_secs(5)).await;
    assert_eq!(events[0]["status"], "approved");

    let mut run_events = c.watch("toolmesh.v1.events.acme.inv-run1").await;
    let mut body = with_approval(status_call("s1"), json!({"id": id}));
    body["invocation_id"] = json!("inv-run1");
    let ran = ok(c.call("acme", body).await);
    assert!(ran["summary"].is_object());
    let kinds: Vec<String> = collect(&mut run_events, 3, Duration::from_secs(5))
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["started", "approved", "finished"]);

    let again = status_with(&c, "acme", "s1", json!({"id": id})).await;
    assert_eq!(again["error"], "approval_expired", "{again}");
    assert_eq!(c.approval_status("acme", id).await, "used");
    // Decisions on a used approval still follow the first decision.
    assert_eq!(c.decide("acme", id, true).await["ok"], true);
    assert_eq!(c.decide("acme", id, false).await["error"], "conflict");
}

#[tokio::test]
async fn rejection_and_conflicting_decisions() {
    let (c, _policy) = gated(&[]).await;
    let id = &approval_id(&c, "acme", status_call("s1")).await;
    assert_eq!(
        c.decide("acme", id, false).await["approval"]["status"],
        "rejected"
    );
    assert_eq!(c.decide("acme", id, false).await["ok"], true);
    assert_eq!(c.decide("acme", id, true).await["error"], "conflict");
    let reply = status_with(&c, "acme", "s1", json!({"id": id})).await;
    assert_eq!(reply["error"], "approval_rejected", "{reply}");
    let listed = c.approvals("acme", "list", json!({})).await;
    assert_eq!(listed["approvals"], json!([]));
}

#[tokio::test]
async fn an_approval_is_bound_to_session_tool_and_arguments() {
    let (dir, path) = policy_file(
        "[tools.component_status]\nrisk_level = \"high\"\n[tools.tool_search]\nrisk_level = \"high\"\n",
    );
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let search = |q: &str, session: &str| json!({"tool": "tool_search", "session_id": session, "arguments": {"query": q}});
    let id = &approval_id(&c, "acme", search("read", "s1")).await;
    c.decide("acme", id, true).await;
    for other in [
        search("write", "s1"),
        search("read", "s2"),
        status_call("s1"),
        json!({"tool": "tool_search", "arguments": {"query": "read"}}),
    ] {
        let reply = c
            .call("acme", with_approval(other.clone(), json!({"id": id})))
            .await;
        assert_eq!(reply["error"], "approval_mismatch", "{other}: {reply}");
    }
    // Still usable for the call it was granted for; key order does not matter (JCS).
    let same = json!({"tool": "tool_search", "session_id": "s1", "arguments": {"query": "read"}});
    ok(c.call("acme", with_approval(same, json!({"id": id}))).await);
    drop(dir);
}

#[tokio::test]
async fn racing_decisions_have_one_winner_and_the_tool_runs_once() {
    let (c, _policy) = gated(&[]).await;
    let id = approval_id(&c, "acme", status_call("s1")).await;
    let decisions = futures::future::join_all((0..20).map(|i| {
        let c = &c;
        let id = id.clone();
        async move { c.decide("acme", &id, i % 2 == 0).await }
    }))
    .await;
    let winners: Vec<bool> = decisions
        .iter()
        .filter(|d| d["ok"] == true)
        .map(|d| d["approval"]["status"] == "approved")
        .collect();
    let conflicts = decisions
        .iter()
        .filter(|d| d["error"] == "conflict")
        .count();
    assert_eq!(winners.len() + conflicts, 20, "{decisions:?}");
    // Every ok reply agrees on one outcome; every contrary one is a conflict.
    assert!(winners.iter().all(|w| *w == winners[0]));
    assert_eq!(winners.len(), 10);

    let id2 = approval_id(&c, "acme", status_call("s2")).await;
    c.decide("acme", &id2, true).await;
    let calls = futures::future::join_all((0..10).map(|_| {
        let c = &c;
        let body = with_approval(status_call("s2"), json!({"id": id2}));
        async move { c.call("acme", body).await }
    }))
    .await;
    let ran = calls.iter().filter(|r| r["ok"] == true).count();
    let refused = calls
        .iter()
        .filter(|r| r["error"] == "approval_expired")
        .count();
    assert_eq!((ran, refused), (1, 9), "{calls:?}");
}

#[tokio::test]
async fn accounts_cannot_see_or_decide_each_others_approvals() {
    let (c, _policy) = gated(&[]).await;
    let id = &approval_id(&c, "acme", status_call("s1")).await;
    assert_eq!(
        c.approvals("evil", "list", json!({})).await["approvals"],
        json!([])
    );
    assert_eq!(
        c.approvals("evil", "get", json!({"id": id})).await["error"],
        "not_found"
    );
    assert_eq!(c.decide("evil", id, true).await["error"], "not_found");
    let reply = status_with(&c, "evil", "s1", json!({"id": id})).await;
    assert_eq!(reply["error"], "not_found", "{reply}");
    let reply = status_with(&c, "evil", "s1", json!({"id": id, "approved": true})).await;
    assert_eq!(reply["error"], "not_found", "{reply}");
    // Still pending for its own account.
    assert_eq!(c.approval_status("acme", id).await, "pending");
}

#[tokio::test]
async fn in_band_decisions() {
    let (c, _policy) = gated(&[]).await;
    // Created and decided in one step.
    ok(status_with(&c, "acme", "s1", json!({"approved": true})).await);
    let reply = status_with(&c, "acme", "s1", json!({"approved": false})).await;
    assert_eq!(reply["error"], "approval_rejected", "{reply}");
    assert_eq!(reply["approval_request"]["decided_by"], "in-band");

    // With an id: approve in band, then it is used.
    let id = &approval_id(&c, "acme", status_call("s2")).await;
    ok(status_with(&c, "acme", "s2", json!({"id": id, "approved": true})).await);
    let got = c.approvals("acme", "get", json!({"id": id})).await;
    assert_eq!(got["approval"]["status"], "used");
    assert_eq!(got["approval"]["decided_by"], "in-band");

    // Contrary to an earlier decision: conflict.
    let bid = &approval_id(&c, "acme", status_call("s3")).await;
    c.decide("acme", bid, false).await;
    let reply = status_with(&c, "acme", "s3", json!({"id": bid, "approved": true})).await;
    assert_eq!(reply["error"], "conflict", "{reply}");
}

#[tokio::test]
async fn in_band_can_be_switched_off() {
    let (c, _policy) = gated(&[("TOOLMESH_APPROVAL_IN_BAND", "0")]).await;
    let reply = status_with(&c, "acme", "s1", json!({"approved": true})).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    // The caller hears why its in-band decision did nothing.
    let says_why = |reply: &serde_json::Value| {
        let message = reply["error_message"].as_str().unwrap_or_default();
        message.contains("TOOLMESH_APPROVAL_IN_BAND=0")
            && message.contains("toolmesh.v1.approvals.acme.decide")
    };
    assert!(says_why(&reply), "{reply}");
    let id = reply["approval_request"]["id"].as_str().unwrap();
    let reply = status_with(&c, "acme", "s1", json!({"id": id, "approved": true})).await;
    assert_eq!(reply["error"], "approval_pending", "{reply}");
    assert!(says_why(&reply), "{reply}");
    // Without an in-band decision there is nothing to explain.
    let reply = c.call("acme", status_call("s1")).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    assert!(!says_why(&reply), "{reply}");
    assert_eq!(c.approval_status("acme", id).await, "pending");
}

#[tokio::test]
async fn a_parked_call_runs_when_approved_from_another_client() {
    let (c, _policy) = gated(&[]).await;
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let mut body = status_call("s1");
    body["wait_for_approval_s"] = json!(60);
    let parked = c.call_in_background("acme", body);
    let announced = collect(&mut requested, 1, Duration::from_secs(5)).await;
    let id = announced[0]["id"].as_str().unwrap().to_owned();
    // The approver is another connection.
    let approver = c.nats.client().await;
    let decided = toolmesh_testkit::request_json(
        &approver,
        "toolmesh.v1.approvals.acme.decide",
        json!({"id": id, "approved": true, "approver": "bob"}),
    )
    .await;
    assert_eq!(decided["ok"], true);
    let reply = ok(tokio::time::timeout(Duration::from_secs(10), parked)
        .await
        .unwrap()
        .unwrap());
    assert!(reply["summary"].is_object());
    assert_eq!(c.approval_status("acme", &id).await, "used");
}

#[tokio::test]
async fn a_parked_call_is_rejected_times_out_or_is_cancelled() {
    let (c, _policy) = gated(&[]).await;
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let park = |session: &str, wait: u64, inv: &str| {
        let body = json!({"tool": "component_status", "session_id": session,
                          "wait_for_approval_s": wait, "invocation_id": inv});
        c.call_in_background("acme", body)
    };
    // Rejected.
    let parked = park("s1", 60, "inv-p1");
    let id = collect(&mut requested, 1, Duration::from_secs(5)).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    c.decide("acme", &id, false).await;
    let reply = parked.await.unwrap();
    assert_eq!(reply["error"], "approval_rejected", "{reply}");

    // The wait runs out: approval_pending with the request, still pending.
    let reply = park("s2", 1, "inv-p2").await.unwrap();
    assert_eq!(reply["error"], "approval_pending", "{reply}");
    assert_eq!(reply["approval_request"]["status"], "pending");
    let _ = collect(&mut requested, 1, Duration::from_secs(1)).await;

    // Cancelled through toolmesh.v1.cancel.
    let parked = park("s3", 60, "inv-p3");
    collect(&mut requested, 1, Duration::from_secs(5)).await;
    // Another account naming the same invocation id reaches nothing.
    let foreign = c.cancel("evil", json!({"invocation_id": "inv-p3"})).await;
    assert_eq!(foreign, json!({"ok": true, "cancelled": false}));
    assert!(
        !parked.is_finished(),
        "a foreign cancel must not end the call"
    );
    // A body with more than the id (a reply, an event) is no cancel.
    let loose = c
        .cancel(
            "acme",
            json!({"ok": true, "invocation_id": "inv-p3", "tool": "component_status"}),
        )
        .await;
    assert_eq!(loose["error"], "invalid_request", "{loose}");
    assert!(!parked.is_finished(), "a loose body must not end the call");
    let cancel = c.cancel("acme", json!({"invocation_id": "inv-p3"})).await;
    assert_eq!(cancel, json!({"ok": true, "cancelled": true}));
    let reply = parked.await.unwrap();
    assert_eq!(reply["error"], "cancelled", "{reply}");

    // Nothing runs under that id any more; bad bodies.
    let again = c.cancel("acme", json!({"invocation_id": "inv-p3"})).await;
    assert_eq!(again, json!({"ok": true, "cancelled": false}));
    let bad = c.cancel("acme", json!({"invocation_id": "a b"})).await;
    assert_eq!(bad["error"], "invalid_request");
    let bad =
        toolmesh_testkit::request_raw(&c.client, "toolmesh.v1.cancel.acme", b"nope".to_vec()).await;
    assert_eq!(bad["error"], "invalid_request");
}

/// A parked call its caller cancels withdraws the approval it made: rejected, reason
/// `withdrawn`, announced on `…decided`. A call of another invocation waiting on that approval
/// withdraws nothing when it is cancelled.
#[tokio::test]
async fn a_cancelled_parked_call_withdraws_the_approval_it_made() {
    let (c, _policy) = gated(&[]).await;
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let mut decided = c.watch("toolmesh.v1.approvals.acme.decided").await;
    let maker = c.call_in_background(
        "acme",
        json!({"tool": "component_status", "session_id": "s1",
               "wait_for_approval_s": 60, "invocation_id": "inv-w1"}),
    );
    let id = collect(&mut requested, 1, Duration::from_secs(5)).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The same call again, presenting the approval: it waits on it too.
    let presenter = c.call_in_background(
        "acme",
        json!({"tool": "component_status", "session_id": "s1", "approval": {"id": id},
               "wait_for_approval_s": 60, "invocation_id": "inv-w2"}),
    );
    let parked = wait_until(Duration::from_secs(10), || async {
        c.cancel("acme", json!({"invocation_id": "inv-w2"})).await["cancelled"] == true
    })
    .await;
    assert!(parked, "the presenting call parks and is cancelled");
    let reply = presenter.await.unwrap();
    assert_eq!(reply["error"], "cancelled", "{reply}");
    assert_eq!(reply["approval_withdrawn"], false, "{reply}");
    assert_eq!(c.approval_status("acme", &id).await, "pending");
    assert!(!maker.is_finished(), "the call that made it still waits");

    let cancel = c.cancel("acme", json!({"invocation_id": "inv-w1"})).await;
    assert_eq!(cancel, json!({"ok": true, "cancelled": true}));
    let reply = maker.await.unwrap();
    assert_eq!(reply["error"], "cancelled", "{reply}");
    assert_eq!(reply["approval_withdrawn"], true, "{reply}");
    let got = c.approvals("acme", "get", json!({"id": id})).await;
    let approval = &got["approval"];
    assert_eq!(approval["status"], "rejected", "{got:#}");
    assert_eq!(approval["reason"], "withdrawn", "{got:#}");
    assert_eq!(approval["decided_by"], "caller", "{got:#}");
    let events = collect(&mut decided, 1, Duration::from_secs(5)).await;
    assert_eq!(
        (&events[0]["id"], &events[0]["status"], &events[0]["reason"]),
        (&json!(id), &json!("rejected"), &json!("withdrawn")),
        "{events:?}"
    );
    assert_eq!(
        c.decide("acme", &id, true).await["error"],
        "conflict",
        "an approver can no longer approve it"
    );
}

#[tokio::test]
async fn approvals_expire() {
    let (c, _policy) = gated(&[("TOOLMESH_APPROVAL_TTL_S", "1")]).await;
    let mut decided = c.watch("toolmesh.v1.approvals.acme.decided").await;
    let id = &approval_id(&c, "acme", status_call("s1")).await;
    let expired = wait_until(Duration::from_secs(10), || async {
        c.approvals("acme", "get", json!({"id": id})).await["approval"]["status"] == "expired"
    })
    .await;
    assert!(expired);
    assert_eq!(
        c.decide("acme", id, true).await["error"],
        "approval_expired"
    );
    assert_eq!(
        c.approvals("acme", "list", json!({})).await["approvals"],
        json!([])
    );
    let reply = status_with(&c, "acme", "s1", json!({"id": id})).await;
    assert_eq!(reply["error"], "approval_expired");
    let events = collect(&mut decided, 1, Duration::from_secs(5)).await;
    assert_eq!(events[0]["status"], "expired", "{events:?}");
}

#[tokio::test]
async fn modes_and_per_account_policy() {
    let (dir, path) = policy_file(
        "mode = \"standard\"\n[accounts.lax]\nmode = \"off\"\n[accounts.tight]\nmode = \"strict\"\n[tools.component_status]\nrisk_level = \"medium\"\n",
    );
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    // standard: medium runs; strict account: medium needs approval; off: even run_command is
    // let through to its actor (which is not running here, so: unavailable, not approval).
    assert_eq!(c.call("std", status_call("s1")).await["ok"], true);
    assert_eq!(
        c.call("tight", status_call("s1")).await["error"],
        "approval_required"
    );
    let run = json!({"tool": "run_command", "session_id": "s1", "arguments": {"command": "true"}});
    assert_eq!(c.call("lax", run.clone()).await["error"], "unavailable");
    assert_eq!(c.call("std", run).await["error"], "approval_required");
    drop(dir);

    let c = Cluster::ungated("gateway,approval").await;
    let run =
        json!({"tool": "delete_workspace_file", "session_id": "s1", "arguments": {"path": "x"}});
    assert_eq!(c.call("acme", run).await["error"], "unavailable");
}

#[tokio::test]
async fn garbage_on_the_approvals_subjects() {
    let c = Cluster::start().await;
    for (verb, body) in [
        ("list", b"[]".to_vec()),
        ("list", b"nope".to_vec()),
        ("get", b"{}".to_vec()),
        ("get", b"{\"id\": 5}".to_vec()),
        ("decide", b"{\"id\": \"appr_x\"}".to_vec()),
        (
            "decide",
            b"{\"id\": \"appr_x\", \"approved\": \"yes\"}".to_vec(),
        ),
        ("decide", b"".to_vec()),
    ] {
        let reply = toolmesh_testkit::request_raw(
            &c.client,
            format!("toolmesh.v1.approvals.acme.{verb}"),
            body,
        )
        .await;
        assert_eq!(reply["error"], "invalid_request", "{verb}: {reply}");
    }
    let reply = c
        .approvals("acme", "get", json!({"id": "appr_doesnotexist"}))
        .await;
    assert_eq!(reply["error"], "not_found");
}

#[tokio::test]
async fn a_pending_approval_survives_a_restart_of_every_node() {
    let (mut c, _policy) = gated(&[]).await;
    let env_path = _policy.path().join("policy.toml").display().to_string();
    let id = approval_id(&c, "acme", status_call("s1")).await;
    for node in &mut c.nodes {
        node.kill();
    }
    c.nodes.clear();
    c.start_node(
        "gateway,approval",
        &[("TOOLMESH_POLICY_FILE", env_path.as_str())],
    )
    .await;
    let got = c.approvals("acme", "get", json!({"id": id})).await;
    assert_eq!(got["approval"]["status"], "pending", "{got}");
    c.decide("acme", &id, true).await;
    ok(status_with(&c, "acme", "s1", json!({"id": id})).await);
}

#[tokio::test]
async fn calls_without_approval_do_not_touch_redis() {
    let (mut c, _policy) = gated(&[]).await;
    let id = approval_id(&c, "acme", status_call("s1")).await;
    c.redis.kill();
    // Low-risk calls still run with Redis gone...
    ok(
        c.tool_call("acme", "tool_search", json!({"query": "status"}))
            .await,
    );
    // ...while gated ones say the approval store is unavailable (and nothing runs).
    let reply = status_with(&c, "acme", "s1", json!({"id": id})).await;
    assert_eq!(reply["error"], "unavailable", "{reply}");
    let mut events = c.client.subscribe("toolmesh.v1.approvals.>").await.unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(200), events.next()).await;
    assert!(quiet.is_err(), "no approval traffic expected");
}

#[tokio::test]
async fn an_approval_is_given_back_when_no_actor_takes_the_call() {
    // Gateway and approval only: nothing serves run_command (sandbox), so the routed call gets
    // "no responders" and provably never ran.
    let c = Cluster::start().await;
    let run = json!({"tool": "run_command", "session_id": "s1", "arguments": {"command": "true"}});
    let id = &approval_id(&c, "acme", run.clone()).await;
    assert_eq!(c.decide("acme", id, true).await["ok"], true);
    let mut decided = c.watch("toolmesh.v1.approvals.acme.decided").await;

    for attempt in 0..2 {
        let reply = c
            .call("acme", with_approval(run.clone(), json!({"id": id})))
            .await;
        assert_eq!(reply["error"], "unavailable", "attempt {attempt}: {reply}");
        assert_eq!(
            reply["approval_released"], true,
            "attempt {attempt}: {reply}"
        );
        let message = reply["error_message"].as_str().unwrap();
        assert!(
            message.contains(id) && message.contains("once that actor runs"),
            "{message}"
        );
        let got = c.approvals("acme", "get", json!({"id": id})).await;
        assert_eq!(got["approval"]["status"], "approved", "{got}");
        assert_eq!(got["approval"]["decided_by"], "alice");
        // Used by the call, then given back: both announced, in that order.
        let statuses: Vec<Value> = collect(&mut decided, 2, Duration::from_secs(5))
            .await
            .iter()
            .map(|e| e["status"].clone())
            .collect();
        assert_eq!(statuses, ["used", "approved"], "attempt {attempt}");
    }
}

#[tokio::test]
async fn an_ungated_call_without_an_actor_is_unavailable_without_a_release() {
    let c = Cluster::ungated("gateway,approval").await;
    let reply = c
        .session_call("acme", "s1", "run_command", json!({"command": "true"}))
        .await;
    assert_eq!(reply["error"], "unavailable", "{reply}");
    assert!(reply.get("approval_released").is_none(), "{reply}");
}

/// JCS numbers are doubles: `9007199254740993` canonicalizes as `…992`, so an approval bound to
/// one would let the other through. A gated call carrying an integer past ±2^53 is refused.
#[tokio::test]
async fn integers_past_2_pow_53_cannot_be_bound_to_an_approval() {
    let c = Cluster::start().await; // strict: edits need approval
    let edit = |n: u64| {
        json!({"tool": "edit_workspace_file", "session_id": "s1", "arguments": {
            "path": "a.txt", "old_text": "x", "new_text": "y", "expected_replacements": n
        }})
    };
    let reply = c.call("acme", edit(9007199254740993)).await;
    assert_eq!(reply["error"], "invalid_arguments", "{reply}");
    assert_eq!(
        reply["details"][0]["path"], "/expected_replacements",
        "{reply}"
    );
    // The largest exact one still reaches the gate.
    let reply = c.call("acme", edit(9007199254740992)).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
}

/// Issue 16: the preview stopped at 500 characters and `get` answered only the preview, so
/// `echo harmless` + 600 spaces + `; rm -rf /workspace/*` showed as a harmless echo and an
/// `env` member after a long command was invisible. `get` answers the exact arguments (their
/// JCS hash is `arguments_sha256`); every preview shows each member, escaped.
#[tokio::test]
async fn an_approver_gets_the_exact_arguments_and_a_preview_that_hides_nothing() {
    let c = Cluster::start().await; // strict: run_command needs approval
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    let mut gate = c
        .watch(toolmesh_kernel::subjects::internal::APPROVAL_GATE)
        .await;
    let command = format!("echo harmless{}; rm -rf /workspace/*", " ".repeat(600));
    let arguments = json!({
        "command": command,
        "cwd": "rtl\u{202e}txt.exe",
        "env": {"LD_PRELOAD": "/workspace/evil.so"},
        "timeout": 30.0,
    });
    let a = request_approval(
        &c,
        "acme",
        json!({"tool": "run_command", "session_id": "s1", "arguments": arguments}),
    )
    .await;
    let id = a["id"].as_str().unwrap();
    // The gateway hands the arguments over and leaves the preview to the approval actor.
    let sent = collect(&mut gate, 1, Duration::from_secs(5)).await;
    assert_eq!(sent[0]["arguments"], arguments, "{}", sent[0]);
    assert!(sent[0].get("arguments_preview").is_none(), "{}", sent[0]);

    let got = ok(c.approvals("acme", "get", json!({"id": id})).await);
    assert_eq!(got["arguments"], arguments, "{got}");
    assert!(got.get("arguments_truncated").is_none(), "{got}");
    assert_eq!(
        toolmesh_kernel::canonical::arguments_sha256(&got["arguments"]),
        got["approval"]["arguments_sha256"].as_str().unwrap()
    );
    assert_eq!(got["approval"]["arguments_sha256"], a["arguments_sha256"]);

    // The same preview wherever an approver meets it: the call's reply, list, get, the event.
    let listed = c.approvals("acme", "list", json!({})).await;
    let announced = collect(&mut requested, 1, Duration::from_secs(5)).await;
    let previews = [
        &a["arguments_preview"],
        &listed["approvals"][0]["arguments_preview"],
        &got["approval"]["arguments_preview"],
        &announced[0]["arguments_preview"],
    ];
    for preview in previews {
        let preview = preview.as_str().unwrap();
        assert!(preview.contains("; rm -rf /workspace/*"), "{preview}");
        assert!(preview.contains("chars hidden"), "{preview}");
        assert!(
            preview.contains(r#""env":{"LD_PRELOAD":"/workspace/evil.so"}"#),
            "{preview}"
        );
        assert!(preview.contains(r#""cwd":"rtl\u202etxt.exe""#), "{preview}");
        assert!(!preview.contains('\u{202e}'), "{preview}");
    }
}

/// A gated call whose arguments an approver could not get in full (with the approval around
/// them, over `max_payload`) is refused before an approval exists: never approved blind, and
/// never a timeout.
#[tokio::test]
async fn a_gated_call_too_large_to_show_is_limit_exceeded() {
    let mut c = Cluster::servers_with_max_payload(64 * 1024).await;
    c.start_node("gateway,approval", &[]).await;
    let write = |bytes: usize| {
        json!({"tool": "write_workspace_file", "session_id": "s1", "arguments": {
            "path": "big.txt", "content": "x".repeat(bytes)
        }})
    };
    let reply = c.call("acme", write(60 * 1024)).await;
    assert_error(&reply, "limit_exceeded", "approver");
    let listed = c.approvals("acme", "list", json!({})).await;
    assert_eq!(listed["approvals"], json!([]), "{listed}");
    // Comfortably under the limit, the approver gets it all.
    let id = approval_id(&c, "acme", write(40 * 1024)).await;
    let got = c.approvals("acme", "get", json!({"id": id})).await;
    assert_eq!(
        got["arguments"]["content"].as_str().unwrap().len(),
        40 * 1024
    );
}
