//! The one way a node serves HTTP (PROTOCOL.md "Tenancy and trust", "HTTP listeners bound their
//! clients"): the MCP front, the approvals console and `/metrics` all go through [`serve`].
//!
//! Each connection holds a permit of a semaphore of [`HttpLimits::max_connections`]. With every
//! permit taken the listener stops accepting until a connection closes: further clients wait in
//! the kernel's listen backlog, as behind nginx's `worker_connections` or Go's
//! `netutil.LimitListener`, instead of being accepted and dropped. A connection must deliver
//! each request head (the first one, and every later one on a kept-alive connection) within
//! [`HttpLimits::header_timeout`] or hyper closes it, so a client that sends nothing, half a
//! head, or nothing after its last response gives its permit back.
//!
//! Connections speak HTTP/1.1 only, through hyper's `http1` builder. hyper-util's `auto`
//! builder is not used: it reads the first bytes to tell HTTP/2 from HTTP/1 with no timeout of
//! its own, so a silent client, or one that trickles the HTTP/2 preface, would hold its
//! permit for ever; no listener here speaks HTTP/2.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::{ConfigError, RawEnv};

/// The variable bounding how long a connection may take to send a request head.
pub const HEADER_TIMEOUT_VAR: &str = "TOOLMESH_HTTP_HEADER_TIMEOUT_S";
/// The variable bounding how many connections each HTTP listener keeps open.
pub const MAX_CONNECTIONS_VAR: &str = "TOOLMESH_HTTP_MAX_CONNECTIONS";
/// `TOOLMESH_HTTP_HEADER_TIMEOUT_S`'s default: ample for any client on any network, short
/// enough that idle or stalled connections give their slot back soon.
pub const DEFAULT_HEADER_TIMEOUT_S: u64 = 10;
/// `TOOLMESH_HTTP_MAX_CONNECTIONS`'s default, per listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The longest header timeout accepted: a day.
const MAX_HEADER_TIMEOUT_S: u64 = 86_400;
/// How long the listener waits after an accept error that is not one connection's (out of
/// file descriptors) before it accepts again, as hyper 0.14 and axum do.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// What one HTTP listener allows its clients, from `TOOLMESH_HTTP_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// How long a connection may take to send a whole request head.
    pub header_timeout: Duration,
    /// How many connections the listener keeps open at once.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_S),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl HttpLimits {
    /// Reads `TOOLMESH_HTTP_HEADER_TIMEOUT_S` (whole seconds, 1 to 86400) and
    /// `TOOLMESH_HTTP_MAX_CONNECTIONS` (at least 1); anything else is an error naming the
    /// variable.
    pub fn from_env(env: &RawEnv) -> Result<HttpLimits, ConfigError> {
        let header_timeout_s = positive(
            env,
            HEADER_TIMEOUT_VAR,
            DEFAULT_HEADER_TIMEOUT_S,
            MAX_HEADER_TIMEOUT_S,
        )?;
        let max_connections = positive(
            env,
            MAX_CONNECTIONS_VAR,
            DEFAULT_MAX_CONNECTIONS as u64,
            Semaphore::MAX_PERMITS as u64,
        )?;
        Ok(HttpLimits {
            header_timeout: Duration::from_secs(header_timeout_s),
            max_connections: usize::try_from(max_connections).unwrap_or(Semaphore::MAX_PERMITS),
        })
    }
}

/// A listener's address from `key` (an IP address and a port), or `default` when unset;
/// anything else is an error naming the variable.
pub fn listen_addr(
    env: &RawEnv,
    key: &'static str,
    default: &str,
) -> Result<SocketAddr, ConfigError> {
    let raw = env.get(key).unwrap_or(default);
    raw.trim()
        .parse()
        .map_err(|e: std::net::AddrParseError| ConfigError::Invalid {
            key,
            value: raw.to_owned(),
            reason: e.to_string(),
        })
}

/// A whole number from 1 to `max`, or `default` when unset.
fn positive(env: &RawEnv, key: &'static str, default: u64, max: u64) -> Result<u64, ConfigError> {
    let Some(raw) = env.get(key) else {
        return Ok(default);
    };
    raw.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| ConfigError::Invalid {
            key,
            value: raw.to_owned(),
            reason: format!("use a whole number from 1 to {max}"),
        })
}

/// Serves `service` on every connection `listener` accepts, within `limits`, until `shutdown`
/// completes; then stops accepting, lets each connection finish its request in flight (an idle
/// one closes at once) and returns when all are closed.
///
/// `service` is any tower service of HTTP requests, an `axum::Router` among them; it is cloned
/// for each connection.
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send,
) where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A permit first: at the cap nothing is accepted until a connection closes.
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // never closed
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::error!(error = %e, "an HTTP listener cannot accept; retrying in a second");
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => continue,
                }
            }
        };
        let conn = http.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(service.clone()),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "an HTTP connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// An accept error that is about one connection (it went away before it was accepted), not
/// about the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
#[path = "listener_tests.rs"]
mod tests;
