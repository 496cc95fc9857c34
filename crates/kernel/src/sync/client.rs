//! [`WorkspaceSync`]: the typed client of the workspace sync subjects, and its delivery
//! failures as PROTOCOL.md codes.

use std::time::Duration;

use async_nats::{Client, Request, RequestErrorKind};
use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::error::{ErrorCode, ToolError};
use crate::ids::{Account, SessionId};
use crate::role::Role;
use crate::subjects::internal;
use crate::sync::error::SyncClientError;
use crate::sync::frames::{decode_fetched, encode_apply, parse_reply};
use crate::sync::messages::{
    ApplyReply, Change, ChangeOp, ChangeOutcome, Expected, FetchFile, FetchRequest, Fetched,
    FileStamp, Manifest, ManifestLimits, ManifestRequest,
};
use crate::sync::rules::{BODY_CONTENT_BUDGET, DEFAULT_TIMEOUT};

/// A typed client of the workspace sync subjects.
#[derive(Debug, Clone)]
pub struct WorkspaceSync {
    client: Client,
    timeout: Duration,
}

impl WorkspaceSync {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// How long to wait for each reply (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The regular files of the workspace with their stamps.
    pub async fn manifest(
        &self,
        account: &Account,
        session: &SessionId,
        limits: ManifestLimits,
    ) -> Result<Manifest, ToolError> {
        let body = serde_json::to_vec(&ManifestRequest {
            account: account.clone(),
            session_id: session.clone(),
            limits,
        })
        .expect("a manifest request serializes");
        let reply = self
            .request(internal::WORKSPACE_MANIFEST, body, "manifest")
            .await?;
        let value: Value =
            serde_json::from_slice(&reply).map_err(|source| SyncClientError::NotJson {
                what: "manifest",
                source,
            })?;
        parse_reply(value)
    }

    /// One fetch round trip: chunks of the files asked for, in order, until the reply's
    /// content budget is used (files not answered were not reached; ask again).
    pub async fn fetch(
        &self,
        account: &Account,
        session: &SessionId,
        files: Vec<FetchFile>,
    ) -> Result<Fetched, ToolError> {
        let body = serde_json::to_vec(&FetchRequest {
            account: account.clone(),
            session_id: session.clone(),
            files,
        })
        .expect("a fetch request serializes");
        let reply = self
            .request(internal::WORKSPACE_FETCH, body, "fetch")
            .await?;
        decode_fetched(&reply)
    }

    /// A whole file, over as many fetches as it takes; starts over (at most 3 times) when
    /// the file changes between chunks.
    pub async fn fetch_file(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
    ) -> Result<(Bytes, FileStamp), ToolError> {
        for _ in 0..3 {
            let mut content = BytesMut::new();
            let mut stamp: Option<FileStamp> = None;
            loop {
                let offset = content.len() as u64;
                let fetched = self
                    .fetch(
                        account,
                        session,
                        vec![FetchFile {
                            path: path.to_owned(),
                            offset,
                        }],
                    )
                    .await?;
                if let Some(failure) = fetched.failed.into_iter().next() {
                    return Err(ToolError::new(failure.error, failure.error_message));
                }
                let Some(chunk) = fetched.chunks.into_iter().next() else {
                    return Err(SyncClientError::FetchWithoutFile.into());
                };
                if stamp.is_some_and(|s| s != chunk.stamp) {
                    break; // changed between chunks: start over
                }
                stamp = Some(chunk.stamp);
                content.extend_from_slice(&chunk.content);
                if chunk.eof {
                    return Ok((content.freeze(), chunk.stamp));
                }
                if chunk.content.is_empty() {
                    return Err(SyncClientError::EmptyChunk.into());
                }
            }
        }
        Err(ToolError::new(
            ErrorCode::Conflict,
            format!("'{path}' kept changing while it was read; try again"),
        ))
    }

    /// Applies changes in order; one outcome per change. The body must stay under NATS
    /// `max_payload`: keep the content of one call under [`BODY_CONTENT_BUDGET`].
    pub async fn apply(
        &self,
        account: &Account,
        session: &SessionId,
        changes: &[Change],
    ) -> Result<Vec<ChangeOutcome>, ToolError> {
        let body = encode_apply(account, session, changes);
        self.apply_encoded(body, changes.len()).await
    }

    /// [`WorkspaceSync::apply`] of a body [`encode_apply`] made of `count` changes.
    async fn apply_encoded(
        &self,
        body: Vec<u8>,
        count: usize,
    ) -> Result<Vec<ChangeOutcome>, ToolError> {
        let reply = self
            .request(internal::WORKSPACE_APPLY, body, "apply")
            .await?;
        let value: Value =
            serde_json::from_slice(&reply).map_err(|source| SyncClientError::NotJson {
                what: "apply",
                source,
            })?;
        let reply: ApplyReply = parse_reply(value)?;
        if reply.outcomes.len() != count {
            return Err(SyncClientError::OutcomeCount {
                got: reply.outcomes.len(),
                sent: count,
            }
            .into());
        }
        Ok(reply.outcomes)
    }

    /// Writes `bytes` to `path` unconditionally (in parts of [`BODY_CONTENT_BUDGET`] when
    /// big), atomically: readers see the old file or the whole new one. For outputs persisted
    /// under [`OUTPUTS_DIR`]. A conflict cannot happen; a rejection is its error.
    ///
    /// [`OUTPUTS_DIR`]: crate::sync::OUTPUTS_DIR
    pub async fn put_file(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        bytes: Bytes,
    ) -> Result<(), ToolError> {
        let total = bytes.len() as u64;
        self.put_parts(account, session, path, total, |offset, len| {
            let offset = offset as usize;
            std::future::ready(Ok(bytes.slice(offset..offset + len)))
        })
        .await
    }

    /// [`WorkspaceSync::put_file`] of the first `total` bytes of `source` (a file on the
    /// worker). Each part is read on tokio's blocking pool, never on the async threads; one
    /// part of [`BODY_CONTENT_BUDGET`] is in memory at a time.
    pub async fn put_from(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        total: u64,
        source: std::sync::Arc<std::fs::File>,
    ) -> Result<(), ToolError> {
        self.put_parts(account, session, path, total, |offset, len| {
            let source = source.clone();
            async move {
                let read = tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    let mut part = vec![0u8; len];
                    source.read_exact_at(&mut part, offset).map(|()| part)
                })
                .await
                .map_err(std::io::Error::other)
                .and_then(|read| read);
                read.map(Bytes::from)
                    .map_err(|source| SyncClientError::ReadPart {
                        path: path.to_owned(),
                        source,
                    })
            }
        })
        .await
    }

    /// Puts `total` bytes in parts, one after the other; `part(offset, len)` gives each. The
    /// first part creates the staging file, the last one lands the file.
    async fn put_parts<F, Fut>(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        total: u64,
        part: F,
    ) -> Result<(), ToolError>
    where
        F: Fn(u64, usize) -> Fut,
        Fut: std::future::Future<Output = Result<Bytes, SyncClientError>>,
    {
        let budget = BODY_CONTENT_BUDGET as u64;
        let upload = (total > budget).then(|| format!("put-{}", nuid::next()));
        let mut offset = 0u64;
        loop {
            let end = (offset + budget).min(total);
            let content = part(offset, (end - offset) as usize).await?;
            let change = Change {
                path: path.to_owned(),
                expected: Expected::Any,
                op: ChangeOp::Put {
                    upload: upload.clone(),
                    offset,
                    total,
                    content,
                    mode: None,
                },
            };
            // The part's bytes go once they are in the body: one copy in memory per part.
            let body = encode_apply(account, session, std::slice::from_ref(&change));
            drop(change);
            let outcome = self
                .apply_encoded(body, 1)
                .await?
                .pop()
                .expect("apply checked the outcome count");
            let last = end == total;
            match outcome {
                ChangeOutcome::Applied { stamp: Some(_), .. } if last => return Ok(()),
                ChangeOutcome::Staged { .. } if !last => offset = end,
                ChangeOutcome::Rejected {
                    error,
                    error_message,
                    ..
                } => return Err(ToolError::new(error, error_message)),
                other => {
                    return Err(SyncClientError::UnexpectedOutcome {
                        path: path.to_owned(),
                        outcome: Box::new(other),
                    }
                    .into())
                }
            }
        }
    }

    async fn request(&self, subject: &str, body: Vec<u8>, what: &str) -> Result<Bytes, ToolError> {
        let request = Request::new()
            .payload(Bytes::from(body))
            .timeout(Some(self.timeout));
        match self.client.send_request(subject.to_owned(), request).await {
            Ok(message) => Ok(message.payload),
            Err(error) => Err(request_failed(&error, what)),
        }
    }
}

/// A delivery failure of a sync request, as a PROTOCOL.md code.
fn request_failed(error: &async_nats::RequestError, what: &str) -> ToolError {
    let role = Role::Workspace;
    match error.kind() {
        RequestErrorKind::NoResponders => ToolError::new(
            ErrorCode::Unavailable,
            format!("no {role} actor is running in the cluster to serve a workspace sync {what}; start a node with --roles {role} and retry"),
        ),
        RequestErrorKind::TimedOut => ToolError::new(
            ErrorCode::Timeout,
            format!("the {role} actor did not answer a workspace sync {what} in time"),
        ),
        RequestErrorKind::MaxPayloadExceeded => ToolError::new(
            ErrorCode::LimitExceeded,
            format!("a workspace sync {what} is over the NATS max_payload; send less per request"),
        ),
        RequestErrorKind::InvalidSubject | RequestErrorKind::Other => ToolError::new(
            ErrorCode::Unavailable,
            format!("could not reach the {role} actor for a workspace sync {what} ({error}); retry"),
        ),
    }
}
