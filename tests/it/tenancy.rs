//! PROTOCOL.md "Tenancy and trust", tried as an attacker would: real nats-server with the
//! deployment's users (docker/nats.conf), a real node, each account with its own credentials.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use toolmesh_testkit::{request_json, Node};

use crate::support::{ok, policy_file, Deployed, GATED_STATUS};

/// One node (gateway and approval) on the deployment's NATS, as the node user.
struct Deployment {
    servers: Deployed,
    _policy: tempfile::TempDir,
    _node: Node,
}

impl Deployment {
    /// `policy` is the node's policy file.
    async fn start(policy: &str, env: &[(&str, &str)]) -> Deployment {
        let servers = Deployed::start();
        let (policy_dir, policy_path) = policy_file(policy);
        let mut spec = servers
            .spec("gateway,approval", "tenancy-1")
            .env("TOOLMESH_POLICY_FILE", policy_path);
        for (key, value) in env {
            spec = spec.env(key, *value);
        }
        let node = spec.start(&servers.nats.client("node").await).await;
        Deployment {
            servers,
            _policy: policy_dir,
            _node: node,
        }
    }
}

/// Finding 1 of issue 28: a request's reply subject made the node publish on another
/// account's subjects — a reply landing on `toolmesh.v1.cancel.globex` cancelled globex's
/// parked call, one on `toolmesh.v1.events.globex.…` was stored as a globex RunEvent.
#[tokio::test]
async fn a_reply_subject_outside_the_inboxes_reaches_no_other_account() {
    // Calls of globex need approval; acme's run at once.
    let policy = format!("mode = \"off\"\n[accounts.globex]\nmode = \"strict\"\n{GATED_STATUS}");
    let deployment = Deployment::start(&policy, &[]).await;
    let nats = &deployment.servers.nats;
    let (acme, globex, approver, node) = (
        nats.client("acme").await,
        nats.client("globex").await,
        nats.client("approver").await,
        nats.client("node").await,
    );
    let mut requested = approver
        .subscribe("toolmesh.v1.approvals.globex.requested")
        .await
        .unwrap();
    let mut forged_events = node
        .subscribe("toolmesh.v1.events.globex.forged")
        .await
        .unwrap();
    let mut cancels = node.subscribe("toolmesh.v1.cancel.globex").await.unwrap();
    approver.flush().await.unwrap();
    node.flush().await.unwrap();

    // globex's call waits for a person.
    let parked = tokio::spawn({
        let globex = globex.clone();
        async move {
            request_json(
                &globex,
                "toolmesh.v1.call.globex",
                json!({"tool": "component_status", "invocation_id": "inv-globex-1",
                       "wait_for_approval_s": 60}),
            )
            .await
        }
    });
    let approval = tokio::time::timeout(Duration::from_secs(10), requested.next())
        .await
        .expect("globex's call asks for approval")
        .unwrap();
    let approval: Value = serde_json::from_slice(&approval.payload).unwrap();

    // acme's calls, each answering onto a globex subject: its reply names globex's call.
    for reply_to in [
        "toolmesh.v1.cancel.globex",
        "toolmesh.v1.events.globex.forged",
    ] {
        acme.publish_with_reply(
            "toolmesh.v1.call.acme",
            reply_to,
            json!({"tool": "component_status", "invocation_id": "inv-globex-1"})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    }
    // An ordinary call of acme after them is still answered.
    ok(request_json(
        &acme,
        "toolmesh.v1.call.acme",
        json!({"tool": "component_status"}),
    )
    .await);

    // globex's call was not cancelled: approved now, it runs.
    ok(request_json(
        &approver,
        "toolmesh.v1.approvals.globex.decide",
        json!({"id": approval["id"], "approved": true, "approver": "alice"}),
    )
    .await);
    let reply = tokio::time::timeout(Duration::from_secs(20), parked)
        .await
        .expect("the parked call ends")
        .unwrap();
    assert_eq!(reply["ok"], true, "globex's call must run: {reply}");
    assert_eq!(reply["invocation_id"], "inv-globex-1");

    // Nothing was published on globex's subjects for acme, and nothing kept as its event.
    let js = async_nats::jetstream::new(node.clone());
    let stream = js.get_stream("TOOLMESH_EVENTS").await.unwrap();
    let kept = stream
        .get_last_raw_message_by_subject("toolmesh.v1.events.globex.forged")
        .await
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .map_err(|e| e.kind());
    assert_eq!(
        kept,
        Err(async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound),
        "a forged globex event is stored"
    );
    node.flush().await.unwrap();
    assert!(
        futures::FutureExt::now_or_never(forged_events.next()).is_none(),
        "a reply was published on globex's events"
    );
    assert!(
        futures::FutureExt::now_or_never(cancels.next()).is_none(),
        "a reply was published on globex's cancel subject"
    );
}

/// Finding 3 of issue 28: each parked call re-read its approval every 2 s, so a few hundred
/// parked calls kept Redis busy. A parked call now reads it once and is woken by the decision.
#[tokio::test]
async fn a_parked_call_does_not_poll_its_approval() {
    let (_policy_dir, policy) = policy_file(GATED_STATUS);
    let c = crate::support::Cluster::with_env(&[("TOOLMESH_POLICY_FILE", policy.as_str())]).await;
    let mut gets = c.watch("toolmesh.v1.approvals.acme.get").await;
    let reply = c
        .call(
            "acme",
            json!({"tool": "component_status", "wait_for_approval_s": 5}),
        )
        .await;
    assert_eq!(reply["error"], "approval_pending", "{reply}");
    c.client.flush().await.unwrap();
    let mut reads = 0;
    while futures::FutureExt::now_or_never(gets.next())
        .flatten()
        .is_some()
    {
        reads += 1;
    }
    assert!(
        reads <= 1,
        "a call parked for 5 s read its approval {reads} times"
    );
}

/// Finding 10 of issue 28: providers ran as the node user and could decide any account's
/// approvals and read every account's events. As the deployment's `provider` user a provider
/// serves its tools, and neither decides nor listens to anything of an account's.
#[tokio::test]
async fn a_provider_serves_as_the_provider_user_and_reaches_nothing_else() {
    let deployment = Deployment::start("", &[]).await;
    let nats = &deployment.servers.nats;
    let _provider =
        crate::providers::Provider::start_on(&nats.url("provider"), "tickets", &[]).await;
    let (acme, approver, as_provider) = (
        nats.client("acme").await,
        nats.client("approver").await,
        nats.client("provider").await,
    );
    let mut overheard = as_provider.subscribe("toolmesh.v1.events.>").await.unwrap();
    as_provider.flush().await.unwrap();
    let ticket = json!({"tool": "ticket_create", "session_id": "s1",
                        "arguments": {"title": "printer on fire"}});
    // ticket_create is medium: strict mode asks for approval first.
    // The gateway finds the provider within 5 s of its announce.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        let reply = request_json(&acme, "toolmesh.v1.call.acme", ticket.clone()).await;
        if reply["error"] != "unknown_tool" {
            break reply;
        }
        assert!(std::time::Instant::now() < deadline, "never found: {reply}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(first["error"], "approval_required", "{first}");
    let id = first["approval_request"]["id"].as_str().unwrap().to_owned();

    // The provider's user approves it: the server refuses the publish.
    let decision = json!({"id": id, "approved": true, "approver": "provider"});
    publish_flushed(&as_provider, "toolmesh.v1.approvals.acme.decide", &decision).await;
    let decided = request_json(
        &approver,
        "toolmesh.v1.approvals.acme.decide",
        json!({"id": id, "approved": true, "approver": "alice"}),
    )
    .await;
    assert_eq!(decided["ok"], true, "the provider decided first: {decided}");
    assert_eq!(decided["approval"]["decided_by"], "alice");

    // The approved call runs in the provider.
    let mut again = ticket.clone();
    again["approval"] = json!({"id": id});
    ok(request_json(&acme, "toolmesh.v1.call.acme", again).await);
    as_provider.flush().await.unwrap();
    assert!(
        futures::FutureExt::now_or_never(overheard.next()).is_none(),
        "the provider's user heard an account's events"
    );
}

/// Issue 31: who decides a routed approval comes from the subject, and NATS gives each
/// reviewer's user only their own `…decide.<name>`: bob cannot decide as alice.
#[tokio::test]
async fn a_reviewer_decides_only_as_themselves_and_only_as_a_member() {
    let policy = "mode = \"off\"\n[reviewers.ops]\nmembers = [\"alice\"]\n\
        [[rules]]\nid = \"ops\"\ntools = [\"component_status\"]\ndecision = \"ask\"\nreviewers = \"ops\"\n";
    let deployment = Deployment::start(policy, &[]).await;
    let nats = &deployment.servers.nats;
    let (acme, alice, bob) = (
        nats.client("acme").await,
        nats.client("alice").await,
        nats.client("bob").await,
    );
    let call = json!({"tool": "component_status", "session_id": "s1"});
    let first = request_json(&acme, "toolmesh.v1.call.acme", call.clone()).await;
    assert_eq!(first["approval_request"]["reviewers"], "ops", "{first}");
    let id = first["approval_request"]["id"].as_str().unwrap().to_owned();
    let decision = json!({"id": id, "approved": true});

    // Bob as alice: the server refuses the publish, so nothing is decided.
    publish_flushed(&bob, "toolmesh.v1.approvals.acme.decide.alice", &decision).await;
    // Bob as himself: not a member of ops.
    let as_bob = request_json(
        &bob,
        "toolmesh.v1.approvals.acme.decide.bob",
        json!({"id": id, "approved": true}),
    )
    .await;
    assert_eq!(as_bob["error"], "forbidden", "{as_bob}");
    let pending = request_json(&alice, "toolmesh.v1.approvals.acme.get", json!({"id": id})).await;
    assert_eq!(pending["approval"]["status"], "pending", "{pending}");
    // Alice, a member, on her own subject.
    let decided = request_json(
        &alice,
        "toolmesh.v1.approvals.acme.decide.alice",
        json!({"id": id, "approved": true}),
    )
    .await;
    assert_eq!(decided["approval"]["decided_by"], "alice", "{decided}");
    let mut again = call;
    again["approval"] = json!({"id": id});
    ok(request_json(&acme, "toolmesh.v1.call.acme", again).await);
}

/// Publishes `body` on `subject` as `client` and flushes: a publish the server refuses is gone
/// by the time this returns.
async fn publish_flushed(client: &async_nats::Client, subject: &'static str, body: &Value) {
    client
        .publish(subject, body.to_string().into())
        .await
        .unwrap();
    client.flush().await.unwrap();
}
