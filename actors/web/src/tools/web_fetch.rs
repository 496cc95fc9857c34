//! `web_fetch`: a public http(s) URL fetched through the egress policy, as text.

use std::time::Duration;

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::metrics::EgressSource;
use toolmesh_kernel::outputs::Whole;
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::{budget, ErrorCode, ToolError};
use url::Url;

use crate::fetch::{WebFetchError, WebFetchErrorKind};
use crate::service::{WebService, MAX_CHARS_CAP};

impl Tool<WebService> for WebFetch {
    const DEF: &'static ToolDef = &crate::service::WEB.named("web_fetch");

    async fn run(self, service: &WebService, call: &ToolCall<'_>) -> ToolResult {
        let url = Url::parse(self.url.trim())
            .map_err(|e| ToolError::invalid_argument("/url", format!("not a URL: {e}")))?;
        let timeout = Duration::from_secs(self.timeout);
        let mut cancel =
            CancelWatch::listen(&service.client, &call.ctx.account, &call.ctx.invocation_id).await;
        let fetched = tokio::select! {
            outcome = tokio::time::timeout(timeout, service.fetcher.fetch(url)) => match outcome {
                Ok(fetched) => {
                    // `toolmesh_egress_decisions_total{source="web"}`: a page fetched was
                    // allowed, a `blocked_url` refused; other failures decided nothing.
                    match &fetched {
                        Ok(_) => service.metrics.egress_decision(EgressSource::Web, true),
                        Err(e) if e.kind() == WebFetchErrorKind::Blocked => {
                            service.metrics.egress_decision(EgressSource::Web, false)
                        }
                        Err(_) => {}
                    }
                    fetched?
                }
                Err(_) => {
                    return Err(ToolError::new(
                        ErrorCode::Timeout,
                        format!("fetching {} took longer than {} s", self.url, self.timeout),
                    ))
                }
            },
            () = cancel.requested() => {
                return Err(ToolError::new(ErrorCode::Cancelled, "web_fetch was cancelled"));
            }
        };
        let budget_chars = self
            .max_chars
            .map_or(call.outputs.budget_chars, |m| m.min(MAX_CHARS_CAP) as usize);
        let cut = budget::cut(&fetched.text, budget_chars);
        let mut fields = Map::new();
        fields.insert("url".into(), Value::from(self.url.clone()));
        fields.insert("final_url".into(), Value::from(fetched.final_url.as_str()));
        fields.insert("status_code".into(), Value::from(fetched.status_code));
        fields.insert("content_type".into(), Value::from(fetched.content_type));
        fields.insert("text".into(), Value::from(cut.preview.clone()));
        fields.insert(
            "truncated".into(),
            Value::Bool(cut.truncated || fetched.body_truncated),
        );
        fields.insert("original_chars".into(), Value::from(cut.original_chars));
        fields.insert("preview_chars".into(), Value::from(cut.preview_chars()));
        fields.insert("body_truncated".into(), Value::Bool(fetched.body_truncated));
        if cut.truncated {
            // The seed's shape: `persisted` (not `persisted_outputs`), or `persist_error`.
            let whole = Whole::Text(Bytes::from(fetched.text));
            match call.outputs.persist("text", whole).await {
                Ok(Some(path)) => {
                    fields.insert(
                        "persisted".into(),
                        json!({"path": path, "mime_type": "text/plain"}),
                    );
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot persist the whole text of a fetch");
                    fields.insert("persist_error".into(), e.brief());
                }
            }
        }
        Ok(fields)
    }
}

/// PROTOCOL.md's code and sentence of a failed fetch: `blocked_url` with `reason`, `timeout`,
/// `fetch_failed` (with `status_code`, `final_url` and `content_type` when a page answered), or
/// `internal`, whose cause is logged here.
impl From<WebFetchError> for ToolError {
    fn from(e: WebFetchError) -> Self {
        match e {
            WebFetchError::Egress(e) => e.to_tool_error(),
            WebFetchError::Status {
                ref url,
                status,
                ref content_type,
            }
            | WebFetchError::NotText {
                ref url,
                status,
                ref content_type,
                ..
            } => ToolError::new(ErrorCode::FetchFailed, e.to_string())
                .with("status_code", status.as_u16())
                .with("final_url", url.as_str())
                .with("content_type", content_type.clone()),
            WebFetchError::Extraction(_) => {
                tracing::warn!(error = %DisplayChain(&e), "web_fetch failed");
                ToolError::internal(e.to_string())
            }
        }
    }
}

/// Fetch a public http(s) URL and return its text with scripts and styles removed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebFetch {
    #[schemars(length(min = 1))]
    pub url: String,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_chars: Option<u64>,
    /// Seconds.
    #[serde(default = "thirty")]
    #[schemars(range(min = 1, max = 300))]
    pub timeout: u64,
}
fn thirty() -> u64 {
    30
}
