//! Unit tests of `archive.rs`.

use super::*;

const CAPS: Caps = Caps {
    max_bytes: 1 << 20,
    max_entries: 100,
};

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn check(zip: &[u8], expect: Result<&[&str], ErrorCode>) {
    check_case("", zip, expect);
}

/// [`check`], naming the case `what` when it fails.
fn check_case(what: &str, zip: &[u8], expect: Result<&[&str], ErrorCode>) {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("stage");
    fs::create_dir(&dest).unwrap();
    match (unpack(zip, &dest, CAPS), expect) {
        (Ok(got), Ok(files)) => assert_eq!(got.files, files, "{what}"),
        (Err(e), Err(code)) => {
            let e = ToolError::from(e);
            assert_eq!(e.code, code, "{what}: {e}");
            // Whatever happened, nothing is outside the staging folder.
            let outside: Vec<_> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|n| n != "stage")
                .collect();
            assert!(outside.is_empty(), "{what}: {outside:?}");
        }
        (got, expect) => panic!("{what}: got {got:?}, expected {expect:?}"),
    }
}

fn one(spec: EntrySpec) -> Vec<u8> {
    let mut zip = ZipBuilder::new();
    zip.file("SKILL.md", b"hi").entry(spec);
    zip.finish()
}

#[test]
fn good_archives_unpack() {
    let mut zip = ZipBuilder::new();
    zip.file("SKILL.md", b"# hi\n")
        .file_mode("scripts/run.sh", b"echo hi\n", true)
        .entry(EntrySpec {
            deflate: false,
            ..EntrySpec::file("data/raw.bin", &[0, 1, 2])
        });
    check(
        &zip.finish(),
        Ok(&["SKILL.md", "scripts/run.sh", "data/raw.bin"]),
    );
}

#[test]
fn hostile_names_are_refused() {
    for name in [
        "../x",
        "..\\x",
        "a/../../x",
        "a\\..\\..\\x",
        "/etc/passwd",
        "\\x",
        "C:\\x",
        "C:/x",
        "a\0b",
    ] {
        check(
            &one(EntrySpec::file(name, b"x")),
            Err(ErrorCode::UnsafeArchive),
        );
    }
    let mut bad = EntrySpec::file("x", b"x");
    bad.name = vec![0xff, 0xfe];
    check(&one(bad), Err(ErrorCode::UnsafeArchive));
}

#[test]
fn special_entries_are_refused() {
    for mode in [0o120_777, 0o010_644, 0o020_644, 0o060_644, 0o140_644] {
        let mut spec = EntrySpec::file("link", b"/etc/passwd");
        spec.unix_mode = Some(mode);
        check(&one(spec), Err(ErrorCode::UnsafeArchive));
    }
    let mut encrypted = EntrySpec::file("secret", b"x");
    encrypted.flags = 1;
    check(&one(encrypted), Err(ErrorCode::UnsafeArchive));
}

#[test]
fn duplicates_are_refused() {
    // Two names for one place: the same name, a backslash for a slash, a file and a folder.
    for (first, second) in [
        ("SKILL.md", "SKILL.md"),
        ("a/b", "a\\b"),
        ("a", "a/b"),
        ("a/b", "a"),
    ] {
        let mut zip = ZipBuilder::new();
        zip.file(first, b"a").file(second, b"b");
        check_case(
            &format!("{first} then {second}"),
            &zip.finish(),
            Err(ErrorCode::UnsafeArchive),
        );
    }
}

#[test]
fn overlapping_entries_are_refused() {
    let mut zip = ZipBuilder::new();
    zip.file("SKILL.md", b"hi")
        .overlapping("outer", "inner", b"payload");
    check(&zip.finish(), Err(ErrorCode::UnsafeArchive));
}

#[test]
fn caps_count_real_bytes_and_entries() {
    // 2 MiB of zeros deflate to a few KiB: counted while inflating.
    let mut zip = ZipBuilder::new();
    zip.file("SKILL.md", b"hi")
        .file("zeros", &vec![0u8; 2 << 20]);
    let bytes = zip.finish();
    assert!(bytes.len() < 16 * 1024);
    check(&bytes, Err(ErrorCode::UnsafeArchive));
    // A central directory that lies about the size disagrees with the local header.
    let mut lying = bytes.clone();
    let cd = u32_at(&lying, lying.len() - 6).unwrap() as usize;
    let second = cd + 46 + "SKILL.md".len();
    lying[second + 24..second + 28].copy_from_slice(&10u32.to_le_bytes());
    check(&lying, Err(ErrorCode::UnsafeArchive));
    // Both headers telling the same lie: caught while inflating.
    let mut zip = ZipBuilder::new();
    zip.file("SKILL.md", b"hi").entry(EntrySpec {
        declared_size: Some(10),
        ..EntrySpec::file("zeros", &vec![0u8; 2 << 20])
    });
    let dir = tempfile::tempdir().unwrap();
    let e = ToolError::from(unpack(&zip.finish(), dir.path(), CAPS).unwrap_err());
    assert_eq!(e.code, ErrorCode::UnsafeArchive, "{e}");
    assert!(e.message.contains("past its declared size"), "{e}");
    let mut many = ZipBuilder::new();
    for i in 0..101 {
        many.file(&format!("f{i}"), b"");
    }
    check(&many.finish(), Err(ErrorCode::UnsafeArchive));
}

#[test]
fn garbage_is_not_a_zip() {
    check(b"not a zip at all, clearly", Err(ErrorCode::InvalidSkill));
    check(b"", Err(ErrorCode::InvalidSkill));
}

/// An archive big enough to be written by several threads: `n` files of 1 MiB.
fn big(n: usize) -> ZipBuilder {
    let mut zip = ZipBuilder::new();
    zip.file("SKILL.md", b"hi");
    for i in 0..n {
        let data: Vec<u8> = (0..1u32 << 20).map(|b| (b * 7 + i as u32) as u8).collect();
        zip.file(&format!("d{}/f{i}", i % 3), &data);
    }
    zip
}

#[test]
fn several_threads_write_the_same_files_and_keep_the_caps() {
    let caps = Caps {
        max_bytes: 64 << 20,
        max_entries: 100,
    };
    let zip = big(12).finish();
    for threads in [1, 2, 3] {
        let dir = tempfile::tempdir().unwrap();
        let out = unpack_on(&zip, dir.path(), caps, threads).unwrap();
        assert_eq!(out.bytes, 2 + (12 << 20));
        assert_eq!(out.files.len(), 13);
        assert_eq!(out.files[1], "d0/f0");
        let f5 = fs::read(dir.path().join("d2/f5")).unwrap();
        assert_eq!(f5.len(), 1 << 20);
        assert_eq!(f5[1], 12);
    }
    // The cap on inflated bytes holds across threads: headers that under-declare are
    // caught while inflating.
    let tight = Caps {
        max_bytes: 10 << 20,
        max_entries: 100,
    };
    let mut corrupt = zip.clone();
    let mut builder = ZipBuilder::new();
    builder.file("SKILL.md", b"hi");
    for i in 0..16 {
        let data: Vec<u8> = (0..1u32 << 20).map(|b| (b * 7 + i) as u8).collect();
        builder.entry(EntrySpec {
            declared_size: Some(512 << 10),
            ..EntrySpec::file(&format!("d{}/f{i}", i % 3), &data)
        });
    }
    let under = builder.finish();
    for threads in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let e = ToolError::from(unpack_on(&under, dir.path(), tight, threads).unwrap_err());
        assert_eq!(e.code, ErrorCode::UnsafeArchive, "{e}");
    }
    // A corrupt entry fails the whole archive, whichever thread meets it: the first
    // entry's CRC, the same in both headers, is not its data's.
    let cd = u32_at(&corrupt, corrupt.len() - 6).unwrap() as usize;
    corrupt[14] ^= 0xff; // in the local header
    corrupt[cd + 16] ^= 0xff; // in the central directory
    for threads in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let e = ToolError::from(unpack_on(&corrupt, dir.path(), caps, threads).unwrap_err());
        assert_eq!(e.code, ErrorCode::InvalidSkill, "{e}");
    }
}

/// Zip64 archives, as the `zip` crate writes them: entries with zip64 sizes and offsets
/// (`large_file`), and a zip64 end of central directory record.
#[test]
fn zip64_archives_unpack() {
    use zip::write::SimpleFileOptions;
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    writer.set_raw_zip64_extensible_data_sector(Box::new([]));
    let options = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Deflated)
        .large_file(true)
        .unix_permissions(0o644);
    writer.start_file("SKILL.md", options).unwrap();
    writer.write_all(b"# zip64\n").unwrap();
    writer.add_directory("scripts/", options).unwrap();
    writer
        .start_file("scripts/run.sh", options.unix_permissions(0o755))
        .unwrap();
    writer.write_all(b"echo big\n").unwrap();
    writer
        .start_file(
            "data/raw.bin",
            options.compression_method(CompressionMethod::Stored),
        )
        .unwrap();
    writer.write_all(&[1, 2, 3]).unwrap();
    let zip = writer.finish().unwrap().into_inner();
    // Zip64 for real: sizes in the central directory are 0xFFFFFFFF, and a zip64 end of
    // central directory record comes before the classic one.
    assert!(memchr::memmem::find(&zip, &0x0606_4b50u32.to_le_bytes()).is_some());
    let cd = memchr::memmem::find(&zip, &CENTRAL_SIG.to_le_bytes()).unwrap();
    assert_eq!(u32_at(&zip, cd + 20), Some(u32::MAX));
    let dir = tempfile::tempdir().unwrap();
    let out = unpack(&zip, dir.path(), CAPS).unwrap();
    assert_eq!(out.files, ["SKILL.md", "scripts/run.sh", "data/raw.bin"]);
    assert_eq!(
        fs::read(dir.path().join("scripts/run.sh")).unwrap(),
        b"echo big\n"
    );
    assert_eq!(
        fs::read(dir.path().join("data/raw.bin")).unwrap(),
        [1, 2, 3]
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| {
            fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(mode("scripts/run.sh") & 0o777, 0o755);
        assert_eq!(mode("SKILL.md") & 0o777, 0o644);
    }
}

/// More than 65,535 entries need the zip64 end of central directory record; with the entry
/// cap raised, such an archive unpacks, and one entry past the cap is `unsafe_archive`.
#[test]
fn an_archive_of_more_than_65535_entries_unpacks() {
    use zip::write::SimpleFileOptions;
    const N: usize = 65_600;
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
    writer.start_file("SKILL.md", options).unwrap();
    writer.write_all(b"many").unwrap();
    for i in 1..N {
        writer
            .start_file(format!("d{}/{i}", i % 64), options)
            .unwrap();
    }
    let zip = writer.finish().unwrap().into_inner();
    assert!(memchr::memmem::find(&zip, &0x0606_4b50u32.to_le_bytes()).is_some());
    let caps = Caps {
        max_bytes: 1 << 20,
        max_entries: N as u64,
    };
    let dir = tempfile::tempdir().unwrap();
    let out = unpack(&zip, dir.path(), caps).unwrap();
    assert_eq!(out.files.len(), N);
    assert!(dir.path().join("d7/65543").is_file());
    let tight = Caps {
        max_entries: N as u64 - 1,
        ..caps
    };
    let dir = tempfile::tempdir().unwrap();
    let e = ToolError::from(unpack(&zip, dir.path(), tight).unwrap_err());
    assert_eq!(e.code, ErrorCode::UnsafeArchive, "{e}");
    assert!(e.message.contains("TOOLMESH_SKILL_MAX_ENTRIES"), "{e}");
}

#[test]
fn zips_are_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("SKILL.md"), "x").unwrap();
    fs::create_dir(dir.path().join("s")).unwrap();
    fs::write(dir.path().join("s/a"), "y").unwrap();
    let a = zip_dir(dir.path()).unwrap();
    let b = zip_dir(dir.path()).unwrap();
    assert_eq!(a, b);
    check(&a, Ok(&["SKILL.md", "s/a"]));
}
