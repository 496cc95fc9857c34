//! Workspace sync over NATS (`kernel::sync`): manifest rules and limits, chunked fetch,
//! staged atomic puts, conditional changes, and confinement — against a real nats-server and
//! the workspace actor as a node runs it.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::PathBuf;

use bytes::Bytes;

use crate::actor::start_workspace;
use crate::{is_symlink, tree};
use toolmesh_kernel::sync::{
    Change, ChangeOp, ChangeOutcome, Current, Expected, FetchFile, Fetched, ManifestLimits,
    WorkspaceSync, BODY_CONTENT_BUDGET,
};
use toolmesh_kernel::{Account, ErrorCode, SessionId};
use toolmesh_testkit::{NatsServer, RedisServer};

struct Rig {
    _nats: NatsServer,
    _redis: RedisServer,
    data: tempfile::TempDir,
    sync: WorkspaceSync,
    account: Account,
    session: SessionId,
}

impl Rig {
    async fn start() -> Rig {
        let data = tempfile::tempdir().unwrap();
        let (nats, redis) = start_workspace(data.path().to_path_buf()).await;
        let sync = WorkspaceSync::new(nats.client().await);
        Rig {
            _nats: nats,
            _redis: redis,
            data,
            sync,
            account: Account::parse("acme").unwrap(),
            session: SessionId::parse("s1").unwrap(),
        }
    }

    fn root(&self) -> PathBuf {
        self.data.path().join("accounts/acme/sessions/s1/workspace")
    }

    fn put(&self, rel: &str, content: &[u8]) {
        let path = self.root().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    async fn manifest(&self, limits: ManifestLimits) -> toolmesh_kernel::sync::Manifest {
        self.sync
            .manifest(&self.account, &self.session, limits)
            .await
            .unwrap()
    }

    async fn apply(&self, changes: &[Change]) -> Vec<ChangeOutcome> {
        self.sync
            .apply(&self.account, &self.session, changes)
            .await
            .unwrap()
    }

    /// One fetch round trip for `paths`, each from its start.
    async fn fetch(&self, paths: &[&str]) -> Fetched {
        let files = paths
            .iter()
            .map(|path| FetchFile {
                path: (*path).into(),
                offset: 0,
            })
            .collect();
        self.sync
            .fetch(&self.account, &self.session, files)
            .await
            .unwrap()
    }

    /// `put_file`, then the workspace holds exactly `content` at `rel`.
    async fn put_file_lands(&self, rel: &str, content: Bytes) {
        self.sync
            .put_file(&self.account, &self.session, rel, content.clone())
            .await
            .unwrap();
        assert!(
            std::fs::read(self.root().join(rel)).unwrap() == content[..],
            "{rel}: the bytes put differ"
        );
    }

    /// Applies the cases' changes as one batch and checks each outcome, in short, against
    /// its case.
    async fn apply_expecting(&self, cases: Vec<(Change, &str)>) -> Vec<ChangeOutcome> {
        let (changes, wanted): (Vec<Change>, Vec<&str>) = cases.into_iter().unzip();
        let outcomes = self.apply(&changes).await;
        assert_eq!(shorts(&outcomes), wanted, "{changes:#?}\n{outcomes:#?}");
        outcomes
    }
}

const WIDE: ManifestLimits = ManifestLimits {
    max_files: 10_000,
    max_file_bytes: 1 << 30,
    max_total_bytes: 1 << 40,
};

fn put(path: &str, expected: Expected, content: &'static [u8]) -> Change {
    Change {
        path: path.into(),
        expected,
        op: ChangeOp::Put {
            upload: None,
            offset: 0,
            total: content.len() as u64,
            content: Bytes::from_static(content),
            mode: None,
        },
    }
}

fn delete(path: &str, expected: Expected) -> Change {
    Change {
        path: path.into(),
        expected,
        op: ChangeOp::Delete {
            prune_empty_dirs: false,
        },
    }
}

/// `len` bytes that repeat every `period` bytes, so that a misplaced part shows.
fn pattern(len: usize, period: usize) -> Bytes {
    (0..len)
        .map(|i| (i % period) as u8)
        .collect::<Vec<_>>()
        .into()
}

/// One upload to `path` in parts: each part a slice of `content`, all with the same `mode`.
struct Upload {
    path: &'static str,
    expected: Expected,
    id: &'static str,
    content: Bytes,
    mode: Option<u32>,
}

impl Upload {
    fn part(&self, offset: usize, end: usize) -> Change {
        Change {
            path: self.path.into(),
            expected: self.expected,
            op: ChangeOp::Put {
                upload: Some(self.id.into()),
                offset: offset as u64,
                total: self.content.len() as u64,
                content: self.content.slice(offset..end),
                mode: self.mode,
            },
        }
    }
}

/// An outcome in short (its kind, whether it carries a stamp, what a conflict found, a
/// rejection's code), so that a batch's outcomes are checked against one list.
fn short(outcome: &ChangeOutcome) -> String {
    match outcome {
        ChangeOutcome::Applied { stamp: None, .. } => "applied".into(),
        ChangeOutcome::Applied { stamp: Some(_), .. } => "applied with stamp".into(),
        ChangeOutcome::Staged { .. } => "staged".into(),
        ChangeOutcome::Conflict {
            current: Current::File(_),
            ..
        } => "conflict: File".into(),
        ChangeOutcome::Conflict { current, .. } => format!("conflict: {current:?}"),
        ChangeOutcome::Rejected { error, .. } => format!("rejected: {error:?}"),
    }
}

fn shorts(outcomes: &[ChangeOutcome]) -> Vec<String> {
    outcomes.iter().map(short).collect()
}

#[actix_rt::test]
async fn a_missing_workspace_is_an_empty_manifest() {
    let rig = Rig::start().await;
    let manifest = rig.manifest(WIDE).await;
    assert!(manifest.entries.is_empty());
    assert!(!manifest.truncated);
    assert_eq!(manifest.skipped, 0);
}

#[actix_rt::test]
async fn the_manifest_skips_what_is_never_synced() {
    let rig = Rig::start().await;
    for rel in [
        "a.txt",
        "src/lib.rs",
        ".git/config",
        "src/__pycache__/m.pyc",
        ".venv/bin/python",
        "web/node_modules/x/index.js",
        ".pytest_cache/v",
        ".toolmesh/outputs/o.txt",
        "deep/.toolmesh/kept.txt",
    ] {
        rig.put(rel, b"x");
    }
    symlink("/etc/passwd", rig.root().join("passwd")).unwrap();
    symlink("src", rig.root().join("src-link")).unwrap();
    let fifo = rig.root().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let manifest = rig.manifest(WIDE).await;
    let paths: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["a.txt", "deep/.toolmesh/kept.txt", "src/lib.rs"]);
    let entry = &manifest.entries[0];
    let meta = std::fs::metadata(rig.root().join("a.txt")).unwrap();
    assert_eq!(entry.size, 1);
    assert_eq!(
        entry.ino,
        std::os::unix::fs::MetadataExt::ino(&meta),
        "the stamp names the inode"
    );
}

#[actix_rt::test]
async fn manifest_limits_skip_big_files_and_stop_at_counts() {
    let rig = Rig::start().await;
    rig.put("a.txt", b"1234");
    rig.put("b.txt", &[0u8; 100]);
    rig.put("c.txt", b"12");
    rig.put("d.txt", b"1");
    let manifest = rig
        .manifest(ManifestLimits {
            max_file_bytes: 10,
            ..WIDE
        })
        .await;
    let paths: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["a.txt", "c.txt", "d.txt"]);
    assert_eq!(manifest.skipped, 1);
    assert!(!manifest.truncated);

    let manifest = rig
        .manifest(ManifestLimits {
            max_files: 2,
            max_file_bytes: 10,
            ..WIDE
        })
        .await;
    assert_eq!(manifest.entries.len(), 2);
    assert!(manifest.truncated);

    let manifest = rig
        .manifest(ManifestLimits {
            max_total_bytes: 5,
            max_file_bytes: 10,
            ..WIDE
        })
        .await;
    let paths: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["a.txt"], "c.txt would pass 5 bytes in all");
    assert!(manifest.truncated);
}

#[actix_rt::test]
async fn a_big_file_is_fetched_in_chunks_byte_exact() {
    let rig = Rig::start().await;
    let content: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    rig.put("big.bin", &content);
    rig.put("small.txt", b"hello");

    let first = rig.fetch(&["small.txt", "big.bin", "missing.txt"]).await;
    assert_eq!(first.chunks.len(), 2, "the budget ends inside big.bin");
    assert_eq!(first.chunks[0].content, "hello");
    assert!(first.chunks[0].eof);
    assert!(!first.chunks[1].eof);
    let sent: usize = first.chunks.iter().map(|c| c.content.len()).sum();
    assert_eq!(sent, BODY_CONTENT_BUDGET);
    assert!(first.failed.is_empty(), "missing.txt was not reached");

    let (bytes, stamp) = rig
        .sync
        .fetch_file(&rig.account, &rig.session, "big.bin")
        .await
        .unwrap();
    assert_eq!(stamp.size, content.len() as u64);
    assert!(bytes == content, "fetched bytes differ");

    let err = rig
        .sync
        .fetch_file(&rig.account, &rig.session, "missing.txt")
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::NotFound);
}

#[actix_rt::test]
async fn a_multi_part_put_is_invisible_until_its_last_part() {
    let rig = Rig::start().await;
    rig.put("dir/keep.txt", b"old");
    let content = pattern(1_300_000, 251);
    let total = content.len() as u64;
    let upload = Upload {
        path: "dir/new/big.bin",
        expected: Expected::Absent,
        id: "u1",
        content: content.clone(),
        mode: None,
    };
    let cuts = [0, 500_000, 1_000_000, content.len()];
    for window in cuts.windows(2) {
        let outcome = rig
            .apply(&[upload.part(window[0], window[1])])
            .await
            .remove(0);
        if window[1] < content.len() {
            assert_eq!(
                outcome,
                ChangeOutcome::Staged {
                    path: "dir/new/big.bin".into(),
                    received: window[1] as u64
                }
            );
            assert!(!rig.root().join("dir/new").exists(), "nothing visible yet");
        } else {
            let ChangeOutcome::Applied {
                stamp: Some(stamp), ..
            } = outcome
            else {
                panic!("last part: {outcome:?}")
            };
            assert_eq!(stamp.size, total);
        }
    }
    assert!(std::fs::read(rig.root().join("dir/new/big.bin")).unwrap() == content[..]);
    assert_eq!(
        tree(&rig.root().join(".toolmesh/sync")),
        Vec::<String>::new(),
        "no staging file is left"
    );

    // A part out of order is refused and changes nothing.
    let outcome = rig
        .apply(&[Change {
            path: "dir/other.bin".into(),
            expected: Expected::Any,
            op: ChangeOp::Put {
                upload: Some("u2".into()),
                offset: 10,
                total: 20,
                content: Bytes::from_static(&[1; 10]),
                mode: None,
            },
        }])
        .await
        .remove(0);
    assert_eq!(short(&outcome), "rejected: InvalidRequest", "{outcome:?}");
    assert!(!rig.root().join("dir/other.bin").exists());

    // put_file: unconditional, chunked.
    rig.put_file_lands(
        ".toolmesh/outputs/o.txt",
        vec![7u8; 2 * BODY_CONTENT_BUDGET + 5].into(),
    )
    .await;
}

/// Parts go one after the other: a part that does not start where the staged bytes end is
/// refused and the upload goes on from where it was.
#[actix_rt::test]
async fn a_part_ahead_of_the_staged_bytes_is_refused_and_the_upload_goes_on() {
    let rig = Rig::start().await;
    let content = pattern(2_000_000, 253);
    let upload = Upload {
        path: "big.bin",
        expected: Expected::Any,
        id: "u3",
        content: content.clone(),
        mode: None,
    };
    let first = rig.apply(&[upload.part(0, 500_000)]).await;
    assert_eq!(shorts(&first), ["staged"]);
    // The third part before the second is refused …
    let early = rig.apply(&[upload.part(1_000_000, 1_500_000)]).await;
    assert_eq!(shorts(&early), ["rejected: InvalidRequest"], "{early:?}");
    assert!(!rig.root().join("big.bin").exists());
    // … and the upload goes on in order.
    for (offset, end) in [(500_000, 1_000_000), (1_000_000, 1_500_000)] {
        let next = rig.apply(&[upload.part(offset, end)]).await;
        assert_eq!(shorts(&next), ["staged"], "{offset}..{end}");
    }
    let last = rig.apply(&[upload.part(1_500_000, 2_000_000)]).await;
    assert_eq!(shorts(&last), ["applied with stamp"], "{last:?}");
    assert!(std::fs::read(rig.root().join("big.bin")).unwrap() == content[..]);
    assert_eq!(
        tree(&rig.root().join(".toolmesh/sync")),
        Vec::<String>::new(),
        "no staging file is left"
    );

    // put_file sends many parts and lands the whole file.
    rig.put_file_lands("many.bin", pattern(9 * BODY_CONTENT_BUDGET + 17, 241))
        .await;
}

#[actix_rt::test]
async fn conditional_changes_conflict_when_the_workspace_moved_on() {
    let rig = Rig::start().await;
    rig.put("a.txt", b"one");
    rig.put("b.txt", b"bee");
    let manifest = rig.manifest(WIDE).await;
    let seen_a = manifest.entries[0].stamp();
    let seen_b = manifest.entries[1].stamp();

    // The workspace changes a.txt (by rename, as every workspace write does).
    std::fs::write(rig.root().join("a.tmp"), b"two").unwrap();
    std::fs::rename(rig.root().join("a.tmp"), rig.root().join("a.txt")).unwrap();

    let outcomes = rig
        .apply_expecting(vec![
            (
                put("a.txt", Expected::Stamp(seen_a), b"sandbox"),
                "conflict: File",
            ),
            (
                put("b.txt", Expected::Stamp(seen_b), b"sandbox b"),
                "applied with stamp",
            ),
            (put("c.txt", Expected::Absent, b"new"), "applied with stamp"),
            (
                put("b.txt", Expected::Absent, b"must not exist"),
                "conflict: File",
            ),
        ])
        .await;
    let ChangeOutcome::Conflict {
        current: Current::File(now),
        ..
    } = outcomes[0]
    else {
        unreachable!()
    };
    assert_eq!(now.size, 3);
    assert_eq!(
        std::fs::read(rig.root().join("a.txt")).unwrap(),
        b"two",
        "workspace wins"
    );
    let ChangeOutcome::Applied {
        stamp: Some(new_b), ..
    } = outcomes[1]
    else {
        unreachable!()
    };
    assert_eq!(
        std::fs::read(rig.root().join("b.txt")).unwrap(),
        b"sandbox b"
    );

    // Deletes: a stale stamp conflicts, the right one deletes, an absent path is done.
    rig.apply_expecting(vec![
        (delete("b.txt", Expected::Stamp(seen_b)), "conflict: File"),
        (delete("b.txt", Expected::Stamp(new_b)), "applied"),
        (delete("never.txt", Expected::Stamp(new_b)), "applied"),
    ])
    .await;
    assert!(!rig.root().join("b.txt").exists());

    // Pruning: the emptied parents go.
    rig.put("x/y/z.txt", b"z");
    let z = rig
        .manifest(WIDE)
        .await
        .entries
        .into_iter()
        .find(|e| e.path == "x/y/z.txt")
        .unwrap();
    let outcome = rig
        .apply(&[Change {
            path: "x/y/z.txt".into(),
            expected: Expected::Stamp(z.stamp()),
            op: ChangeOp::Delete {
                prune_empty_dirs: true,
            },
        }])
        .await;
    assert_eq!(shorts(&outcome), ["applied"]);
    assert!(!rig.root().join("x").exists());
}

#[actix_rt::test]
async fn paths_outside_the_workspace_are_rejected_and_nothing_outside_changes() {
    let rig = Rig::start().await;
    rig.put("a.txt", b"a");
    let outside = rig.data.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), b"secret").unwrap();
    symlink(&outside, rig.root().join("out")).unwrap();
    symlink(outside.join("secret.txt"), rig.root().join("secret-link")).unwrap();
    let before = tree(&outside);

    rig.apply_expecting(vec![
        (
            put("../x.txt", Expected::Any, b"x"),
            "rejected: PathOutsideWorkspace",
        ),
        (
            put("/etc/x.txt", Expected::Any, b"x"),
            "rejected: PathOutsideWorkspace",
        ),
        (
            put("out/x.txt", Expected::Any, b"x"),
            "rejected: PathOutsideWorkspace",
        ),
        (
            put("out/secret.txt", Expected::Any, b"pwned"),
            "rejected: PathOutsideWorkspace",
        ),
        (
            delete("out/secret.txt", Expected::Any),
            "rejected: PathOutsideWorkspace",
        ),
        (
            put(".toolmesh/sync/up-x", Expected::Any, b"x"),
            "rejected: InvalidArguments",
        ),
        (
            put("a.txt/b.txt", Expected::Any, b"x"),
            "rejected: InvalidArguments",
        ),
    ])
    .await;

    // A link at the path itself: a conditional put conflicts; an unconditional one replaces
    // the link, never writing through it.
    rig.apply_expecting(vec![
        (
            put("secret-link", Expected::Absent, b"pwned"),
            "conflict: Symlink",
        ),
        (
            put("secret-link", Expected::Any, b"replaced"),
            "applied with stamp",
        ),
    ])
    .await;
    assert_eq!(
        std::fs::read(rig.root().join("secret-link")).unwrap(),
        b"replaced"
    );

    // Fetch: neither through a link nor outside.
    let fetched = rig
        .fetch(&["out/secret.txt", "../outside/secret.txt"])
        .await;
    assert!(fetched.chunks.is_empty());
    assert_eq!(fetched.failed.len(), 2);
    assert!(
        fetched
            .failed
            .iter()
            .all(|f| f.error == ErrorCode::PathOutsideWorkspace),
        "{fetched:?}"
    );

    assert_eq!(tree(&outside), before, "nothing outside changed");
    assert_eq!(
        std::fs::read(outside.join("secret.txt")).unwrap(),
        b"secret"
    );
}

fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(path: &std::path::Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn put_mode(path: &str, expected: Expected, content: &'static [u8], mode: u32) -> Change {
    let mut change = put(path, expected, content);
    if let ChangeOp::Put { mode: m, .. } = &mut change.op {
        *m = Some(mode);
    }
    change
}

fn dir_change(path: &str, op: ChangeOp) -> Change {
    Change {
        path: path.into(),
        expected: Expected::Any,
        op,
    }
}

#[actix_rt::test]
async fn modes_travel_masked_and_a_mode_change_is_a_change() {
    let rig = Rig::start().await;
    rig.put("run.sh", b"#!/bin/sh\necho hi\n");
    chmod(&rig.root().join("run.sh"), 0o644);
    let before = rig.manifest(WIDE).await.entries[0].stamp();
    assert_eq!(before.mode, Some(0o644), "the manifest carries the mode");

    // chmod changes no mtime, size or inode: the mode alone makes the stamp differ.
    chmod(&rig.root().join("run.sh"), 0o755);
    let after = rig.manifest(WIDE).await.entries[0].stamp();
    assert_eq!(after.mode, Some(0o755));
    assert_eq!(
        (after.size, after.mtime_ns, after.ino),
        (before.size, before.mtime_ns, before.ino)
    );
    assert_ne!(after, before);
    rig.apply_expecting(vec![
        // A mode change is a change.
        (
            put("run.sh", Expected::Stamp(before), b"stale"),
            "conflict: File",
        ),
        (
            // An older peer names no mode: its stamp still holds.
            put(
                "run.sh",
                Expected::Stamp(toolmesh_kernel::sync::FileStamp {
                    mode: None,
                    ..after
                }),
                b"#!/bin/sh\necho older\n",
            ),
            "applied with stamp",
        ),
    ])
    .await;

    // A put's mode is applied, masked: exec bits travel; setuid, setgid, sticky and write for
    // group or others never do, and the owner keeps read and write.
    let outcomes = rig
        .apply(&[
            put_mode("exec.sh", Expected::Absent, b"x", 0o755),
            put_mode("suid.sh", Expected::Absent, b"x", 0o7777),
            put_mode("locked.txt", Expected::Absent, b"x", 0o000),
            put("plain.txt", Expected::Absent, b"x"),
        ])
        .await;
    let stamps: Vec<Option<u32>> = outcomes
        .iter()
        .map(|o| match o {
            ChangeOutcome::Applied {
                stamp: Some(stamp), ..
            } => stamp.mode,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(mode_of(&rig.root().join("exec.sh")), 0o755);
    assert_eq!(mode_of(&rig.root().join("suid.sh")), 0o755);
    assert_eq!(mode_of(&rig.root().join("locked.txt")), 0o600);
    assert_eq!(
        mode_of(&rig.root().join("plain.txt")) & 0o111,
        0,
        "no mode: a new file's default"
    );
    assert_eq!(stamps[..3], [Some(0o755), Some(0o755), Some(0o600)]);

    // A put in parts takes the mode of its last part.
    let upload = Upload {
        path: "tool.bin",
        expected: Expected::Absent,
        id: "m1",
        content: vec![3u8; BODY_CONTENT_BUDGET + 10].into(),
        mode: Some(0o4755),
    };
    let first = rig.apply(&[upload.part(0, BODY_CONTENT_BUDGET)]).await;
    assert_eq!(shorts(&first), ["staged"], "{first:?}");
    let last = rig
        .apply(&[upload.part(BODY_CONTENT_BUDGET, BODY_CONTENT_BUDGET + 10)])
        .await;
    assert_eq!(shorts(&last), ["applied with stamp"], "{last:?}");
    assert_eq!(mode_of(&rig.root().join("tool.bin")), 0o755);
}

#[actix_rt::test]
async fn directories_are_listed_made_and_removed_only_when_empty() {
    let rig = Rig::start().await;
    let root = rig.root();
    rig.put("src/lib.rs", b"fn main() {}");
    for dir in [
        "empty",
        "a/b",
        "node_modules/pkg",
        ".git/objects",
        "src/__pycache__",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let outside = rig.data.path().join("outside");
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    symlink(&outside, root.join("out")).unwrap();

    let manifest = rig.manifest(WIDE).await;
    assert_eq!(
        manifest.dirs.as_deref(),
        Some(&["a".to_owned(), "a/b".into(), "empty".into(), "src".into()][..]),
        "every synced directory, parents first; skipped ones and links are not listed"
    );
    // Directories count toward max_files with the files.
    let manifest = rig
        .manifest(ManifestLimits {
            max_files: 3,
            ..WIDE
        })
        .await;
    assert!(manifest.truncated);
    assert_eq!(
        manifest.entries.len() + manifest.dirs.as_ref().map_or(0, Vec::len),
        3,
        "{manifest:?}"
    );

    // A directory already there is done.
    rig.apply_expecting(vec![
        (dir_change("new/deeper", ChangeOp::MakeDir), "applied"),
        (dir_change("new/deeper", ChangeOp::MakeDir), "applied"),
        (
            dir_change("src/lib.rs", ChangeOp::MakeDir),
            "conflict: File",
        ),
        (
            dir_change("out/made", ChangeOp::MakeDir),
            "rejected: PathOutsideWorkspace",
        ),
        (
            dir_change("node_modules/x", ChangeOp::MakeDir),
            "rejected: InvalidArguments",
        ),
        (
            dir_change(".git", ChangeOp::MakeDir),
            "rejected: InvalidArguments",
        ),
        (
            dir_change(".toolmesh/sync/x", ChangeOp::MakeDir),
            "rejected: InvalidArguments",
        ),
    ])
    .await;
    assert!(root.join("new/deeper").is_dir());
    assert!(!outside.join("made").exists(), "nothing made outside");

    // A directory that is not empty stays; one that was never there is done.
    rig.apply_expecting(vec![
        (dir_change("new/deeper", ChangeOp::RemoveDir), "applied"),
        (dir_change("src", ChangeOp::RemoveDir), "conflict: Dir"),
        (
            dir_change("src/lib.rs", ChangeOp::RemoveDir),
            "conflict: File",
        ),
        (dir_change("never", ChangeOp::RemoveDir), "applied"),
        (dir_change("out", ChangeOp::RemoveDir), "conflict: Symlink"),
        (
            dir_change("out/sub", ChangeOp::RemoveDir),
            "rejected: PathOutsideWorkspace",
        ),
    ])
    .await;
    assert!(!root.join("new/deeper").exists());
    assert!(root.join("new").is_dir(), "parents are left alone");
    assert!(root.join("src/lib.rs").is_file());
    assert!(is_symlink(&root.join("out")));
    assert!(outside.join("sub").is_dir(), "nothing removed outside");
}
