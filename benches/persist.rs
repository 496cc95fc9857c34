//! Persisting a large command output into the workspace, against writing the same bytes to a
//! file directly, measured in one run.
//!
//! `cargo bench --bench persist` starts a nats-server, a redis-server and a node
//! `--roles workspace`, writes a spool file of `BENCH_PERSIST_MB` (default 30) MB of text and
//! then, in alternating samples:
//!
//! - **raw**: copies the spool file to a new file of the same data directory in parts of
//!   512 KiB, `fsync`s and renames it (the least the workspace actor does with the bytes);
//! - **persist**: `WorkspaceSync::put_from` of the spool file, as `tools::put_output` does it:
//!   parts of 512 KiB (`BODY_CONTENT_BUDGET`), each a NATS round trip to the workspace actor,
//!   one after the other.
//!
//! Each column runs `BENCH_SAMPLES` (default 12) times quiet and again with `BENCH_BUSY`
//! (default 2) threads spinning on the cores beside it. Prints p50, p99 and MB/s of each.
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::{Account, SessionId};
use toolmesh_testkit::{NatsServer, RedisServer};

mod support;
use support::{load_average, ms, node_on, percentile, TOOLMESH};

const PART: usize = 512 * 1024;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Copies `from` to a new file beside `to` in parts, fsyncs it and renames it to `to`.
fn raw_copy(from: &std::path::Path, to: &std::path::Path) {
    use std::io::Read;
    let staging = to.with_extension("staging");
    let mut source = std::fs::File::open(from).expect("spool file");
    let mut target = std::fs::File::create(&staging).expect("staging file");
    let mut part = vec![0u8; PART];
    loop {
        let n = source.read(&mut part).expect("read");
        if n == 0 {
            break;
        }
        target.write_all(&part[..n]).expect("write");
    }
    target.sync_all().expect("fsync");
    std::fs::rename(&staging, to).expect("rename");
}

fn row(name: &str, mut samples: Vec<Duration>, bytes: u64) {
    samples.sort();
    let total: Duration = samples.iter().sum();
    let mb_s = bytes as f64 * samples.len() as f64 / 1e6 / total.as_secs_f64();
    println!(
        "{name:<44} {:>9.1} {:>9.1} {:>9.1}",
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99)),
        mb_s
    );
}

fn main() {
    support::block_on(run());
}

async fn run() {
    let mb = env_usize("BENCH_PERSIST_MB", 30);
    let samples = env_usize("BENCH_SAMPLES", 12);
    let busy_threads = env_usize("BENCH_BUSY", 2);
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let client = nats.client().await;
    let node_id = format!("bench-persist-{}", std::process::id());
    let _node = node_on(TOOLMESH, "workspace", &node_id, &nats, &redis, data.path())
        .start(&client)
        .await;

    let spool = data.path().join("spool.txt");
    let line = "a line of a command's output, 48 bytes long ...\n";
    let total = (mb * 1_000_000 / line.len() * line.len()) as u64;
    std::fs::write(&spool, line.repeat((total as usize) / line.len())).expect("spool file");
    let raw_dir = data.path().join("raw");
    std::fs::create_dir_all(&raw_dir).expect("raw dir");
    let sync = WorkspaceSync::new(client.clone());
    let account = Account::parse("bench").expect("account");
    let session = SessionId::parse("persist").expect("session");
    let source = Arc::new(std::fs::File::open(&spool).expect("spool file"));
    println!(
        "toolmesh persist bench: {} bytes in parts of {PART} ({} round trips), {samples} samples per column, load {}",
        total,
        total.div_ceil(PART as u64),
        load_average()
    );
    println!("{:<44} {:>9} {:>9} {:>9}", "", "p50 ms", "p99 ms", "MB/s");
    for busy in [0, busy_threads] {
        let stop = Arc::new(AtomicBool::new(false));
        let spinners: Vec<_> = (0..busy)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        let mut raw = Vec::new();
        let mut persist = Vec::new();
        for i in 0..samples {
            let (from, to) = (spool.clone(), raw_dir.join(format!("copy-{i}.txt")));
            let started = Instant::now();
            tokio::task::spawn_blocking(move || raw_copy(&from, &to))
                .await
                .expect("raw copy");
            raw.push(started.elapsed());

            let path = format!(".toolmesh/outputs/bench-{busy}-{i}.txt");
            let started = Instant::now();
            sync.put_from(&account, &session, &path, total, source.clone())
                .await
                .expect("put_from");
            persist.push(started.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        for spinner in spinners {
            let _ = spinner.join();
        }
        let label = if busy == 0 {
            "quiet".to_owned()
        } else {
            format!("{busy} busy threads")
        };
        row(&format!("raw file copy, {label}"), raw, total);
        row(&format!("put_from, {label}"), persist, total);
    }
}
