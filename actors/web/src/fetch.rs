//! One `web_fetch`: the egress checks of every hop, redirects followed by hand, the body read
//! up to the byte cap, and the text made of it.
//!
//! The client and the redirect loop are the kernel's ([`toolmesh_kernel::egress`]): the client
//! follows no redirect itself, uses no proxy and resolves names only through the policy's
//! resolver; [`Egress::get`] checks each hop before it is requested (the scheme, then an IP
//! literal against the policy, or a name resolved and every address checked, for a clear
//! `reason`; the resolver checks again when the client connects, which is what defeats DNS
//! rebinding).

use std::sync::Arc;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;
use toolmesh_kernel::egress::{Egress, FetchError};
use url::Url;

use crate::text;

/// Redirects followed at most (PROTOCOL.md); one more is `fetch_failed`.
pub const MAX_REDIRECTS: usize = 5;

const USER_AGENT: &str = concat!("toolmesh-web/", env!("CARGO_PKG_VERSION"));

/// What a fetch brought back.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    pub final_url: Url,
    pub status_code: u16,
    pub content_type: Option<String>,
    pub text: String,
    /// The body was longer than the byte cap and was cut there.
    pub body_truncated: bool,
}

/// Fetches URLs under an egress policy.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    egress: Arc<Egress>,
    max_bytes: usize,
}

/// Why a fetch brought no text back. `tools::web_fetch` turns it into PROTOCOL.md's code.
#[derive(Debug, thiserror::Error)]
pub enum WebFetchError {
    /// A hop was refused, could not be resolved or requested, or redirected too often; or the
    /// body could not be read.
    #[error(transparent)]
    Egress(#[from] FetchError),
    /// The last hop answered 4xx or 5xx.
    #[error("{url} answered HTTP {}", status_text(*.status))]
    Status {
        url: Url,
        status: StatusCode,
        content_type: Option<String>,
    },
    /// The body is not text (by its `Content-Type` or its first bytes).
    #[error("{url} is {essence}, not text; web_fetch returns text only")]
    NotText {
        url: Url,
        essence: String,
        status: StatusCode,
        content_type: Option<String>,
    },
    /// The blocking task making text of the body failed (it panicked).
    #[error("the text extraction failed: {0}")]
    Extraction(#[source] tokio::task::JoinError),
}

/// What kind of [`WebFetchError`] it is, for callers that branch (the egress metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebFetchErrorKind {
    /// The egress policy refused a hop: `blocked_url`.
    Blocked,
    /// A hop timed out: `timeout`.
    TimedOut,
    /// The page could not be fetched as text: `fetch_failed`.
    Failed,
    /// A fault of this actor: `internal`.
    Internal,
}

impl WebFetchError {
    pub fn kind(&self) -> WebFetchErrorKind {
        match self {
            WebFetchError::Egress(FetchError::Refused { .. }) => WebFetchErrorKind::Blocked,
            WebFetchError::Egress(FetchError::Send { error, .. }) if error.is_timeout() => {
                WebFetchErrorKind::TimedOut
            }
            WebFetchError::Egress(_)
            | WebFetchError::Status { .. }
            | WebFetchError::NotText { .. } => WebFetchErrorKind::Failed,
            WebFetchError::Extraction(_) => WebFetchErrorKind::Internal,
        }
    }
}

impl Fetcher {
    pub fn new(egress: Egress, max_bytes: u64) -> Result<Self, reqwest::Error> {
        let egress = Arc::new(egress);
        let client = egress.client_builder().user_agent(USER_AGENT).build()?;
        Ok(Self {
            client,
            egress,
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
        })
    }

    /// Fetches `url`, following at most [`MAX_REDIRECTS`] redirects, each checked again.
    /// The caller bounds the time.
    pub async fn fetch(&self, url: Url) -> Result<Fetched, WebFetchError> {
        let fetched = self
            .egress
            .get(&self.client, url, MAX_REDIRECTS, |client, url| {
                client.get(url.clone()).header(
                    ACCEPT,
                    "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.8",
                )
            })
            .await?;
        let (current, mut response, hops) = (fetched.url, fetched.response, fetched.redirects);
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if status.is_client_error() || status.is_server_error() {
            return Err(WebFetchError::Status {
                url: current,
                status,
                content_type,
            });
        }
        let mut body = Vec::new();
        let mut body_truncated = false;
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(|e| FetchError::send(e, current.clone(), hops))?;
            let Some(chunk) = chunk else { break };
            let room = self.max_bytes - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                body_truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let (essence, charset) = text::parse_content_type(content_type.as_deref().unwrap_or(""));
        let Some(kind) = text::kind_of(&essence, &body) else {
            return Err(WebFetchError::NotText {
                url: current,
                essence,
                status,
                content_type,
            });
        };
        // Parsing megabytes of HTML is CPU work: off the async threads.
        let text = tokio::task::spawn_blocking(move || {
            let decoded = text::decode(&body, charset.as_deref(), body_truncated);
            match kind {
                text::Kind::Html => text::html_to_text(&decoded),
                text::Kind::Plain => text::plain_text(decoded),
            }
        })
        .await
        .map_err(WebFetchError::Extraction)?;
        Ok(Fetched {
            final_url: current,
            status_code: status.as_u16(),
            content_type,
            text,
            body_truncated,
        })
    }
}

fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmesh_kernel::{ErrorCode, ToolError};

    /// The pre-check is skipped here, as if a name had resolved to a public address then
    /// and to loopback now (DNS rebinding): the client's own resolver still refuses it, and
    /// the refusal is `blocked_url`, not a connection error.
    #[tokio::test]
    async fn the_client_refuses_refused_addresses_when_it_connects() {
        let fetcher = Fetcher::new(Egress::default(), 1024).unwrap();
        let url = Url::parse("http://localhost:9/").unwrap();
        let error = fetcher.client.get(url.clone()).send().await.unwrap_err();
        let refused = WebFetchError::from(FetchError::send(error, url, 0));
        assert_eq!(refused.kind(), WebFetchErrorKind::Blocked, "{refused}");
        let refused = ToolError::from(refused);
        assert_eq!(refused.code, ErrorCode::BlockedUrl, "{refused}");
        let reason = refused.details["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("localhost resolves to loopback address"),
            "{reason}"
        );
    }
}
