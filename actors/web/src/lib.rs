//! toolmesh-web: the web actor. It serves `web_fetch` and `web_search` (PROTOCOL.md "Web")
//! over `toolmesh.internal.v1.run.web`, in the queue group `toolmesh.web`.
//!
//! Architecture invariant: `web_fetch` connects only to addresses its egress policy checked
//! ([`toolmesh_kernel::egress`]): every hop's IP literal or resolved addresses are checked before the request,
//! and the HTTP client's only resolver hands out checked addresses, so DNS rebinding cannot
//! swap one in; redirects are followed by hand, each checked again; no proxy is used.

pub mod config;
pub mod fetch;
pub mod search;
pub mod service;
pub mod text;
pub mod tools;
pub mod variables;

use std::sync::Arc;

use toolmesh_kernel::config::Secret;
use toolmesh_kernel::host::{drainable, listen, ActorHandle, InFlight, Lifecycle, Listen};
use toolmesh_kernel::outputs::Keeper;
use toolmesh_kernel::subjects::internal;
use toolmesh_kernel::Role;

pub use config::WebConfig;

/// What the web actor needs besides NATS.
#[derive(Debug, Clone)]
pub struct WebSettings {
    /// `TOOLMESH_WEB_*`.
    pub config: WebConfig,
    /// `TOOLMESH_RESULT_BUDGET_CHARS`: the budget of `web_fetch`'s `text` by default.
    pub budget_chars: usize,
    /// The node's metrics.
    pub metrics: toolmesh_kernel::metrics::Metrics,
}

#[derive(Debug, thiserror::Error)]
pub enum WebStartError {
    #[error("TOOLMESH_WEB_ALLOWED_NETWORKS: {0}")]
    AllowedNetworks(String),
    #[error(transparent)]
    SearchProvider(#[from] search::SearchConfigError),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error(transparent)]
    Listen(#[from] toolmesh_kernel::host::ListenError),
}

/// Starts the web actor (inside an actix `System`); returns once it is subscribed.
pub async fn spawn(
    client: async_nats::Client,
    settings: WebSettings,
    lifecycle: Lifecycle,
    in_flight: InFlight,
) -> Result<ActorHandle, WebStartError> {
    let config = settings.config;
    let policy = toolmesh_kernel::egress::Egress::new(&config.allowed_networks)
        .map_err(WebStartError::AllowedNetworks)?;
    let search = search::SearchProvider::from_config(
        config.search_provider.as_deref(),
        config.search_url.as_deref(),
        config.search_api_key.as_ref().map(Secret::expose),
    )?;
    let service = Arc::new(service::WebService {
        client: client.clone(),
        fetcher: fetch::Fetcher::new(policy, config.max_bytes)?,
        search,
        metrics: settings.metrics,
    });
    let [calls] = listen(
        &client,
        [Listen::shared(internal::run(Role::Web), Role::Web)],
    )
    .await?;
    let handle = toolmesh_actix_host::start(
        Role::Web,
        "web",
        toolmesh_actix_host::Serving {
            server: toolmesh_actix_host::ToolServer::new(
                client.clone(),
                Role::Web,
                tools::TOOLS,
                Keeper::remote(settings.budget_chars, client),
            ),
            host: service,
        },
        drainable(calls, lifecycle.drain),
        in_flight,
    );
    Ok(handle)
}
