//! Everything is in Redis: approvals survive a restart of the actor and of Redis itself, and a
//! Redis that is down answers `unavailable` without taking the actor down.

use std::process::Command;

use serde_json::json;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::wire::ApprovalStatus;
use toolmesh_testkit::{wait_until, NatsServer, RedisServer};

use crate::support::*;

#[actix_rt::test]
async fn a_pending_approval_survives_an_actor_restart() {
    let mut rig = Rig::start().await;
    let call = Call::new("acme");
    let created = rig.create(&call).await;

    let desk = rig.desk.take().expect("a desk");
    desk.stop().await;
    let asked = rig
        .client
        .request(internal::APPROVAL_GATE, "{}".into())
        .await;
    assert!(
        matches!(&asked, Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders),
        "a drained desk no longer listens: {asked:?}"
    );

    rig.restart_desk().await;
    assert_eq!(approval_of(&rig.get("acme", &created.id).await), created);
    assert_eq!(ids_of(&rig.list("acme").await), vec![created.id.clone()]);
    approval_of(&rig.decide("acme", &created.id, true, None).await);
    proceeded(rig.gate(&call.presenting(&created.id)).await);
}

#[actix_rt::test]
async fn a_pending_approval_survives_a_redis_restart() {
    let mut rig = Rig::start().await;
    let call = Call::new("acme");
    let created = rig.create(&call).await;

    rig.redis.restart();
    // The first request after the restart may find the old connection gone: `unavailable`,
    // safe to retry, until the connection manager has reconnected.
    assert!(
        wait_until(PATIENCE, || async {
            let reply = rig.get("acme", &created.id).await;
            reply["ok"] == true || {
                assert_eq!(error_of(&reply), "unavailable");
                false
            }
        })
        .await,
        "the approval is readable again after Redis restarted"
    );
    assert_eq!(approval_of(&rig.get("acme", &created.id).await), created);
    approval_of(&rig.decide("acme", &created.id, true, None).await);
    proceeded(rig.gate(&call.presenting(&created.id)).await);
}

#[actix_rt::test]
async fn redis_down_at_startup_answers_unavailable_until_it_is_up() {
    let nats = NatsServer::start();
    // A port of Redis's own, then Redis down: the actor starts without it.
    let mut redis = RedisServer::start();
    redis.kill();
    let desk = Desk::start(&nats.url(), &redis.url(), config(3600, true)).await;
    let client = nats.client().await;

    let reply =
        toolmesh_testkit::request_json(&client, "toolmesh.v1.approvals.acme.list", json!({})).await;
    assert_eq!(error_of(&reply), "unavailable");
    assert!(
        reply["error_message"].as_str().unwrap().contains("Redis"),
        "{reply}"
    );
    let outcome: toolmesh_kernel::wire::GateOutcome = serde_json::from_value(
        toolmesh_testkit::request_json(&client, internal::APPROVAL_GATE, Call::new("acme").body())
            .await,
    )
    .unwrap();
    assert_eq!(refusal(outcome).0, "unavailable");

    redis.restart();
    assert!(
        wait_until(PATIENCE, || async {
            toolmesh_testkit::request_json(&client, "toolmesh.v1.approvals.acme.list", json!({}))
                .await["ok"]
                == true
        })
        .await,
        "the actor connects once Redis is up"
    );
    let outcome: toolmesh_kernel::wire::GateOutcome = serde_json::from_value(
        toolmesh_testkit::request_json(&client, internal::APPROVAL_GATE, Call::new("acme").body())
            .await,
    )
    .unwrap();
    assert!(
        matches!(outcome, toolmesh_kernel::wire::GateOutcome::Required { approval, .. } if approval.status == ApprovalStatus::Pending)
    );
    desk.stop().await;
}

#[actix_rt::test]
async fn drain_answers_the_requests_in_flight_before_stopping() {
    let mut rig = Rig::start().await;
    rig.create(&Call::new("acme")).await; // the desk is connected to Redis
    let desk = rig.desk.take().expect("a desk");

    // Hold Redis still for a moment, so a request is surely in flight when the drain starts.
    let paused = Command::new("redis-cli")
        .args([
            "-p",
            &rig.redis.port().to_string(),
            "CLIENT",
            "PAUSE",
            "1500",
            "ALL",
        ])
        .output()
        .expect("redis-cli is installed (apt-get install -y redis-tools)");
    assert!(paused.status.success(), "{paused:?}");
    let client = rig.client.clone();
    let body = serde_json::to_vec(&Call::new("acme").body()).unwrap();
    let reply =
        tokio::spawn(async move { client.request(internal::APPROVAL_GATE, body.into()).await });
    assert!(
        wait_until(PATIENCE, || async { desk.in_flight.get() == 1 }).await,
        "the request reaches the desk and waits for Redis"
    );
    let in_flight = desk.in_flight.clone();
    desk.stop().await;
    assert_eq!(in_flight.get(), 0);

    let reply = reply
        .await
        .unwrap()
        .expect("the request in flight was answered");
    let outcome: toolmesh_kernel::wire::GateOutcome =
        serde_json::from_slice(&reply.payload).unwrap();
    assert!(
        matches!(outcome, toolmesh_kernel::wire::GateOutcome::Required { .. }),
        "{outcome:?}"
    );
}
