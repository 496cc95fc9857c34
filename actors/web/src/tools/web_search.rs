//! `web_search`: a web search through the configured provider.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolmesh_kernel::tools::{Tool, ToolCall, ToolDef, ToolResult};
use toolmesh_kernel::{budget, ErrorCode, ToolError};

use crate::search::{Query, SearchError, SearchErrorKind};
use crate::service::WebService;

impl Tool<WebService> for WebSearch {
    const DEF: &'static ToolDef = &crate::service::WEB.named("web_search");

    async fn run(self, service: &WebService, call: &ToolCall<'_>) -> ToolResult {
        let Some(provider) = &service.search else {
            return Err(ToolError::new(
                ErrorCode::ProviderNotConfigured,
                "no web search provider is configured; set TOOLMESH_WEB_SEARCH_PROVIDER to http \
                 (with TOOLMESH_WEB_SEARCH_URL) or fake on the web nodes",
            ));
        };
        let results = provider
            .search(Query {
                query: &self.query,
                max_results: self.max_results as usize,
                recency_days: self.recency_days,
            })
            .await?;
        let mut fields = Map::new();
        fields.insert("query".into(), Value::from(self.query));
        fields.insert("provider".into(), Value::from(provider.name()));
        fields.insert("results".into(), Value::Array(results));
        budget::fit_list(&mut fields, "results", call.fields_limit);
        Ok(fields)
    }
}

/// PROTOCOL.md's code and sentence of a failed search: `timeout`, or `fetch_failed` (with
/// `status_code` when the provider answered an HTTP error).
impl From<SearchError> for ToolError {
    fn from(e: SearchError) -> Self {
        let code = match e.kind() {
            SearchErrorKind::TimedOut => ErrorCode::Timeout,
            SearchErrorKind::Failed => ErrorCode::FetchFailed,
        };
        let error = ToolError::new(code, e.to_string());
        match e {
            SearchError::Status(status) => error.with("status_code", status.as_u16()),
            _ => error,
        }
    }
}

/// Search the web through the configured provider; returns titles, URLs and snippets.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearch {
    #[schemars(length(min = 1))]
    pub query: String,
    #[serde(default = "five")]
    #[schemars(range(min = 1, max = 50))]
    pub max_results: u64,
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub recency_days: Option<u64>,
}
fn five() -> u64 {
    5
}
