//! The node's `/metrics` listener (`TOOLMESH_METRICS_LISTEN`): Prometheus scrapes the node's
//! registry ([`toolmesh_kernel::metrics::Metrics`]) there as OpenMetrics text.

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use toolmesh_kernel::listener::HttpLimits;
use toolmesh_kernel::metrics::{self, Metrics};

/// Binds `listen` and serves `GET /metrics` within `limits` until `stop` is cancelled; answers
/// the bound address (the port of `:0` is the one the system chose).
pub async fn serve(
    listen: SocketAddr,
    limits: HttpLimits,
    metrics: Metrics,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(metrics);
    tokio::spawn(toolmesh_kernel::listener::serve(
        listener,
        app,
        limits,
        stop.cancelled_owned(),
    ));
    tracing::info!(addr = %bound, "serving metrics at /metrics");
    Ok(bound)
}

async fn scrape(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics.render().await,
    )
}
