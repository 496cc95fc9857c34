//! The skill tools end to end: gateway → skills actor, against a local Skill Service fixture
//! (hand-made archives, good and hostile) and local skill folders; the bundle client a sandbox
//! worker uses; the `toolmesh skill-service` command.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use toolmesh_kernel::skills::SkillBundles;
use toolmesh_kernel::ErrorCode;
use toolmesh_skills::archive::{EntrySpec, ZipBuilder};
use toolmesh_skills::catalog::SkillManifest;
use toolmesh_skills::service::{RunningService, ServedSkill, ServiceCatalog, ServiceOptions};
use toolmesh_testkit::LogTap;

use crate::support::{ok, strings, write_skill, Cluster, BIN};

const TOKEN: &str = "fixture-token";
/// The inflate cap the node runs with (the inflate bomb passes it).
const MAX_BYTES: u64 = 1024 * 1024;

fn manifest(name: &str, description: &str) -> SkillManifest {
    SkillManifest {
        description: description.into(),
        version: "1.0.0".into(),
        ..SkillManifest::new(name)
    }
}

fn skill_md(name: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: The {name} skill\nversion: 1.0.0\ntags: [test]\nrequires_sandbox: true\n---\n{body}")
}

/// A file big enough to take several bundle pages, with bytes that show misplaced chunks.
fn big_file() -> Vec<u8> {
    (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect()
}

fn zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut z = ZipBuilder::new();
    for (name, data) in entries {
        z.file(name, data);
    }
    z.finish()
}

/// The hostile archive cases: (skill name, archive, expected code).
fn hostile(targets: &Targets) -> Vec<(&'static str, Vec<u8>, ErrorCode)> {
    let md = skill_md("x", "x\n");
    let md = md.as_bytes();
    let mut symlink = EntrySpec::file("link", b"/etc/passwd");
    symlink.unix_mode = Some(0o120_777);
    let mut fifo = EntrySpec::file("pipe", b"");
    fifo.unix_mode = Some(0o010_644);
    let mut encrypted = EntrySpec::file("secret.txt", b"x");
    encrypted.flags = 1;
    let with = |spec: EntrySpec| {
        let mut z = ZipBuilder::new();
        z.file("SKILL.md", md).entry(spec);
        z.finish()
    };
    let mut overlap = ZipBuilder::new();
    overlap
        .file("SKILL.md", md)
        .overlapping("outer.bin", "inner.bin", &[7u8; 4096]);
    vec![
        (
            "slip-forward",
            zip(&[("SKILL.md", md), (&targets.slip_forward, b"owned")]),
            ErrorCode::UnsafeArchive,
        ),
        (
            "slip-backward",
            zip(&[("SKILL.md", md), (&targets.slip_backward, b"owned")]),
            ErrorCode::UnsafeArchive,
        ),
        (
            "absolute",
            zip(&[("SKILL.md", md), (&targets.absolute, b"owned")]),
            ErrorCode::UnsafeArchive,
        ),
        ("symlink", with(symlink), ErrorCode::UnsafeArchive),
        ("fifo", with(fifo), ErrorCode::UnsafeArchive),
        ("encrypted", with(encrypted), ErrorCode::UnsafeArchive),
        (
            "duplicate",
            zip(&[("SKILL.md", md), ("a.txt", b"1"), ("a.txt", b"2")]),
            ErrorCode::UnsafeArchive,
        ),
        ("overlap-bomb", overlap.finish(), ErrorCode::UnsafeArchive),
        (
            "inflate-bomb",
            zip(&[
                ("SKILL.md", md),
                ("zeros.bin", &vec![0u8; 3 * MAX_BYTES as usize]),
            ]),
            ErrorCode::UnsafeArchive,
        ),
        (
            "no-skill-md",
            zip(&[("README.md", b"no skill here")]),
            ErrorCode::InvalidSkill,
        ),
        (
            "two-top-folders",
            zip(&[("a/SKILL.md", md), ("b/SKILL.md", md)]),
            ErrorCode::InvalidSkill,
        ),
        (
            "bad-front-matter",
            zip(&[("SKILL.md", b"---\nname: x\nno end\n")]),
            ErrorCode::InvalidSkill,
        ),
    ]
}

/// Where escaping entries would land if they were followed.
struct Targets {
    slip_forward: String,
    slip_backward: String,
    absolute: String,
    paths: Vec<PathBuf>,
}

impl Targets {
    fn new(data_dir: &Path) -> Targets {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        // Staging is <data>/skills-cache/.staging/<id>/: four levels up is the data dir's
        // parent.
        let slip_forward = format!("../../../../slip-fwd-{tag}");
        let slip_backward = format!("..\\..\\..\\..\\slip-back-{tag}");
        let absolute = data_dir.join(format!("abs-{tag}")).display().to_string();
        let parent = data_dir.parent().unwrap();
        let paths = vec![
            parent.join(format!("slip-fwd-{tag}")),
            parent.join(format!("slip-back-{tag}")),
            PathBuf::from(&absolute),
        ];
        Targets {
            slip_forward,
            slip_backward,
            absolute,
            paths,
        }
    }
}

struct Fixture {
    cluster: Cluster,
    service: RunningService,
    archive_host: RunningService,
    targets: Targets,
    _local: tempfile::TempDir,
}

/// A skill of one `SKILL.md`, `body`.
fn plain(name: &str, description: &str, body: &[u8]) -> ServedSkill {
    ServedSkill::new(manifest(name, description), zip(&[("SKILL.md", body)]))
}

async fn fixture(extra_env: &[(&str, &str)]) -> Fixture {
    let mut cluster = Cluster::servers().await;
    let targets = Targets::new(cluster.data_dir.path());
    let good = zip(&[
        (
            "good-skill/SKILL.md",
            skill_md("good-skill", "# Good\nUse it well.\n").as_bytes(),
        ),
        ("good-skill/scripts/run.sh", b"#!/bin/sh\necho good\n"),
        ("good-skill/data/big.bin", &big_file()),
    ]);
    let mut space_a = ServiceCatalog::default();
    space_a.add(
        "space-a",
        ServedSkill::new(manifest("good-skill", "Draws good diagrams"), good),
    );
    let mut wrong = ServedSkill::new(
        manifest("wrong-hash", "Hash is wrong"),
        zip(&[("SKILL.md", skill_md("wrong-hash", "tampered\n").as_bytes())]),
    );
    wrong.sha256 = "0".repeat(64);
    space_a.add("space-a", wrong);
    for (name, archive, _) in hostile(&targets) {
        space_a.add(
            "space-a",
            ServedSkill::new(manifest(name, "hostile"), archive),
        );
    }
    let mut inactive = plain("inactive-skill", "Switched off", b"inactive");
    inactive.manifest.status = "inactive".into();
    space_a.add("space-a", inactive);
    space_a.add("space-a", plain("dup-skill", "from space a", b"from a"));
    space_a.add("space-a", plain("shadowed", "remote one", b"remote"));
    // An archive on another origin: the token must not go there.
    let elsewhere = zip(&[(
        "SKILL.md",
        skill_md("cross-origin", "from elsewhere\n").as_bytes(),
    )]);
    let mut host_catalog = ServiceCatalog::default();
    host_catalog.add(
        "space-a",
        ServedSkill::new(manifest("cross-origin", ""), elsewhere.clone()),
    );
    let archive_host = RunningService::start(host_catalog, ServiceOptions::default())
        .await
        .unwrap();
    let mut cross = ServedSkill::new(manifest("cross-origin", "Archive elsewhere"), elsewhere);
    cross.archive_url = Some(format!(
        "{}/archives/space-a/cross-origin.zip",
        archive_host.url()
    ));
    space_a.add("space-a", cross);
    space_a.add("space-b", plain("dup-skill", "from space b", b"from b"));
    space_a.add("space-b", plain("only-b", "Only in b", b"b only"));
    let service = RunningService::start(
        space_a,
        ServiceOptions {
            token: Some(TOKEN.into()),
            public_url: None,
        },
    )
    .await
    .unwrap();

    let local = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let p = local.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "shadowed/SKILL.md",
        "---\nname: shadowed\ndescription: the local one\n---\nlocal instructions\n",
    );
    write(
        "pdf-tools/SKILL.md",
        "---\nname: pdf-tools\ndescription: Read and merge PDF documents\ntags: [pdf, documents]\naliases: [acrobat]\nexamples: [\"merge two invoices\"]\nversion: 0.3.0\n---\n# PDF\nRun scripts/merge.py.\n",
    );
    write("pdf-tools/scripts/merge.py", "print('merge')\n");
    write("not-a-skill/README.md", "nothing\n");

    let url = service.url();
    let local_dir = local.path().display().to_string();
    let max = MAX_BYTES.to_string();
    let mut env = vec![
        ("TOOLMESH_TOOL_APPROVAL_MODE", "off"),
        ("TOOLMESH_SKILL_SERVICE_URL", url.as_str()),
        ("TOOLMESH_SKILL_SPACE_IDS", "space-a,space-b"),
        ("TOOLMESH_SKILL_SERVICE_TOKEN", TOKEN),
        ("TOOLMESH_SKILLS_DIR", local_dir.as_str()),
        ("TOOLMESH_SKILL_MAX_BYTES", max.as_str()),
    ];
    env.extend_from_slice(extra_env);
    cluster.start_node("gateway,approval,skills", &env).await;
    Fixture {
        cluster,
        service,
        archive_host,
        targets,
        _local: local,
    }
}

async fn tool(c: &Cluster, name: &str, args: Value) -> Value {
    c.call("acme", json!({"tool": name, "arguments": args}))
        .await
}

async fn load_skill(c: &Cluster, name: &str) -> Value {
    tool(c, "load_skill", json!({"skill_name": name})).await
}

/// Every path under `dir`, relative.
fn walk(dir: &Path) -> BTreeSet<String> {
    fn go(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            out.insert(path.strip_prefix(base).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                go(&path, base, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    go(dir, dir, &mut out);
    out
}

#[tokio::test]
async fn hostile_archives_are_refused_and_nothing_escapes_staging() {
    let f = fixture(&[]).await;
    let data = f.cluster.data_dir.path();
    for (name, _, code) in hostile(&f.targets) {
        let before = walk(data);
        let r = tool(&f.cluster, "load_skill", json!({"skill_name": name})).await;
        assert_eq!(r["ok"], false, "{name}: {r}");
        assert_eq!(r["error"], code.as_str(), "{name}: {r}");
        let after = walk(data);
        let new: Vec<&String> = after
            .difference(&before)
            .filter(|p| *p != "skills-cache" && *p != "skills-cache/.staging")
            .collect();
        assert!(new.is_empty(), "{name} left {new:?}");
        // The staging area is cleaned up, and no cache entry appeared.
        let staging = data.join("skills-cache/.staging");
        assert_eq!(walk(&staging).len(), 0, "{name}: staging not removed");
        for target in &f.targets.paths {
            assert!(!target.exists(), "{name}: {} exists", target.display());
        }
    }
    // The wrong hash is refused before anything is unpacked.
    let before = walk(data);
    let r = load_skill(&f.cluster, "wrong-hash").await;
    assert_eq!(r["error"], "hash_mismatch", "{r}");
    assert_eq!(walk(data), before);
    // An archive on another loopback origin is refused by the egress policy, unasked.
    let r = load_skill(&f.cluster, "cross-origin").await;
    assert_eq!(r["error"], "blocked_url", "{r}");
    assert_eq!(r["reason"], "loopback address 127.0.0.1", "{r}");
    assert!(f.archive_host.requests().is_empty());
}

#[tokio::test]
async fn a_hash_mismatch_may_be_allowed_with_a_warning() {
    let f = fixture(&[("TOOLMESH_SKILL_ALLOW_HASH_MISMATCH", "1")]).await;
    let r = ok(load_skill(&f.cluster, "wrong-hash").await);
    assert_eq!(r["instructions"], "tampered\n");
    let warnings = r["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{r}");
    assert!(warnings[0].as_str().unwrap().contains("sha256"), "{r}");
}

#[tokio::test]
async fn listing_merges_local_and_spaces_with_precedence() {
    let f = fixture(&[]).await;
    let r = ok(tool(&f.cluster, "list_skills", json!({})).await);
    assert_eq!(r["skill_space_ids"], json!(["space-a", "space-b"]));
    let skills = r["skills"].as_array().unwrap();
    let names: Vec<&str> = skills.iter().map(|s| s["name"].as_str().unwrap()).collect();
    // Local first (sorted by folder), then space-a in its order, then space-b.
    assert_eq!(&names[..2], ["pdf-tools", "shadowed"], "{names:?}");
    let by_name = |n: &str| skills.iter().find(|s| s["name"] == n).unwrap();
    assert_eq!(by_name("shadowed")["space_id"], "local");
    assert_eq!(by_name("pdf-tools")["space_id"], "local");
    assert_eq!(by_name("dup-skill")["space_id"], "space-a");
    assert_eq!(by_name("dup-skill")["description"], "from space a");
    assert_eq!(by_name("only-b")["space_id"], "space-b");
    for n in ["shadowed", "dup-skill"] {
        assert_eq!(names.iter().filter(|x| **x == n).count(), 1, "{n} twice");
    }
    assert!(!names.contains(&"inactive-skill"));
    assert!(!names.contains(&"not-a-skill"));
    // The fixture refuses requests without the token: listing worked, so it was sent.
    assert!(f
        .service
        .requests()
        .iter()
        .all(|q| q.authorization.as_deref() == Some(&format!("Bearer {TOKEN}")[..])));

    // Unknown and inactive skills are skill_not_found with the list.
    for name in ["inactive-skill", "no-such-skill"] {
        let r = tool(&f.cluster, "load_skill", json!({"skill_name": name})).await;
        assert_eq!(r["error"], "skill_not_found", "{r}");
        assert!(r["available_skills"]
            .as_array()
            .unwrap()
            .contains(&json!("good-skill")));
    }
    // The local one wins the clash.
    let r = load_skill(&f.cluster, "shadowed").await;
    assert_eq!(r["instructions"], "local instructions\n", "{r}");
    assert_eq!(r["space_id"], "local");
}

#[tokio::test]
async fn a_public_space_allow_list_hides_other_skills() {
    let f = fixture(&[("TOOLMESH_SKILL_SPACE_ALLOWLISTS", "space-b=dup-skill")]).await;
    let r = tool(&f.cluster, "list_skills", json!({})).await;
    let names = strings(&r, "skills", "name");
    assert!(!names.iter().any(|n| n == "only-b"), "{names:?}");
    assert!(names.iter().any(|n| n == "good-skill"), "{names:?}");
}

#[tokio::test]
async fn search_scores_and_refuses_an_empty_query() {
    let f = fixture(&[]).await;
    let r = ok(tool(&f.cluster, "search_skills", json!({"query": "pdf"})).await);
    assert_eq!(r["query"], "pdf");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results[0]["name"], "pdf-tools", "{r}");
    assert!(results[0]["score"].as_f64().unwrap() > 0.0);
    assert!(results
        .windows(2)
        .all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()));
    // Aliases and examples count; a misspelling still finds it.
    for query in ["acrobat", "invoices", "documnts"] {
        let r = tool(&f.cluster, "search_skills", json!({"query": query})).await;
        assert_eq!(r["results"][0]["name"], "pdf-tools", "{query}: {r}");
    }
    let r = tool(
        &f.cluster,
        "search_skills",
        json!({"query": "skill", "max_results": 2}),
    )
    .await;
    assert_eq!(r["results"].as_array().unwrap().len(), 2, "{r}");
    for query in ["", "   "] {
        let r = tool(&f.cluster, "search_skills", json!({"query": query})).await;
        assert_eq!(r["ok"], false);
        assert_eq!(r["error"], "invalid_arguments", "{r}");
    }
}

#[tokio::test]
async fn load_skill_verifies_caches_and_reports_cache_hits() {
    // The archive host listens on loopback like the service, on another port: only the
    // service's own origin is reachable without the allow-list.
    let f = fixture(&[("TOOLMESH_SKILL_ALLOWED_NETWORKS", "127.0.0.1/32")]).await;
    let r = ok(load_skill(&f.cluster, "good-skill").await);
    assert_eq!(r["instructions"], "# Good\nUse it well.\n");
    assert_eq!(r["name"], "good-skill");
    assert_eq!(r["version"], "1.0.0");
    assert_eq!(r["space_id"], "space-a");
    assert_eq!(r["cache_hit"], false);
    assert_eq!(r["has_scripts_dir"], true);
    assert_eq!(r["script_files"], json!(["scripts/run.sh"]));
    assert_eq!(r["requires_sandbox"], true);
    assert!(r["usage"].as_str().unwrap().contains("execute_skills"));
    let sha = r["sha256"].as_str().unwrap().to_owned();
    let root = f.cluster.data_dir.path().join("skills-cache").join(&sha);
    assert_eq!(
        std::fs::read(root.join("good-skill/data/big.bin")).unwrap(),
        big_file()
    );
    assert_eq!(r["root_dir"], root.join("good-skill").display().to_string());
    let downloads = |s: &RunningService| {
        s.requests()
            .iter()
            .filter(|q| q.path.starts_with("/archives/"))
            .count()
    };
    assert_eq!(downloads(&f.service), 1);
    let again = ok(load_skill(&f.cluster, "good-skill").await);
    assert_eq!(again["cache_hit"], true);
    assert_eq!(again["instructions"], r["instructions"]);
    assert_eq!(downloads(&f.service), 1, "a cache hit downloads nothing");

    // The archive on another origin is fetched without the token.
    let r = ok(load_skill(&f.cluster, "cross-origin").await);
    assert_eq!(r["instructions"], "from elsewhere\n");
    let seen = f.archive_host.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].authorization, None, "the token leaked: {seen:?}");
}

#[tokio::test]
async fn bundles_hand_skill_files_to_a_worker() {
    let f = fixture(&[]).await;
    let client = &f.cluster.client;
    let bundles = SkillBundles::fetch(client, &["good-skill".into(), "pdf-tools".into()])
        .await
        .unwrap();
    assert_eq!(bundles.len(), 2);
    let good = &bundles[0];
    assert_eq!(good.name, "good-skill");
    assert_eq!(good.space_id, "space-a");
    assert_eq!(good.sha256.len(), 64);
    assert_eq!(good.instructions.as_deref(), Some("# Good\nUse it well.\n"));
    let paths: Vec<&str> = good.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["SKILL.md", "data/big.bin", "scripts/run.sh"]);
    // 700 KB is more than one page: reassembled byte for byte.
    assert_eq!(good.files[1].bytes, big_file());
    assert_eq!(good.files[1].mode, 0o644);
    let local = &bundles[1];
    assert_eq!(local.sha256, "local");
    assert_eq!(local.space_id, "local");
    assert_eq!(
        local.instructions.as_deref(),
        Some("# PDF\nRun scripts/merge.py.\n")
    );
    let paths: Vec<&str> = local.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["SKILL.md", "scripts/merge.py"]);
    assert_eq!(local.files[1].bytes, "print('merge')\n");

    let error = SkillBundles::fetch(client, &["nope".into()])
        .await
        .unwrap_err();
    assert_eq!(error.code, ErrorCode::SkillNotFound);
    assert!(error.details["available_skills"]
        .as_array()
        .unwrap()
        .contains(&json!("pdf-tools")));
    let error = SkillBundles::fetch(client, &["symlink".into()])
        .await
        .unwrap_err();
    assert_eq!(error.code, ErrorCode::UnsafeArchive);
    assert!(SkillBundles::fetch(client, &[]).await.unwrap().is_empty());
}

/// Kills the child on drop.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The URL of the `skill service listening url=…` line of `toolmesh skill-service`'s log.
fn listening_url(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("skill service listening url=")?;
    rest.split_whitespace().next().map(str::to_owned)
}

#[tokio::test]
async fn the_skill_service_command_serves_a_folder_to_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let skill = write_skill(
        dir.path(),
        "hello",
        "---\nname: hello\ndescription: Says hello\nversion: 2.0.0\ntags: [greeting]\n---\nSay hello.\n",
        "echo hello\n",
    );
    let mut child = std::process::Command::new(BIN)
        .args([
            "skill-service",
            "--dir",
            &dir.path().display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--space",
            "demo",
            "--token",
            "t0k",
        ])
        // Its `info` line says where it listens.
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start toolmesh skill-service");
    let log = LogTap::start(child.stderr.take().unwrap(), |_| {});
    let _child = ChildGuard(child);
    let url = log
        .find(Duration::from_secs(10), listening_url)
        .unwrap_or_else(|| panic!("the skill service did not listen:\n{}", log.text()));
    let mut cluster = Cluster::servers().await;
    cluster
        .start_node(
            "gateway,approval,skills",
            &[
                ("TOOLMESH_SKILL_SERVICE_URL", url.as_str()),
                ("TOOLMESH_SKILL_SPACE_IDS", "demo"),
                ("TOOLMESH_SKILL_SERVICE_TOKEN", "t0k"),
                ("TOOLMESH_SKILLS_DIR", "/nonexistent-skills-dir"),
            ],
        )
        .await;
    let r = ok(tool(&cluster, "list_skills", json!({})).await);
    assert_eq!(r["skills"][0]["name"], "hello", "{r}");
    assert_eq!(r["skills"][0]["space_id"], "demo");
    assert_eq!(r["skills"][0]["version"], "2.0.0");
    let r = ok(load_skill(&cluster, "hello").await);
    assert_eq!(r["instructions"], "Say hello.\n");
    assert_eq!(r["script_files"], json!(["scripts/hello.sh"]));
    assert_eq!(r["cache_hit"], false);
    // Zipping is deterministic: the same folder hashes the same on every start.
    let zipped = toolmesh_skills::archive::zip_dir(&skill).unwrap();
    assert_eq!(r["sha256"], toolmesh_kernel::canonical::sha256_hex(&zipped));
}
