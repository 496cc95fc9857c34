//! Unit tests of `output/`.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::Semaphore;
use toolmesh_kernel::ToolError;

use super::*;

fn settings(dir: &Path, preview_chars: usize, max_bytes: u64) -> SpoolSettings {
    SpoolSettings {
        dir: dir.to_owned(),
        preview_chars,
        max_bytes,
        quotas: Vec::new(),
        handover: None,
    }
}

/// What a spool with `settings`, for stream `name`, captured of `pieces` pushed in turn.
async fn capture(settings: SpoolSettings, name: &str, pieces: &[&str]) -> Captured {
    let mut spool = Spool::new(settings, name);
    for piece in pieces {
        spool.push(piece).await;
    }
    spool.finish().await
}

fn file_text(captured: &Captured) -> String {
    std::fs::read_to_string(&captured.file.as_ref().expect("a spool file").path)
        .expect("spool file")
}

#[test]
fn pieces_decode_as_the_whole_stream_would() {
    // Valid text, cut characters, and bytes that are no UTF-8 at all.
    let mut bytes = "naïve €uro 🦀 ".repeat(40).into_bytes();
    bytes.extend_from_slice(&[0xE2, 0x82, b'a', 0xFF, 0xF0, 0x9F, 0xA6, 0x80, 0x80, 0xC3]);
    let whole = String::from_utf8_lossy(&bytes).into_owned();
    for size in 1..=9 {
        let mut decoder = Utf8Decoder::default();
        let mut text = String::new();
        for piece in bytes.chunks(size) {
            text.push_str(&decoder.decode(piece));
        }
        text.push_str(&decoder.finish());
        assert_eq!(text, whole, "pieces of {size}");
    }
}

#[tokio::test]
async fn short_text_stays_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let captured = capture(settings(dir.path(), 10, 1000), "s", &["héllo", "wörld"]).await;
    assert_eq!(captured.preview, "héllowörld");
    assert_eq!((captured.chars, captured.truncated), (10, false));
    assert!(captured.file.is_none());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Waits (briefly) until `path` is gone: a spool file is removed on the blocking pool.
async fn gone(path: &Path) -> bool {
    for _ in 0..200 {
        if !path.exists() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn long_text_is_spooled_whole_and_counted_in_characters() {
    let dir = tempfile::tempdir().unwrap();
    let captured = capture(settings(dir.path(), 4, 1000), "s", &["ab", "cdé€f", "g"]).await;
    assert_eq!(captured.preview, "abcd");
    assert_eq!((captured.chars, captured.truncated), (8, true));
    assert_eq!(file_text(&captured), "abcdé€fg");
    assert_eq!(captured.file.as_ref().unwrap().bytes, 11);
    assert_eq!(captured.dropped_bytes(), 0);
    assert_eq!(captured.cap, None);
    let path = captured.file.as_ref().unwrap().path.clone();
    drop(captured);
    assert!(gone(&path).await, "a spool file goes with its capture");
}

#[tokio::test]
async fn past_the_cap_text_is_counted_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    // "abc€€" is 3 + 6 bytes: the cap cuts inside the first €.
    let captured = capture(settings(dir.path(), 2, 5), "s", &["abc€€", "xyz"]).await;
    assert_eq!(captured.chars, 8);
    assert_eq!(file_text(&captured), "abc");
    let file = captured.file.as_ref().unwrap();
    assert!(file.capped);
    assert_eq!(captured.cap, Some(Cap::Stream));
    assert_eq!(captured.dropped_bytes(), 12 - 3);
}

#[tokio::test]
async fn memory_stays_bounded_by_the_preview_whatever_is_pushed() {
    let dir = tempfile::tempdir().unwrap();
    let preview = 1000;
    let mut spool = Spool::new(settings(dir.path(), preview, 64 << 20), "s");
    let mut decoder = Utf8Decoder::default();
    let piece = "€ 16 KiB of output, line after line\n".repeat(450);
    let mut pushed = 0u64;
    while pushed < 50_000_000 {
        spool.push(&decoder.decode(piece.as_bytes())).await;
        pushed += piece.len() as u64;
        assert!(
            spool.memory_bytes() <= 4 * preview + 2 * (WRITE_BATCH + piece.len()),
            "{} bytes in memory",
            spool.memory_bytes()
        );
    }
    let captured = spool.finish().await;
    assert_eq!(captured.bytes, pushed);
    assert_eq!(captured.file.as_ref().unwrap().bytes, pushed);
    assert_eq!(
        std::fs::metadata(&captured.file.as_ref().unwrap().path)
            .unwrap()
            .len(),
        pushed
    );
}

#[tokio::test]
async fn kept_text_reads_back_from_any_offset() {
    let dir = tempfile::tempdir().unwrap();
    for preview in [100, 3] {
        let mut spool = Spool::new(settings(dir.path(), preview, 1000), "s");
        spool.push("line-1\nlïne-2\n").await;
        // Pending (in memory), then written: the same text either way.
        for _ in 0..2 {
            let kept = spool.kept_from(0);
            assert_eq!(kept.read(0, 100).unwrap(), "line-1\nlïne-2\n");
            assert_eq!(kept.read(7, 100).unwrap(), "lïne-2\n");
            // A cut inside a character stops before it.
            assert_eq!(kept.read(7, 2).unwrap(), "l");
            assert_eq!(kept.read(spool.kept_bytes(), 100).unwrap(), "");
            assert_eq!(spool.kept_from(7).read(7, 100).unwrap(), "lïne-2\n");
            spool.settle().await;
        }
    }
    // Part on disk, part pending: a read crosses from one to the other.
    let mut spool = Spool::new(settings(dir.path(), 3, 1000), "s");
    spool.push("on disk\n").await;
    spool.settle().await;
    spool.push("pending\n").await;
    let kept = spool.kept_from(0);
    assert!(kept.on_disk(0) && !kept.on_disk(8));
    assert_eq!(kept.read(0, 100).unwrap(), "on disk\n");
    assert_eq!(kept.read(8, 100).unwrap(), "pending\n");
}

#[tokio::test]
async fn shared_caps_keep_what_they_have_room_for_and_give_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let session = Quota::new(Cap::Session, 10);
    let worker = Quota::new(Cap::Worker, 100);
    let with_quotas = SpoolSettings {
        quotas: vec![session.clone(), worker.clone()],
        ..settings(dir.path(), 2, 1000)
    };
    // The first stream takes 6 of the session's 10 bytes …
    let first = capture(with_quotas.clone(), "a", &["abcdef"]).await;
    assert_eq!((first.file.as_ref().unwrap().bytes, first.cap), (6, None));
    assert_eq!((session.used(), worker.used()), (6, 6));
    // … the second gets the 4 left, the rest is counted, not kept …
    let second = capture(with_quotas.clone(), "b", &["0123456789"]).await;
    assert_eq!(second.chars, 10);
    assert_eq!(file_text(&second), "0123");
    assert_eq!(second.cap, Some(Cap::Session));
    assert_eq!(second.dropped_bytes(), 6);
    assert_eq!((session.used(), worker.used()), (10, 10));
    // … a third finds the session full and keeps its preview only …
    let third = capture(with_quotas.clone(), "c", &["xyz"]).await;
    assert!(third.file.is_none());
    assert_eq!(third.cap, Some(Cap::Session));
    assert_eq!(third.preview, "xy");
    assert_eq!(third.dropped_bytes(), 1);
    // … and what a stream took comes back when its file goes.
    drop((first, second, third));
    assert_eq!((session.used(), worker.used()), (0, 0));
    // The worker's cap binds across sessions the same way.
    let small_worker = Quota::new(Cap::Worker, 5);
    let other = SpoolSettings {
        quotas: vec![Quota::new(Cap::Session, 100), small_worker.clone()],
        ..settings(dir.path(), 2, 1000)
    };
    let captured = capture(other, "d", &["abcdefgh"]).await;
    assert_eq!(file_text(&captured), "abcde");
    assert_eq!(captured.cap, Some(Cap::Worker));
}

/// A workspace in memory: what each put wrote, by path; a put waits for `gate` to open
/// and fails when `refuse` is set.
#[derive(Default)]
struct FakeWorkspace {
    files: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    gate: Option<Arc<Semaphore>>,
    refuse: bool,
}

impl FakeWorkspace {
    /// A workspace whose puts wait until the gate it comes with is opened.
    fn gated() -> (Arc<Semaphore>, Arc<FakeWorkspace>) {
        let gate = Arc::new(Semaphore::new(0));
        let workspace = Arc::new(FakeWorkspace {
            gate: Some(gate.clone()),
            ..FakeWorkspace::default()
        });
        (gate, workspace)
    }
}

fn handover_to(workspace: &Arc<FakeWorkspace>) -> Handover {
    let workspace = workspace.clone();
    Handover::new(Arc::new(move |path, bytes, file| {
        let workspace = workspace.clone();
        async move {
            if let Some(gate) = &workspace.gate {
                drop(gate.acquire().await);
            }
            if workspace.refuse {
                return Err(ToolError::new(
                    toolmesh_kernel::ErrorCode::LimitExceeded,
                    "the workspace is full",
                ));
            }
            let mut text = vec![0u8; bytes as usize];
            file.read_exact_at(&mut text, 0).unwrap();
            let text = String::from_utf8(text).unwrap();
            workspace.files.lock().unwrap().insert(path, text);
            Ok(())
        }
        .boxed()
    }))
}

/// A spool named `name` that hands its parts over to `workspace`, under a session cap of
/// `cap` bytes (a 2-character preview, a 1 MiB file); and the cap, to see what it holds.
fn handing_over(
    dir: &Path,
    workspace: &Arc<FakeWorkspace>,
    cap: u64,
    name: &str,
) -> (Spool, Arc<Quota>) {
    let session = Quota::new(Cap::Session, cap);
    let settings = SpoolSettings {
        quotas: vec![session.clone()],
        handover: Some(handover_to(workspace)),
        ..settings(dir, 2, 1 << 20)
    };
    (Spool::new(settings, name), session)
}

/// Lets the spawned puts run until no part of `spool` is on its way.
async fn landed(spool: &mut Spool) {
    for _ in 0..10_000 {
        spool.collect();
        if spool.in_flight.is_none() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("a part never landed");
}

/// The text of a capture: its parts (from the workspace), then its file.
fn whole_text(captured: &Captured, workspace: &FakeWorkspace) -> String {
    let files = workspace.files.lock().unwrap();
    let mut text: String = captured
        .parts
        .iter()
        .map(|p| files[&p.path].clone())
        .collect();
    if let Some(file) = &captured.file {
        text.push_str(&std::fs::read_to_string(&file.path).unwrap());
    }
    text
}

#[tokio::test]
async fn past_half_a_shared_cap_the_spool_goes_to_the_workspace_and_spooling_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = Arc::new(FakeWorkspace::default());
    let (mut spool, session) = handing_over(dir.path(), &workspace, 1000, "task-1-stdout");
    let mut all = String::new();
    for i in 0..500 {
        let line = format!("line {i:04} ünïcode\n");
        spool.push(&line).await;
        all.push_str(&line);
        assert!(session.used() <= 1000, "{} bytes held", session.used());
        landed(&mut spool).await;
    }
    let captured = spool.finish().await;
    assert_eq!(captured.bytes, all.len() as u64);
    assert!(captured.parts.len() > 5, "{} parts", captured.parts.len());
    assert_eq!(whole_text(&captured, &workspace), all, "nothing is lost");
    assert_eq!((captured.dropped_bytes(), captured.cap), (0, None));
    assert!(captured.parts[0]
        .path
        .starts_with(".toolmesh/outputs/task-1-stdout-part-"));
    // The parts' bytes went back to the cap; the last file's go with it.
    assert_eq!(session.used(), captured.file.as_ref().unwrap().bytes);
    drop(captured);
    assert_eq!(session.used(), 0);
}

#[tokio::test]
async fn while_a_part_is_on_its_way_the_cap_holds_and_the_excess_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, workspace) = FakeWorkspace::gated();
    let (mut spool, session) = handing_over(dir.path(), &workspace, 100, "s");
    spool.push(&"a".repeat(60)).await; // past half: handed over, held until it lands
    assert!(spool.in_flight.is_some());
    spool.push(&"b".repeat(30)).await; // room for 30 more
    spool.push(&"c".repeat(30)).await; // room for 10: 20 dropped
    assert_eq!(session.used(), 100, "the cap holds");
    spool.push(&"d".repeat(5)).await; // after a drop nothing more is kept until the read
    gate.add_permits(1);
    let captured = spool.finish().await;
    assert_eq!(captured.chars, 125);
    assert_eq!(captured.parts.len(), 1);
    let text = whole_text(&captured, &workspace);
    assert_eq!(
        text,
        format!("{}{}{}", "a".repeat(60), "b".repeat(30), "c".repeat(10))
    );
    assert_eq!(
        (captured.dropped_bytes(), captured.cap),
        (25, Some(Cap::Session))
    );
}

#[tokio::test]
async fn a_part_the_workspace_refuses_is_dropped_with_what_followed_it() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = Arc::new(FakeWorkspace {
        refuse: true,
        ..FakeWorkspace::default()
    });
    let (mut spool, session) = handing_over(dir.path(), &workspace, 100, "s");
    spool.push(&"a".repeat(60)).await;
    landed(&mut spool).await;
    spool.push(&"b".repeat(30)).await;
    let captured = spool.finish().await;
    assert_eq!(captured.chars, 90);
    assert!(captured.parts.is_empty() && captured.file.is_none());
    assert_eq!(captured.preview, "aa");
    assert_eq!(
        (captured.dropped_bytes(), captured.cap),
        (88, Some(Cap::Workspace))
    );
    let error = captured.persist_error.as_ref().expect("why");
    assert_eq!(error.code, toolmesh_kernel::ErrorCode::LimitExceeded);
    assert_eq!(session.used(), 0, "nothing is held for text that is gone");
}

#[tokio::test]
async fn kept_text_reads_across_a_part_on_its_way() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, workspace) = FakeWorkspace::gated();
    let (mut spool, _) = handing_over(dir.path(), &workspace, 100, "s");
    spool.push(&format!("{}\n", "a".repeat(59))).await;
    spool.push("next\n").await;
    let kept = spool.kept_from(0);
    assert_eq!(kept.start(), 0);
    assert!(kept.on_disk(0));
    assert_eq!(kept.read(0, 100).unwrap(), format!("{}\n", "a".repeat(59)));
    assert_eq!(kept.read(60, 100).unwrap(), "next\n");
    gate.add_permits(1);
    landed(&mut spool).await;
    // Once it landed, what it held is in the workspace only.
    assert_eq!(spool.kept_from(0).start(), 60);
}
