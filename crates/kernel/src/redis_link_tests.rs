use std::time::{Duration, Instant};

use redis::Script;
use toolmesh_testkit::{wait_until, ClosedPort, RedisSentinels, RedisServer};

use super::*;

/// `TOOLMESH_REDIS_*` as `env` sets them, read: the config as `{:?}` shows it, or the error.
fn check(env: &[(&str, &str)], expect: &str) {
    let got = match RedisConfig::from_env(&RawEnv::from_pairs(env.iter().copied())) {
        Ok(config) => format!("{config:?}"),
        Err(e) => e.to_string(),
    };
    assert!(got.contains(expect), "{env:?}: {got}");
}

#[test]
fn the_config_reads_a_url_or_sentinels_and_the_wait() {
    check(&[], r#"target: Url("redis://127.0.0.1:6379")"#);
    check(&[], "wait: ReplicaWait { replicas: 0, timeout: 1s }");
    check(
        &[("TOOLMESH_REDIS_SENTINELS", "10.0.0.1:26379, [::1]:26380")],
        r#"sentinels: ["10.0.0.1:26379", "[::1]:26380"], master_name: "toolmesh""#,
    );
    // With sentinels a write waits for one replica unless told otherwise.
    check(
        &[("TOOLMESH_REDIS_SENTINELS", "s:26379")],
        "wait: ReplicaWait { replicas: 1, timeout: 1s }",
    );
    check(
        &[
            ("TOOLMESH_REDIS_SENTINELS", "s:26379"),
            ("TOOLMESH_REDIS_MASTER_NAME", "main"),
            ("TOOLMESH_REDIS_WAIT_REPLICAS", "0"),
            ("TOOLMESH_REDIS_WAIT_MS", "250"),
        ],
        r#"master_name: "main", primary_url: "redis://127.0.0.1:6379" }, wait: ReplicaWait { replicas: 0, timeout: 250ms }"#,
    );
    check(
        &[("TOOLMESH_REDIS_WAIT_REPLICAS", "2")],
        "wait: ReplicaWait { replicas: 2, timeout: 1s }",
    );
    // A master name without sentinels changes nothing.
    check(
        &[("TOOLMESH_REDIS_MASTER_NAME", "main")],
        r#"target: Url("redis://127.0.0.1:6379")"#,
    );
    // Passwords never show.
    check(
        &[
            ("TOOLMESH_REDIS_URL", "redis://:hunter2@r:6379/2"),
            ("TOOLMESH_REDIS_SENTINELS", "redis://:s3cret@s:26379"),
        ],
        r#"sentinels: ["redis://***@s:26379"], master_name: "toolmesh", primary_url: "redis://***@r:6379/2""#,
    );
}

#[test]
fn bad_values_name_the_variable() {
    for (env, says) in [
        (
            ("TOOLMESH_REDIS_SENTINELS", "s"),
            "TOOLMESH_REDIS_SENTINELS",
        ),
        (("TOOLMESH_REDIS_SENTINELS", "s:x"), "is not a port number"),
        (("TOOLMESH_REDIS_SENTINELS", ":26379"), "not host:port"),
        (("TOOLMESH_REDIS_SENTINELS", "s:0"), "not host:port"),
        (("TOOLMESH_REDIS_WAIT_MS", "0"), "TOOLMESH_REDIS_WAIT_MS"),
        (
            ("TOOLMESH_REDIS_WAIT_REPLICAS", "-1"),
            "TOOLMESH_REDIS_WAIT_REPLICAS",
        ),
    ] {
        check(&[env], says);
    }
    check(
        &[
            ("TOOLMESH_REDIS_SENTINELS", "s:1"),
            ("TOOLMESH_REDIS_MASTER_NAME", "a b"),
        ],
        "TOOLMESH_REDIS_MASTER_NAME",
    );
    check(
        &[("TOOLMESH_REDIS_SENTINELS", "redis://:pw@")],
        r#"TOOLMESH_REDIS_SENTINELS="redis://***@" is not valid"#,
    );
}

#[test]
fn what_says_the_primary_may_have_moved() {
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert!(primary_moved(&io));
    assert!(primary_moved(&not_connected()));
    for code in ["READONLY", "MASTERDOWN", "LOADING"] {
        let e = RedisError::from((ErrorKind::Server(server_kind(code)), "from the server"));
        assert!(primary_moved(&e), "{code}");
    }
    let script = RedisError::from((ErrorKind::Server(ServerErrorKind::NoScript), "NOSCRIPT"));
    assert!(!primary_moved(&script));
    let typed = RedisError::from((ErrorKind::UnexpectedReturnType, "a bug"));
    assert!(!primary_moved(&typed));
}

fn server_kind(code: &str) -> ServerErrorKind {
    match code {
        "READONLY" => ServerErrorKind::ReadOnly,
        "MASTERDOWN" => ServerErrorKind::MasterDown,
        _ => ServerErrorKind::BusyLoading,
    }
}

#[test]
fn only_a_script_call_takes_a_wait_behind_it() {
    let script = Script::new("return 1");
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(script.get_hash()).arg(0);
    assert!(is_evalsha(&eval));
    assert!(!is_evalsha(
        redis::cmd("SCRIPT").arg("LOAD").arg("return 1")
    ));
    assert_eq!(replication(1, 1), Replication::Confirmed { acked: 1 });
    assert_eq!(
        replication(0, 1),
        Replication::Short {
            acked: 0,
            wanted: 1
        }
    );
}

const INCR: &str = "return redis.call('INCR', KEYS[1])";

fn wait_for(replicas: u32, ms: u64) -> ReplicaWait {
    ReplicaWait {
        replicas,
        timeout: Duration::from_millis(ms),
    }
}

#[tokio::test]
async fn a_write_without_the_replicas_it_waits_for_is_short_after_the_wait() {
    let redis = RedisServer::start();
    let link = RedisLink::new(&RedisConfig::url(redis.url())).unwrap();
    let mut conn = link.connection().await.unwrap();
    let script = Script::new(INCR);
    // A fresh server has no script yet: loaded, run again, and waited for again.
    let started = Instant::now();
    let (n, replication): (i64, _) = conn
        .invoke_replicated(&script.key("k"), wait_for(1, 300))
        .await
        .unwrap();
    assert_eq!(n, 1, "the script ran once");
    assert_eq!(
        replication,
        Replication::Short {
            acked: 0,
            wanted: 1
        }
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    let (n, replication): (i64, _) = conn
        .invoke_replicated(&script.key("k"), ReplicaWait::NONE)
        .await
        .unwrap();
    assert_eq!((n, replication), (2, Replication::NotAsked));
}

#[tokio::test]
async fn a_link_to_nothing_fails_within_the_first_connect_wait_and_a_bad_url_at_once() {
    let closed = ClosedPort::new();
    let link = RedisLink::new(&RedisConfig::url(format!(
        "redis://127.0.0.1:{}",
        closed.port()
    )))
    .unwrap();
    let started = Instant::now();
    let e = link.connection().await.unwrap_err();
    assert!(primary_moved(&e), "{e}");
    assert!(started.elapsed() < FIRST_CONNECT_WAIT + Duration::from_secs(1));
    assert!(RedisLink::new(&RedisConfig::url("redis://")).is_err());
}

#[tokio::test]
async fn through_sentinels_writes_wait_for_a_replica_and_follow_the_primary() {
    let mut set = RedisSentinels::start(2);
    let config = RedisConfig {
        target: RedisTarget::Sentinels {
            sentinels: set.sentinels().split(',').map(str::to_owned).collect(),
            master_name: RedisSentinels::MASTER_NAME.to_owned(),
            primary_url: DEFAULT_REDIS_URL.to_owned(),
        },
        wait: wait_for(1, 1000),
    };
    let link = RedisLink::new(&config).unwrap();
    let script = Script::new(INCR);
    let mut conn = link.connection().await.unwrap();
    let (n, replication): (i64, _) = conn
        .invoke_replicated(&script.key("k"), link.wait())
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(
        matches!(replication, Replication::Confirmed { acked } if acked >= 1),
        "{replication:?}"
    );

    let old = set.kill_primary();
    let new = set
        .failed_over_from(old, Duration::from_secs(30))
        .await
        .expect("the sentinels promote a replica");
    // The first request after the kill fails and tells the link; later ones reach the new
    // primary, where the confirmed write is.
    let reached = wait_until(Duration::from_secs(30), || async {
        let Ok(mut conn) = link.connection().await else {
            return false;
        };
        let written: RedisResult<(i64, Replication)> =
            conn.invoke_replicated(&script.key("k"), link.wait()).await;
        matches!(written, Ok((2.., Replication::Confirmed { .. })))
    })
    .await;
    assert!(reached, "no confirmed write on the new primary {new}");
    let address: String = {
        let current = link.0.current.borrow();
        current.as_ref().unwrap().address.clone()
    };
    assert_eq!(address, format!("127.0.0.1:{new}"));
}
