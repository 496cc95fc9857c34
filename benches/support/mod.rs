//! What the root benchmarks share: their one-thread runtime, percentiles, units, the machine's
//! load, sequential request/reply timing, a raw NATS responder and a raw `docker exec` to
//! measure the tools against, and the removal of a run's containers. Each bench compiles this
//! module on its own and uses a part of it.
#![allow(dead_code)]

/// The raw `docker exec` the sandbox crate's exec bench measures against too.
#[path = "../../actors/sandbox/tests/support/raw_exec.rs"]
pub mod raw_exec;

use std::future::Future;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use toolmesh_testkit::{NatsServer, NodeSpec, RedisServer};

/// The `toolmesh` binary of this build.
pub const TOOLMESH: &str = env!("CARGO_BIN_EXE_toolmesh");

/// A node of `bin` with `roles`, named `id`, on `nats` and `redis` with its data in `data`:
/// what every bench's node starts from.
pub fn node_on(
    bin: &str,
    roles: &str,
    id: &str,
    nats: &NatsServer,
    redis: &RedisServer,
    data: &Path,
) -> NodeSpec {
    NodeSpec::new(bin, roles, id)
        .env("TOOLMESH_NATS_URL", nats.url())
        .env("TOOLMESH_REDIS_URL", redis.url())
        .env("TOOLMESH_DATA_DIR", data.display().to_string())
}

/// Runs a bench to its end on a one-thread runtime: the load generator takes one core and the
/// node under test gets the rest. A multi-thread runtime's cross-thread wakeups halved the raw
/// figure on 2 cores, which would flatter every ratio.
pub fn block_on<F: Future>(bench: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(bench)
}

/// The `p` quantile (0..=1) of durations sorted ascending.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Busy and total jiffies of all CPUs so far, from `/proc/stat`'s first line.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …: idle and iowait are not busy.
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Waits until the machine has been quiet (CPUs busy below `max_busy`, 0..=1) for `calm`
/// seconds in a row, at most `limit`, so that a section does not start while the previous one
/// (or whatever ran before the bench: Docker removing containers, a build) still occupies the
/// cores. The load average cannot tell: it lags a minute behind. Returns what to print: how
/// long it waited and how busy the last second was.
pub async fn wait_until_quiet(max_busy: f64, calm: u32, limit: Duration) -> String {
    let started = Instant::now();
    let mut quiet_for = 0;
    let mut last = cpu_jiffies();
    let mut busy = f64::NAN;
    while quiet_for < calm && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu_jiffies();
        if let (Some((b0, t0)), Some((b1, t1))) = (last, now) {
            busy = (b1 - b0) as f64 / (t1 - t0).max(1) as f64;
        }
        last = now;
        quiet_for = if busy < max_busy { quiet_for + 1 } else { 0 };
    }
    format!(
        "after {:.0} s waiting for a quiet machine ({}% busy{})",
        started.elapsed().as_secs_f64(),
        (busy * 100.0).round(),
        if quiet_for < calm { ", gave up" } else { "" }
    )
}

/// Sequential request/reply round trips, appended to `out`.
pub async fn latencies(
    client: &async_nats::Client,
    subject: &str,
    body: &Bytes,
    samples: usize,
    out: &mut Vec<Duration>,
) {
    for _ in 0..samples {
        let t = Instant::now();
        let reply = client
            .request(subject.to_owned(), body.clone())
            .await
            .expect("request");
        out.push(t.elapsed());
        assert!(!reply.payload.is_empty());
    }
}

/// How an alternating comparison runs: warm-up requests to each side, rounds of sequential
/// samples, then rounds of throughput with requests in flight.
/// The pace of the gateway benches: 10 rounds of 2,000 sequential calls a side, then 5 s of
/// throughput with 64 in flight.
pub const GATEWAY_PACE: Pace = Pace {
    warmup: 2_000,
    rounds: 10,
    samples_per_round: 2_000,
    in_flight: 64,
    throughput_rounds: 5,
    throughput_round: Duration::from_secs(1),
};

pub struct Pace {
    pub warmup: usize,
    pub rounds: usize,
    pub samples_per_round: usize,
    pub in_flight: usize,
    pub throughput_rounds: usize,
    pub throughput_round: Duration,
}

impl Pace {
    /// The pace in words, for the line above a comparison's table.
    pub fn describe(&self) -> String {
        format!(
            "{} sequential samples each, alternating rounds; {} in flight for {} x {} s each",
            self.rounds * self.samples_per_round,
            self.in_flight,
            self.throughput_rounds,
            self.throughput_round.as_secs()
        )
    }
}

/// One side of a comparison: its row's label, and the subject and body it is asked with.
pub struct Side<'a> {
    pub label: &'a str,
    pub subject: &'a str,
    pub body: &'a Bytes,
    /// The client (and so the server) this side's requests go through; none: the one
    /// [`compare_alternating`] is given.
    pub client: Option<&'a async_nats::Client>,
}

impl<'a> Side<'a> {
    pub fn new(label: &'a str, subject: &'a str, body: &'a Bytes) -> Side<'a> {
        Side {
            label,
            subject,
            body,
            client: None,
        }
    }

    /// This side's requests go through `client` (a cluster of its own).
    pub fn through(mut self, client: &'a async_nats::Client) -> Side<'a> {
        self.client = Some(client);
        self
    }
}

/// Measures `base` and `tested` in alternating rounds, so that both see the same machine (on
/// a shared 2-core box, noise from outside moves both figures, not one), and prints p50 and
/// p99 in µs and calls/s of each, then `tested` over `base` in a row labelled `ratio`.
pub async fn compare_alternating(
    client: &async_nats::Client,
    pace: &Pace,
    base: Side<'_>,
    tested: Side<'_>,
    ratio: &str,
) {
    let mut warm = Vec::new();
    let via = |side: &Side<'_>| side.client.cloned().unwrap_or_else(|| client.clone());
    for side in [&base, &tested] {
        latencies(&via(side), side.subject, side.body, pace.warmup, &mut warm).await;
    }
    let mut samples = [Vec::new(), Vec::new()];
    for _ in 0..pace.rounds {
        for (side, out) in [&base, &tested].into_iter().zip(samples.iter_mut()) {
            let client = via(side);
            latencies(
                &client,
                side.subject,
                side.body,
                pace.samples_per_round,
                out,
            )
            .await;
        }
    }
    let mut calls = [(0, Duration::ZERO), (0, Duration::ZERO)];
    for _ in 0..pace.throughput_rounds {
        for (side, (n, t)) in [&base, &tested].into_iter().zip(calls.iter_mut()) {
            let (more, took) = throughput(
                &via(side),
                side.subject,
                side.body,
                pace.in_flight,
                pace.throughput_round,
            )
            .await;
            *n += more;
            *t += took;
        }
    }
    println!(
        "{:<30} {:>10} {:>10} {:>14}",
        "", "p50 µs", "p99 µs", "calls/s"
    );
    let mut rows = Vec::new();
    for ((side, samples), (n, t)) in [&base, &tested]
        .into_iter()
        .zip(samples.iter_mut())
        .zip(calls)
    {
        samples.sort();
        let row = (
            us(percentile(samples, 0.5)),
            us(percentile(samples, 0.99)),
            n as f64 / t.as_secs_f64(),
        );
        println!(
            "{:<30} {:>10.1} {:>10.1} {:>14.0}",
            side.label, row.0, row.1, row.2
        );
        rows.push(row);
    }
    println!(
        "{:<30} {:>10.2} {:>10.2} {:>14.2}",
        ratio,
        rows[1].0 / rows[0].0,
        rows[1].1 / rows[0].1,
        rows[1].2 / rows[0].2
    );
}

/// One `run_command` through the gateway on `subject`, which must answer within 60 s, ok and
/// with exit code 0; its reply.
pub async fn run_command_ok(
    client: &async_nats::Client,
    subject: &'static str,
    body: &Bytes,
) -> serde_json::Value {
    let reply = tokio::time::timeout(
        Duration::from_secs(60),
        client.request(subject, body.clone()),
    )
    .await
    .expect("run_command answers within 60 s")
    .expect("request");
    let v: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON reply");
    assert!(
        v["ok"] == true && v["exit_code"] == 0,
        "run_command failed: {v}"
    );
    v
}

/// Starts a raw responder on `subject` answering every request with `reply` (its own thread,
/// connection and runtime, like a node), and returns once `client` gets answers from it.
pub async fn start_raw_responder(
    client: &async_nats::Client,
    url: &str,
    subject: &'static str,
    reply: Bytes,
    body: &Bytes,
) {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let responder = async_nats::connect(url).await.expect("responder connects");
            let mut sub = responder.subscribe(subject).await.expect("subscribe");
            while let Some(msg) = sub.next().await {
                if let Some(to) = msg.reply {
                    let _ = responder.publish(to, reply.clone()).await;
                }
            }
        });
    });
    let ready = toolmesh_testkit::wait_until(Duration::from_secs(5), || async {
        client.request(subject, body.clone()).await.is_ok()
    })
    .await;
    assert!(ready, "raw responder did not come up");
}

/// Requests completed with `in_flight` requests of `body` outstanding on `subject` during
/// `window`, and the time taken.
pub async fn throughput(
    client: &async_nats::Client,
    subject: &str,
    body: &Bytes,
    in_flight: usize,
    window: Duration,
) -> (u64, Duration) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let deadline = Instant::now() + window;
    let done = Arc::new(AtomicU64::new(0));
    let workers = (0..in_flight).map(|_| {
        let (client, subject, body, done) = (
            client.clone(),
            subject.to_owned(),
            body.clone(),
            done.clone(),
        );
        tokio::spawn(async move {
            while Instant::now() < deadline {
                client
                    .request(subject.clone(), body.clone())
                    .await
                    .expect("request");
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    let started = Instant::now();
    futures::future::join_all(workers).await;
    (done.load(Ordering::Relaxed), started.elapsed())
}

/// The ids of every container, running or not, that `docker ps --filter <filter>` lists.
pub fn containers(filter: &str) -> Vec<String> {
    Command::new("docker")
        .args(["ps", "-aq", "--filter", filter])
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Removes these containers and their volumes; a cleanup, so failures are ignored.
pub fn remove_containers(ids: &[String]) {
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(ids)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Removes, on drop, every container labelled by one of these node ids.
pub struct NodeContainers(pub Vec<String>);

impl Drop for NodeContainers {
    fn drop(&mut self) {
        for node in &self.0 {
            remove_containers(&containers(&format!("label=io.toolmesh.node={node}")));
        }
    }
}
