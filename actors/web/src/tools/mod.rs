//! The web tools of PROTOCOL.md: `web_fetch` and `web_search`, one file each (definition,
//! arguments, handler), listed in [`TOOLS`].
//!
//! `web_fetch` budgets `text` with the seed's field names: `truncated`, `original_chars`,
//! `preview_chars`, and `persisted: {"path", "mime_type"}` when the whole text was written to
//! the session's workspace (`.toolmesh/outputs/<invocation_id>-text.txt`, through the
//! workspace actor's sync subjects). Without a session the text is cut and nothing persisted.
//! `body_truncated` says the body itself passed `TOOLMESH_WEB_MAX_BYTES` and was cut there
//! (then `truncated` is true as well, and nothing beyond the cap exists to persist).

mod web_fetch;
mod web_search;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::tools::{TableEntry, ToolDef, ToolTable};
use toolmesh_kernel::wire::ActorCall;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::fetch::Fetcher;
use crate::search::SearchProvider;

/// The web actor's tools.
pub const TOOLS: &[Tool] = &[web_fetch::TOOL, web_search::TOOL];

/// One web tool: its definition and its handler.
#[derive(Debug)]
pub struct Tool {
    pub def: ToolDef,
    run: for<'a> fn(&'a WebService, &'a ActorCall) -> Reply<'a>,
}

impl TableEntry for Tool {
    fn def(&self) -> &ToolDef {
        &self.def
    }
}

/// What a handler answers.
type Reply<'a> = BoxFuture<'a, Result<Map<String, Value>, ToolError>>;

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
    /// The node's metrics: `web_fetch`'s egress decisions.
    pub metrics: toolmesh_kernel::metrics::Metrics,
}

fn args<T: DeserializeOwned>(call: &ActorCall) -> Result<T, ToolError> {
    serde_json::from_value(call.arguments.clone())
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, e.to_string()))
}

impl WebService {
    pub async fn run(&self, call: &ActorCall) -> Result<Map<String, Value>, ToolError> {
        let tool = TOOLS.find(&call.tool).ok_or_else(|| {
            ToolError::new(
                ErrorCode::UnknownTool,
                format!("the web actor does not serve {}", call.tool),
            )
        })?;
        (tool.run)(self, call).await
    }
}
