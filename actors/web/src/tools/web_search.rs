//! `web_search`: a web search through the configured provider.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolmesh_kernel::tools::{Define, Review, Tool, ToolCall, ToolDef, ToolGroup, ToolResult};
use toolmesh_kernel::wire::{RiskLevel, SideEffect};
use toolmesh_kernel::{budget, ErrorCode, Role, ToolError};

use super::WebService;
use crate::search::Query;

pub struct WebSearch;

impl Define for WebSearch {
    type Args = WebSearchArgs;
    const DEF: &'static ToolDef = &ToolDef {
        name: "web_search",
        group: ToolGroup::Web,
        description:
            "Search the web through the configured provider; returns titles, URLs and snippets.",
        risk_level: RiskLevel::Low,
        side_effects: &[SideEffect::NetworkEgress],
        needs_session: false,
        role: Role::Web,
        profiles: &[],
        review: Review::Arguments,
    };
}

impl Tool for WebSearch {
    type Host = WebService;

    async fn run(
        &self,
        service: &WebService,
        _call: &ToolCall<'_>,
        args: WebSearchArgs,
    ) -> ToolResult {
        service.web_search(args).await
    }
}

/// Search the web through the configured provider.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearchArgs {
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

impl WebService {
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
