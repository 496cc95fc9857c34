//! Unit tests of `audit.rs`.

use super::*;

fn ctx(invocation: &str) -> InvocationContext {
    InvocationContext {
        account: Account::parse("acme").unwrap(),
        invocation_id: crate::InvocationId::parse(invocation).unwrap(),
        session_id: None,
        user_id: Some("u".into()),
        agent_id: None,
    }
}

/// A chain of `entries`, sealed one after the other, stored from seq 1.
fn chain(entries: &[AuditEntry]) -> Vec<StoredEntry> {
    let mut prev: Option<String> = None;
    let mut out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let (object, sha) = seal(entry, prev.as_deref());
        prev = Some(sha);
        out.push(StoredEntry {
            seq: i as u64 + 1,
            entry: Value::Object(object),
        });
    }
    out
}

fn call(invocation: &str, status: &str) -> AuditEntry {
    AuditEntry::call(&ctx(invocation), "write_workspace_file", status)
}

fn check(entries: &[StoredEntry], faults: &[(u64, &str)], gaps: &[&str]) {
    let account = Account::parse("acme").unwrap();
    let report = verify(&account, entries, SystemTime::now(), Duration::ZERO);
    let got: Vec<(u64, String)> = report
        .problems
        .iter()
        .map(|p| (p.seq, p.fault.to_string()))
        .collect();
    assert_eq!(got.len(), faults.len(), "{got:?}");
    for ((seq, text), (want_seq, fragment)) in got.iter().zip(faults) {
        assert_eq!(seq, want_seq, "{got:?}");
        assert!(text.starts_with(fragment), "{text} vs {fragment}");
    }
    let got_gaps: Vec<&str> = report
        .gaps
        .iter()
        .map(|g| g.invocation_id.as_str())
        .collect();
    assert_eq!(got_gaps, gaps);
}

#[test]
fn the_hash_covers_every_member_but_sha256_in_jcs_form() {
    let (object, sha) = seal(&call("inv-1", "finished"), Some("ab"));
    assert_eq!(object.get("sha256").and_then(Value::as_str), Some(&*sha));
    assert_eq!(
        object.keys().next_back().map(String::as_str),
        Some("sha256")
    );
    let mut without = object.clone();
    without.remove("sha256");
    let jcs = serde_json_canonicalizer::to_string(&Value::Object(without)).unwrap();
    assert!(
        jcs.starts_with(r#"{"account":"acme","agent_id":null,"#),
        "{jcs}"
    );
    assert!(jcs.contains(r#""prev_sha256":"ab""#), "{jcs}");
    assert_eq!(sha, sha256_hex(jcs.as_bytes()));
    // Member order does not matter, only content.
    let reordered: Map<String, Value> = object.clone().into_iter().rev().collect();
    assert_eq!(entry_sha256(&reordered), sha);
}

#[test]
fn a_whole_chain_verifies_and_each_kind_of_damage_is_named() {
    let entries = [
        call("inv-1", "started"),
        call("inv-1", "finished"),
        call("inv-2", "finished"),
        call("inv-3", "finished"),
    ];
    let whole = chain(&entries);
    check(&whole, &[], &[]);

    // A changed member: the entry's own hash fails.
    let mut altered = whole.clone();
    altered[2].entry["ok"] = Value::Bool(true);
    check(&altered, &[(3, "altered")], &[]);

    // A removed entry: the next one's link fails.
    let mut removed = whole.clone();
    removed.remove(2);
    check(&removed, &[(4, "broken link")], &[]);

    // An entry re-hashed after a change (a forger without the later entries' help):
    // its own hash holds, the link after it does not.
    let mut rehashed = whole.clone();
    let mut object = rehashed[1].entry.as_object().unwrap().clone();
    object.insert("ok".into(), Value::Bool(false));
    let sha = entry_sha256(&object);
    object.insert("sha256".into(), Value::from(sha));
    rehashed[1].entry = Value::Object(object);
    check(&rehashed, &[(3, "broken link")], &[]);

    // Not an object, and another account's entry.
    let mut junk = whole.clone();
    junk[0].entry = Value::from("nope");
    check(&junk, &[(1, "malformed"), (2, "broken link")], &[]);
    let mut other = chain(&[AuditEntry {
        account: Account::parse("globex").unwrap(),
        ..call("inv-9", "finished")
    }]);
    other[0].seq = 7;
    check(&other, &[(7, "names account")], &[]);
}

#[test]
fn a_started_call_without_finished_is_a_gap_once_the_grace_passed() {
    let entries = chain(&[
        call("inv-1", "started"),
        call("inv-2", "started"),
        call("inv-2", "finished"),
    ]);
    check(&entries, &[], &["inv-1"]);
    let account = Account::parse("acme").unwrap();
    let young = verify(
        &account,
        &entries,
        SystemTime::now(),
        Duration::from_secs(3600),
    );
    assert!(young.gaps.is_empty());
    assert_eq!(young.open.len(), 1);
    assert!(young.whole());
}

#[test]
fn the_first_retained_entry_s_link_is_taken_as_given() {
    let entries = chain(&[
        call("inv-1", "finished"),
        call("inv-2", "finished"),
        call("inv-3", "finished"),
    ]);
    let account = Account::parse("acme").unwrap();
    let aged = verify(&account, &entries[1..], SystemTime::now(), Duration::ZERO);
    assert!(aged.whole(), "{aged:?}");
    assert_eq!(
        aged.taken_as_given.as_deref(),
        entries[0].entry["sha256"].as_str()
    );
    let genesis = verify(&account, &entries, SystemTime::now(), Duration::ZERO);
    assert_eq!(genesis.taken_as_given, None);
}

#[test]
fn approval_entries_name_the_call_that_made_the_change() {
    let approval: ApprovalRequest = serde_json::from_value(serde_json::json!({
        "id": "appr_1", "account": "acme", "session_id": "s-1", "invocation_id": "inv-1",
        "tool_name": "write_workspace_file", "risk_level": "high",
        "side_effects": ["workspace_write"], "arguments_sha256": "ab",
        "arguments_preview": "{}", "status": "approved", "created_at": "x",
        "expires_at": "y", "decided_by": "alice", "decided_at": "z", "reason": null
    }))
    .unwrap();
    let by_person = AuditEntry::approval(&approval, "approved", None);
    assert_eq!(by_person.invocation_id.as_deref(), Some("inv-1"));
    assert_eq!(by_person.decided_by.as_deref(), Some("alice"));
    let used = AuditEntry::approval(&approval, "used", Some(&ctx("inv-2")));
    assert_eq!(used.invocation_id.as_deref(), Some("inv-2"));
    assert_eq!(used.user_id.as_deref(), Some("u"));
    assert_eq!(used.approval_id.as_deref(), Some("appr_1"));
}

#[test]
fn backoff_stays_under_its_ceiling() {
    for attempt in 0..MAX_ATTEMPTS {
        let pause = backoff(attempt);
        assert!(pause <= MAX_BACKOFF, "{attempt}: {pause:?}");
        assert!(pause >= Duration::from_micros(500), "{attempt}: {pause:?}");
    }
}

/// Two writers (two connections, as two nodes) appending to one account at once keep one
/// linear chain on a real JetStream server: no fork, nothing lost, every link whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_keep_one_linear_chain() {
    let server = toolmesh_testkit::NatsServer::start_jetstream();
    let config = AuditConfig::default();
    let a = AuditTrail::start(&server.client().await, "node-a", &config).await;
    let b = AuditTrail::start(&server.client().await, "node-b", &config).await;
    assert!(a.is_on() && b.is_on());
    let mut tasks = Vec::new();
    for i in 0..60 {
        let trail = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            trail
                .append(call(&format!("inv-{i}"), "finished"))
                .await
                .expect("appended")
                .expect("the trail is on")
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let account = Account::parse("acme").unwrap();
    let page = a
        .read(&account, 0, MAX_QUERY_LIMIT, usize::MAX)
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 60);
    assert!(!page.more);
    let report = verify(&account, &page.entries, SystemTime::now(), Duration::ZERO);
    assert!(report.whole(), "{report:?}");
    assert_eq!(report.taken_as_given, None);
    assert_eq!(a.written() + b.written(), 60);
    assert_eq!(a.failed() + b.failed(), 0);
    // Paging: after the 10th entry, 5 at a time.
    let after = page.entries[9].seq;
    let next = a.read(&account, after, 5, usize::MAX).await.unwrap();
    assert_eq!(next.entries.len(), 5);
    assert!(next.more);
    assert_eq!(next.entries[0], page.entries[10]);
}

#[tokio::test]
async fn without_jetstream_the_trail_is_off_and_says_why() {
    let server = toolmesh_testkit::NatsServer::start();
    let trail = AuditTrail::start(&server.client().await, "n", &AuditConfig::default()).await;
    assert!(!trail.is_on());
    assert_eq!(trail.append(call("inv-1", "finished")).await.unwrap(), None);
    assert_eq!(trail.status()["status"], "off");
    let account = Account::parse("acme").unwrap();
    assert!(matches!(
        trail.read(&account, 0, 1, usize::MAX).await,
        Err(AuditError::Off(_))
    ));
}

fn check_head(text: &str, expect: Result<(&str, Option<u64>, Option<&str>), &str>) {
    match (ChainHead::parse(text), expect) {
        (Ok(head), Ok((sha, seq, account))) => {
            assert_eq!(
                (head.sha256.as_str(), head.seq, head.account.as_deref()),
                (sha, seq, account),
                "{text}"
            );
        }
        (Err(e), Err(fragment)) => assert!(e.contains(fragment), "{text}: {e}"),
        (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn a_kept_head_reads_back_from_what_head_prints_or_from_its_sha256() {
    let entries = chain(&[call("inv-1", "finished"), call("inv-2", "finished")]);
    let account = Account::parse("acme").unwrap();
    let head = ChainHead::of(&account, &entries).unwrap();
    assert_eq!(head.seq, Some(2));
    assert_eq!(
        Some(head.sha256.as_str()),
        entries[1].entry["sha256"].as_str()
    );
    assert_eq!(head.at.as_deref(), entries[1].entry["at"].as_str());
    // Printed (pretty, with `ok`, as the command does) and read back.
    let mut printed = serde_json::json!({"ok": true});
    printed
        .as_object_mut()
        .unwrap()
        .extend(head.to_json().as_object().unwrap().clone());
    let printed = serde_json::to_string_pretty(&printed).unwrap();
    assert_eq!(ChainHead::parse(&printed).unwrap(), head);
    assert_eq!(position(&entries, &head.sha256), Some(2));
    assert_eq!(position(&entries, &"0".repeat(64)), None);
    assert_eq!(ChainHead::of(&account, &[]), None);

    let sha = "ab".repeat(32);
    check_head(&sha, Ok((&sha, None, None)));
    check_head(
        &format!("  {}\n", sha.to_uppercase()),
        Ok((&sha, None, None)),
    );
    check_head(
        &format!(r#"{{"sha256": "{sha}", "seq": 7, "account": "acme", "extra": 1}}"#),
        Ok((&sha, Some(7), Some("acme"))),
    );
    check_head("abc", Err("not a sha256"));
    check_head(&"zz".repeat(32), Err("not a sha256"));
    check_head(r#"{"sha256": null}"#, Err("no sha256"));
    check_head(r#"{"seq": 3}"#, Err("no sha256"));
    check_head(&format!(r#"{{"sha256": "{sha}", "seq": -1}}"#), Err("seq"));
    check_head(r#"{"sha256": 5}"#, Err("sha256 is not a string"));
    check_head("{nope", Err("not a JSON object"));
}

/// A stream made before the trail was append-only (purge and delete allowed, one hour) is
/// raised when a node starts: nats-server turns `deny_delete`/`deny_purge` on by an update,
/// and refuses every update that would turn them off again. A node with a shorter
/// `max_age` then changes nothing.
#[tokio::test]
async fn an_older_audit_stream_is_raised_and_jetstream_never_lowers_its_protection() {
    let server = toolmesh_testkit::NatsServer::start_jetstream();
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let before = stream::Config {
        deny_delete: false,
        deny_purge: false,
        max_age: Duration::from_secs(3600),
        ..AuditConfig::default().stream_config()
    };
    js.create_stream(before).await.unwrap();
    let config = |js: &jetstream::Context| {
        let js = js.clone();
        async move {
            js.get_stream(STREAM)
                .await
                .unwrap()
                .cached_info()
                .config
                .clone()
        }
    };

    let trail = AuditTrail::start(&client, "n-1", &AuditConfig::default()).await;
    assert!(trail.is_on());
    let raised = config(&js).await;
    assert!(raised.deny_delete && raised.deny_purge, "{raised:?}");
    assert_eq!(raised.max_age, Duration::from_secs(DEFAULT_MAX_AGE_S));

    for lowered in [
        stream::Config {
            deny_purge: false,
            ..raised.clone()
        },
        stream::Config {
            deny_delete: false,
            ..raised.clone()
        },
    ] {
        let refused = js
            .update_stream(&lowered)
            .await
            .expect_err("JetStream took protection back");
        assert!(
            refused.to_string().contains("can not cancel deny"),
            "{refused}"
        );
    }
    assert_eq!(config(&js).await, raised);

    let short = AuditConfig {
        max_age: Duration::from_secs(1),
        ..AuditConfig::default()
    };
    let trail = AuditTrail::start(&client, "n-2", &short).await;
    assert!(trail.is_on());
    assert_eq!(config(&js).await, raised);
}

/// Two writers (two nodes' connections, each with every server's URL) racing on one account
/// of a three-replica trail on a NATS cluster, while the stream's leader is killed: every
/// append lands once, and the chain stays one whole line through the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_keep_one_linear_chain_through_a_leader_change() {
    let mut cluster = toolmesh_testkit::NatsCluster::start().await;
    let config = AuditConfig {
        replicas: 3,
        ..AuditConfig::default()
    };
    let connect = |name: &'static str| {
        let urls = cluster.urls();
        async move {
            crate::host::connect_client(&urls, name)
                .await
                .expect("connect to the cluster")
        }
    };
    let (client_a, client_b) = (connect("node-a").await, connect("node-b").await);
    let a = AuditTrail::start(&client_a, "node-a", &config).await;
    let b = AuditTrail::start(&client_b, "node-b", &config).await;
    assert!(a.is_on() && b.is_on());
    let js = jetstream::new(client_a.clone());
    let info = js.get_stream(STREAM).await.unwrap().cached_info().clone();
    assert_eq!(info.config.num_replicas, 3);
    let leader = info.cluster.and_then(|c| c.leader).expect("a leader");

    let appended = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..80 {
        let trail = if i % 2 == 0 { a.clone() } else { b.clone() };
        let appended = appended.clone();
        tasks.push(tokio::spawn(async move {
            let seq = trail
                .append(call(&format!("inv-{i}"), "finished"))
                .await
                .expect("appended through the election")
                .expect("the trail is on");
            appended.fetch_add(1, Ordering::Relaxed);
            seq
        }));
    }
    // The leader dies with appends on their way.
    assert!(
        toolmesh_testkit::wait_until(Duration::from_secs(10), || async {
            appended.load(Ordering::Relaxed) >= 10
        })
        .await
    );
    cluster.kill(cluster.index_of(&leader).unwrap());
    for task in tasks {
        task.await.unwrap();
    }
    // A read makes a consumer: it waits for the meta leader too, if that one died.
    cluster.wait_for_jetstream().await;
    let account = Account::parse("acme").unwrap();
    let read = std::cell::RefCell::new(None);
    toolmesh_testkit::wait_until(Duration::from_secs(20), || async {
        let page = a.read(&account, 0, MAX_QUERY_LIMIT, usize::MAX).await;
        let ok = page.is_ok();
        *read.borrow_mut() = Some(page);
        ok
    })
    .await;
    let page = match read.into_inner() {
        Some(Ok(page)) => page,
        Some(Err(e)) => panic!("the trail cannot be read after the election: {e}"),
        None => panic!("the trail was never read"),
    };
    assert_eq!(page.entries.len(), 80, "each append once");
    let report = verify(&account, &page.entries, SystemTime::now(), Duration::ZERO);
    assert!(report.whole(), "{report:?}");
    assert_eq!(report.taken_as_given, None);
    let invocations: std::collections::HashSet<&str> = page
        .entries
        .iter()
        .map(|e| e.entry["invocation_id"].as_str().unwrap())
        .collect();
    assert_eq!(invocations.len(), 80);
    assert_eq!(a.written() + b.written(), 80);
    assert_eq!(a.failed() + b.failed(), 0);
}

/// A publish whose answer was lost is sent again as it was: JetStream answers "duplicate"
/// for an entry it stored (it checks `Nats-Msg-Id` before the expected sequence), and "wrong
/// last sequence" for one it did not. The writer's exactly-once rests on this order.
#[tokio::test]
async fn jetstream_checks_the_message_id_before_the_expected_sequence() {
    let server = toolmesh_testkit::NatsServer::start_jetstream();
    let client = server.client().await;
    let trail = AuditTrail::start(&client, "n", &AuditConfig::default()).await;
    let Mode::On { js } = &trail.0.mode else {
        panic!("the trail is off");
    };
    let subject = "toolmesh.v1.audit.acme";
    let sealed = |sha: &str, expected: u64| Sealed {
        body: Bytes::from_static(b"{}"),
        sha: sha.to_owned(),
        expected,
        expected_stream: None,
    };
    let stored = |p: Published| match p {
        Published::Stored { seq, duplicate } => (seq, duplicate),
        Published::Raced(e) | Published::Unknown(e) => panic!("not stored: {e}"),
    };
    assert_eq!(
        stored(publish(js, subject, &sealed("x", 0)).await),
        (1, false)
    );
    assert_eq!(
        stored(publish(js, subject, &sealed("y", 1)).await),
        (2, false)
    );
    // `x` again, as it was first sent: stored already, at 1.
    assert_eq!(
        stored(publish(js, subject, &sealed("x", 0)).await),
        (1, true)
    );
    // Something never stored, on a stale head: refused.
    assert!(matches!(
        publish(js, subject, &sealed("z", 0)).await,
        Published::Raced(_)
    ));
}
