//! The cluster view: every live node, from heartbeats (every 2 s; 3 missed and a node drops out).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::ids::NodeId;
use crate::role::Role;
use crate::wire::{Heartbeat, NodeStatus};

pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// A node that has not been heard from for three intervals is gone.
pub const HEARTBEAT_EXPIRY: Duration = Duration::from_secs(6);

#[derive(Debug, Default)]
pub struct ClusterView {
    nodes: Mutex<HashMap<NodeId, (NodeStatus, Instant)>>,
}

impl ClusterView {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a heartbeat; true when the node was not known before (so the caller can
    /// answer with its own heartbeat and the newcomer sees the cluster at once).
    pub fn record(&self, heartbeat: Heartbeat) -> bool {
        let mut nodes = self.nodes.lock().expect("cluster view lock");
        if heartbeat.leaving {
            nodes.remove(&heartbeat.status.node_id);
            return false;
        }
        let id = heartbeat.status.node_id.clone();
        let fresh = match nodes.get(&id) {
            Some((_, seen)) => seen.elapsed() > HEARTBEAT_EXPIRY,
            None => true,
        };
        nodes.insert(id, (heartbeat.status, Instant::now()));
        fresh
    }

    /// Live nodes, sorted by id.
    pub fn live(&self) -> Vec<NodeStatus> {
        let mut nodes = self.nodes.lock().expect("cluster view lock");
        nodes.retain(|_, (_, seen)| seen.elapsed() <= HEARTBEAT_EXPIRY);
        let mut live: Vec<NodeStatus> = nodes.values().map(|(s, _)| s.clone()).collect();
        live.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        live
    }

    /// How many live nodes run `role`.
    pub fn nodes_with(&self, role: Role) -> usize {
        self.live()
            .iter()
            .filter(|n| n.roles.contains(&role))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(id: &str, leaving: bool) -> Heartbeat {
        Heartbeat {
            status: NodeStatus {
                node_id: NodeId::parse(id).unwrap(),
                roles: vec![Role::Gateway],
                version: "0".into(),
                uptime_s: 0,
                in_flight: 0,
                sandbox: None,
            },
            leaving,
        }
    }

    #[test]
    fn nodes_join_and_leave() {
        let view = ClusterView::new();
        assert!(view.record(beat("b", false)));
        assert!(!view.record(beat("b", false)));
        assert!(view.record(beat("a", false)));
        let ids: Vec<_> = view
            .live()
            .into_iter()
            .map(|n| n.node_id.to_string())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(view.nodes_with(Role::Gateway), 2);
        view.record(beat("a", true));
        assert_eq!(view.live().len(), 1);
    }
}
