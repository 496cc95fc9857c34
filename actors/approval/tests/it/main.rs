//! Integration tests of the approval actor against real nats-server and redis-server, spoken
//! to only over NATS, as the gateway and any client would.

mod accounts;
mod durability;
mod expiry;
mod flows;
mod garbage;
mod in_band;
mod list;
mod races;
mod release;
mod support;
mod withdraw;
