//! Policy rules (PROTOCOL.md "Approval policy"): `deny`, `allow` and `ask` decide before the
//! mode, name their rule and revision, and a `SIGHUP` reads the file again.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_testkit::wait_until;

use crate::policies::{policy, NOTES, NO_SECRETS, ONE_MEMBER_GROUPS, TWO_OF_OPS};
use crate::support::{
    assert_error, assert_policy_denied, ok, policy_file, trail_entries, trail_entry, Cluster,
};

/// `ask-status`: `component_status` of acme asks.
const ASK_STATUS: &str = r#"
[[rules]]
id = "ask-status"
tools = ["component_status"]
accounts = ["acme"]
decision = "ask"
"#;

/// Strict, with [`NO_SECRETS`], [`NOTES`] and [`ASK_STATUS`].
fn rules() -> String {
    policy("strict", &[NO_SECRETS, NOTES, ASK_STATUS])
}

fn write(path: &str) -> Value {
    json!({"path": path, "content": "hello\n"})
}

/// The `approval` section of `component_status` as `account` sees it (no session).
async fn approval_status(c: &Cluster, account: &str) -> Value {
    let status = ok(c.tool_call(account, "component_status", json!({})).await);
    status["approval"].clone()
}

#[tokio::test]
async fn rules_deny_allow_and_ask_before_the_mode_and_name_themselves() {
    let rules = rules();
    let (_dir, path) = policy_file(&rules);
    let revision = sha256_hex(rules.as_bytes());
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    let c = Cluster::with_node("gateway,approval,workspace", &env).await;

    // allow: a medium-risk write runs in strict mode without an approval, and its events say
    // which rule and revision let it.
    let mut events = c.watch("toolmesh.v1.events.acme.inv-notes").await;
    let body = json!({"tool": "write_workspace_file", "session_id": "s1",
        "invocation_id": "inv-notes", "arguments": write("notes/a.txt")});
    ok(c.call("acme", body).await);
    for kind in ["started", "finished"] {
        let msg = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
        let event: Value = serde_json::from_slice(&msg.unwrap().unwrap().payload).unwrap();
        assert_eq!(event["kind"], kind, "{event}");
        assert_eq!(event["rule_id"], "notes", "{event}");
        assert_eq!(event["policy_revision"], revision.as_str(), "{event}");
    }
    let read = c.read_workspace_file("acme", "s1", "notes/a.txt").await;
    assert!(ok(read)["content"].as_str().unwrap().contains("hello"));

    // deny: whatever the tool, nothing runs and the caller learns the rule and its reason.
    let denied = c
        .session_call("acme", "s1", "write_workspace_file", write("secrets/key"))
        .await;
    let reason = "secrets stay where they are";
    assert_policy_denied(&denied, "no-secrets", reason, &revision);
    assert_eq!(denied["rule_id"], "no-secrets", "{denied}");
    // Through the dispatcher the rule sees the inner tool and arguments.
    let dispatched = json!({"tool": "tool_dispatcher", "session_id": "s1", "arguments": {
        "action": "call", "tool_name": "write_workspace_file", "arguments": write("secrets/key")}});
    let denied = c.call("acme", dispatched).await;
    assert_eq!(denied["error"], "policy_denied", "{denied}");
    assert_eq!(
        denied["dispatched_tool_name"], "write_workspace_file",
        "{denied}"
    );
    let unread = c.read_workspace_file("acme", "s1", "secrets/key").await;
    assert_eq!(
        unread["error"], "policy_denied",
        "reads are denied too: {unread}"
    );
    let listing = c
        .session_call("acme", "s1", "list_workspace_files", json!({"path": "."}))
        .await;
    let names = listing.to_string();
    assert!(!names.contains("secrets"), "nothing was written: {names}");

    // No rule: the mode decides (strict asks about a medium-risk write).
    let gated = c
        .session_call("acme", "s1", "write_workspace_file", write("other.txt"))
        .await;
    assert_eq!(gated["error"], "approval_required", "{gated}");

    // ask: a low-risk tool needs an approval for the account the rule names, not for others.
    let asked = c.tool_call("acme", "component_status", json!({})).await;
    assert_eq!(asked["error"], "approval_required", "{asked}");
    let other = approval_status(&c, "globex").await;
    assert_eq!(other["policy_revision"], revision.as_str(), "{other}");
    assert_eq!(other["rules"], 3, "{other}");
    let node = toolmesh_testkit::request_json(
        &c.client,
        format!("toolmesh.v1.status.{}", c.nodes[0].node_id),
        json!({}),
    )
    .await;
    assert_eq!(node["policy_revision"], revision.as_str(), "{node}");
}

#[tokio::test]
async fn sighup_reads_the_file_again_and_a_bad_file_keeps_the_old_rules() {
    let deny_status =
        "[[rules]]\nid = \"v2\"\ntools = [\"component_status\"]\ndecision = \"deny\"\n";
    let (_dir, path) = policy_file("mode = \"off\"\n");
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    let c = Cluster::with_env(&env).await;
    ok(c.tool_call("acme", "component_status", json!({})).await);

    std::fs::write(&path, deny_status).unwrap();
    c.nodes[0].hangup();
    let v2 = sha256_hex(deny_status.as_bytes());
    let applied = wait_until(Duration::from_secs(10), || async {
        let reply = c.tool_call("acme", "component_status", json!({})).await;
        reply["error"] == "policy_denied" && reply["policy_revision"] == v2.as_str()
    })
    .await;
    assert!(applied, "the reloaded rule did not apply");

    // A bad file is refused, named in the log, and the rules read before stay.
    std::fs::write(
        &path,
        "[[rules]]\nid = \"bad\"\ntools = [\"x\"]\ndecision = \"perhaps\"\n",
    )
    .unwrap();
    c.nodes[0].hangup();
    assert!(
        c.nodes[0].logs("rules[0] (id \"bad\")", Duration::from_secs(10)),
        "the refusal names the rule"
    );
    // A node without a gateway lives through a SIGHUP too.
    let mut c = c;
    let other = c.start_node("workspace", &[("RUST_LOG", "info")]).await;
    c.nodes[other].hangup();
    assert!(
        c.nodes[other].logs("no policy to read again", Duration::from_secs(10)),
        "the workspace node heard the SIGHUP"
    );
    let status = toolmesh_testkit::request_json(
        &c.client,
        format!("toolmesh.v1.status.{}", c.nodes[other].node_id),
        json!({}),
    )
    .await;
    assert_eq!(status["ok"], true, "{status}");
    let still = c.tool_call("acme", "component_status", json!({})).await;
    assert_error(&still, "policy_denied", "v2");
    assert_eq!(still["policy_revision"], v2.as_str(), "{still}");
}

#[tokio::test]
async fn a_bad_rule_stops_the_node_naming_the_rule_and_field() {
    let (_dir, path) = policy_file(
        "[[rules]]\nid = \"paths\"\ntools = [\"*\"]\ndecision = \"deny\"\nwhen = { path = { regex = \"(\" } }\n",
    );
    let stderr = crate::support::node_refusal("gateway", &[("TOOLMESH_POLICY_FILE", &path)]);
    assert!(
        stderr.contains("rules[0] (id \"paths\"): when.path: regex:"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_call_a_rule_let_through_names_the_rule_in_the_audit_trail() {
    let rules = rules();
    let (_dir, path) = policy_file(&rules);
    let revision = sha256_hex(rules.as_bytes());
    let mut c = Cluster::servers_with_jetstream().await;
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    c.start_node("gateway,approval,workspace", &env).await;
    ok(
        c.session_call("acme", "s1", "write_workspace_file", write("notes/b.txt"))
            .await,
    );
    let reply = c.audit_trail("acme", 100).await;
    let entries = trail_entries(&reply);
    let statuses: Vec<_> = entries
        .iter()
        .map(|e| (e["status"].as_str(), e["rule_id"].as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            (Some("started"), Some("notes")),
            (Some("finished"), Some("notes"))
        ],
        "{reply}"
    );
    assert!(entries
        .iter()
        .all(|e| e["policy_revision"] == revision.as_str()));
    // A call no rule decided records nulls.
    ok(c.tool_call("globex", "component_status", json!({})).await);
    let other = c.audit_trail("globex", 100).await;
    let entry = &other["entries"][0];
    assert!(
        entry["rule_id"].is_null() && entry["policy_revision"].is_null(),
        "{other}"
    );
}

/// Off, but `component_status` needs two of `ops` ([`TWO_OF_OPS`]).
fn reviewed() -> String {
    policy("off", &[TWO_OF_OPS])
}

/// `component_status` of acme in `session`, presenting approval `approval` when given.
async fn status(c: &Cluster, session: &str, approval: Option<&str>) -> Value {
    let mut body = json!({"tool": "component_status", "session_id": session});
    if let Some(id) = approval {
        body["approval"] = json!({ "id": id });
    }
    c.call("acme", body).await
}

/// A decision on `…decide.<approver>` (`None`: the plain subject, naming `alice` in the body).
async fn decide_as(c: &Cluster, approver: Option<&str>, id: &str, approved: bool) -> Value {
    let subject = match approver {
        Some(who) => format!("toolmesh.v1.approvals.acme.decide.{who}"),
        None => "toolmesh.v1.approvals.acme.decide".to_owned(),
    };
    let body = json!({"id": id, "approved": approved, "approver": "alice", "reason": "seen"});
    toolmesh_testkit::request_json(&c.client, subject, body).await
}

#[tokio::test]
async fn an_approval_routed_to_reviewers_is_decided_by_a_quorum_of_members_named_by_subject() {
    let reviewed = reviewed();
    let (_dir, path) = policy_file(&reviewed);
    let revision = sha256_hex(reviewed.as_bytes());
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let required = status(&c, "s1", None).await;
    assert_eq!(required["error"], "approval_required", "{required}");
    assert_eq!(
        required["in_band"], false,
        "the caller cannot decide it: {required}"
    );
    let approval = &required["approval_request"];
    assert_eq!(approval["rule_id"], "ask-ops", "{approval}");
    assert_eq!(approval["policy_revision"], revision.as_str(), "{approval}");
    assert_eq!(approval["reviewers"], "ops", "{approval}");
    assert_eq!(approval["quorum"], 2, "{approval}");
    assert_eq!(approval["decisions"], json!([]), "{approval}");
    let id = approval["id"].as_str().unwrap();

    // Not by the plain subject, whatever the body says; not by a non-member.
    assert_error(
        &decide_as(&c, None, id, true).await,
        "forbidden",
        "decide.<approver>",
    );
    assert_error(
        &decide_as(&c, Some("mallory"), id, true).await,
        "forbidden",
        "mallory",
    );
    // Not by the call itself, in band.
    let in_band = c
        .call(
            "acme",
            json!({"tool": "component_status", "session_id": "s1",
            "approval": {"id": id, "approved": true}}),
        )
        .await;
    assert_eq!(in_band["error"], "forbidden", "{in_band}");

    // One member's approval counts once, however often it is sent.
    for _ in 0..2 {
        let counted = ok(decide_as(&c, Some("alice"), id, true).await);
        assert_eq!(counted["approval"]["status"], "pending", "{counted}");
        let decisions = &counted["approval"]["decisions"];
        assert_eq!(decisions.as_array().map(Vec::len), Some(1), "{counted}");
        assert_eq!(decisions[0]["approver"], "alice", "{counted}");
        assert_eq!(decisions[0]["reason"], "seen", "{counted}");
    }
    let pending = status(&c, "s1", Some(id)).await;
    assert_eq!(pending["error"], "approval_pending", "{pending}");

    // The second member completes the quorum and is the one recorded.
    let approved = ok(decide_as(&c, Some("bob"), id, true).await);
    assert_eq!(approved["approval"]["status"], "approved", "{approved}");
    assert_eq!(approved["approval"]["decided_by"], "bob", "{approved}");
    // A member's contrary decision after that is a conflict.
    let late = decide_as(&c, Some("carol"), id, false).await;
    assert_eq!(late["error"], "conflict", "{late}");
    let ran = status(&c, "s1", Some(id)).await;
    ok(ran);

    // One member's rejection rejects at once.
    let again = status(&c, "s1", None).await;
    let second = again["approval_request"]["id"].as_str().unwrap().to_owned();
    let rejected = ok(decide_as(&c, Some("carol"), &second, false).await);
    assert_eq!(rejected["approval"]["status"], "rejected", "{rejected}");
    assert_eq!(rejected["approval"]["decided_by"], "carol", "{rejected}");
}

/// Escalation in acme (`ops` to `leads` after 1 s), plain expiry in globex (also
/// `notify::slack_and_json_hear_an_escalation_then_the_expiry_with_the_consoles_link`).
pub(crate) fn deadlines() -> String {
    let rules = r#"
[[rules]]
id = "escalating"
tools = ["component_status"]
accounts = ["acme"]
decision = "ask"
reviewers = "ops"
expires_in_s = 1
on_timeout = "escalate"
escalate_to = "leads"

[[rules]]
id = "lapsing"
tools = ["component_status"]
accounts = ["globex"]
decision = "ask"
expires_in_s = 1
"#;
    policy("off", &[ONE_MEMBER_GROUPS, rules])
}

#[tokio::test]
async fn a_deadline_escalates_once_to_another_group_or_expires_the_approval() {
    let (_dir, path) = policy_file(&deadlines());
    let c = Cluster::with_env(&[("TOOLMESH_POLICY_FILE", path.as_str())]).await;
    let mut requested = c.watch("toolmesh.v1.approvals.acme.requested").await;
    // A call parked on its approval keeps waiting across the escalation.
    let parked = c.call_in_background(
        "acme",
        json!({"tool": "component_status", "session_id": "s1", "wait_for_approval_s": 30}),
    );
    let first: Value = {
        let msg = tokio::time::timeout(Duration::from_secs(5), requested.next()).await;
        serde_json::from_slice(&msg.unwrap().unwrap().payload).unwrap()
    };
    assert_eq!(first["reviewers"], "ops", "{first}");
    assert_eq!(first["escalated"], false, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    // At its deadline it is announced again, now for the leads, with a new deadline.
    let again: Value = {
        let msg = tokio::time::timeout(Duration::from_secs(10), requested.next()).await;
        serde_json::from_slice(&msg.unwrap().unwrap().payload).unwrap()
    };
    assert_eq!(
        (again["id"].as_str(), again["reviewers"].as_str()),
        (Some(id.as_str()), Some("leads")),
        "{again}"
    );
    assert_eq!(again["escalated"], true, "{again}");
    assert_eq!(again["status"], "pending", "{again}");
    assert!(
        again["expires_at"].as_str() > first["expires_at"].as_str(),
        "{again}"
    );
    // The first group no longer decides it; the second does, and the parked call runs.
    assert_error(
        &decide_as(&c, Some("alice"), &id, true).await,
        "forbidden",
        "alice",
    );
    let approved = ok(decide_as(&c, Some("lee"), &id, true).await);
    assert_eq!(approved["approval"]["decided_by"], "lee", "{approved}");
    let ran = tokio::time::timeout(Duration::from_secs(10), parked).await;
    ok(ran.unwrap().unwrap());

    // Without escalation the rule's deadline expires the approval.
    let required = c.call("globex", json!({"tool": "component_status"})).await;
    let id = required["approval_request"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let expired = wait_until(Duration::from_secs(10), || async {
        let got = c.approvals("globex", "get", json!({"id": id})).await;
        got["approval"]["status"] == "expired"
    })
    .await;
    assert!(
        expired,
        "the approval did not expire at the rule's deadline"
    );
}

/// A decision on approval `id` of acme (as alice) that asks for `grant`.
async fn approve_and_remember(c: &Cluster, id: &str, grant: Value) -> Value {
    let body = json!({"id": id, "approved": true, "approver": "alice", "grant": grant});
    c.approvals("acme", "decide", body).await
}

async fn required_id(c: &Cluster, session: &str) -> String {
    let reply = status(c, session, None).await;
    assert_eq!(reply["error"], "approval_required", "{reply}");
    reply["approval_request"]["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_grant_remembers_a_decision_for_its_scope_uses_and_expiry_until_revoked() {
    let (_dir, path) = policy_file(crate::support::GATED_STATUS);
    let mut c = Cluster::servers_with_jetstream().await;
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    c.start_node("gateway,approval", &env).await;
    let id = required_id(&c, "s1").await;
    let decided = ok(approve_and_remember(&c, &id, json!({"scope": "session", "uses": 2})).await);
    let grant = &decided["grant"];
    assert_eq!(decided["approval"]["status"], "approved", "{decided}");
    assert_eq!(grant["session_id"], "s1", "{grant}");
    assert_eq!(grant["tools"], json!(["component_status"]), "{grant}");
    assert_eq!(
        (grant["uses_left"].as_u64(), grant["approval_id"].as_str()),
        (Some(2), Some(id.as_str()))
    );
    assert_eq!(grant["created_by"], "alice", "{grant}");
    let grant_id = grant["id"].as_str().unwrap().to_owned();
    // The approval and its audit entry name the grant it was remembered as.
    assert_eq!(
        decided["approval"]["grant_id"],
        grant_id.as_str(),
        "{decided}"
    );
    let trail = c.audit_trail("acme", 100).await;
    let approved = trail_entry(&trail, |e| {
        e["approval_id"] == id.as_str() && e["status"] == "approved"
    });
    assert_eq!(approved["grant_id"], grant_id.as_str(), "{approved}");

    // Two later calls of the session run without an approval, each naming the grant.
    let mut events = c.watch("toolmesh.v1.events.acme.inv-granted").await;
    let body =
        json!({"tool": "component_status", "session_id": "s1", "invocation_id": "inv-granted"});
    let ran = ok(c.call("acme", body).await);
    assert_eq!(ran["grant_id"], grant_id.as_str(), "{ran}");
    let seen = crate::support::events_until_finished(&mut events, Duration::from_secs(5)).await;
    assert_eq!(
        seen.last().unwrap()["grant_id"],
        grant_id.as_str(),
        "{seen:?}"
    );
    // Another session is not covered by a session grant.
    let other = status(&c, "s2", None).await;
    assert_eq!(other["error"], "approval_required", "{other}");
    ok(status(&c, "s1", None).await);
    // Its uses are spent: the next call asks again.
    let spent = status(&c, "s1", None).await;
    assert_eq!(spent["error"], "approval_required", "{spent}");
    let listed = c.grants("acme", "list", json!({})).await;
    assert_eq!(listed["grants"][0]["uses_left"], 0, "{listed}");
    // The audit trail names the grant on the calls it covered.
    let trail = c.audit_trail("acme", 100).await;
    let named = trail_entries(&trail)
        .iter()
        .filter(|e| e["grant_id"] == grant_id.as_str() && e["status"] == "finished")
        .count();
    assert_eq!(named, 2, "{trail}");

    // An account grant covers every session until it is revoked.
    let id = required_id(&c, "s3").await;
    let decided =
        ok(approve_and_remember(&c, &id, json!({"scope": "account", "expires_in_s": 600})).await);
    let account_grant = decided["grant"]["id"].as_str().unwrap().to_owned();
    assert!(decided["grant"]["session_id"].is_null(), "{decided}");
    ok(status(&c, "s9", None).await);
    let revoked = c
        .grants("acme", "revoke", json!({ "id": account_grant }))
        .await;
    assert!(revoked["grant"]["revoked_at"].is_string(), "{revoked}");
    let after = status(&c, "s9", None).await;
    assert_eq!(after["error"], "approval_required", "{after}");
    // Another account sees none of them.
    let theirs = c.grants("globex", "list", json!({})).await;
    assert_eq!(theirs["grants"], json!([]), "{theirs}");
}

#[tokio::test]
async fn grants_are_refused_where_the_policy_forbids_them_and_never_overspent() {
    let policy = "mode = \"strict\"\n[tools.component_status]\nrisk_level = \"high\"\n\
        [[rules]]\nid = \"no-grants\"\ntools = [\"tool_search\"]\ndecision = \"ask\"\ngrantable = false\n";
    let (_dir, path) = policy_file(policy);
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    let mut c = Cluster::with_env(&env).await;
    c.start_node("gateway", &env).await;
    // A rule with grantable = false: asking is forbidden and the approval stays pending.
    let asked = c
        .call(
            "acme",
            json!({"tool": "tool_search", "arguments": {"query": "x"}}),
        )
        .await;
    let id = asked["approval_request"]["id"].as_str().unwrap().to_owned();
    let refused = approve_and_remember(&c, &id, json!({"scope": "account"})).await;
    assert_eq!(refused["error"], "forbidden", "{refused}");
    assert_eq!(c.approval_status("acme", &id).await, "pending");
    // Bad grant bodies are invalid requests naming the member.
    let bad = approve_and_remember(&c, &id, json!({"scope": "galaxy"})).await;
    assert_error(&bad, "invalid_request", "grant.scope");
    let bad = approve_and_remember(
        &c,
        &id,
        json!({"scope": "account", "when": {"x": {"regex": "("}}}),
    )
    .await;
    assert_error(&bad, "invalid_request", "grant.when.x: regex");

    // Three uses, ten calls racing through two gateways: exactly three run.
    let id = required_id(&c, "s1").await;
    ok(approve_and_remember(&c, &id, json!({"scope": "account", "uses": 3})).await);
    let calls: Vec<_> = (0..10)
        .map(|i| {
            c.call_in_background(
                "acme",
                json!({"tool": "component_status", "session_id": format!("r{i}")}),
            )
        })
        .collect();
    let mut ran = 0;
    for call in calls {
        let reply = call.await.unwrap();
        if reply["ok"] == true {
            assert!(reply["grant_id"].is_string(), "{reply}");
            ran += 1;
        } else {
            assert_eq!(reply["error"], "approval_required", "{reply}");
        }
    }
    assert_eq!(ran, 3, "a grant of three uses ran {ran} calls");
}

#[tokio::test]
async fn racing_decisions_through_two_approval_nodes_count_each_member_once() {
    let (_dir, path) = policy_file(&reviewed());
    let env = [("TOOLMESH_POLICY_FILE", path.as_str())];
    let mut c = Cluster::with_env(&env).await;
    c.start_node("gateway,approval", &env).await;
    let required = status(&c, "s1", None).await;
    let id = required["approval_request"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Alice's approval sent twenty times at once, through either node: counted once.
    let alice: Vec<_> = (0..20)
        .map(|_| {
            let client = c.client.clone();
            let id = id.clone();
            tokio::spawn(async move {
                let body = json!({"id": id, "approved": true});
                toolmesh_testkit::request_json(
                    &client,
                    "toolmesh.v1.approvals.acme.decide.alice",
                    body,
                )
                .await
            })
        })
        .collect();
    for reply in alice {
        let reply = ok(reply.await.unwrap());
        assert_eq!(reply["approval"]["status"], "pending", "{reply}");
    }
    let got = ok(c.approvals("acme", "get", json!({"id": id})).await);
    assert_eq!(
        got["approval"]["decisions"].as_array().map(Vec::len),
        Some(1),
        "{got}"
    );

    // Bob and Carol race to complete the quorum: one of them settles it, once.
    let mut decided = c.watch("toolmesh.v1.approvals.acme.decided").await;
    let racers: Vec<_> = ["bob", "carol"]
        .into_iter()
        .map(|who| {
            let client = c.client.clone();
            let id = id.clone();
            tokio::spawn(async move {
                let subject = format!("toolmesh.v1.approvals.acme.decide.{who}");
                toolmesh_testkit::request_json(
                    &client,
                    subject,
                    json!({"id": id, "approved": true}),
                )
                .await
            })
        })
        .collect();
    for racer in racers {
        let reply = ok(racer.await.unwrap());
        assert_eq!(reply["approval"]["status"], "approved", "{reply}");
    }
    let event = tokio::time::timeout(Duration::from_secs(5), decided.next())
        .await
        .expect("a decided event")
        .unwrap();
    let approval: Value = serde_json::from_slice(&event.payload).unwrap();
    let settler = approval["decided_by"].as_str().unwrap().to_owned();
    assert!(settler == "bob" || settler == "carol", "{approval}");
    // The call runs once; a second event for the same decision would be a second settling.
    ok(status(&c, "s1", Some(&id)).await);
    let next = tokio::time::timeout(Duration::from_secs(5), decided.next())
        .await
        .expect("the used event")
        .unwrap();
    let used: Value = serde_json::from_slice(&next.payload).unwrap();
    assert_eq!(
        used["status"], "used",
        "one approved event, then used: {used}"
    );
    let got = ok(c.approvals("acme", "get", json!({"id": id})).await);
    let decisions = got["approval"]["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 2, "alice and the settler only: {got}");
    assert_eq!(decisions[1]["approver"], settler.as_str(), "{got}");
}
