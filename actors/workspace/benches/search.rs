//! `search_workspace_files` against `rg` on the same corpus, measured in one run.
//!
//! `cargo bench -p toolmesh-workspace --bench search` generates ~200 MB of deterministic
//! code-like text in ~18,000 files (nested directories, a `.gitignore` excluding some, every
//! file under 1 MB) inside a Workspace's root, then times [`search`] and `rg` with the same
//! semantics (`rg --no-config -n -i --max-filesize 1M --no-require-git [-F]`, output lines
//! counted) for a literal and a regex query with a moderate number of matches and a literal with
//! few, `max_results` 5000. Each is warmed up once, then measured in alternating rounds
//! (toolmesh, rg, toolmesh, …) so both see the same machine, and the p50s are compared.
//! This prints figures; it asserts only that both engines find the same number of lines.
//!
//! `TOOLMESH_BENCH_CORPUS=<dir>` reuses (or keeps) a corpus in that directory; `TOOLMESH_BENCH_ROUNDS` sets the rounds.
// Printing the table is what a harness-less bench is for.
#![allow(clippy::print_stdout)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use toolmesh_kernel::{Account, SessionId};
use toolmesh_workspace::confine::Workspace;
use toolmesh_workspace::search::{search, SearchOptions};

const FILES: usize = 18_000;
const TARGET_BYTES: usize = 200_000_000;
const MAX_FILE_BYTES: usize = 900 * 1024;
const RG: &str = "/usr/bin/rg";
const DEFAULT_ROUNDS: usize = 5;
const SEED: u64 = 0x5EA2_C400_0000_0001;

/// Moderate: injected on about one line in 2,000 / 3,000 of ~5 M lines.
const LITERAL: &str = "retry_budget";
const REGEX: &str = r"fn\s+on_\w+_event\(";
/// Few: injected on about one line in 1.5 M.
const RARE: &str = "zebra_quokka_fence";

const WORDS: &[&str] = &[
    "user", "count", "parse", "config", "value", "buffer", "index", "node", "tree", "path", "file",
    "read", "write", "state", "cache", "item", "list", "map", "key", "name", "size", "len", "data",
    "error", "result", "token", "span", "queue", "lock", "guard", "frame", "block", "stream",
    "header", "body", "client", "server", "request", "reply", "session", "account", "handle",
    "update", "delete", "insert", "query", "filter", "sort", "merge", "split", "join", "load",
    "store", "flush", "open", "close", "start", "stop", "init", "total", "limit", "offset",
    "width", "height", "color", "text", "line", "column", "field", "record", "batch", "pool",
];
const KEYWORDS: &[&str] = &[
    "pub", "let", "const", "static", "mut", "async", "unsafe", "impl",
];
const TYPES: &[&str] = &[
    "u8",
    "u32",
    "u64",
    "i64",
    "usize",
    "bool",
    "String",
    "Vec<u8>",
    "Option<u32>",
];

/// splitmix64: deterministic, fast, good enough for text.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
}

fn ident(rng: &mut Rng, out: &mut String) {
    let parts = 1 + rng.below(3);
    for i in 0..parts {
        if i > 0 {
            out.push('_');
        }
        out.push_str(rng.pick(WORDS));
    }
}

fn type_name(rng: &mut Rng, out: &mut String) {
    if rng.one_in(3) {
        out.push_str(rng.pick(TYPES));
        return;
    }
    for _ in 0..1 + rng.below(2) {
        let word = rng.pick(WORDS);
        out.push(word.as_bytes()[0].to_ascii_uppercase() as char);
        out.push_str(&word[1..]);
    }
}

/// One line of Rust-looking code.
fn code_line(rng: &mut Rng, out: &mut String) {
    for _ in 0..rng.below(4) {
        out.push_str("    ");
    }
    if rng.one_in(2_000) {
        let _ = write!(out, "let {LITERAL} = {};", rng.below(100));
    } else if rng.one_in(3_000) {
        out.push_str("fn on_");
        ident(rng, out);
        out.push_str("_event(&mut self) {");
    } else if rng.one_in(1_500_000) {
        let _ = write!(out, "// {RARE}: see the design notes");
    } else {
        match rng.below(10) {
            0 => {
                out.push_str("fn ");
                ident(rng, out);
                out.push('(');
                ident(rng, out);
                out.push_str(": ");
                type_name(rng, out);
                out.push_str(") -> ");
                type_name(rng, out);
                out.push_str(" {");
            }
            1 => {
                out.push_str("if ");
                ident(rng, out);
                let _ = write!(out, " > {} {{ return ", rng.below(10_000));
                ident(rng, out);
                out.push_str("; }");
            }
            2 => {
                out.push_str("// ");
                for _ in 0..3 + rng.below(8) {
                    out.push_str(rng.pick(WORDS));
                    out.push(' ');
                }
            }
            3 => {
                ident(rng, out);
                out.push('.');
                ident(rng, out);
                out.push('(');
                ident(rng, out);
                out.push_str(");");
            }
            4 => out.push('}'),
            5 => {
                out.push_str("pub struct ");
                type_name(rng, out);
                out.push_str(" {");
            }
            6 => {
                ident(rng, out);
                out.push_str(": ");
                type_name(rng, out);
                out.push(',');
            }
            7 => {
                out.push_str("use crate::");
                ident(rng, out);
                out.push_str("::");
                type_name(rng, out);
                out.push(';');
            }
            _ => {
                out.push_str(rng.pick(KEYWORDS));
                out.push(' ');
                ident(rng, out);
                let _ = write!(out, " = {}", rng.next() % 1_000_000);
                out.push_str(if rng.one_in(2) { ";" } else { " as u64;" });
            }
        }
    }
    out.push('\n');
}

/// Writes the corpus under `dir`; returns (files, bytes).
fn generate(dir: &Path) -> (usize, usize) {
    let mut rng = Rng(SEED);
    let mut total = 0;
    let per_file = TARGET_BYTES / FILES;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(".gitignore"), "generated/\n*.log\n").unwrap();
    let mut text = String::with_capacity(MAX_FILE_BYTES + 256);
    for i in 0..FILES {
        // 20 packages × 30 modules, some with a nested level; one module in 40 is generated
        // code (ignored), one file in 50 a log (ignored).
        let (pkg, module) = (i % 20, (i / 20) % 30);
        let mut path: PathBuf = dir.join(format!("pkg{pkg:02}/mod{module:02}"));
        if (i / 600) % 3 == 1 {
            path.push(format!("sub{}", i % 4));
        }
        if module % 40 == 7 || (i / 600) % 40 == 5 {
            path.push("generated");
        }
        let ext = if rng.one_in(50) { "log" } else { "rs" };
        path.push(format!("file{i:05}.{ext}"));
        // Mostly small files, a few large ones: average ≈ TARGET_BYTES / FILES.
        let size = if rng.one_in(33) {
            per_file * 2 + rng.below(per_file * 12)
        } else {
            per_file / 5 + rng.below(per_file * 6 / 5)
        }
        .min(MAX_FILE_BYTES);
        text.clear();
        while text.len() < size {
            code_line(&mut rng, &mut text);
        }
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        total += text.len();
    }
    (FILES, total)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

struct Case {
    label: &'static str,
    query: &'static str,
    is_regex: bool,
}

fn run_toolmesh(ws: &Workspace, case: &Case) -> (Duration, u64, bool, u64, u64) {
    let args = SearchOptions {
        query: case.query.to_owned(),
        is_regex: case.is_regex,
        glob: None,
        case_sensitive: false,
        context_lines: 0,
        max_results: 5000,
    };
    let started = Instant::now();
    let out = search(ws, Path::new(""), &args).expect("search");
    let took = started.elapsed();
    (
        took,
        out.match_count,
        out.truncated,
        out.files_searched,
        out.files_skipped_large,
    )
}

fn run_rg(root: &Path, case: &Case) -> (Duration, u64) {
    let mut cmd = Command::new(RG);
    cmd.args([
        "--no-config",
        "-n",
        "-i",
        "--max-filesize",
        "1M",
        "--no-require-git",
    ]);
    if !case.is_regex {
        cmd.arg("-F");
    }
    cmd.arg("-e").arg(case.query).arg(root);
    let started = Instant::now();
    let out = cmd.output().expect("run rg");
    let took = started.elapsed();
    let lines = out.stdout.iter().filter(|&&b| b == b'\n').count() as u64;
    (took, lines)
}

fn main() {
    if !Path::new(RG).exists() {
        println!("search bench: {RG} not found (Debian package ripgrep); skipped");
        return;
    }
    let rounds = std::env::var("TOOLMESH_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let kept = std::env::var_os("TOOLMESH_BENCH_CORPUS").map(PathBuf::from);
    let temp = tempfile::tempdir().unwrap();
    let data = kept.clone().unwrap_or_else(|| temp.path().to_path_buf());
    let ws = Workspace::open(
        &data,
        &Account::parse("bench").unwrap(),
        &SessionId::parse("search").unwrap(),
    )
    .unwrap();
    let corpus = ws.root().join("corpus");
    let started = Instant::now();
    let marker = corpus.join(".complete");
    if kept.is_some() && marker.exists() {
        println!("corpus: reusing {}", corpus.display());
    } else {
        let _ = std::fs::remove_dir_all(&corpus);
        let (files, bytes) = generate(&corpus);
        std::fs::write(&marker, "").unwrap();
        println!(
            "corpus: {files} files, {:.1} MB in {:.1} s at {}",
            bytes as f64 / 1e6,
            started.elapsed().as_secs_f64(),
            corpus.display()
        );
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{threads} cores; {rounds} rounds after one warmup; rg: {}",
        rg_version()
    );

    let cases = [
        Case {
            label: "literal, moderate",
            query: LITERAL,
            is_regex: false,
        },
        Case {
            label: "regex, moderate",
            query: REGEX,
            is_regex: true,
        },
        Case {
            label: "literal, few",
            query: RARE,
            is_regex: false,
        },
    ];
    let mut rows = Vec::new();
    for case in &cases {
        // Warmup: page cache, and a check that both engines see the same lines.
        let (_, ours, truncated, searched, skipped) = run_toolmesh(&ws, case);
        let (_, theirs) = run_rg(ws.root(), case);
        assert_eq!(
            ours, theirs,
            "{}: toolmesh and rg disagree on matching lines",
            case.label
        );
        let (mut ours_t, mut rg_t) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            ours_t.push(run_toolmesh(&ws, case).0);
            rg_t.push(run_rg(ws.root(), case).0);
        }
        rows.push((
            case,
            ours,
            truncated,
            searched,
            skipped,
            median(&mut ours_t),
            median(&mut rg_t),
        ));
    }

    println!();
    println!(
        "{:<20} {:>8} {:>9} {:>9} {:>14} {:>10} {:>8}",
        "query", "matches", "searched", "skipped", "toolmesh p50", "rg p50", "ratio"
    );
    for (case, matches, truncated, searched, skipped, ours, theirs) in rows {
        println!(
            "{:<20} {:>7}{} {:>9} {:>9} {:>11.1} ms {:>7.1} ms {:>7.2}x",
            case.label,
            matches,
            if truncated { "+" } else { " " },
            searched,
            skipped,
            ours.as_secs_f64() * 1e3,
            theirs.as_secs_f64() * 1e3,
            ours.as_secs_f64() / theirs.as_secs_f64()
        );
    }
    println!("(ratio = toolmesh / rg; target <= 1.10x; `+` = truncated at max_results)");
}

fn rg_version() -> String {
    Command::new(RG)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_default()
}
