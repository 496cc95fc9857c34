//! End-to-end tests of toolmesh nodes (the real binary) against a real nats-server and
//! redis-server, speaking only the public protocol of PROTOCOL.md.

mod approvals;
mod audit;
mod bridge;
mod claims;
mod cli;
mod console;
mod direct;
mod docs;
mod edit;
mod events;
mod gateway;
mod http_limits;
mod mcp;
mod mcp_tasks;
mod metrics;
mod micro;
mod nats_cluster;
mod node;
mod notify;
mod permissions;
mod providers;
mod policies;
mod reply_size;
mod review;
mod rules;
mod sandbox;
mod sandbox_quota;
mod sentinel;
mod skills;
mod support;
mod templates;
mod tenancy;
mod traces;
mod web;
mod workspace;
