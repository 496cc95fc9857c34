//! The pool against real Redis and Docker: a new session is handed a started sandbox before
//! its registry claim has come back, and a lost claim leaves that sandbox untouched and back
//! among the warm ones.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::{Account, ErrorCode, NodeId, SessionId};
use toolmesh_sandbox::backend::docker::{container_name, DockerBackend};
use toolmesh_sandbox::backend::{Backend, SandboxLimits, LABEL_NODE};
use toolmesh_sandbox::mirror::SyncLimits;
use toolmesh_sandbox::pool::{OpenError, Pool, PoolSettings, SessionKey};
use toolmesh_sandbox::registry::{Claim, SessionRegistry};
use toolmesh_testkit::{NatsServer, RedisServer};

const TTL: Duration = Duration::from_secs(60);

fn image() -> String {
    std::env::var("TOOLMESH_SANDBOX_IMAGE").unwrap_or_else(|_| "toolmesh/sandbox:latest".into())
}

/// Removes the node's containers on drop (also when the test panics).
struct NodeContainers(String);

impl Drop for NodeContainers {
    fn drop(&mut self) {
        let filter = format!("label={LABEL_NODE}={}", self.0);
        let listed = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
            .expect("docker ps");
        for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
            let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
        }
    }
}

fn key(session: &str) -> SessionKey {
    (
        Account::parse("acme").unwrap(),
        SessionId::parse(session).unwrap(),
    )
}

/// A worker's pool of `max_sessions` with one warm sandbox, on real Redis and Docker.
struct Rig {
    _nats: NatsServer,
    redis: RedisServer,
    _dir: tempfile::TempDir,
    node: NodeId,
    _containers: NodeContainers,
    pool: Arc<Pool>,
}

impl Rig {
    async fn start(max_sessions: usize) -> Rig {
        let nats = NatsServer::start();
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        let node = NodeId::parse(format!("pooltest{}-{max_sessions}", std::process::id())).unwrap();
        let containers = NodeContainers(node.as_str().to_owned());
        let backend = DockerBackend::new(image(), vec![image()]).expect("docker backend");
        backend
            .check()
            .await
            .expect("docker backend usable (run scripts/build-images)");
        let pool = Arc::new(Pool::new(
            Arc::new(backend),
            PoolSettings {
                node: node.clone(),
                dir: dir.path().to_owned(),
                limits: SandboxLimits {
                    memory_mb: 256,
                    pids: 64,
                    cpus: 1.0,
                    network: "none".into(),
                    tmpfs_mb: 16,
                },
                max_sessions,
                idle_ttl: TTL,
                warm: 1,
                concurrency: 2,
                sync_limits: SyncLimits::default(),
            },
            SessionRegistry::new(&redis.url(), TTL).unwrap(),
            WorkspaceSync::new(nats.client().await),
        ));
        pool.fill_warm().await;
        Rig {
            _nats: nats,
            redis,
            _dir: dir,
            node,
            _containers: containers,
            pool,
        }
    }

    fn registry(&self) -> SessionRegistry {
        SessionRegistry::new(&self.redis.url(), TTL).unwrap()
    }
}

fn container_exists(sandbox_id: &str) -> bool {
    Command::new("docker")
        .args(["inspect", &container_name(sandbox_id)])
        .output()
        .expect("docker inspect")
        .status
        .success()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_claim_puts_the_warm_sandbox_back_untouched() {
    let rig = Rig::start(4).await;
    let (pool, node) = (&rig.pool, rig.node.clone());
    let registry = rig.registry();

    // Another worker holds s1.
    let other = NodeId::parse("other-worker").unwrap();
    let (account, s1) = key("s1");
    let held = registry.claim(&account, &s1, &other, "sbx-elsewhere", None);
    assert_eq!(held.await.unwrap(), Claim::Taken);

    let session = pool
        .open(&key("s1"), None)
        .await
        .expect("handed out at once");
    let warm_id = session.sandbox.sandbox_id.clone();
    match session.claimed().await {
        Err(OpenError::HeldBy(holder)) => assert_eq!(holder, other),
        claimed => panic!("the claim should be lost to {other}: {claimed:?}"),
    }
    assert!(
        pool.local(&key("s1")).is_none(),
        "a lost session leaves the pool"
    );
    assert_eq!(pool.in_use(), 0);
    drop(session);
    let placement = registry.lookup(&account, &s1).await.unwrap().unwrap();
    assert_eq!(placement.node, other, "the holder keeps its session");

    // The same started sandbox serves the next new session, once its claim holds.
    let next = pool.open(&key("s2"), None).await.expect("opened");
    assert_eq!(next.sandbox.sandbox_id, warm_id);
    next.claimed().await.expect("s2 is nobody else's");
    let (_, s2) = key("s2");
    let placement = registry.lookup(&account, &s2).await.unwrap().unwrap();
    assert_eq!((placement.node, placement.sandbox_id), (node, warm_id));
    drop(next);
    pool.shutdown().await;
}

/// At `max_sessions`, a new session takes the room of the least recently used idle one, whose
/// sandbox and registry entry then go; busy sessions are never evicted.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_worker_evicts_its_least_recently_used_idle_session() {
    let rig = Rig::start(2).await;
    let (pool, registry) = (&rig.pool, rig.registry());
    let mut sandboxes = Vec::new();
    for name in ["s1", "s2"] {
        let session = pool.open(&key(name), None).await.expect("opened");
        session.claimed().await.expect("claimed");
        sandboxes.push(session.sandbox.sandbox_id.clone());
        pool.fill_warm().await;
    }
    assert_eq!(pool.in_use(), 2);

    // s1 is the least recently used: s3 takes its room.
    let s3 = pool.open(&key("s3"), None).await.expect("room is made");
    s3.claimed().await.expect("claimed");
    assert!(pool.local(&key("s1")).is_none(), "s1 was evicted");
    assert!(pool.local(&key("s2")).is_some(), "s2 stays");
    assert_eq!(pool.in_use(), 2);
    let (account, s1) = key("s1");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while container_exists(&sandboxes[0]) || registry.lookup(&account, &s1).await.unwrap().is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "s1's sandbox and registry entry go"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(container_exists(&sandboxes[1]), "s2's sandbox stays");

    // Both held sessions busy (s3's use is still alive, s2 in use now): no room.
    let s2 = pool.local(&key("s2")).expect("s2");
    match pool.open(&key("s4"), None).await {
        Err(OpenError::Failed(e)) => assert_eq!(e.code, ErrorCode::Unavailable, "{e}"),
        opened => panic!("every session is busy, yet: {opened:?}"),
    }
    drop((s2, s3));
    pool.shutdown().await;
}
