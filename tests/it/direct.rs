//! Direct replies: a routed call that used no approval, from a caller whose reply subject is
//! under `_INBOX.`, is finished by the actor itself (`finished`, then the reply straight to
//! the caller, then a `delivered` notice to the gateway), sparing the reply a hop through the
//! gateway. Any other caller gets the reply through the gateway.
//!
//! A fake workspace actor (a plain subscriber in the workspace queue group) shows what the
//! gateway asks of the actor and answers with the kernel's `host::answer`, as the real actors
//! do.

use std::time::{Duration, Instant};

use async_nats::{Client, Subject, Subscriber};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use toolmesh_kernel::host::{answer, confirm_subscriptions};
use toolmesh_kernel::wire::{ActorCall, ActorReply};

use crate::support::{collect, fake_workspace, ok, take_call, Cluster};

/// A gateway and approval node with `env`, and a fake workspace actor on its bus.
async fn with_fake_workspace(env: &[(&str, &str)]) -> (Cluster, Subscriber) {
    let c = Cluster::with_env(env).await;
    let actor = fake_workspace(&c.client).await;
    (c, actor)
}

/// Sends `body` with `reply_to` as its reply subject; returns the subscription on it.
async fn send_call(client: &Client, reply_to: &str, body: Value) -> Subscriber {
    let replies = client.subscribe(reply_to.to_owned()).await.unwrap();
    confirm_subscriptions(client).await.unwrap();
    client
        .publish_with_reply(
            "toolmesh.v1.call.acme",
            reply_to.to_owned(),
            Bytes::from(serde_json::to_vec(&body).unwrap()),
        )
        .await
        .unwrap();
    replies
}

/// Answers `call` as a real actor does (`host::answer`).
async fn finish(client: &Client, gateway_reply: &Subject, call: &ActorCall, reply: ActorReply) {
    let finish = call.direct_finish();
    answer(
        client,
        Some(gateway_reply),
        finish.as_ref(),
        reply,
        Instant::now(),
    )
    .await;
}

/// An ordinary reply of the actor: `text` as the file's content.
fn content(text: &str) -> ActorReply {
    let mut fields = Map::new();
    fields.insert("content".into(), json!(text));
    ActorReply::ok(fields)
}

/// The one reply `replies` gets (a second within 800 ms fails the test).
async fn only_reply(replies: &mut Subscriber) -> Value {
    let got = collect(replies, 2, Duration::from_millis(800)).await;
    assert_eq!(got.len(), 1, "exactly one reply: {got:?}");
    got[0].clone()
}

fn read_call(invocation: &str) -> Value {
    json!({"tool": "read_workspace_file", "session_id": "s1", "invocation_id": invocation,
           "arguments": {"path": "a.txt"}})
}

#[tokio::test]
async fn the_actor_answers_the_caller_itself() {
    let (c, mut actor) = with_fake_workspace(&[]).await;
    let mut events = c.watch("toolmesh.v1.events.acme.inv-direct1").await;
    let reply_to = "_INBOX.acme.direct-test-1";
    let mut replies = send_call(&c.client, reply_to, read_call("inv-direct1")).await;

    let (call, gateway_reply) = take_call(&mut actor).await;
    let direct = call
        .direct
        .clone()
        .expect("the gateway asks for a direct reply");
    assert_eq!(direct.reply_to, reply_to);
    assert_eq!(direct.event_tool, "read_workspace_file");
    assert_eq!(direct.dispatched_tool_name, None);
    assert_eq!(call.event_seq, 1, "after the gateway's `started`");
    // The gateway must not answer on its own once told the caller has the reply.
    let mut acks = c.client.subscribe(gateway_reply.clone()).await.unwrap();
    confirm_subscriptions(&c.client).await.unwrap();
    finish(
        &c.client,
        &gateway_reply,
        &call,
        content("     1\tfrom the actor\n"),
    )
    .await;

    assert_eq!(
        only_reply(&mut replies).await,
        json!({"ok": true, "invocation_id": "inv-direct1", "content": "     1\tfrom the actor\n"})
    );
    let ack = collect(&mut acks, 1, Duration::from_secs(2)).await;
    assert_eq!(ack[0]["delivered"], true, "{ack:?}");
    let got = collect(&mut events, 2, Duration::from_secs(2)).await;
    let kinds: Vec<&str> = got.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["started", "finished"], "{got:?}");
    assert_eq!(got[1]["seq"], 1);
    assert_eq!(got[1]["ok"], true);
    assert_eq!(got[1]["tool"], "read_workspace_file");
    assert!(got[1]["duration_ms"].is_u64());
}

#[tokio::test]
async fn a_direct_failure_keeps_the_error_shape_and_the_dispatcher_name() {
    let (c, mut actor) = with_fake_workspace(&[]).await;
    let mut events = c.watch("toolmesh.v1.events.acme.inv-direct2").await;
    let reply_to = "_INBOX.acme.direct-test-2";
    let body = json!({"tool": "tool_dispatcher", "session_id": "s1", "invocation_id": "inv-direct2",
                      "arguments": {"action": "call", "tool_name": "read_workspace_file",
                                    "arguments": {"path": "missing.txt"}}});
    let mut replies = send_call(&c.client, reply_to, body).await;
    let (call, gateway_reply) = take_call(&mut actor).await;
    let direct = call.direct.clone().expect("a direct reply");
    assert_eq!(direct.event_tool, "tool_dispatcher");
    assert_eq!(
        direct.dispatched_tool_name.as_deref(),
        Some("read_workspace_file")
    );
    let error = toolmesh_kernel::ToolError::new(
        toolmesh_kernel::ErrorCode::NotFound,
        "missing.txt does not exist",
    )
    .with("path", "missing.txt");
    finish(&c.client, &gateway_reply, &call, ActorReply::error(error)).await;
    assert_eq!(
        only_reply(&mut replies).await,
        json!({"ok": false, "invocation_id": "inv-direct2", "error": "not_found",
               "error_message": "missing.txt does not exist", "path": "missing.txt",
               "dispatched_tool_name": "read_workspace_file"})
    );
    let got = collect(&mut events, 2, Duration::from_secs(2)).await;
    assert_eq!(got[1]["kind"], "finished", "{got:?}");
    assert_eq!(got[1]["ok"], false);
    assert_eq!(got[1]["error"], "not_found");
    assert_eq!(got[1]["dispatched_tool_name"], "read_workspace_file");
}

#[tokio::test]
async fn other_callers_get_the_reply_through_the_gateway() {
    // A reply subject outside `_INBOX.` (a prefix the operator named in
    // TOOLMESH_REPLY_PREFIXES) may be one actor nodes cannot publish to: the gateway answers
    // it, from the actor's ordinary reply.
    let (c, mut actor) =
        with_fake_workspace(&[("TOOLMESH_REPLY_PREFIXES", "_INBOX.,replies.")]).await;
    let mut replies = send_call(&c.client, "replies.acme.3", read_call("inv-direct3")).await;
    let (call, gateway_reply) = take_call(&mut actor).await;
    assert_eq!(call.direct, None);
    finish(&c.client, &gateway_reply, &call, content("x")).await;
    assert_eq!(
        only_reply(&mut replies).await,
        json!({"ok": true, "invocation_id": "inv-direct3", "content": "x"})
    );
}

#[tokio::test]
async fn a_call_that_used_an_approval_is_answered_by_the_gateway() {
    // Whatever becomes of it (an actor refusing before it ran gives the approval back), the
    // gateway must see the actor's answer: no direct reply.
    let (c, mut actor) = with_fake_workspace(&[]).await;
    let body = json!({"tool": "write_workspace_file", "session_id": "s1", "invocation_id": "inv-direct4",
                      "arguments": {"path": "a.txt", "content": "x"},
                      "approval": {"approved": true}});
    let mut replies = send_call(&c.client, "_INBOX.acme.direct-test-4", body).await;
    let (call, gateway_reply) = take_call(&mut actor).await;
    assert_eq!(call.direct, None);
    finish(&c.client, &gateway_reply, &call, ActorReply::ok(Map::new())).await;
    ok(only_reply(&mut replies).await);
}
