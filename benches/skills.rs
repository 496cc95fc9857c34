//! The first and the cached `load_skill` of a ~50 MB skill, against the raw cost of their
//! parts, measured in one run on the same machine.
//!
//! `cargo bench --bench skills` writes a skill folder (`SKILL.md`, small scripts, ~24 MiB of
//! compressible text, ~24 MiB of random bytes), serves it with the reference Skill Service
//! (`toolmesh skill-service --dir`, a process), and starts a nats-server, a redis-server and
//! one `toolmesh node --roles gateway,skills` whose debug log of the cache
//! (`skill archive installed`, one line per install with its phase times) it reads. Then:
//!
//! 1. **First load**: `load_skill` through the gateway with the cache entry
//!    `$TOOLMESH_DATA_DIR/skills-cache/<sha256>` removed before each sample, with the node's
//!    breakdown (Skill Service lookup, download, sha256, extract, check, rename), against the
//!    raw cost in this process of sha256 over the same zip bytes (GB/s), of inflating them to
//!    memory, and of unpacking them with the skills crate's own reader into a temp folder (MB/s
//!    of inflated bytes).
//! 2. **Cached load**: `load_skill` answering `cache_hit: true`, p50/p99 over sequential calls,
//!    against raw async-nats request/reply to a responder answering the very bytes `load_skill`
//!    answers, in alternating rounds (raw, load, raw, …) so that both see the same machine;
//!    then the parts of a cached load measured here (the two Skill Service requests it makes,
//!    listing the skill's files).
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_skills::archive::{self, Caps};
use toolmesh_skills::SkillsConfig;
use toolmesh_testkit::{LogTap, NatsServer, RedisServer};

mod support;
use support::{latencies, load_average, ms, percentile, us};

const SKILL: &str = "big-skill";
const SPACE: &str = "bench";
const GATEWAY: &str = "toolmesh.v1.call.bench";
const RAW_SUBJECT: &str = "bench.raw.load_skill";
/// Text files of `TEXT_FILE_BYTES` each, and random files of `RANDOM_FILE_BYTES` each.
const TEXT_FILES: usize = 24;
const TEXT_FILE_BYTES: usize = 1 << 20;
const RANDOM_FILES: usize = 48;
const RANDOM_FILE_BYTES: usize = 512 << 10;
const SCRIPT_FILES: usize = 40;
const COLD_SAMPLES: usize = 7;
const RAW_REPS: usize = 7;
const WARMUP: usize = 200;
const ROUNDS: usize = 4;
const SAMPLES_PER_ROUND: usize = 500;
const CAPS: Caps = Caps {
    max_bytes: 256 << 20,
    max_entries: 10_000,
};

/// xorshift64*: deterministic bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }

    /// Prose-like text: words of a small vocabulary, lines of varying length.
    fn text(&mut self, n: usize) -> Vec<u8> {
        const WORDS: &[&str] = &[
            "the",
            "skill",
            "loads",
            "archive",
            "from",
            "a",
            "space",
            "and",
            "verifies",
            "its",
            "sha256",
            "before",
            "unpacking",
            "every",
            "entry",
            "into",
            "staging",
            "then",
            "renames",
            "cache",
            "agent",
            "tool",
            "request",
            "reply",
            "gateway",
            "node",
            "sandbox",
            "runs",
            "scripts",
            "with",
            "arguments",
            "returns",
            "output",
            "files",
            "error",
            "when",
            "input",
            "is",
            "invalid",
            "or",
            "missing",
            "data",
            "table",
            "row",
            "column",
            "value",
            "42",
            "2024-01-01",
            "example",
            "note:",
            "see",
            "section",
            "below",
            "for",
            "details",
            "of",
        ];
        let mut out = Vec::with_capacity(n + 64);
        let mut line = 0;
        while out.len() < n {
            let r = self.next();
            out.extend_from_slice(WORDS[(r % WORDS.len() as u64) as usize].as_bytes());
            line += 1;
            if line > 6 + (r >> 32) % 10 {
                out.push(b'\n');
                line = 0;
            } else {
                out.push(b' ');
            }
        }
        out.truncate(n);
        out
    }
}

/// Writes the skill folder under `root/<SKILL>` and returns that folder.
fn write_skill(root: &Path) -> PathBuf {
    let dir = root.join(SKILL);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let put = |path: &str, data: &[u8]| {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("skill folder");
        std::fs::write(p, data).expect("skill file");
    };
    put(
        "SKILL.md",
        format!(
            "---\nname: {SKILL}\ndescription: A large skill for the load benchmark\nversion: 1.0.0\ntags: [bench]\n---\n# Big skill\n\nRead docs/ and run scripts/ as needed.\n"
        )
        .as_bytes(),
    );
    for i in 0..SCRIPT_FILES {
        put(&format!("scripts/step_{i:02}.py"), &rng.text(4 << 10));
    }
    for i in 0..TEXT_FILES {
        put(&format!("docs/part_{i:02}.md"), &rng.text(TEXT_FILE_BYTES));
    }
    for i in 0..RANDOM_FILES {
        put(
            &format!("assets/blob_{i:02}.bin"),
            &rng.bytes(RANDOM_FILE_BYTES),
        );
    }
    dir
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `toolmesh skill-service --dir <dir>` on a port it picks; waits until it listens (it zips and
/// hashes the skills first) and says where, in its log.
fn start_skill_service(dir: &Path) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolmesh"))
        .arg("skill-service")
        .arg("--dir")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0", "--space", SPACE])
        .env("RUST_LOG", "warn,toolmesh_skills::service=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmesh skill-service starts");
    let listening = "skill service listening url=";
    let log = LogTap::start(child.stderr.take().expect("stderr"), move |line| {
        if !line.contains(listening) {
            eprintln!("{line}");
        }
    });
    let proc = Proc(child);
    let url = log
        .find(Duration::from_secs(120), |line| {
            let (_, rest) = line.split_once(listening)?;
            rest.split_whitespace().next().map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("the skill service did not listen:\n{}", log.text()));
    (proc, url)
}

/// One `skill archive installed` line of the node's log: its numeric fields.
type Install = serde_json::Map<String, Value>;

/// A `toolmesh node --roles gateway,skills` whose JSON log is read here: install lines go to
/// the channel, others to this process's stderr.
async fn start_node(
    client: &async_nats::Client,
    env: &[(&str, String)],
) -> (Proc, mpsc::Receiver<Install>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolmesh"));
    cmd.args(["node", "--roles", "gateway,skills"])
        .env("TOOLMESH_NODE_ID", "bench-node")
        .env("RUST_LOG", "warn,toolmesh_skills::cache=debug")
        .env("TOOLMESH_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("toolmesh node starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let parsed: Option<Value> = serde_json::from_str(&line).ok();
            match parsed.as_ref().and_then(|v| v.get("fields")) {
                Some(fields) if fields["message"] == "skill archive installed" => {
                    let _ = tx.send(fields.as_object().cloned().unwrap_or_default());
                }
                _ => eprintln!("node: {line}"),
            }
        }
    });
    let mut proc = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = proc.0.try_wait() {
            panic!("the node exited during startup: {status}");
        }
        let ask = client.request("toolmesh.v1.status.bench-node", "{}".into());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), ask).await {
            break;
        }
        assert!(Instant::now() < deadline, "the node did not answer status");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (proc, rx)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    percentile(&v, 0.5)
}

async fn load_skill(client: &async_nats::Client, body: &Bytes) -> Value {
    let reply = client
        .request(GATEWAY, body.clone())
        .await
        .expect("load_skill answers");
    serde_json::from_slice(&reply.payload).expect("a JSON reply")
}

/// This thread's time on a CPU so far (`/proc/thread-self/schedstat`, ns): with other work on
/// the machine, wall time says what a caller waits, CPU time what the code costs.
fn cpu_now() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// Wall and on-CPU time of one step.
#[derive(Clone, Copy)]
struct Cost {
    wall: Duration,
    cpu: Duration,
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Cost) {
    let (wall, cpu) = (Instant::now(), cpu_now());
    let out = f();
    let cost = Cost {
        wall: wall.elapsed(),
        cpu: cpu_now().saturating_sub(cpu),
    };
    (out, cost)
}

fn median_cost(costs: &[Cost]) -> Cost {
    Cost {
        wall: median(costs.iter().map(|c| c.wall).collect()),
        cpu: median(costs.iter().map(|c| c.cpu).collect()),
    }
}

struct Raw {
    hash: Cost,
    inflate: Cost,
    write: Cost,
    unpack_one: Cost,
    unpack: Cost,
    threads: usize,
    inflated: u64,
}

/// The raw costs, in this process, medians of `RAW_REPS`: sha256 of the zip; inflating every
/// entry to memory (no files); writing the skill's files from memory (no zip); and
/// `archive::unpack` into a fresh folder under `scratch`, on one thread and as the loader
/// runs it.
fn raw_costs(zip: &[u8], sha: &str, skill_dir: &Path, scratch: &Path) -> Raw {
    let files: Vec<(String, Vec<u8>)> = toolmesh_skills::library::list_files(skill_dir, CAPS)
        .expect("list the skill")
        .into_iter()
        .map(|(path, _)| {
            let data = std::fs::read(skill_dir.join(&path)).expect("read a skill file");
            (path, data)
        })
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(archive::MAX_UNPACK_THREADS);
    let (mut hash, mut inflate, mut write, mut one, mut auto) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut inflated = 0;
    let mut folder = 0;
    let mut fresh = || {
        folder += 1;
        let dest = scratch.join(format!("unpack-{folder}"));
        std::fs::create_dir(&dest).expect("scratch folder");
        dest
    };
    for _ in 0..RAW_REPS {
        let (got, cost) = timed(|| sha256_hex(zip));
        hash.push(cost);
        assert_eq!(got, sha);

        let (n, cost) = timed(|| inflate_all(zip));
        inflate.push(cost);

        let dest = fresh();
        let ((), cost) = timed(|| {
            for (path, data) in &files {
                let target = dest.join(path);
                std::fs::create_dir_all(target.parent().expect("a parent")).expect("folder");
                std::fs::write(target, data).expect("write a file");
            }
        });
        write.push(cost);
        std::fs::remove_dir_all(&dest).expect("remove the scratch folder");

        for (threads, costs) in [(1, &mut one), (threads, &mut auto)] {
            let dest = fresh();
            let (out, cost) = timed(|| archive::unpack_on(zip, &dest, CAPS, threads));
            costs.push(cost);
            let out = out.expect("the archive unpacks");
            assert_eq!(out.bytes, n);
            inflated = out.bytes;
            std::fs::remove_dir_all(&dest).expect("remove the scratch folder");
        }
    }
    Raw {
        hash: median_cost(&hash),
        inflate: median_cost(&inflate),
        write: median_cost(&write),
        unpack_one: median_cost(&one),
        unpack: median_cost(&auto),
        threads,
        inflated,
    }
}

/// Inflates every entry of a zip written by `archive::zip_dir` (local headers in order) to
/// memory; returns the inflated bytes.
fn inflate_all(zip: &[u8]) -> u64 {
    let u16_at = |at: usize| u16::from_le_bytes([zip[at], zip[at + 1]]) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(zip[at..at + 4].try_into().expect("4 bytes"));
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0u64;
    let mut at = 0;
    while u32_at(at) == 0x0403_4b50 {
        let method = u16_at(at + 8);
        let compressed = u32_at(at + 18) as usize;
        let start = at + 30 + u16_at(at + 26) + u16_at(at + 28);
        let data = &zip[start..start + compressed];
        if method == 8 {
            let mut dec = flate2::bufread::DeflateDecoder::new(data);
            loop {
                let n = dec.read(&mut buf).expect("inflates");
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
        } else {
            total += data.len() as u64;
        }
        at = start + compressed;
    }
    total
}

fn main() {
    support::block_on(run());
}

async fn run() {
    println!(
        "toolmesh skills bench (load average at start {})",
        load_average()
    );
    let skills = tempfile::tempdir().expect("temp dir");
    let skill_dir = write_skill(skills.path());
    let zip = archive::zip_dir(&skill_dir).expect("zip the skill");
    let sha = sha256_hex(&zip);

    let (_service, service_url) = start_skill_service(skills.path());
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let client = nats.client().await;
    let data = tempfile::tempdir().expect("temp dir");
    let threads = std::env::var("TOOLMESH_WORKER_THREADS").unwrap_or_else(|_| "0".into());
    let (_node, installs) = start_node(
        &client,
        &[
            ("TOOLMESH_NATS_URL", nats.url()),
            ("TOOLMESH_REDIS_URL", redis.url()),
            ("TOOLMESH_DATA_DIR", data.path().display().to_string()),
            ("TOOLMESH_WORKER_THREADS", threads.clone()),
            ("TOOLMESH_TOOL_APPROVAL_MODE", "off".into()),
            ("TOOLMESH_SKILL_SERVICE_URL", service_url.clone()),
            ("TOOLMESH_SKILL_SPACE_IDS", SPACE.into()),
            ("TOOLMESH_SKILLS_DIR", "/nonexistent-skills-dir".into()),
        ],
    )
    .await;
    let cached_dir = data.path().join("skills-cache").join(&sha);
    let body = Bytes::from(
        serde_json::to_vec(&json!({"tool": "load_skill", "arguments": {"skill_name": SKILL}}))
            .expect("a body"),
    );

    // 1. First loads, each with the cache entry removed.
    let mut cold = Vec::new();
    let mut phases: Vec<Install> = Vec::new();
    for _ in 0..COLD_SAMPLES {
        if cached_dir.exists() {
            std::fs::remove_dir_all(&cached_dir).expect("empty the cache");
        }
        let t = Instant::now();
        let r = load_skill(&client, &body).await;
        cold.push(t.elapsed());
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["cache_hit"], false, "{r}");
        assert_eq!(r["sha256"], sha.as_str(), "the service zipped other bytes");
        let install = installs
            .recv_timeout(Duration::from_secs(10))
            .expect("the node logs its install");
        phases.push(install);
    }
    let scratch = tempfile::tempdir_in(data.path()).expect("scratch dir");
    let raw = raw_costs(&zip, &sha, &skill_dir, scratch.path());

    let mb = |bytes: f64| bytes / 1e6;
    let field = |name: &str| {
        median(
            phases
                .iter()
                .map(|p| Duration::from_micros(p[name].as_u64().unwrap_or(0)))
                .collect(),
        )
    };
    let zip_len = zip.len() as f64;
    let inflated = raw.inflated as f64;
    println!(
        "\n1. first load_skill of {SKILL}: archive {:.1} MB ({} entries), inflated {:.1} MB; {COLD_SAMPLES} samples, cache entry removed before each; raw medians of {RAW_REPS}",
        mb(zip_len),
        1 + SCRIPT_FILES + TEXT_FILES + RANDOM_FILES,
        mb(inflated),
    );
    let mut sorted = cold.clone();
    sorted.sort();
    println!(
        "load_skill through the gateway: median {:.1} ms, min {:.1} ms, max {:.1} ms",
        ms(percentile(&sorted, 0.5)),
        ms(sorted[0]),
        ms(sorted[sorted.len() - 1])
    );
    println!("{:<44} {:>10} {:>14}", "", "ms", "rate");
    let row = |what: &str, d: Duration, rate: String| {
        println!("{what:<44} {:>10.1} {rate:>14}", ms(d));
    };
    let gbs = |bytes: f64, d: Duration| format!("{:.2} GB/s", bytes / d.as_secs_f64() / 1e9);
    let mbs = |bytes: f64, d: Duration| format!("{:.0} MB/s", bytes / d.as_secs_f64() / 1e6);
    println!("node, median of each phase (wall):");
    let phase_names = [
        ("  download info + cache check", "lookup_us", None),
        ("  download", "download_us", Some(zip_len)),
        ("  sha256", "hash_us", Some(zip_len)),
        (
            "  extract (rate of inflated bytes)",
            "extract_us",
            Some(inflated),
        ),
        ("  check SKILL.md", "check_us", None),
        ("  rename into the cache", "rename_us", None),
    ];
    let mut sum = Duration::ZERO;
    for (what, name, bytes) in phase_names {
        let d = field(name);
        sum += d;
        let rate = match (name, bytes) {
            ("hash_us", Some(b)) => gbs(b, d),
            (_, Some(b)) => mbs(b, d),
            _ => String::new(),
        };
        row(what, d, rate);
    }
    row("  sum of the phases", sum, String::new());
    row("  whole install (median)", field("total_us"), String::new());
    let rest = median(cold.clone()).saturating_sub(field("total_us"));
    row(
        "  rest (gateway, catalog, listing, reply)",
        rest,
        String::new(),
    );
    println!("raw, in this process (wall / on-CPU of this thread):");
    let raw_row = |what: &str, c: Cost, rate: &dyn Fn(f64, Duration) -> String, bytes: f64| {
        println!(
            "{what:<44} {:>10.1} {:>14}   cpu {:>6.1} ms {:>12}",
            ms(c.wall),
            rate(bytes, c.wall),
            ms(c.cpu),
            rate(bytes, c.cpu)
        );
    };
    raw_row("  sha256 of the zip", raw.hash, &gbs, zip_len);
    raw_row(
        "  inflate every entry to memory",
        raw.inflate,
        &mbs,
        inflated,
    );
    raw_row(
        "  write the files from memory (no zip)",
        raw.write,
        &mbs,
        inflated,
    );
    raw_row(
        "  archive::unpack, 1 thread",
        raw.unpack_one,
        &mbs,
        inflated,
    );
    println!(
        "{:<44} {:>10.1} {:>14}   (cpu of the calling thread only)",
        format!("  archive::unpack, {} threads", raw.threads),
        ms(raw.unpack.wall),
        mbs(inflated, raw.unpack.wall),
    );
    println!(
        "targets: hashing >= 1.5 GB/s (node {}, raw {} wall, {} on-CPU); extraction >= 300 MB/s (node {}, raw {} on {} threads, {} on 1)",
        gbs(zip_len, field("hash_us")),
        gbs(zip_len, raw.hash.wall),
        gbs(zip_len, raw.hash.cpu),
        mbs(inflated, field("extract_us")),
        mbs(inflated, raw.unpack.wall),
        raw.threads,
        mbs(inflated, raw.unpack_one.wall),
    );

    // 2. Cached loads against raw NATS request/reply answering the same bytes.
    let sample = client
        .request(GATEWAY, body.clone())
        .await
        .expect("load_skill answers")
        .payload;
    let parsed: Value = serde_json::from_slice(&sample).expect("JSON reply");
    assert_eq!(parsed["cache_hit"], true, "{parsed}");
    support::start_raw_responder(&client, &nats.url(), RAW_SUBJECT, sample.clone(), &body).await;
    let mut warm = Vec::new();
    latencies(&client, RAW_SUBJECT, &body, WARMUP, &mut warm).await;
    latencies(&client, GATEWAY, &body, WARMUP, &mut warm).await;
    let (mut raw_rtt, mut cached) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        latencies(&client, RAW_SUBJECT, &body, SAMPLES_PER_ROUND, &mut raw_rtt).await;
        latencies(&client, GATEWAY, &body, SAMPLES_PER_ROUND, &mut cached).await;
    }
    raw_rtt.sort();
    cached.sort();
    let check = load_skill(&client, &body).await;
    assert_eq!(check["cache_hit"], true, "{check}");

    // The parts of a cached load, measured here: the Skill Service requests the loader makes
    // on every call (the space's list, then the download info), and listing the skill's files.
    let service = toolmesh_skills::catalog::ServiceClient::new(&SkillsConfig {
        dir: PathBuf::from("/nonexistent-skills-dir"),
        service_url: Some(service_url),
        space_ids: vec![SPACE.into()],
        service_token: None,
        allow_hash_mismatch: false,
        max_bytes: CAPS.max_bytes,
        max_entries: CAPS.max_entries,
        space_allowlists: Vec::new(),
        download_timeout: Duration::from_secs(30),
        allowed_networks: Vec::new(),
    })
    .expect("a Skill Service client");
    let (mut list, mut info, mut files) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..SAMPLES_PER_ROUND {
        let t = Instant::now();
        service.list_space(SPACE).await.expect("list");
        list.push(t.elapsed());
        let t = Instant::now();
        service
            .download_info(SPACE, SKILL)
            .await
            .expect("download info");
        info.push(t.elapsed());
        let t = Instant::now();
        let listed = toolmesh_skills::library::list_files(&cached_dir, CAPS).expect("list files");
        files.push(t.elapsed());
        assert_eq!(listed.len(), 1 + SCRIPT_FILES + TEXT_FILES + RANDOM_FILES);
    }

    println!(
        "\n2. cached load_skill: reply {} bytes; {} sequential samples each; alternating rounds",
        sample.len(),
        ROUNDS * SAMPLES_PER_ROUND
    );
    println!("{:<44} {:>10} {:>10}", "", "p50 µs", "p99 µs");
    let (rp50, rp99) = (percentile(&raw_rtt, 0.5), percentile(&raw_rtt, 0.99));
    let (cp50, cp99) = (percentile(&cached, 0.5), percentile(&cached, 0.99));
    let line = |what: &str, p50: f64, p99: f64| println!("{what:<44} {p50:>10.1} {p99:>10.1}");
    line("raw async-nats req/reply", us(rp50), us(rp99));
    line("load_skill, cache_hit: true", us(cp50), us(cp99));
    println!(
        "{:<44} {:>10.2} {:>10.2}",
        "ratio load_skill / raw",
        us(cp50) / us(rp50),
        us(cp99) / us(rp99)
    );
    println!("parts of a cached load, measured here ({SAMPLES_PER_ROUND} samples):");
    for (what, mut v) in [
        ("  Skill Service: list the space", list),
        ("  Skill Service: download info", info),
        ("  list the skill's files", files),
    ] {
        v.sort();
        line(what, us(percentile(&v, 0.5)), us(percentile(&v, 0.99)));
    }
    println!("\nload average at end {}", load_average());
}
