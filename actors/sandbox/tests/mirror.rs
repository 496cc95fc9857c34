//! The mirror against a real nats-server and the workspace actor: round trips, a hostile
//! local directory (links out, FIFOs, the skip list), conflicts, big files, and the cost of a
//! sync when nothing changed.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use toolmesh_kernel::sync::WorkspaceSync;
use toolmesh_kernel::{Account, SessionId};
use toolmesh_sandbox::mirror::{Mirror, PullReport, PushReport, SyncLimits};
use toolmesh_testkit::{NatsServer, RedisServer};

#[path = "../../workspace/tests/support/actor.rs"]
mod workspace_actor;
use workspace_actor::start_workspace;

struct Rig {
    _nats: NatsServer,
    _redis: RedisServer,
    dir: tempfile::TempDir,
    mirror: Mirror,
}

impl Rig {
    async fn start() -> Rig {
        Rig::with_limits(SyncLimits::default()).await
    }

    async fn with_limits(limits: SyncLimits) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (nats, redis) = start_workspace(dir.path().join("data")).await;
        let mirror = Mirror::new(
            WorkspaceSync::new(nats.client().await),
            Account::parse("acme").unwrap(),
            SessionId::parse("s1").unwrap(),
            dir.path().join("mirror"),
            limits,
        );
        Rig {
            _nats: nats,
            _redis: redis,
            dir,
            mirror,
        }
    }

    fn ws(&self) -> PathBuf {
        self.dir
            .path()
            .join("data/accounts/acme/sessions/s1/workspace")
    }

    fn local(&self) -> PathBuf {
        self.dir.path().join("mirror")
    }

    /// A workspace write as the workspace actor makes it: temp file + rename.
    fn ws_write(&self, rel: &str, content: &[u8]) {
        write_by_rename(&self.ws().join(rel), content);
    }
}

fn write_by_rename(path: &Path, content: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let temp = path.with_extension("tmp-test");
    std::fs::write(&temp, content).unwrap();
    std::fs::rename(temp, path).unwrap();
}

/// Every regular file under `root` (relative path → content), links not followed.
fn files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in read {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned();
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn names(files: &[(String, Vec<u8>)]) -> Vec<&str> {
    files.iter().map(|(p, _)| p.as_str()).collect()
}

#[actix_rt::test]
async fn a_round_trip_carries_new_changed_deleted_and_nested_files() {
    let mut rig = Rig::start().await;
    rig.ws_write("a.txt", b"alpha");
    rig.ws_write("sub/b.txt", b"beta");
    rig.ws_write("sub/deeper/c.txt", b"gamma");

    let report = rig.mirror.pull().await.unwrap();
    assert_eq!(
        report,
        PullReport {
            copied: 3,
            removed: 0,
            dirs_created: 0,
            dirs_removed: 0,
            skipped: 0,
            truncated: false
        }
    );
    assert_eq!(files(&rig.local()), files(&rig.ws()));
    if rig.mirror.owner.is_some() {
        for rel in ["a.txt", "sub", "sub/deeper/c.txt"] {
            let meta = std::fs::metadata(rig.local().join(rel)).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid()),
                (1000, 1000),
                "{rel} belongs to the sandbox user"
            );
        }
    }
    assert_eq!(
        rig.mirror.pull().await.unwrap().copied,
        0,
        "nothing changed"
    );
    assert!(rig.mirror.push().await.unwrap().changed.is_empty());

    // The sandbox works: new file, in-place edit, delete, a new nested tree, a removed tree.
    let local = rig.local();
    std::fs::write(local.join("new.txt"), b"new").unwrap();
    std::fs::write(local.join("a.txt"), b"alpha, edited in place").unwrap();
    std::fs::remove_file(local.join("sub/b.txt")).unwrap();
    std::fs::create_dir_all(local.join("pkg/mod")).unwrap();
    std::fs::write(local.join("pkg/mod/x.py"), b"print(1)").unwrap();
    std::fs::remove_dir_all(local.join("sub/deeper")).unwrap();

    let mut report = rig.mirror.push().await.unwrap();
    report.changed.sort();
    report.deleted.sort();
    assert_eq!(report.changed, ["a.txt", "new.txt", "pkg/mod/x.py"]);
    assert_eq!(
        report.deleted,
        ["sub/b.txt", "sub/deeper/", "sub/deeper/c.txt"]
    );
    assert!(report.conflicts.is_empty());
    assert_eq!(files(&rig.ws()), files(&local));
    assert!(
        !rig.ws().join("sub/deeper").exists(),
        "an emptied tree is pruned"
    );

    // Nothing more to do either way.
    let again = rig.mirror.push().await.unwrap();
    assert!(
        again.changed.is_empty() && again.deleted.is_empty(),
        "{again:?}"
    );
    assert_eq!(rig.mirror.pull().await.unwrap().copied, 0);

    // The workspace changes and deletes: the next pull follows.
    rig.ws_write("a.txt", b"rewritten by a tool");
    std::fs::remove_file(rig.ws().join("new.txt")).unwrap();
    let report = rig.mirror.pull().await.unwrap();
    assert_eq!((report.copied, report.removed), (1, 1), "{report:?}");
    assert_eq!(files(&local), files(&rig.ws()));
}

#[actix_rt::test]
async fn links_fifos_and_skipped_directories_never_travel() {
    let mut rig = Rig::start().await;
    rig.ws_write("keep.txt", b"keep");
    rig.ws_write(".git/HEAD", b"ref: main");
    rig.ws_write("node_modules/m/index.js", b"js");
    rig.ws_write(".toolmesh/outputs/o.txt", b"output");
    rig.mirror.pull().await.unwrap();
    assert_eq!(
        names(&files(&rig.local())),
        ["keep.txt"],
        "the skip list holds on pull"
    );

    let secret_dir = rig.dir.path().join("host-secrets");
    std::fs::create_dir(&secret_dir).unwrap();
    let secret = b"TOP-SECRET-7f3a9c";
    std::fs::write(secret_dir.join("secret.txt"), secret).unwrap();
    let secret_intact = || {
        assert_eq!(
            std::fs::read(secret_dir.join("secret.txt")).unwrap(),
            secret,
            "the file outside is untouched"
        )
    };
    let local = rig.local();
    symlink(secret_dir.join("secret.txt"), local.join("leak.txt")).unwrap();
    symlink(&secret_dir, local.join("leakdir")).unwrap();
    symlink("/etc/passwd", local.join("passwd")).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(local.join("fifo"))
        .status()
        .unwrap()
        .success());
    for rel in [
        ".git/config",
        "node_modules/x.js",
        ".toolmesh/evil.txt",
        "a/__pycache__/m.pyc",
    ] {
        std::fs::create_dir_all(local.join(rel).parent().unwrap()).unwrap();
        std::fs::write(local.join(rel), b"skip me").unwrap();
    }
    std::fs::write(local.join("ok.txt"), b"fine").unwrap();
    // A known file swapped for a link to the secret: it reads as deleted, never as the secret.
    std::fs::remove_file(local.join("keep.txt")).unwrap();
    symlink(secret_dir.join("secret.txt"), local.join("keep.txt")).unwrap();

    let report = rig.mirror.push().await.unwrap();
    // `a` holds only a skipped `__pycache__`: it travels as an empty directory.
    assert_eq!(report.changed, ["ok.txt", "a/"], "{report:?}");
    assert_eq!(report.deleted, ["keep.txt"]);
    for (path, content) in files(&rig.ws()) {
        assert!(
            !content.windows(secret.len()).any(|w| w == secret),
            "{path} holds the secret"
        );
    }
    let ws_names = files(&rig.ws());
    assert_eq!(
        names(&ws_names),
        [
            ".git/HEAD",
            ".toolmesh/outputs/o.txt",
            "node_modules/m/index.js",
            "ok.txt"
        ]
    );
    secret_intact();

    // Pull over a planted link: the link is replaced as a link, the target is untouched.
    rig.ws_write("leak.txt", b"from the workspace");
    rig.mirror.pull().await.unwrap();
    assert!(std::fs::symlink_metadata(local.join("leak.txt"))
        .unwrap()
        .is_file());
    assert_eq!(
        std::fs::read(local.join("leak.txt")).unwrap(),
        b"from the workspace"
    );
    secret_intact();
    // A directory swapped for a link to outside: writing beneath it replaces the link.
    rig.ws_write("leakdir/x.txt", b"x");
    rig.mirror.pull().await.unwrap();
    assert!(std::fs::symlink_metadata(local.join("leakdir"))
        .unwrap()
        .is_dir());
    assert_eq!(
        names(&files(&secret_dir)),
        ["secret.txt"],
        "nothing written outside"
    );
}

#[actix_rt::test]
async fn changes_on_both_sides_conflict_and_the_workspace_wins() {
    let mut rig = Rig::start().await;
    rig.ws_write("a.txt", b"v1");
    rig.ws_write("b.txt", b"b1");
    rig.mirror.pull().await.unwrap();

    // Meanwhile the workspace changes both, and the sandbox edits a.txt and deletes b.txt
    // and creates c.txt, which the workspace also created.
    rig.ws_write("a.txt", b"v2 from the workspace");
    rig.ws_write("b.txt", b"b2 from the workspace");
    rig.ws_write("c.txt", b"c from the workspace");
    std::fs::write(rig.local().join("a.txt"), b"v2 from the sandbox").unwrap();
    std::fs::remove_file(rig.local().join("b.txt")).unwrap();
    std::fs::write(rig.local().join("c.txt"), b"c from the sandbox").unwrap();

    let mut report = rig.mirror.push().await.unwrap();
    report.conflicts.sort();
    assert_eq!(report.conflicts, ["a.txt", "b.txt", "c.txt"], "{report:?}");
    assert!(report.changed.is_empty() && report.deleted.is_empty());
    assert_eq!(
        std::fs::read(rig.ws().join("a.txt")).unwrap(),
        b"v2 from the workspace"
    );
    assert_eq!(
        std::fs::read(rig.ws().join("b.txt")).unwrap(),
        b"b2 from the workspace"
    );

    let report = rig.mirror.pull().await.unwrap();
    assert_eq!(report.copied, 3);
    assert_eq!(
        files(&rig.local()),
        files(&rig.ws()),
        "the workspace version wins"
    );
}

#[actix_rt::test]
async fn big_files_travel_in_parts_and_limits_hold_on_push() {
    let mut rig = Rig::start().await;
    let big: Vec<u8> = (0..2_500_000u32)
        .map(|i| (i.wrapping_mul(7919) >> 5) as u8)
        .collect();
    rig.ws_write("big.bin", &big);
    rig.mirror.pull().await.unwrap();
    assert!(std::fs::read(rig.local().join("big.bin")).unwrap() == big);

    let mut edited = big.clone();
    edited[1_234_567] ^= 0xff;
    std::fs::write(rig.local().join("big.bin"), &edited).unwrap();
    // Over max_file_bytes (10 MiB by default): skipped, and not taken for a deletion.
    let file = std::fs::File::create(rig.local().join("huge.bin")).unwrap();
    file.set_len(11 * 1024 * 1024).unwrap();
    let report = rig.mirror.push().await.unwrap();
    assert_eq!(report.changed, ["big.bin"], "{report:?}");
    assert_eq!(report.skipped, 1);
    assert!(std::fs::read(rig.ws().join("big.bin")).unwrap() == edited);
    assert!(!rig.ws().join("huge.bin").exists());
}

#[actix_rt::test]
async fn a_sync_with_nothing_changed_is_one_round_trip_each_way() {
    let mut rig = Rig::start().await;
    for i in 0..10 {
        rig.ws_write(&format!("src/f{i}.py"), b"print('hi')\n");
    }
    rig.mirror.pull().await.unwrap();
    rig.mirror.push().await.unwrap();
    let rounds = 50u32;
    let started = Instant::now();
    for _ in 0..rounds {
        assert_eq!(rig.mirror.pull().await.unwrap().copied, 0);
        assert!(rig.mirror.push().await.unwrap().changed.is_empty());
    }
    let each = started.elapsed() / rounds;
    eprintln!("pull + push with nothing changed: {each:?} per command (debug build)");
    assert!(each < Duration::from_millis(50), "{each:?}");
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every directory under `root` (relative) but the workspace's own and `node_modules`, links
/// not followed.
fn dirs(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .to_owned(),
                );
                stack.push(path);
            }
        }
    }
    out.retain(|d| !d.starts_with(".toolmesh") && !d.starts_with("node_modules"));
    out.sort();
    out
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[actix_rt::test]
async fn modes_travel_both_ways_and_setuid_never_reaches_the_workspace() {
    let mut rig = Rig::start().await;
    rig.ws_write("run.sh", b"#!/bin/sh\necho hi\n");
    chmod(&rig.ws().join("run.sh"), 0o755);
    rig.ws_write("data.txt", b"data");
    chmod(&rig.ws().join("data.txt"), 0o644);
    rig.mirror.pull().await.unwrap();
    let local = rig.local();
    assert_eq!(
        mode_of(&local.join("run.sh")),
        0o755,
        "the exec bit comes in"
    );
    assert_eq!(mode_of(&local.join("data.txt")), 0o644);

    // chmod +x in the sandbox: a mode-only change is pushed, and comes back as no change.
    chmod(&local.join("data.txt"), 0o755);
    let report = rig.mirror.push().await.unwrap();
    assert_eq!(report.changed, ["data.txt"], "{report:?}");
    assert_eq!(mode_of(&rig.ws().join("data.txt")), 0o755);
    assert_eq!(std::fs::read(rig.ws().join("data.txt")).unwrap(), b"data");
    assert!(rig.mirror.push().await.unwrap().changed.is_empty());
    assert_eq!(rig.mirror.pull().await.unwrap().copied, 0);

    // setuid, setgid and sticky set in the sandbox never reach the workspace.
    chmod(&local.join("run.sh"), 0o7755);
    assert_eq!(mode_of(&local.join("run.sh")), 0o7755);
    let report = rig.mirror.push().await.unwrap();
    assert_eq!(report.changed, ["run.sh"], "{report:?}");
    assert_eq!(mode_of(&rig.ws().join("run.sh")), 0o755);
    assert!(rig.mirror.push().await.unwrap().changed.is_empty());

    // A mode-only change in the workspace comes in on the next pull.
    chmod(&rig.ws().join("data.txt"), 0o644);
    assert_eq!(rig.mirror.pull().await.unwrap().copied, 1);
    assert_eq!(mode_of(&local.join("data.txt")), 0o644);
}

#[actix_rt::test]
async fn empty_directories_travel_both_ways() {
    let mut rig = Rig::start().await;
    let (ws, local) = (rig.ws(), rig.local());
    std::fs::create_dir_all(ws.join("empty-ws/inner")).unwrap();
    rig.ws_write("full/f.txt", b"f");
    rig.ws_write("tree/t.txt", b"t");
    rig.ws_write("keep/k.txt", b"k");
    let report = rig.mirror.pull().await.unwrap();
    assert_eq!(report.dirs_created, 2, "empty-ws and its inner: {report:?}");
    assert_eq!(dirs(&local), dirs(&ws));

    // Made in the sandbox: pushed, parents first; skipped names and links are not.
    std::fs::create_dir_all(local.join("made/deep")).unwrap();
    std::fs::create_dir(local.join("made2")).unwrap();
    std::fs::create_dir_all(local.join("node_modules/pkg")).unwrap();
    let outside = rig.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    symlink(&outside, local.join("linked")).unwrap();
    let report = rig.mirror.push().await.unwrap();
    assert_eq!(
        report.changed,
        ["made/", "made/deep/", "made2/"],
        "{report:?}"
    );
    assert!(ws.join("made/deep").is_dir() && ws.join("made2").is_dir());
    assert!(!ws.join("node_modules").exists());
    assert!(!ws.join("linked").exists());
    let again = rig.mirror.push().await.unwrap();
    assert!(
        again.changed.is_empty() && again.deleted.is_empty(),
        "{again:?}"
    );

    // Removed in the sandbox: removed in the workspace while empty there; a directory the
    // workspace filled meanwhile stays (the workspace wins) and comes back on the next pull.
    std::fs::remove_dir(local.join("made/deep")).unwrap();
    std::fs::remove_dir(local.join("made2")).unwrap();
    rig.ws_write("made2/x.txt", b"from the workspace");
    std::fs::remove_dir_all(local.join("tree")).unwrap();
    std::fs::remove_file(local.join("keep/k.txt")).unwrap();
    let report = rig.mirror.push().await.unwrap();
    assert_eq!(
        sorted(report.deleted.clone()),
        ["keep/k.txt", "made/deep/", "tree/", "tree/t.txt"],
        "{report:?}"
    );
    assert_eq!(report.conflicts, ["made2/"], "{report:?}");
    assert!(!ws.join("made/deep").exists() && ws.join("made").is_dir());
    assert!(!ws.join("tree").exists(), "a removed tree goes");
    assert!(
        ws.join("keep").is_dir(),
        "a folder emptied in the sandbox stays"
    );
    assert!(ws.join("made2/x.txt").is_file());
    rig.mirror.pull().await.unwrap();
    assert_eq!(
        std::fs::read(local.join("made2/x.txt")).unwrap(),
        b"from the workspace"
    );

    // Removed in the workspace: removed here if empty here.
    std::fs::remove_dir_all(ws.join("empty-ws")).unwrap();
    std::fs::remove_dir_all(ws.join("full")).unwrap();
    std::fs::remove_dir(ws.join("keep")).unwrap();
    std::fs::create_dir(local.join("keep/sandbox-made")).unwrap();
    let report = rig.mirror.pull().await.unwrap();
    assert_eq!((report.removed, report.dirs_removed), (1, 3), "{report:?}");
    assert!(!local.join("empty-ws").exists() && !local.join("full").exists());
    assert!(
        local.join("keep/sandbox-made").is_dir(),
        "a directory not empty here stays"
    );
    // … and what the sandbox made in it goes to the workspace on the next push.
    rig.mirror.push().await.unwrap();
    assert!(ws.join("keep/sandbox-made").is_dir());
    assert_eq!(dirs(&local), dirs(&ws));

    // A workspace directory where the sandbox planted a link: the link is replaced, never
    // followed.
    std::fs::create_dir(ws.join("planted")).unwrap();
    symlink(&outside, local.join("planted")).unwrap();
    rig.mirror.pull().await.unwrap();
    assert!(std::fs::symlink_metadata(local.join("planted"))
        .unwrap()
        .is_dir());
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "nothing made outside"
    );
}

#[actix_rt::test]
async fn directories_count_toward_the_entry_cap() {
    let mut rig = Rig::with_limits(SyncLimits {
        max_files: 3,
        ..SyncLimits::default()
    })
    .await;
    rig.mirror.pull().await.unwrap();
    for d in ["d1", "d2", "d3", "d4", "d5"] {
        std::fs::create_dir(rig.local().join(d)).unwrap();
    }
    let report = rig.mirror.push().await.unwrap();
    assert_eq!(report.changed.len(), 3, "{report:?}");
    assert_eq!(dirs(&rig.ws()).len(), 3);
}

/// The push after `make` (run in the local directory, after a first file `kept` was synced and
/// then removed locally): its report, and whether the workspace still has `kept`.
async fn push_after(limits: SyncLimits, make: impl FnOnce(&Path)) -> (PushReport, Rig) {
    let mut rig = Rig::with_limits(limits).await;
    rig.mirror.pull().await.unwrap();
    std::fs::write(rig.local().join("kept"), "x").unwrap();
    let first = rig.mirror.push().await.unwrap();
    assert_eq!(first.changed, ["kept"], "{first:?}");
    assert!(!first.truncated);
    std::fs::remove_file(rig.local().join("kept")).unwrap();
    make(&rig.local());
    let report = rig.mirror.push().await.unwrap();
    (report, rig)
}

#[actix_rt::test]
async fn the_walk_stops_at_its_depth_and_path_caps_and_then_deletes_nothing() {
    let limits = SyncLimits {
        max_depth: 3,
        ..SyncLimits::default()
    };
    let (report, rig) = push_after(limits, |local| {
        std::fs::create_dir_all(local.join("a/b/c/d")).unwrap();
        std::fs::write(local.join("a/b/two"), "3").unwrap();
        std::fs::write(local.join("a/b/c/four"), "4").unwrap();
    })
    .await;
    assert!(report.truncated, "{report:?}");
    assert!(
        report.deleted.is_empty(),
        "a cut walk deletes nothing: {report:?}"
    );
    assert!(rig.ws().join("kept").exists());
    assert_eq!(dirs(&rig.ws()), ["a", "a/b", "a/b/c"]);
    assert_eq!(
        names(&files(&rig.ws())),
        ["a/b/two", "kept"],
        "what lies past the depth is not synced"
    );

    // 25 levels of 200-character names: the paths past 4096 bytes (level 21 on) are cut.
    let name = "n".repeat(200);
    let (report, rig) = push_after(SyncLimits::default(), |local| {
        // One level at a time from a held handle: the whole path is past PATH_MAX.
        let mut dir =
            cap_std::fs::Dir::open_ambient_dir(local, cap_std::ambient_authority()).unwrap();
        for _ in 0..25 {
            dir.create_dir(&name).unwrap();
            dir = dir.open_dir(&name).unwrap();
        }
    })
    .await;
    assert!(report.truncated, "{:?}", report.skipped);
    assert!(rig.ws().join("kept").exists());
    let synced = dirs(&rig.ws());
    assert_eq!(synced.len(), 20, "{:?}", synced.last().map(String::len));
    assert!(synced.iter().all(|d| d.len() <= 4096));
}

#[actix_rt::test]
async fn links_and_skipped_names_count_toward_the_walk_s_entry_cap() {
    let limits = SyncLimits {
        max_entries: 50,
        ..SyncLimits::default()
    };
    let (report, rig) = push_after(limits, |local| {
        for i in 0..40 {
            symlink("/etc/passwd", local.join(format!("link{i}"))).unwrap();
            std::fs::create_dir(local.join(format!("node_modules{i}"))).unwrap();
            std::fs::create_dir_all(local.join(format!("d{i}/node_modules"))).unwrap();
        }
    })
    .await;
    assert!(report.truncated, "{report:?}");
    assert!(rig.ws().join("kept").exists(), "a cut walk deletes nothing");

    // Under the cap the same kinds of entries are walked past, and the deletion goes through.
    let (report, rig) = push_after(limits, |local| {
        for i in 0..10 {
            symlink("/etc/passwd", local.join(format!("link{i}"))).unwrap();
        }
        std::fs::create_dir_all(local.join("d/node_modules")).unwrap();
    })
    .await;
    assert!(!report.truncated, "{report:?}");
    assert_eq!(report.deleted, ["kept"]);
    assert!(!rig.ws().join("kept").exists());
}
