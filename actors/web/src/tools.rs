//! The web tools of PROTOCOL.md: `web_fetch` and `web_search`, their arguments, their result
//! fields and the result budget of `text`.
//!
//! `web_fetch` budgets `text` with the seed's field names: `truncated`, `original_chars`,
//! `preview_chars`, and `persisted: {"path", "mime_type"}` when the whole text was written to
//! the session's workspace (`.toolmesh/outputs/<invocation_id>-text.txt`, through the
//! workspace actor's sync subjects). Without a session the text is cut and nothing persisted.
//! `body_truncated` says the body itself passed `TOOLMESH_WEB_MAX_BYTES` and was cut there
//! (then `truncated` is true as well, and nothing beyond the cap exists to persist).

use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use toolmesh_kernel::budget;
use toolmesh_kernel::host::CancelWatch;
use toolmesh_kernel::sync::{WorkspaceSync, OUTPUTS_DIR};
use toolmesh_kernel::tools::args::{WebFetchArgs, WebSearchArgs};
use toolmesh_kernel::wire::ActorCall;
use toolmesh_kernel::{ErrorCode, ToolError};
use url::Url;

use crate::fetch::Fetcher;
use crate::search::{Query, SearchProvider};

/// `max_chars` above this is clamped: a reply must fit a NATS body.
pub const MAX_CHARS_CAP: u64 = 100_000;

/// What both web tools need.
#[derive(Debug)]
pub struct WebService {
    pub client: async_nats::Client,
    pub fetcher: Fetcher,
    pub search: Option<SearchProvider>,
    pub sync: WorkspaceSync,
    /// `TOOLMESH_RESULT_BUDGET_CHARS`: the budget of `text` when the call names none.
    pub budget_chars: usize,
}

fn args<T: DeserializeOwned>(call: &ActorCall) -> Result<T, ToolError> {
    serde_json::from_value(call.arguments.clone())
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, e.to_string()))
}

impl WebService {
    pub async fn run(&self, call: &ActorCall) -> Result<Map<String, Value>, ToolError> {
        match call.tool.as_str() {
            "web_fetch" => self.web_fetch(call, args(call)?).await,
            "web_search" => self.web_search(args(call)?).await,
            other => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the web actor does not serve {other}"),
            )),
        }
    }

    async fn web_fetch(
        &self,
        call: &ActorCall,
        args: WebFetchArgs,
    ) -> Result<Map<String, Value>, ToolError> {
        let url = Url::parse(args.url.trim())
            .map_err(|e| ToolError::invalid_argument("/url", format!("not a URL: {e}")))?;
        let timeout = Duration::from_secs(args.timeout);
        let mut cancel = CancelWatch::listen(
            &self.client,
            &call.invocation.account,
            &call.invocation.invocation_id,
        )
        .await;
        let fetched = tokio::select! {
            outcome = tokio::time::timeout(timeout, self.fetcher.fetch(url)) => match outcome {
                Ok(fetched) => fetched?,
                Err(_) => {
                    return Err(ToolError::new(
                        ErrorCode::Timeout,
                        format!("fetching {} took longer than {} s", args.url, args.timeout),
                    ))
                }
            },
            () = cancel.requested() => {
                return Err(ToolError::new(ErrorCode::Cancelled, "web_fetch was cancelled"));
            }
        };
        let budget_chars = args
            .max_chars
            .map_or(self.budget_chars, |m| m.min(MAX_CHARS_CAP) as usize);
        let cut = budget::cut(&fetched.text, budget_chars);
        let mut fields = Map::new();
        fields.insert("url".into(), Value::from(args.url.clone()));
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
            if let Some(session) = &call.invocation.session_id {
                let path = format!("{OUTPUTS_DIR}/{}-text.txt", call.invocation.invocation_id);
                match self
                    .sync
                    .put_file(
                        &call.invocation.account,
                        session,
                        &path,
                        Bytes::from(fetched.text),
                    )
                    .await
                {
                    Ok(()) => {
                        fields.insert(
                            "persisted".into(),
                            json!({"path": path, "mime_type": "text/plain"}),
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot persist the whole text of a fetch");
                        fields.insert("persist_error".into(), e.brief());
                    }
                }
            }
        }
        Ok(fields)
    }

    async fn web_search(&self, args: WebSearchArgs) -> Result<Map<String, Value>, ToolError> {
        let Some(provider) = &self.search else {
            return Err(ToolError::new(
                ErrorCode::ProviderNotConfigured,
                "no web search provider is configured; set TOOLMESH_WEB_SEARCH_PROVIDER to http \
                 (with TOOLMESH_WEB_SEARCH_URL) or fake on the web nodes",
            ));
        };
        let results = provider
            .search(Query {
                query: &args.query,
                max_results: args.max_results as usize,
                recency_days: args.recency_days,
            })
            .await?;
        let mut fields = Map::new();
        fields.insert("query".into(), Value::from(args.query));
        fields.insert("provider".into(), Value::from(provider.name()));
        fields.insert("results".into(), Value::Array(results));
        budget::fit_list(
            &mut fields,
            "results",
            budget::fields_limit(self.client.max_payload()),
        );
        Ok(fields)
    }
}
