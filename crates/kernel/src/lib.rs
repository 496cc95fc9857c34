//! toolmesh-kernel: what every toolmesh actor shares and nothing more.
//!
//! Wire types of PROTOCOL.md ([`wire`]), the one module of subject names ([`subjects`]), the
//! error codes ([`error`]), the tool registry with schemas and policies ([`tools`], [`policy`]),
//! configuration from the environment ([`config`]), the NATS server list ([`nats_url`]), the
//! egress policy of outbound requests ([`egress`]), JetStream streams ([`streams`]), NATS glue ([`host`], [`cluster`]), where a
//! node may answer ([`replies`]), the one HTTP server of every listener ([`listener`]) and the
//! way to Redis, through Sentinel too, of the actors keeping state there ([`redis_link`]).
//!
//! Architecture invariant: this crate knows no actor and exposes no actix type, so actors stay
//! independent of each other and of the actor framework's future.

pub mod audit;
pub mod budget;
pub mod canonical;
pub mod cluster;
pub mod config;
pub mod egress;
pub mod error;
pub mod events;
pub mod host;
pub mod ids;
pub mod listener;
pub mod metrics;
pub mod nats_url;
pub mod outputs;
pub mod permissions;
pub mod policy;
pub mod redis_link;
pub mod replies;
pub mod role;
pub mod settings;
pub mod skills;
pub mod streams;
pub mod subjects;
pub mod sync;
pub mod text;
pub mod time;
pub mod tools;
pub mod trace;
pub mod wire;

pub use error::{ErrorCode, ToolError};
pub use ids::{Account, InvocationId, NodeId, SessionId};
pub use role::Role;

/// The version every node reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
