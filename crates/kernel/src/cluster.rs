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

/// How long the view remembers that a node left on purpose (a `leaving` heartbeat), so that a
/// call it ran is not mistaken for one lost with its worker.
pub const DEPARTED_MEMORY: Duration = Duration::from_secs(600);

#[derive(Debug)]
pub struct ClusterView {
    nodes: Mutex<HashMap<NodeId, (NodeStatus, Instant)>>,
    /// Nodes that said goodbye (`leaving`), and when.
    departed: Mutex<HashMap<NodeId, Instant>>,
    /// When the view began: until [`HEARTBEAT_EXPIRY`] after it, it may not have heard every
    /// live node yet.
    started: Instant,
}

impl Default for ClusterView {
    fn default() -> Self {
        Self {
            nodes: Mutex::default(),
            departed: Mutex::default(),
            started: Instant::now(),
        }
    }
}

/// What the view knows of one node right now ([`ClusterView::presence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Heard from within [`HEARTBEAT_EXPIRY`]; last at `last_seen`.
    Live { last_seen: Instant },
    /// It sent a `leaving` heartbeat: it drained (finished or cancelled its work) and left.
    Left,
    /// Never heard of, or silent for longer than [`HEARTBEAT_EXPIRY`].
    Unknown,
}

impl Presence {
    /// When a node in this state counts as lost, for a watch that began at `since`: one
    /// [`HEARTBEAT_EXPIRY`] after its last heartbeat, or after `since` for a node not heard of
    /// yet (a worker may claim a call before its first heartbeat reached us). `None`: never,
    /// the node left on purpose.
    pub fn lost_at(self, since: Instant) -> Option<Instant> {
        match self {
            Presence::Live { last_seen } => Some(last_seen + HEARTBEAT_EXPIRY),
            Presence::Left => None,
            Presence::Unknown => Some(since + HEARTBEAT_EXPIRY),
        }
    }
}

impl ClusterView {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a heartbeat; true when the node was not known before (so the caller can
    /// answer with its own heartbeat and the newcomer sees the cluster at once).
    pub fn record(&self, heartbeat: Heartbeat) -> bool {
        let mut nodes = self.nodes.lock().expect("cluster view lock");
        let id = heartbeat.status.node_id.clone();
        {
            let mut departed = self.departed.lock().expect("cluster view lock");
            if heartbeat.leaving {
                nodes.remove(&id);
                departed.retain(|_, at| at.elapsed() <= DEPARTED_MEMORY);
                departed.insert(id, Instant::now());
                return false;
            }
            if !departed.is_empty() {
                departed.remove(&id);
            }
        }
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

    /// Whether `node` may be taken for gone now: it left, or it has been silent for
    /// [`HEARTBEAT_EXPIRY`]. A node never heard of counts as gone only once the view itself is
    /// that old: a node that has just started has not yet heard the heartbeats of the others.
    pub fn gone(&self, node: &NodeId) -> bool {
        match self.presence(node) {
            Presence::Live { .. } => false,
            Presence::Left => true,
            Presence::Unknown => self.started.elapsed() > HEARTBEAT_EXPIRY,
        }
    }

    /// What the view knows of `node` now.
    pub fn presence(&self, node: &NodeId) -> Presence {
        let nodes = self.nodes.lock().expect("cluster view lock");
        if let Some((_, seen)) = nodes.get(node) {
            if seen.elapsed() <= HEARTBEAT_EXPIRY {
                return Presence::Live { last_seen: *seen };
            }
        }
        drop(nodes);
        let departed = self.departed.lock().expect("cluster view lock");
        match departed.get(node) {
            Some(at) if at.elapsed() <= DEPARTED_MEMORY => Presence::Left,
            _ => Presence::Unknown,
        }
    }

    /// Resolves once `node` is lost: no heartbeat for [`HEARTBEAT_EXPIRY`] (counted from `since`
    /// if it was never heard of), without a `leaving` heartbeat. Never resolves for a node that
    /// left on purpose: a draining node still finishes (or cancels and answers) its calls.
    ///
    /// No polling: it sleeps until the moment the node would expire and looks again; each
    /// heartbeat in between just moves that moment on, so a watch wakes about once per
    /// [`HEARTBEAT_EXPIRY`] and notices a loss the instant it happens.
    pub async fn lost(&self, node: &NodeId, since: Instant) {
        loop {
            let Some(at) = self.presence(node).lost_at(since) else {
                return futures::future::pending().await;
            };
            if Instant::now() > at {
                return;
            }
            // Just past the moment, so that `presence` sees it expired.
            let wake = at + Duration::from_millis(1);
            tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
        }
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
            status: NodeStatus::bare(NodeId::parse(id).unwrap(), vec![Role::Gateway]),
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

    /// A young view takes no node it has not heard of for gone; an older one does, and a
    /// node that left is gone at any age.
    #[test]
    fn a_young_view_takes_no_unheard_node_for_gone() {
        let young = ClusterView::new();
        let (a, b) = (NodeId::parse("a").unwrap(), NodeId::parse("b").unwrap());
        assert!(!young.gone(&a), "not heard of yet");
        young.record(beat("b", true));
        assert!(young.gone(&b), "b left");

        let old = ClusterView {
            started: Instant::now() - HEARTBEAT_EXPIRY - Duration::from_millis(1),
            ..ClusterView::new()
        };
        assert!(old.gone(&a), "silent for a whole expiry");
        old.record(beat("a", false));
        assert!(!old.gone(&a), "heard of");
    }

    #[test]
    fn presence_tells_left_from_lost() {
        let view = ClusterView::new();
        let a = NodeId::parse("a").unwrap();
        assert_eq!(view.presence(&a), Presence::Unknown);
        view.record(beat("a", false));
        let Presence::Live { last_seen } = view.presence(&a) else {
            panic!("a is live");
        };
        let since = Instant::now();
        assert_eq!(
            Presence::Live { last_seen }.lost_at(since),
            Some(last_seen + HEARTBEAT_EXPIRY)
        );
        assert_eq!(
            Presence::Unknown.lost_at(since),
            Some(since + HEARTBEAT_EXPIRY)
        );
        // A goodbye is not a loss; coming back makes it live again.
        view.record(beat("a", true));
        assert_eq!(view.presence(&a), Presence::Left);
        assert_eq!(Presence::Left.lost_at(since), None);
        view.record(beat("a", false));
        assert!(matches!(view.presence(&a), Presence::Live { .. }));
    }

    #[tokio::test]
    async fn a_watch_ends_for_a_silent_node_and_not_for_a_departed_one() {
        let view = ClusterView::new();
        let ghost = NodeId::parse("ghost").unwrap();
        // Never heard of, and the watch began an expiry ago: lost at once.
        let long_ago = Instant::now() - HEARTBEAT_EXPIRY - Duration::from_millis(10);
        tokio::time::timeout(Duration::from_secs(1), view.lost(&ghost, long_ago))
            .await
            .expect("a node never heard of is lost after one expiry");
        view.record(beat("ghost", true));
        let still = tokio::time::timeout(Duration::from_millis(50), view.lost(&ghost, long_ago));
        assert!(still.await.is_err(), "a departed node is never lost");
    }
}
