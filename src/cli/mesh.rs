//! A client command's NATS connection ([`Mesh`]): requests that end at a refusal, the trace of
//! the environment, and the NATS URL as messages show it.

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use serde_json::Value;

use toolmesh_kernel::permissions::Refusals;

/// A client command's NATS connection, and what the server refused it: every request and
/// subscription of a command ends at once, saying why, when the server refuses it
/// (`toolmesh_kernel::permissions`).
pub(crate) struct Mesh {
    pub(crate) client: async_nats::Client,
    pub(crate) refusals: Refusals,
}

pub(crate) async fn request(
    mesh: &Mesh,
    subject: String,
    body: &Value,
    timeout_s: u64,
) -> anyhow::Result<Value> {
    let payload = Bytes::from(serde_json::to_vec(body)?);
    let mut request = async_nats::Request::new()
        .payload(payload)
        .timeout(Some(Duration::from_secs(timeout_s.max(1))));
    if let Some(headers) = environment_trace() {
        request = request.headers(headers);
    }
    let reply = mesh
        .refusals
        .guard(&subject, mesh.client.send_request(subject.clone(), request))
        .await?
        .map_err(|e| {
        use async_nats::RequestErrorKind::*;
        match e.kind() {
            NoResponders => anyhow::anyhow!("no toolmesh node answers on {subject}; is a node with the right role running (toolmesh node --roles all)?"),
            TimedOut => anyhow::anyhow!("no reply on {subject} within {timeout_s} s"),
            _ => anyhow::anyhow!("request on {subject} failed: {e}"),
        }
    })?;
    serde_json::from_slice(&reply.payload).context("the reply is not JSON")
}

/// `TRACEPARENT` and `TRACESTATE` of the environment (OpenTelemetry's environment carrier) as
/// NATS headers: a script running inside a trace makes its requests part of it (README
/// "Traces"). A value that names no valid span is ignored.
fn environment_trace() -> Option<async_nats::HeaderMap> {
    let parent = std::env::var("TRACEPARENT").ok()?;
    let state = std::env::var("TRACESTATE").ok();
    toolmesh_kernel::trace::headers_from(&parent, state.as_deref())
}

/// Whether any server of a (comma-separated) NATS URL names a user.
pub(super) fn url_has_user(nats_url: &str) -> bool {
    nats_url.split(',').any(|url| {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        rest.split('/').next().unwrap_or_default().contains('@')
    })
}

#[cfg(test)]
mod tests {
    use crate::cli::mesh::url_has_user;

    #[test]
    fn a_user_in_any_server_url_counts() {
        assert!(url_has_user("nats://acme:x@h:4222"));
        assert!(!url_has_user("nats://h:4222,nats://i:4222"));
    }
}
