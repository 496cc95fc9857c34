//! One `web_fetch`: the egress checks of every hop, redirects followed by hand, the body read
//! up to the byte cap, and the text made of it.
//!
//! The HTTP client follows no redirect itself (`Policy::none`) and uses no proxy (a proxy
//! would connect to the target on our behalf, unchecked); its only resolver is
//! [`CheckedResolver`]. Each hop is checked before it is requested: the scheme, then an IP
//! literal against the policy, or a name resolved and every address checked (for a clear
//! `reason`; the resolver checks again when the client connects, which is what defeats DNS
//! rebinding).

use std::error::Error as _;
use std::sync::Arc;

use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use reqwest::redirect::Policy;
use reqwest::StatusCode;
use toolmesh_kernel::{ErrorCode, ToolError};
use url::{Host, Url};

use crate::egress::{resolve_checked, CheckedResolver, EgressPolicy, ResolveError};
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
    policy: Arc<EgressPolicy>,
    max_bytes: usize,
}

fn blocked(reason: impl Into<String>, url: &Url) -> ToolError {
    let reason = reason.into();
    ToolError::new(
        ErrorCode::BlockedUrl,
        format!("the egress policy refuses {url}: {reason}"),
    )
    .with("reason", reason)
}

fn fetch_failed(message: String) -> ToolError {
    ToolError::new(ErrorCode::FetchFailed, message)
}

/// `error` and its sources, joined: reqwest's own message alone rarely says what went wrong.
fn chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn resolve_failed(error: &ResolveError, url: &Url, hop: usize) -> ToolError {
    match error {
        ResolveError::Blocked { host, blocked: b } => {
            blocked(hop_reason(hop, format!("{host} resolves to {b}")), url)
        }
        other => fetch_failed(format!("cannot fetch {url}: {other}")),
    }
}

/// Names the redirect a refusal happened on, so the reason says why a URL that looked fine
/// was refused.
fn hop_reason(hop: usize, reason: String) -> String {
    if hop == 0 {
        reason
    } else {
        format!("redirect {hop} leads to {reason}")
    }
}

impl Fetcher {
    pub fn new(policy: EgressPolicy, max_bytes: u64) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(policy);
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(CheckedResolver {
                policy: policy.clone(),
            }))
            .redirect(Policy::none())
            .no_proxy()
            .user_agent(USER_AGENT)
            .build()?;
        Ok(Self {
            client,
            policy,
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
        })
    }

    /// Checks one hop before it is requested.
    async fn check(&self, url: &Url, hop: usize) -> Result<(), ToolError> {
        match url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(blocked(
                    hop_reason(
                        hop,
                        format!("scheme {other}: is not allowed, only http and https"),
                    ),
                    url,
                ))
            }
        }
        let ip = match url.host() {
            None => return Err(blocked(hop_reason(hop, "a URL without a host".into()), url)),
            Some(Host::Ipv4(v4)) => v4.into(),
            Some(Host::Ipv6(v6)) => v6.into(),
            Some(Host::Domain(name)) => {
                return resolve_checked(&self.policy, name)
                    .await
                    .map(drop)
                    .map_err(|e| resolve_failed(&e, url, hop));
            }
        };
        self.policy
            .check(ip)
            .map_err(|b| blocked(hop_reason(hop, b.reason), url))
    }

    fn send_failed(&self, error: &reqwest::Error, url: &Url, hop: usize) -> ToolError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(cause) = source {
            if let Some(refused) = cause.downcast_ref::<ResolveError>() {
                return resolve_failed(refused, url, hop);
            }
            source = cause.source();
        }
        if error.is_timeout() {
            return ToolError::new(ErrorCode::Timeout, format!("fetching {url} timed out"));
        }
        fetch_failed(format!("cannot fetch {url}: {}", chain(error)))
    }

    /// Fetches `url`, following at most [`MAX_REDIRECTS`] redirects, each checked again.
    /// The caller bounds the time.
    pub async fn fetch(&self, url: Url) -> Result<Fetched, ToolError> {
        let mut current = url;
        let mut hop = 0;
        let mut response = loop {
            self.check(&current, hop).await?;
            let response = self
                .client
                .get(current.clone())
                .header(
                    ACCEPT,
                    "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.8",
                )
                .send()
                .await
                .map_err(|e| self.send_failed(&e, &current, hop))?;
            let location = response
                .status()
                .is_redirection()
                .then(|| response.headers().get(LOCATION))
                .flatten();
            let Some(location) = location else {
                break response;
            };
            if hop == MAX_REDIRECTS {
                return Err(fetch_failed(format!(
                    "{current} redirects again after {MAX_REDIRECTS} redirects; \
                     web_fetch follows at most {MAX_REDIRECTS}"
                ))
                .with("final_url", current.as_str()));
            }
            let next = location
                .to_str()
                .ok()
                .and_then(|l| current.join(l).ok())
                .ok_or_else(|| {
                    fetch_failed(format!(
                        "{current} redirects to a Location that is not a URL: {location:?}"
                    ))
                })?;
            hop += 1;
            current = next;
        };
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if status.is_client_error() || status.is_server_error() {
            return Err(
                fetch_failed(format!("{current} answered HTTP {}", status_text(status)))
                    .with("status_code", status.as_u16())
                    .with("final_url", current.as_str())
                    .with("content_type", content_type),
            );
        }
        let mut body = Vec::new();
        let mut body_truncated = false;
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(|e| self.send_failed(&e, &current, hop))?;
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
            return Err(fetch_failed(format!(
                "{current} is {essence}, not text; web_fetch returns text only"
            ))
            .with("status_code", status.as_u16())
            .with("final_url", current.as_str())
            .with("content_type", content_type));
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
        .map_err(|e| ToolError::internal(format!("the text extraction failed: {e}")))?;
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

    /// The pre-check is skipped here, as if a name had resolved to a public address then
    /// and to loopback now (DNS rebinding): the client's own resolver still refuses it, and
    /// the refusal is `blocked_url`, not a connection error.
    #[tokio::test]
    async fn the_client_refuses_refused_addresses_when_it_connects() {
        let fetcher = Fetcher::new(EgressPolicy::default(), 1024).unwrap();
        let url = Url::parse("http://localhost:9/").unwrap();
        let error = fetcher.client.get(url.clone()).send().await.unwrap_err();
        let refused = fetcher.send_failed(&error, &url, 0);
        assert_eq!(refused.code, ErrorCode::BlockedUrl, "{refused}");
        let reason = refused.details["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("localhost resolves to loopback address"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn every_hop_is_checked_before_it_is_requested() {
        let fetcher = Fetcher::new(EgressPolicy::default(), 1024).unwrap();
        let check = |url: &str, hop: usize| {
            let url = Url::parse(url).unwrap();
            let fetcher = fetcher.clone();
            async move {
                fetcher
                    .check(&url, hop)
                    .await
                    .map_err(|e| e.details["reason"].clone())
            }
        };
        assert_eq!(
            check("http://[::1]/", 0).await.unwrap_err(),
            "loopback address ::1"
        );
        assert_eq!(
            check("http://10.0.0.1/", 2).await.unwrap_err(),
            "redirect 2 leads to private address 10.0.0.1"
        );
        assert_eq!(
            check("ftp://8.8.8.8/", 0).await.unwrap_err(),
            "scheme ftp: is not allowed, only http and https"
        );
        assert!(check("http://8.8.8.8/", 0).await.is_ok());
        assert!(check("https://[2606:4700:4700::1111]/", 0).await.is_ok());
    }
}
