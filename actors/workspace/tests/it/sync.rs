//! Workspace sync over NATS (`kernel::sync`): manifest rules and limits, chunked fetch,
//! staged atomic puts, conditional changes, and confinement — against a real nats-server and
//! the workspace actor as a node runs it.

use std::os::unix::fs::symlink;
use std::path::PathBuf;

use bytes::Bytes;

use crate::tree;
use toolmesh_kernel::host::{InFlight, Lifecycle};
use toolmesh_kernel::sync::{
    Change, ChangeOp, ChangeOutcome, Current, Expected, FetchFile, ManifestLimits, WorkspaceSync,
    BODY_CONTENT_BUDGET,
};
use toolmesh_kernel::{Account, ErrorCode, SessionId};
use toolmesh_testkit::{NatsServer, RedisServer};
use toolmesh_workspace::{spawn, WorkspaceSettings};

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
        let nats = NatsServer::start();
        let redis = RedisServer::start();
        let data = tempfile::tempdir().unwrap();
        let node = nats.client().await;
        spawn(
            node,
            WorkspaceSettings {
                data_dir: data.path().to_path_buf(),
                redis_url: redis.url(),
                budget_chars: 20_000,
            },
            Lifecycle::new(),
            InFlight::default(),
        )
        .await
        .expect("workspace actor starts");
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

    let first = rig
        .sync
        .fetch(
            &rig.account,
            &rig.session,
            vec![
                FetchFile {
                    path: "small.txt".into(),
                    offset: 0,
                },
                FetchFile {
                    path: "big.bin".into(),
                    offset: 0,
                },
                FetchFile {
                    path: "missing.txt".into(),
                    offset: 0,
                },
            ],
        )
        .await
        .unwrap();
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
    let content: Bytes = (0..1_300_000u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let total = content.len() as u64;
    let part = |offset: usize, end: usize| Change {
        path: "dir/new/big.bin".into(),
        expected: Expected::Absent,
        op: ChangeOp::Put {
            upload: Some("u1".into()),
            offset: offset as u64,
            total,
            content: content.slice(offset..end),
        },
    };
    let cuts = [0, 500_000, 1_000_000, content.len()];
    for window in cuts.windows(2) {
        let outcome = rig.apply(&[part(window[0], window[1])]).await.remove(0);
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
            },
        }])
        .await
        .remove(0);
    assert!(
        matches!(
            outcome,
            ChangeOutcome::Rejected {
                error: ErrorCode::InvalidRequest,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(!rig.root().join("dir/other.bin").exists());

    // put_file: unconditional, chunked.
    let big: Bytes = vec![7u8; 2 * BODY_CONTENT_BUDGET + 5].into();
    rig.sync
        .put_file(
            &rig.account,
            &rig.session,
            ".toolmesh/outputs/o.txt",
            big.clone(),
        )
        .await
        .unwrap();
    assert!(std::fs::read(rig.root().join(".toolmesh/outputs/o.txt")).unwrap() == big[..]);
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
        .apply(&[
            put("a.txt", Expected::Stamp(seen_a), b"sandbox"),
            put("b.txt", Expected::Stamp(seen_b), b"sandbox b"),
            put("c.txt", Expected::Absent, b"new"),
            put("b.txt", Expected::Absent, b"must not exist"),
        ])
        .await;
    let ChangeOutcome::Conflict {
        current: Current::File(now),
        ..
    } = outcomes[0]
    else {
        panic!("{:?}", outcomes[0])
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
        panic!("{:?}", outcomes[1])
    };
    assert_eq!(
        std::fs::read(rig.root().join("b.txt")).unwrap(),
        b"sandbox b"
    );
    assert!(matches!(outcomes[2], ChangeOutcome::Applied { .. }));
    assert!(matches!(
        outcomes[3],
        ChangeOutcome::Conflict {
            current: Current::File(_),
            ..
        }
    ));

    // Deletes: a stale stamp conflicts, the right one deletes, an absent path is done.
    let outcomes = rig
        .apply(&[
            delete("b.txt", Expected::Stamp(seen_b)),
            delete("b.txt", Expected::Stamp(new_b)),
            delete("never.txt", Expected::Stamp(new_b)),
        ])
        .await;
    assert!(
        matches!(outcomes[0], ChangeOutcome::Conflict { .. }),
        "{:?}",
        outcomes[0]
    );
    assert!(matches!(
        outcomes[1],
        ChangeOutcome::Applied { stamp: None, .. }
    ));
    assert!(matches!(
        outcomes[2],
        ChangeOutcome::Applied { stamp: None, .. }
    ));
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
    assert!(matches!(outcome[0], ChangeOutcome::Applied { .. }));
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

    let outcomes = rig
        .apply(&[
            put("../x.txt", Expected::Any, b"x"),
            put("/etc/x.txt", Expected::Any, b"x"),
            put("out/x.txt", Expected::Any, b"x"),
            put("out/secret.txt", Expected::Any, b"pwned"),
            delete("out/secret.txt", Expected::Any),
            put(".toolmesh/sync/up-x", Expected::Any, b"x"),
            put("a.txt/b.txt", Expected::Any, b"x"),
        ])
        .await;
    let codes: Vec<Option<ErrorCode>> = outcomes
        .iter()
        .map(|o| match o {
            ChangeOutcome::Rejected { error, .. } => Some(*error),
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        [
            Some(ErrorCode::PathOutsideWorkspace),
            Some(ErrorCode::PathOutsideWorkspace),
            Some(ErrorCode::PathOutsideWorkspace),
            Some(ErrorCode::PathOutsideWorkspace),
            Some(ErrorCode::PathOutsideWorkspace),
            Some(ErrorCode::InvalidArguments),
            Some(ErrorCode::InvalidArguments),
        ],
        "{outcomes:#?}"
    );

    // A link at the path itself: a conditional put conflicts; an unconditional one replaces
    // the link, never writing through it.
    let outcomes = rig
        .apply(&[
            put("secret-link", Expected::Absent, b"pwned"),
            put("secret-link", Expected::Any, b"replaced"),
        ])
        .await;
    assert!(
        matches!(
            outcomes[0],
            ChangeOutcome::Conflict {
                current: Current::Symlink,
                ..
            }
        ),
        "{:?}",
        outcomes[0]
    );
    assert!(
        matches!(outcomes[1], ChangeOutcome::Applied { .. }),
        "{:?}",
        outcomes[1]
    );
    assert_eq!(
        std::fs::read(rig.root().join("secret-link")).unwrap(),
        b"replaced"
    );

    // Fetch: neither through a link nor outside.
    let fetched = rig
        .sync
        .fetch(
            &rig.account,
            &rig.session,
            vec![
                FetchFile {
                    path: "out/secret.txt".into(),
                    offset: 0,
                },
                FetchFile {
                    path: "../outside/secret.txt".into(),
                    offset: 0,
                },
            ],
        )
        .await
        .unwrap();
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
