//! The session registry's contract, the same for both stores it can live in: a real Redis and
//! a real JetStream key-value bucket. Claims are compare-and-set (one winner among racing
//! workers, a holder believed gone can be replaced, a live one cannot), touches keep an entry
//! alive past its TTL, releases forget only the releaser's own entry.

use std::time::{Duration, Instant};

use toolmesh_kernel::redis_link::RedisConfig;
use toolmesh_kernel::{Account, NodeId, SessionId};
use toolmesh_sandbox::pool::SessionKey;
use toolmesh_sandbox::registry::kv::{KvRegistry, BUCKET};
use toolmesh_sandbox::registry::{Claim, Claimant, Placement, RedisRegistry, SessionRegistry};
use toolmesh_testkit::{wait_until, LeafSite, NatsServer, RedisServer, HUB_DOMAIN};

/// Short, so that expiry is seen within a test.
const TTL: Duration = Duration::from_secs(2);

/// A store with its server, kept alive as long as the registry is used.
enum Rig {
    Redis(RedisServer),
    Kv(NatsServer),
    /// A hub in the domain [`HUB_DOMAIN`] and a worker site linked to it: registries open
    /// alternately on either side, all through the domain.
    Leaf(NatsServer, LeafSite, std::sync::atomic::AtomicUsize),
}

impl Rig {
    async fn start(kind: &str) -> Rig {
        match kind {
            "redis" => Rig::Redis(RedisServer::start()),
            "leaf" => {
                let hub = NatsServer::start_hub();
                let site = LeafSite::start(hub.leaf_port()).await;
                Rig::Leaf(hub, site, Default::default())
            }
            _ => Rig::Kv(NatsServer::start_jetstream()),
        }
    }

    /// A registry of this store, as one more worker opens it.
    async fn registry(&self) -> SessionRegistry {
        match self {
            Rig::Redis(redis) => SessionRegistry::Redis(
                RedisRegistry::new(&RedisConfig::url(redis.url()), TTL).unwrap(),
            ),
            Rig::Kv(nats) => {
                let js = async_nats::jetstream::new(nats.client().await);
                SessionRegistry::JetStream(KvRegistry::start(&js, TTL, 1).await.unwrap().into())
            }
            Rig::Leaf(hub, site, opened) => {
                let n = opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let url = if n % 2 == 0 { site.url() } else { hub.url() };
                let client = async_nats::connect(url).await.unwrap();
                let js = async_nats::jetstream::with_domain(client, HUB_DOMAIN);
                SessionRegistry::JetStream(KvRegistry::start(&js, TTL, 1).await.unwrap().into())
            }
        }
    }
}

/// Three tests of one check, one per store: Redis, JetStream, and JetStream across a leaf link.
macro_rules! in_every_store {
    ($check:ident) => {
        mod $check {
            #[tokio::test]
            async fn redis() {
                super::$check("redis").await;
            }

            #[tokio::test]
            async fn jetstream() {
                super::$check("jetstream").await;
            }

            #[tokio::test]
            async fn leaf_site() {
                super::$check("leaf").await;
            }
        }
    };
}

fn ids(session: &str) -> SessionKey {
    (
        Account::parse("acme").unwrap(),
        SessionId::parse(session).unwrap(),
    )
}

/// A claim by `node` for its sandbox `sandbox_id`, replacing nobody.
fn by<'a>(node: &'a NodeId, sandbox_id: &'a str) -> Claimant<'a> {
    Claimant {
        node,
        sandbox_id,
        replacing: None,
    }
}

/// [`by`], in place of `gone`.
fn instead_of<'a>(node: &'a NodeId, sandbox_id: &'a str, gone: &'a NodeId) -> Claimant<'a> {
    Claimant {
        replacing: Some(gone),
        ..by(node, sandbox_id)
    }
}

fn node(name: &str) -> NodeId {
    NodeId::parse(name).unwrap()
}

async fn claims_are_compare_and_set(kind: &str) {
    let rig = Rig::start(kind).await;
    let (w1, w2) = (rig.registry().await, rig.registry().await);
    let key = ids("s1");
    let (a, b, c) = (node("worker-a"), node("worker-b"), node("worker-c"));

    assert_eq!(w1.lookup(&key).await.unwrap(), None);
    let taken = w1.claim(&key, &by(&a, "sbx-a")).await;
    assert_eq!(taken.unwrap(), Claim::Taken, "{kind}: nobody held it");
    // Again by its holder (a retried claim, a new sandbox): still taken, the entry follows.
    let again = w1.claim(&key, &by(&a, "sbx-a2")).await;
    assert_eq!(again.unwrap(), Claim::Taken, "{kind}: its own holder");
    let seen = w2.lookup(&key).await.unwrap();
    assert_eq!(
        seen,
        Some(Placement {
            node: a.clone(),
            sandbox_id: "sbx-a2".into()
        }),
        "{kind}: another worker sees the holder"
    );

    // A live holder is not replaced; one believed gone is, by the worker that believes it.
    let held = w2.claim(&key, &by(&b, "sbx-b")).await;
    assert_eq!(held.unwrap(), Claim::HeldBy(a.clone()), "{kind}");
    let wrong = w2.claim(&key, &instead_of(&b, "sbx-b", &c)).await;
    assert_eq!(
        wrong.unwrap(),
        Claim::HeldBy(a.clone()),
        "{kind}: c never held it"
    );
    let over = w2.claim(&key, &instead_of(&b, "sbx-b", &a)).await;
    assert_eq!(over.unwrap(), Claim::Taken, "{kind}: a was gone");
    assert_eq!(w1.lookup(&key).await.unwrap().unwrap().node, b);

    // The former holder can neither touch nor release it any more.
    assert!(!w1.touch(&key, &a).await.unwrap(), "{kind}");
    w1.release(&key, &a).await.unwrap();
    assert_eq!(
        w1.lookup(&key).await.unwrap().unwrap().node,
        b,
        "{kind}: a release by a non-holder changes nothing"
    );
    assert!(w2.touch(&key, &b).await.unwrap(), "{kind}");
    w2.release(&key, &b).await.unwrap();
    assert_eq!(w1.lookup(&key).await.unwrap(), None, "{kind}");
    // Released, it is free again for anyone.
    let next = w1.claim(&key, &by(&c, "sbx-c")).await;
    assert_eq!(next.unwrap(), Claim::Taken, "{kind}: free after a release");
}

in_every_store!(claims_are_compare_and_set);

/// Eight workers claim one new session at once: exactly one takes it, and every other one is
/// told that winner.
async fn one_of_racing_claims_wins(kind: &str) {
    let rig = Rig::start(kind).await;
    let mut workers = Vec::new();
    for _ in 0..8 {
        workers.push(rig.registry().await);
    }
    let key = ids("raced");
    let claims = workers.iter().enumerate().map(|(i, registry)| {
        let key = key.clone();
        async move {
            let me = node(&format!("worker-{i}"));
            let claim = registry
                .claim(&key, &by(&me, &format!("sbx-{i}")))
                .await
                .unwrap();
            (me, claim)
        }
    });
    let outcomes = futures::future::join_all(claims).await;
    let winners: Vec<_> = outcomes
        .iter()
        .filter(|(_, claim)| *claim == Claim::Taken)
        .map(|(me, _)| me.clone())
        .collect();
    assert_eq!(winners.len(), 1, "{kind}: {outcomes:?}");
    let winner = &winners[0];
    for (me, claim) in &outcomes {
        if me != winner {
            assert_eq!(claim, &Claim::HeldBy(winner.clone()), "{kind}: {me}");
        }
    }
    let holder = workers[0].lookup(&key).await.unwrap().unwrap();
    assert_eq!(&holder.node, winner, "{kind}");
}

in_every_store!(one_of_racing_claims_wins);

/// An entry its holder keeps touching outlives the TTL; one nobody touches is gone after it.
async fn touched_entries_live_and_others_lapse(kind: &str) {
    let rig = Rig::start(kind).await;
    let registry = rig.registry().await;
    let (kept, lapsed) = (ids("kept"), ids("lapsed"));
    let me = node("worker-a");
    for key in [&kept, &lapsed] {
        let claim = registry.claim(key, &by(&me, "sbx")).await;
        assert_eq!(claim.unwrap(), Claim::Taken, "{kind}");
    }
    let start = Instant::now();
    // Its holder keeps touching `kept` (at each look) until `lapsed` is gone.
    let lapsed_went = wait_until(TTL * 4, || async {
        assert!(registry.touch(&kept, &me).await.unwrap(), "{kind}");
        registry.lookup(&lapsed).await.unwrap().is_none()
    })
    .await;
    assert!(lapsed_went, "{kind}: an untouched entry outlived four TTLs");
    assert!(
        start.elapsed() >= TTL / 2,
        "{kind}: the entry went before its TTL ({:?})",
        start.elapsed()
    );
    assert_eq!(
        registry.lookup(&kept).await.unwrap().unwrap().node,
        me,
        "{kind}: the touched entry outlived its TTL"
    );
}

in_every_store!(touched_entries_live_and_others_lapse);

/// The bucket is a key-value bucket any NATS client reads: `nats kv get` or a client's
/// `get_key_value` see the holder under `<account>.<session>`.
#[tokio::test]
async fn the_jetstream_registry_is_a_plain_key_value_bucket() {
    let nats = NatsServer::start_jetstream();
    let client = nats.client().await;
    let js = async_nats::jetstream::new(client);
    let registry = KvRegistry::start(&js, TTL, 1).await.unwrap();
    let key = ids("plain");
    let claim = registry.claim(&key, &by(&node("worker-a"), "sbx-1")).await;
    assert_eq!(claim.unwrap(), Claim::Taken);
    // A second start (another worker) finds the bucket as it is.
    KvRegistry::start(&js, TTL, 1).await.unwrap();
    let kv = js.get_key_value(BUCKET).await.unwrap();
    let value = kv.get("acme.plain").await.unwrap().expect("the entry");
    let value: serde_json::Value = serde_json::from_slice(&value).unwrap();
    assert_eq!(
        value,
        serde_json::json!({"node": "worker-a", "sandbox": "sbx-1"})
    );
}
