//! The pool against real Redis and Docker: a new session is handed a started sandbox before
//! its registry claim has come back, and a lost claim leaves that sandbox untouched and back
//! among the warm ones; a drain waits for the creations in flight and leaves nothing behind;
//! dead workers' folders are reaped.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use toolmesh_kernel::redis_link::RedisConfig;
use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::{Account, ErrorCode, NodeId, SessionId};
use toolmesh_sandbox::backend::docker::{container_name, DockerBackend};
use toolmesh_sandbox::backend::spawner::Spawner;
use toolmesh_sandbox::backend::{Backend, SandboxLimits, LABEL_NODE};
use toolmesh_sandbox::mirror::SyncLimits;
use toolmesh_sandbox::pool::{OpenError, Pool, PoolSettings, SessionKey};
use toolmesh_sandbox::registry::{Claim, Claimant, RedisRegistry, SessionRegistry};
use toolmesh_sandbox::templates::{Network, Template, Templates};
use toolmesh_testkit::{NatsServer, RedisServer};

mod support;
use support::{image, limits};

/// The pool's only template.
fn dflt(pool: &Pool) -> Arc<Template> {
    pool.settings.templates.default_template().clone()
}

const TTL: Duration = Duration::from_secs(60);

/// Removes the node's containers on drop (also when the test panics).
struct NodeContainers(String);

impl Drop for NodeContainers {
    fn drop(&mut self) {
        for id in containers_of(&self.0) {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v", &id])
                .output();
        }
    }
}

/// Every container (running or not) labelled with `node`.
fn containers_of(node: &str) -> Vec<String> {
    let filter = format!("label={LABEL_NODE}={node}");
    let listed = Command::new("docker")
        .args(["ps", "-aq", "--filter", &filter])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn key(session: &str) -> SessionKey {
    key_of("acme", session)
}

fn key_of(account: &str, session: &str) -> SessionKey {
    (
        Account::parse(account).unwrap(),
        SessionId::parse(session).unwrap(),
    )
}

/// A worker's pool of `max_sessions` with one warm sandbox, on real Redis and Docker.
struct Rig {
    _nats: NatsServer,
    redis: RedisServer,
    dir: tempfile::TempDir,
    node: NodeId,
    _containers: NodeContainers,
    pool: Arc<Pool>,
}

impl Rig {
    async fn start(max_sessions: usize) -> Rig {
        let node = format!("pooltest{}-{max_sessions}", std::process::id());
        let rig = Rig::new(&node, max_sessions, 1, false).await;
        rig.pool.fill_warm().await;
        rig
    }

    /// A pool of `max_sessions` keeping `warm` sandboxes (none made yet), whose commands run
    /// through a spawner when `spawner`, as the node's do.
    async fn new(node: &str, max_sessions: usize, warm: usize, spawner: bool) -> Rig {
        let nats = NatsServer::start();
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        let node = NodeId::parse(node).unwrap();
        let containers = NodeContainers(node.as_str().to_owned());
        let backend = DockerBackend::new(image(), vec![image()]).expect("docker backend");
        let backend = match spawner {
            true => backend.with_spawner(Spawner::program(env!(
                "CARGO_BIN_EXE_toolmesh-sandbox-spawner"
            ))),
            false => backend,
        };
        backend
            .check()
            .await
            .expect("docker backend usable (run scripts/build-images)");
        let pool = Arc::new(Pool::new(
            Arc::new(backend),
            PoolSettings {
                node: node.clone(),
                dir: dir.path().to_owned(),
                templates: Templates::of_default(Template {
                    name: "default".into(),
                    image: toolmesh_sandbox::config::DEFAULT_SANDBOX_IMAGE.into(),
                    limits: SandboxLimits {
                        memory_mb: 256,
                        tmpfs_mb: 16,
                        ..limits()
                    },
                    network: Network::None,
                    warm: Some(warm),
                    idle_ttl: TTL,
                }),
                max_sessions,
                max_sessions_per_account: max_sessions,
                idle_ttl: TTL,
                metrics: Default::default(),
                concurrency: 2,
                sync_limits: SyncLimits::default(),
                disk: toolmesh_sandbox::disk::DiskPlan { mb: 64, note: None },
            },
            SessionRegistry::Redis(
                RedisRegistry::new(&RedisConfig::url(redis.url()), TTL).unwrap(),
            ),
            WorkspaceSync::new(nats.client().await),
        ));
        Rig {
            _nats: nats,
            redis,
            dir,
            node,
            _containers: containers,
            pool,
        }
    }

    fn registry(&self) -> SessionRegistry {
        SessionRegistry::Redis(
            RedisRegistry::new(&RedisConfig::url(self.redis.url()), TTL).unwrap(),
        )
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
    let held = registry
        .claim(
            &key("s1"),
            &Claimant {
                node: &other,
                sandbox_id: "sbx-elsewhere",
                replacing: None,
            },
        )
        .await;
    assert_eq!(held.unwrap(), Claim::Taken);

    let session = pool
        .open(&key("s1"), None, &dflt(pool))
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
    let placement = registry.lookup(&key("s1")).await.unwrap().unwrap();
    assert_eq!(placement.node, other, "the holder keeps its session");

    // The same started sandbox serves the next new session, once its claim holds.
    let next = pool
        .open(&key("s2"), None, &dflt(pool))
        .await
        .expect("opened");
    assert_eq!(next.sandbox.sandbox_id, warm_id);
    next.claimed().await.expect("s2 is nobody else's");
    let placement = registry.lookup(&key("s2")).await.unwrap().unwrap();
    assert_eq!((placement.node, placement.sandbox_id), (node, warm_id));
    drop(next);
    pool.shutdown().await;
}

/// At `max_sessions`, a new session of another account takes the room of the least recently
/// used idle one of the account holding the most, whose sandbox and registry entry then go;
/// busy sessions are never evicted. (acme holds its quota, `max_sessions`: a third session of
/// its own would be `limit_exceeded`, `sandbox_quota::*`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_full_worker_evicts_its_least_recently_used_idle_session() {
    let rig = Rig::start(2).await;
    let (pool, registry) = (&rig.pool, rig.registry());
    let mut sandboxes = Vec::new();
    for name in ["s1", "s2"] {
        let session = pool
            .open(&key(name), None, &dflt(pool))
            .await
            .expect("opened");
        session.claimed().await.expect("claimed");
        sandboxes.push(session.sandbox.sandbox_id.clone());
        pool.fill_warm().await;
    }
    assert_eq!(pool.in_use(), 2);

    // s1 is the least recently used: globex's s3 takes its room.
    let s3 = pool
        .open(&key_of("globex", "s3"), None, &dflt(pool))
        .await
        .expect("room is made");
    s3.claimed().await.expect("claimed");
    assert!(pool.local(&key("s1")).is_none(), "s1 was evicted");
    assert!(pool.local(&key("s2")).is_some(), "s2 stays");
    assert_eq!(pool.in_use(), 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while container_exists(&sandboxes[0]) || registry.lookup(&key("s1")).await.unwrap().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "s1's sandbox and registry entry go"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(container_exists(&sandboxes[1]), "s2's sandbox stays");

    // Both held sessions busy (s3's use is still alive, s2 in use now): no room.
    let s2 = pool.local(&key("s2")).expect("s2");
    match pool.open(&key("s4"), None, &dflt(pool)).await {
        Err(OpenError::Failed(e)) => assert_eq!(e.code, ErrorCode::Unavailable, "{e}"),
        opened => panic!("every session is busy, yet: {opened:?}"),
    }
    drop((s2, s3));
    pool.shutdown().await;
}

/// Polls `done` every 50 ms until it holds; panics with `what` after 60 s.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A worker drained right after its start, while its warm-up's creations are in flight (two at
/// once: the start's and a session's top-up), waits for them and removes what they made: no
/// container of the node is left, running or not, and neither is its sandbox folder.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_drained_during_its_warm_up_leaves_nothing() {
    let rig = Rig::new(&format!("pooldrain{}", std::process::id()), 4, 2, true).await;
    let (pool, node) = (rig.pool.clone(), rig.node.as_str().to_owned());
    let warm_ups: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.fill_warm().await })
        })
        .collect();
    wait_until("a warm sandbox's container is being made", || {
        !containers_of(&node).is_empty()
    })
    .await;
    // The worker's folder is its own alone: no other user on the host reaches the spawner's
    // socket or a workspace (the containers reach theirs through their bind mounts).
    assert_eq!(mode_of(&pool.node_dir()), 0o700);
    pool.shutdown().await;
    assert_eq!(
        containers_of(&node),
        Vec::<String>::new(),
        "no container is left"
    );
    assert!(!pool.node_dir().exists(), "the worker's folder is removed");
    for warm_up in warm_ups {
        warm_up.await.unwrap();
    }
    assert_eq!(containers_of(&node), Vec::<String>::new(), "nor made later");
    assert!(!pool.node_dir().exists());
}

/// Marks `folder` as last touched an hour ago.
fn age_an_hour(folder: &std::path::Path) {
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::open(folder)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
}

/// The folder of a worker that died (killed: it could not remove it) is removed by a live
/// worker of the same sandbox directory once it has been left untouched for a while; live
/// workers' folders, a folder just made and the staged spawners stay. A worker started under
/// a dead one's id removes that folder at its start.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_workers_folder_is_reaped_by_a_live_one() {
    let rig = Rig::new(&format!("poolreap{}", std::process::id()), 4, 0, false).await;
    let dir = rig.dir.path();
    let node = rig.node.as_str().to_owned();
    let make = |name: &str, old: bool| {
        let folder = dir.join(name);
        std::fs::create_dir_all(folder.join("sbx-0123/workspace")).unwrap();
        std::fs::write(folder.join("sbx-0123/workspace/notes.txt"), "session files").unwrap();
        if old {
            age_an_hour(&folder);
        }
        folder
    };
    let dead = make("dead-worker", true);
    let live = make("live-worker", true);
    let young = make("young-worker", false);
    let staged = make(".spawner", true);
    let own = make(&node, true);

    let live_nodes = vec!["live-worker".to_owned(), node.clone()];
    rig.pool.reap_orphans("", Some(&live_nodes)).await;
    assert!(!dead.exists(), "the dead worker's folder is reaped");
    for kept in [&live, &young, &staged, &own] {
        assert!(kept.exists(), "{} stays", kept.display());
    }

    // At its start (no cluster view yet) a worker removes what its previous run left.
    rig.pool.reap_orphans(&node, None).await;
    assert!(!own.exists(), "the previous run's folder is removed");
    assert!(live.exists() && young.exists() && staged.exists());
}

/// A sandbox folder whose removal failed (here: made by hand, 5,000 levels deep) is removed by
/// its own worker's reaper once nothing touched it for a minute; a held sandbox's folder and
/// a folder just made stay.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_folder_left_behind_is_reaped_by_its_own_worker() {
    let rig = Rig::new(&format!("poolleft{}", std::process::id()), 4, 0, false).await;
    let session = rig
        .pool
        .open(&key("s1"), None, &dflt(&rig.pool))
        .await
        .expect("opened");
    session.claimed().await.expect("claimed");
    let held = session.sandbox.workspace_dir.parent().unwrap().to_owned();
    let own = rig.dir.path().join(rig.node.as_str());
    let make = |name: &str, old: bool| {
        let folder = own.join(name);
        std::fs::create_dir_all(folder.join("workspace")).unwrap();
        let mut dir = cap_std::fs::Dir::open_ambient_dir(
            folder.join("workspace"),
            cap_std::ambient_authority(),
        )
        .unwrap();
        for _ in 0..5000 {
            dir.create_dir("d").unwrap();
            dir = dir.open_dir("d").unwrap();
        }
        if old {
            age_an_hour(&folder);
        }
        folder
    };
    let left = make("sbx-left0123456789", true);
    let young = make("sbx-young012345678", false);
    age_an_hour(&held);

    let live_nodes = vec![rig.node.as_str().to_owned()];
    rig.pool.reap_orphans("", Some(&live_nodes)).await;
    assert!(!left.exists(), "the folder left behind is reaped");
    assert!(young.exists(), "a folder just made stays");
    assert!(
        held.join("workspace").is_dir(),
        "a held sandbox's folder stays"
    );
    drop(session);
    rig.pool.shutdown().await;
    assert!(!own.exists(), "the drain removes the rest");
}
