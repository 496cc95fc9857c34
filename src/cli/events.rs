//! `toolmesh events` and the watches: kept RunEvents replayed from JetStream and followed,
//! and live subjects printed as they come.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use toolmesh_kernel::text::display_json;

use crate::cli::mesh::Mesh;
use crate::cli::output::{emit, hint};

/// How long one pull of `toolmesh events` waits on the server: a lost consumer is noticed
/// after two missed heartbeats of half of it.
const EVENTS_PULL_EXPIRY: Duration = Duration::from_secs(4);

/// `toolmesh events`: replays the kept RunEvents of `subject` from `TOOLMESH_EVENTS` with an
/// ordered consumer (deliver all), then follows. The ordered consumer goes on from the last
/// stream sequence it delivered when it must be made again (a NATS restart), so nothing is
/// printed twice or skipped. Without JetStream it falls back to live events and says so.
pub(super) async fn replay_events(mesh: &Mesh, subject: String) -> anyhow::Result<ExitCode> {
    let nats = &mesh.client;
    use async_nats::jetstream::consumer::{pull, DeliverPolicy};
    use toolmesh_kernel::streams::EVENTS_STREAM;
    let mut js = async_nats::jetstream::new(nats.clone());
    // A refused request goes unanswered: give up on it well before the caller does.
    js.set_timeout(Duration::from_secs(5));
    // A named consumer: its create request carries the filter in its subject
    // (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`), which account users are allowed.
    let name = format!("events_{}", uuid::Uuid::new_v4().simple());
    let create = format!("$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{name}.{subject}");
    let config = pull::OrderedConfig {
        name: Some(name),
        filter_subject: subject.clone(),
        deliver_policy: DeliverPolicy::All,
        // Short pulls: their heartbeats are what tells a lost consumer (a NATS restart) within
        // seconds, and the ordered consumer is made again from the last sequence it delivered.
        max_expires: EVENTS_PULL_EXPIRY,
        ..Default::default()
    };
    let created = mesh
        .refusals
        .guard(&create, js.create_consumer_on_stream(config, EVENTS_STREAM))
        .await;
    let created = match created {
        Ok(created) => created,
        // Refused at once (the server says so): this user may not read these events.
        Err(refused) => {
            hint(&format!("no replay of {subject}: {refused}"));
            return Ok(ExitCode::FAILURE);
        }
    };
    let consumer = match created {
        Ok(consumer) => consumer,
        // The server has JetStream but made no consumer: most likely this user may not read
        // these events (a permissions violation leaves the request unanswered). Live events
        // would be refused the same way, so say so and stop.
        Err(err) if nats.server_info().jetstream => {
            hint(&format!(
                "no replay of {subject} ({err}): the server refused or did not answer; \
                 may this user read these events?"
            ));
            return Ok(ExitCode::FAILURE);
        }
        Err(err) => {
            hint(&format!(
                "no replay ({err}): the server keeps no {EVENTS_STREAM}; showing live events only"
            ));
            return print_streams(mesh, &[subject]).await;
        }
    };
    let mut messages = consumer.messages().await?;
    hint(&format!(
        "replaying and watching {subject} (Ctrl-C to stop)"
    ));
    loop {
        tokio::select! {
            msg = messages.next() => {
                match msg {
                    None => break,
                    Some(Ok(msg)) => {
                        let body: Value = serde_json::from_slice(&msg.payload).unwrap_or_else(|_| {
                            Value::from(String::from_utf8_lossy(&msg.payload).into_owned())
                        });
                        emit(&display_json(&json!({ "subject": msg.subject.as_str(), "body": body })))?;
                    }
                    // The ordered consumer recreates itself after such errors (missed
                    // heartbeats, a reconnect); it goes on from the last sequence delivered.
                    Some(Err(err)) => tracing::debug!(%err, "events consumer"),
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn print_streams(mesh: &Mesh, subjects: &[String]) -> anyhow::Result<ExitCode> {
    let mut subs = Vec::new();
    for subject in subjects {
        subs.push(mesh.client.subscribe(subject.clone()).await?);
    }
    // A subscription the server refuses is silence, not an error: end on its refusal.
    let refused = futures::future::select_all(
        subjects
            .iter()
            .map(|subject| Box::pin(mesh.refusals.of_subscription(subject))),
    );
    tokio::pin!(refused);
    let mut sub = futures::stream::select_all(subs);
    hint(&format!(
        "watching {} (Ctrl-C to stop)",
        subjects.join(", ")
    ));
    loop {
        tokio::select! {
            msg = sub.next() => {
                let Some(msg) = msg else { break };
                let body: Value = serde_json::from_slice(&msg.payload).unwrap_or_else(|_| {
                    Value::from(String::from_utf8_lossy(&msg.payload).into_owned())
                });
                emit(&display_json(&json!({ "subject": msg.subject.as_str(), "body": body })))?;
            }
            (refused, _, _) = &mut refused => return Err(refused.into()),
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}
