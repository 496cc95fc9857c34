//! toolmesh: the node binary's library. It wires the actor crates into a node (`node`, with each
//! actor's config read by its own crate in `configs`), and holds the command line (`cli`).
//! Everything testable lives in the crates it wires.

mod audit_cli;
pub mod cli;
pub mod configs;
pub mod metrics;
pub mod micro;
pub mod node;
mod otel;
pub mod tools;
pub mod variables;
