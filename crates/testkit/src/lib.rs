//! Real services for tests: `nats-server`, `redis-server` and `toolmesh node` processes, each
//! killed and cleaned up when its handle drops. A missing binary is a panic that says which
//! Debian package to install.
//!
//! No port is bound, released and handed on (another process could take it in between): a
//! server picks its own port and the test reads it back from its log (`nats-server -p -1`, a
//! node's listeners on port 0); redis-server, which cannot, retries another port when its
//! candidate is taken.

//!
//! The parts: `nats` ([`NatsServer`], [`AuthNats`]), `nats_cluster` ([`NatsCluster`]), `leaf`
//! ([`LeafSite`]),
//! `redis` ([`RedisServer`]), `node`
//! ([`NodeSpec`], [`Node`]), `logs` ([`LogTap`], [`captured_logs`]), `client` ([`wait_until`],
//! the request helpers), `net` ([`ClosedPort`], [`http_target`]), [`raw_http`], `egress_probe`
//! ([`EGRESS_PROBE`]) and `process` (finding the programs).

mod client;
mod egress_probe;
mod leaf;
mod logs;
mod nats;
mod nats_cluster;
mod net;
mod node;
mod process;
pub mod raw_http;
mod redis;
mod sentinel;

pub use client::{request_json, request_json_within, request_raw, wait_until};
pub use egress_probe::{egress_probe_command, EGRESS_PROBE};
pub use leaf::LeafSite;
pub use logs::{captured_logs, LogTap};
pub use nats::{AuthNats, NatsServer, HUB_DOMAIN};
pub use nats_cluster::{NatsCluster, CLUSTER_SIZE};
pub use net::{http_target, ClosedPort};
pub use node::{Listener, Node, NodeSpec};
pub use process::venv_bin;
pub use redis::RedisServer;
pub use sentinel::{redis_cli, RedisSentinels, DOWN_AFTER_MS};
