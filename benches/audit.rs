//! Reading the audit trail: `AuditTrail::read` (one ordered consumer per page) against the raw
//! JetStream operation it replaced, a direct get of each entry by subject and sequence, in one
//! run on the same stream.
//!
//! `cargo bench --bench audit` starts a JetStream nats-server, appends `ENTRIES` chained entries
//! for one account with the real writer, then reads pages of 100 entries (the query's default)
//! and of 1000 (its most) from random points of the chain, alternating the two ways round by
//! round. It prints p50/p99 per page, entries per second, and the ratio.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use async_nats::jetstream;
use toolmesh_kernel::audit::{AuditConfig, AuditEntry, AuditTrail};
use toolmesh_kernel::wire::InvocationContext;
use toolmesh_kernel::{Account, InvocationId};
use toolmesh_testkit::NatsServer;

mod support;
use support::{ms, percentile};

const ENTRIES: usize = 5_000;
const ROUNDS: usize = 10;
const PAGES_PER_ROUND: usize = 10;

/// One page the old way: a direct get per entry, from `after` on.
async fn direct_gets(stream: &jetstream::stream::Stream, subject: &str, after: u64, limit: usize) {
    let mut next = after + 1;
    for _ in 0..limit {
        match stream.get_first_raw_message_by_subject(subject, next).await {
            Ok(message) => next = message.sequence + 1,
            Err(_) => break,
        }
    }
}

fn main() {
    support::block_on(async {
        let nats = NatsServer::start_jetstream();
        let client = nats.client().await;
        let trail = AuditTrail::start(&client, "bench-node", &AuditConfig::default()).await;
        assert!(trail.is_on(), "JetStream is on");
        let account = Account::parse("bench").unwrap();
        let started = Instant::now();
        for i in 0..ENTRIES {
            let ctx = InvocationContext {
                account: account.clone(),
                invocation_id: InvocationId::parse(format!("inv-{i}")).unwrap(),
                session_id: None,
                user_id: Some("bench-user".into()),
                agent_id: None,
            };
            trail
                .append(AuditEntry::call(&ctx, "read_workspace_file", "finished"))
                .await
                .expect("appended")
                .expect("the trail is on");
        }
        println!(
            "toolmesh audit read bench: {ENTRIES} entries appended in {:.1} s ({:.0} appends/s, one writer)",
            started.elapsed().as_secs_f64(),
            ENTRIES as f64 / started.elapsed().as_secs_f64()
        );
        let js = jetstream::new(client.clone());
        let stream = js.get_stream("TOOLMESH_AUDIT").await.unwrap();
        let subject = format!("toolmesh.v1.audit.{account}");
        let first = trail
            .read(&account, 0, 1, usize::MAX)
            .await
            .unwrap()
            .entries[0]
            .seq;

        for limit in [100usize, 1000] {
            let mut starts = (0..ROUNDS * PAGES_PER_ROUND * 2)
                .map(|i| first - 1 + ((i * 7919) % (ENTRIES - limit)) as u64);
            let (mut raw, mut read) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                for _ in 0..PAGES_PER_ROUND {
                    let after = starts.next().unwrap();
                    let t = Instant::now();
                    direct_gets(&stream, &subject, after, limit).await;
                    raw.push(t.elapsed());
                }
                for _ in 0..PAGES_PER_ROUND {
                    let after = starts.next().unwrap();
                    let t = Instant::now();
                    let page = trail
                        .read(&account, after, limit, usize::MAX)
                        .await
                        .unwrap();
                    read.push(t.elapsed());
                    assert_eq!(page.entries.len(), limit);
                    assert!(page.more);
                    assert_eq!(page.entries[0].seq, after + 1);
                }
            }
            raw.sort();
            read.sort();
            let per_s = |d: &[Duration]| {
                (d.len() * limit) as f64 / d.iter().sum::<Duration>().as_secs_f64()
            };
            println!(
                "\npages of {limit} entries, {} pages each way, alternating rounds",
                ROUNDS * PAGES_PER_ROUND
            );
            println!(
                "{:<34} {:>10} {:>10} {:>14}",
                "", "p50 ms", "p99 ms", "entries/s"
            );
            for (label, samples) in [
                ("direct get per entry (raw)", &raw),
                ("AuditTrail::read (ordered consumer)", &read),
            ] {
                println!(
                    "{:<34} {:>10.2} {:>10.2} {:>14.0}",
                    label,
                    ms(percentile(samples, 0.5)),
                    ms(percentile(samples, 0.99)),
                    per_s(samples)
                );
            }
            println!(
                "{:<34} {:>10.2} {:>10.2} {:>14.2}",
                "ratio read / raw",
                ms(percentile(&read, 0.5)) / ms(percentile(&raw, 0.5)),
                ms(percentile(&read, 0.99)) / ms(percentile(&raw, 0.99)),
                per_s(&read) / per_s(&raw)
            );
        }
    });
}
