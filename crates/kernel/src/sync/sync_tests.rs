//! Unit tests of `sync/`.

use bytes::Bytes;

use super::*;
use crate::error::{ErrorCode, ToolError};
use crate::ids::{Account, SessionId};

#[test]
fn skip_rules() {
    let check = |path: &str, skipped: bool| assert_eq!(is_skipped_path(path), skipped, "{path}");
    check("a.txt", false);
    check(".git/config", true);
    check("src/node_modules/x/y.js", true);
    check(".toolmesh/outputs/o.txt", true);
    check("src/.toolmesh/x", false);
    check("node_modules", false); // a file named so is not a directory
    check("a/__pycache__/m.pyc", true);
}

#[test]
fn apply_frames_round_trip() {
    let account = Account::parse("acme").unwrap();
    let session = SessionId::parse("s1").unwrap();
    let changes = vec![
        Change {
            path: "a.txt".into(),
            expected: Expected::Absent,
            op: ChangeOp::Put {
                upload: None,
                offset: 0,
                total: 3,
                content: Bytes::from_static(b"abc"),
                mode: Some(0o755),
            },
        },
        Change {
            path: "gone.txt".into(),
            expected: Expected::Stamp(FileStamp {
                size: 1,
                mtime_ns: 2,
                ino: 3,
                mode: Some(0o644),
            }),
            op: ChangeOp::Delete {
                prune_empty_dirs: true,
            },
        },
        Change {
            path: "b.bin".into(),
            expected: Expected::Any,
            op: ChangeOp::Put {
                upload: Some("u1".into()),
                offset: 0,
                total: 10,
                content: Bytes::from_static(&[0, 255, 10]),
                mode: None,
            },
        },
        Change {
            path: "empty/dir".into(),
            expected: Expected::Any,
            op: ChangeOp::MakeDir,
        },
        Change {
            path: "old".into(),
            expected: Expected::Any,
            op: ChangeOp::RemoveDir,
        },
    ];
    let body = Bytes::from(encode_apply(&account, &session, &changes));
    let (a, s, decoded) = decode_apply(&body).unwrap();
    assert_eq!((a, s), (account, session));
    assert_eq!(decoded, changes);
}

#[test]
fn expected_and_outcomes_have_readable_json() {
    assert_eq!(
        serde_json::to_value(Expected::Absent).unwrap(),
        serde_json::json!({"kind": "absent"})
    );
    assert_eq!(
        serde_json::to_value(Expected::Stamp(FileStamp {
            size: 1,
            mtime_ns: 2,
            ino: 3,
            mode: Some(0o755),
        }))
        .unwrap(),
        serde_json::json!({"kind": "stamp", "size": 1, "mtime_ns": 2, "ino": 3, "mode": 0o755})
    );
    let conflict = ChangeOutcome::Conflict {
        path: "x".into(),
        current: Current::Dir,
    };
    assert_eq!(
        serde_json::to_value(&conflict).unwrap(),
        serde_json::json!({"outcome": "conflict", "path": "x", "current": {"kind": "dir"}})
    );
}

#[test]
fn truncated_frames_are_refused() {
    let body = Bytes::from(encode_fetched(&Fetched {
        chunks: vec![Chunk {
            path: "a".into(),
            offset: 0,
            stamp: FileStamp {
                size: 4,
                mtime_ns: 0,
                ino: 1,
                mode: None,
            },
            eof: true,
            content: Bytes::from_static(b"data"),
        }],
        failed: vec![],
    }));
    assert_eq!(decode_fetched(&body).unwrap().chunks[0].content, "data");
    let cut = body.slice(..body.len() - 1);
    assert_eq!(
        decode_fetched(&cut).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        decode_frame(&Bytes::from_static(b"\0\0")).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
    let error = Bytes::from(encode_frame(
        &error_body(ToolError::new(ErrorCode::NotFound, "nope")),
        &[],
    ));
    assert_eq!(
        decode_fetched(&error).unwrap_err().code,
        ErrorCode::NotFound
    );
}

#[test]
fn applied_modes_keep_exec_bits_and_drop_the_rest() {
    let check = |sent: u32, applied: u32| assert_eq!(applied_mode(sent), applied, "{sent:o}");
    check(0o755, 0o755);
    check(0o644, 0o644);
    check(0o700, 0o700);
    check(0o4755, 0o755); // setuid
    check(0o2755, 0o755); // setgid
    check(0o1777, 0o755); // sticky, and no write for group or others
    check(0o000, 0o600); // the owner keeps read and write
    check(0o111, 0o711);
}

#[test]
fn a_stamp_without_a_mode_holds_for_any_mode() {
    let have = FileStamp {
        size: 1,
        mtime_ns: 2,
        ino: 3,
        mode: Some(0o755),
    };
    assert!(have.holds_for(&have));
    assert!(
        FileStamp { mode: None, ..have }.holds_for(&have),
        "an older peer"
    );
    assert!(!FileStamp {
        mode: Some(0o644),
        ..have
    }
    .holds_for(&have));
    assert!(!FileStamp { ino: 4, ..have }.holds_for(&have));
}

#[test]
fn heads_of_an_older_version_still_decode() {
    // An apply of an older mirror: no mode on the put or the stamp.
    let head = serde_json::json!({
        "account": "acme",
        "session_id": "s1",
        "changes": [
            {"path": "a", "expected": {"kind": "stamp", "size": 1, "mtime_ns": 2, "ino": 3},
             "op": "put", "offset": 0, "total": 1, "len": 1},
            {"path": "b", "expected": {"kind": "any"}, "op": "delete"},
        ],
    });
    let body = Bytes::from(encode_frame(&head, &[b"x"]));
    let (_, _, changes) = decode_apply(&body).unwrap();
    assert_eq!(
        changes[0].expected,
        Expected::Stamp(FileStamp {
            size: 1,
            mtime_ns: 2,
            ino: 3,
            mode: None
        })
    );
    assert!(matches!(changes[0].op, ChangeOp::Put { mode: None, .. }));
    // A manifest of an older workspace: no modes, no directories.
    let manifest: Manifest = parse_reply(serde_json::json!({
        "ok": true,
        "entries": [{"path": "a", "size": 1, "mtime_ns": 2, "ino": 3}],
        "skipped": 0,
        "truncated": false,
    }))
    .unwrap();
    assert_eq!(manifest.dirs, None);
    assert_eq!(manifest.entries[0].stamp().mode, None);
    // And what a new side sends stays readable by an older one: no new field is required,
    // and a stamp without a mode serializes as before.
    let old_stamp = serde_json::to_value(FileStamp {
        size: 1,
        mtime_ns: 2,
        ino: 3,
        mode: None,
    })
    .unwrap();
    assert_eq!(
        old_stamp,
        serde_json::json!({"size": 1, "mtime_ns": 2, "ino": 3})
    );
}

#[test]
fn a_stamp_counts_nanoseconds_from_the_epoch_either_way_and_keeps_the_permission_bits() {
    use std::time::{Duration, UNIX_EPOCH};
    let after = UNIX_EPOCH + Duration::from_nanos(1_500);
    let stamp = FileStamp::of(7, Some(after), 42, 0o104_755);
    assert_eq!(
        stamp,
        FileStamp {
            size: 7,
            mtime_ns: 1_500,
            ino: 42,
            mode: Some(0o4755),
        }
    );
    let before = UNIX_EPOCH - Duration::from_nanos(2_000);
    assert_eq!(FileStamp::of(0, Some(before), 1, 0o644).mtime_ns, -2_000);
    assert_eq!(FileStamp::of(0, None, 1, 0o644).mtime_ns, 0);
}
