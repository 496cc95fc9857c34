//! A workspace actor on a real nats-server and redis-server, for the tests that reach it over
//! NATS: this crate's sync tests and the sandbox crate's mirror tests, which include this
//! file.

use std::path::PathBuf;

use toolmesh_kernel::host::{InFlight, Lifecycle};
use toolmesh_testkit::{NatsServer, RedisServer};
use toolmesh_workspace::{spawn, WorkspaceSettings};

/// Starts the servers and a workspace actor keeping its data in `data_dir`; returns once it is
/// subscribed. The servers stop when their handles drop.
pub async fn start_workspace(data_dir: PathBuf) -> (NatsServer, RedisServer) {
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let settings = WorkspaceSettings {
        data_dir,
        redis: toolmesh_kernel::redis_link::RedisConfig::url(redis.url()),
        budget_chars: 20_000,
    };
    spawn(
        nats.client().await,
        settings,
        Lifecycle::new(),
        InFlight::default(),
    )
    .await
    .expect("workspace actor starts");
    (nats, redis)
}
