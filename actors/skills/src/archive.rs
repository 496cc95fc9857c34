//! Zip archives, read defensively and written deterministically.
//!
//! [`unpack`] is the only code that turns an untrusted archive into files. It parses the zip
//! itself (end of central directory, central headers, local headers) instead of trusting a
//! library's extraction (`ZipArchive::extract` re-roots absolute names and has had a symlink
//! escape, CVE-2025-29787), and checks the whole archive before the first byte is written:
//!
//! * every name is UTF-8, relative, free of NUL, `:` and `..` components (with `/` or `\` as the
//!   separator), and names at most one thing (a duplicate, or a file that is also a folder of
//!   another entry, is refused);
//! * every entry is a regular file or a folder: symlinks, devices, FIFOs and sockets (Unix mode
//!   in the external attributes) are refused, and so are encrypted entries;
//! * local headers agree with the central directory (name), and no two entries' byte ranges
//!   (local header through compressed data) overlap, nor reach into the central directory — the
//!   overlapping-file bomb;
//! * the entry count stays within `max_entries`, and the bytes really inflated (counted while
//!   inflating, never taken from headers) within `max_bytes`.
//!
//! Any refusal is `unsafe_archive`; a zip that cannot be parsed (or uses zip64, or a method other
//! than stored and deflate) is `invalid_skill`. Files are created with `create_new` under a
//! destination the caller made fresh, so nothing is written outside it.

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use flate2::bufread::DeflateDecoder;
use toolmesh_kernel::{ErrorCode, ToolError};

const LOCAL_SIG: u32 = 0x0403_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD_LEN: usize = 22;
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;

/// Caps of one archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// What [`unpack`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Regular files, relative, `/`-separated, in archive order.
    pub files: Vec<String>,
    /// Bytes inflated.
    pub bytes: u64,
}

fn unsafe_archive(message: impl Into<String>) -> ToolError {
    ToolError::new(ErrorCode::UnsafeArchive, message)
}

fn unreadable(message: impl std::fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidSkill,
        format!("the skill archive is not a readable zip: {message}"),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Checked, normalised path.
    path: String,
    kind: Kind,
    method: u16,
    crc: u32,
    compressed: u64,
    size: u64,
    executable: bool,
    data_start: u64,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Checks an entry name; `Ok(None)` for a name that is only `.`/empty components of a folder.
pub fn check_name(raw: &[u8]) -> Result<Option<String>, String> {
    let name = std::str::from_utf8(raw).map_err(|_| "an entry name is not UTF-8".to_owned())?;
    let shown = name.escape_debug().to_string();
    if name.is_empty() {
        return Err("an entry has an empty name".into());
    }
    if name.contains('\0') {
        return Err(format!("entry {shown:?} has a NUL byte in its name"));
    }
    let unified = name.replace('\\', "/");
    if unified.starts_with('/') {
        return Err(format!("entry {shown:?} has an absolute path"));
    }
    if unified.contains(':') {
        return Err(format!(
            "entry {shown:?} has a ':' (a drive letter or stream name)"
        ));
    }
    let mut parts = Vec::new();
    for part in unified.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("entry {shown:?} climbs out with '..'")),
            other => parts.push(other),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

/// Reads and checks the whole directory of `zip` (nothing is inflated).
fn read_entries(zip: &[u8], caps: Caps) -> Result<Vec<Entry>, ToolError> {
    if zip.len() < EOCD_LEN {
        return Err(unreadable("too short"));
    }
    // The end of central directory record: the last one whose comment ends the file.
    let lowest = zip.len().saturating_sub(EOCD_LEN + usize::from(u16::MAX));
    let eocd = (lowest..=zip.len() - EOCD_LEN)
        .rev()
        .find(|&at| {
            u32_at(zip, at) == Some(EOCD_SIG)
                && u16_at(zip, at + 20).map(|c| at + EOCD_LEN + usize::from(c)) == Some(zip.len())
        })
        .ok_or_else(|| unreadable("no end of central directory record"))?;
    let count = u16_at(zip, eocd + 10).unwrap_or(0);
    let cd_size = u32_at(zip, eocd + 12).unwrap_or(0);
    let cd_offset = u32_at(zip, eocd + 16).unwrap_or(0);
    if count == u16::MAX || cd_size == u32::MAX || cd_offset == u32::MAX {
        return Err(unreadable("zip64 archives are not supported"));
    }
    if u16_at(zip, eocd + 4) != Some(0) || u16_at(zip, eocd + 6) != Some(0) {
        return Err(unreadable("multi-disk archives are not supported"));
    }
    if u64::from(count) > caps.max_entries {
        return Err(unsafe_archive(format!(
            "the archive has {count} entries, more than TOOLMESH_SKILL_MAX_ENTRIES ({})",
            caps.max_entries
        )));
    }
    let cd_start = cd_offset as usize;
    let cd_end = cd_start
        .checked_add(cd_size as usize)
        .filter(|end| *end <= eocd)
        .ok_or_else(|| unreadable("the central directory lies outside the archive"))?;

    let mut entries = Vec::with_capacity(usize::from(count));
    let mut ranges: Vec<(u64, u64, usize)> = Vec::with_capacity(usize::from(count));
    let mut files: HashSet<String> = HashSet::new();
    let mut dirs: HashSet<String> = HashSet::new(); // folders named by an entry
    let mut parents: HashSet<String> = HashSet::new(); // folders implied by a path
    let mut declared: u64 = 0;
    let mut at = cd_start;
    for index in 0..usize::from(count) {
        let head = zip
            .get(at..at + 46)
            .filter(|_| at + 46 <= cd_end)
            .ok_or_else(|| unreadable("the central directory is cut short"))?;
        if u32_at(head, 0) != Some(CENTRAL_SIG) {
            return Err(unreadable("a central directory header is damaged"));
        }
        let made_by = u16_at(head, 4).unwrap_or(0);
        let flags = u16_at(head, 8).unwrap_or(0);
        let method = u16_at(head, 10).unwrap_or(0);
        let crc = u32_at(head, 16).unwrap_or(0);
        let compressed = u32_at(head, 20).unwrap_or(0);
        let size = u32_at(head, 24).unwrap_or(0);
        let name_len = usize::from(u16_at(head, 28).unwrap_or(0));
        let extra_len = usize::from(u16_at(head, 30).unwrap_or(0));
        let comment_len = usize::from(u16_at(head, 32).unwrap_or(0));
        let external = u32_at(head, 38).unwrap_or(0);
        let local = u32_at(head, 42).unwrap_or(0);
        let name_at = at + 46;
        let raw_name = zip
            .get(name_at..name_at + name_len)
            .filter(|_| name_at + name_len <= cd_end)
            .ok_or_else(|| unreadable("an entry name runs past the central directory"))?;
        at = name_at + name_len + extra_len + comment_len;
        if at > cd_end {
            return Err(unreadable("a central directory header runs past its end"));
        }
        if compressed == u32::MAX || size == u32::MAX || local == u32::MAX {
            return Err(unreadable("zip64 entries are not supported"));
        }
        let shown = String::from_utf8_lossy(raw_name).escape_debug().to_string();
        if flags & 0x0001 != 0 || flags & 0x0040 != 0 || method == 99 {
            return Err(unsafe_archive(format!("entry {shown:?} is encrypted")));
        }
        let checked = check_name(raw_name).map_err(unsafe_archive)?;
        let unix_mode = (made_by >> 8 == 3)
            .then_some(external >> 16)
            .filter(|m| *m != 0);
        let named_dir = raw_name.ends_with(b"/") || raw_name.ends_with(b"\\");
        let kind = match unix_mode.map(|m| m & S_IFMT) {
            Some(S_IFLNK) => {
                return Err(unsafe_archive(format!(
                    "entry {shown:?} is a symlink; symlinks are refused"
                )))
            }
            Some(S_IFDIR) => Kind::Dir,
            Some(S_IFREG) | Some(0) | None => {
                if named_dir || external & 0x10 != 0 {
                    Kind::Dir
                } else {
                    Kind::File
                }
            }
            Some(other) => {
                return Err(unsafe_archive(format!(
                    "entry {shown:?} is a {} and only files and folders may be unpacked",
                    match other {
                        0o010_000 => "FIFO",
                        0o020_000 => "character device",
                        0o060_000 => "block device",
                        0o140_000 => "socket",
                        _ => "special file",
                    }
                )))
            }
        };
        let Some(path) = checked else {
            if kind == Kind::Dir {
                continue; // "./": the root itself
            }
            return Err(unsafe_archive(format!("entry {shown:?} names no file")));
        };
        if kind == Kind::File && !matches!(method, 0 | 8) {
            return Err(unreadable(format!(
                "entry {shown:?} uses compression method {method}; only stored and deflate are supported"
            )));
        }
        // One name, one thing.
        let clash = match kind {
            Kind::File => files.contains(&path) || dirs.contains(&path) || parents.contains(&path),
            Kind::Dir => dirs.contains(&path) || files.contains(&path),
        };
        if clash {
            return Err(unsafe_archive(format!(
                "entry {shown:?} names a path another entry already names (duplicate name)"
            )));
        }
        let mut prefix = String::new();
        for part in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if files.contains(&prefix) {
                return Err(unsafe_archive(format!(
                    "entry {shown:?} lies under {prefix:?}, which is a file (duplicate name)"
                )));
            }
            parents.insert(prefix.clone());
        }
        match kind {
            Kind::File => files.insert(path.clone()),
            Kind::Dir => dirs.insert(path.clone()),
        };
        // The local header: same name, and where the data starts.
        let local_at = local as usize;
        let local_head = zip
            .get(local_at..local_at + 30)
            .ok_or_else(|| unreadable(format!("entry {shown:?} points outside the archive")))?;
        if u32_at(local_head, 0) != Some(LOCAL_SIG) {
            return Err(unreadable(format!(
                "entry {shown:?} points at no local header"
            )));
        }
        let local_name_len = usize::from(u16_at(local_head, 26).unwrap_or(0));
        let local_extra_len = usize::from(u16_at(local_head, 28).unwrap_or(0));
        if zip.get(local_at + 30..local_at + 30 + local_name_len) != Some(raw_name) {
            return Err(unsafe_archive(format!(
                "entry {shown:?} has another name in its local header"
            )));
        }
        let data_start = (local_at + 30 + local_name_len + local_extra_len) as u64;
        let data_end = data_start + u64::from(compressed);
        if data_end > cd_start as u64 {
            return Err(unsafe_archive(format!(
                "entry {shown:?} reaches into the central directory"
            )));
        }
        ranges.push((local_at as u64, data_end, index));
        declared = declared.saturating_add(u64::from(size));
        entries.push(Entry {
            path,
            kind,
            method,
            crc,
            compressed: u64::from(compressed),
            size: u64::from(size),
            executable: unix_mode.is_some_and(|m| m & 0o111 != 0),
            data_start,
        });
    }
    if at != cd_end {
        return Err(unreadable(
            "the central directory holds more than its entry count",
        ));
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(unsafe_archive(
                "two entries share bytes of the archive (an overlapping-file bomb)",
            ));
        }
    }
    if declared > caps.max_bytes {
        return Err(unsafe_archive(format!(
            "the archive declares {declared} bytes, more than TOOLMESH_SKILL_MAX_BYTES ({})",
            caps.max_bytes
        )));
    }
    Ok(entries)
}

/// Inflated bytes below which [`unpack`] writes on one thread.
pub const PARALLEL_MIN_BYTES: u64 = 8 << 20;
/// Threads [`unpack`] writes on, at most.
pub const MAX_UNPACK_THREADS: usize = 4;
/// The write buffer of one unpacking thread.
const UNPACK_BUF: usize = 256 * 1024;

/// Checks `zip` whole, then writes its files and folders under `dest` (an existing, empty
/// folder the caller owns). On `Err` some files may have been written under `dest`: the caller
/// removes it.
///
/// An archive declaring at least [`PARALLEL_MIN_BYTES`] is written by up to
/// [`MAX_UNPACK_THREADS`] threads (as many as the machine has cores), each taking whole
/// entries; the caps are shared, so they hold for the archive as a whole.
pub fn unpack(zip: &[u8], dest: &Path, caps: Caps) -> Result<Unpacked, ToolError> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    unpack_on(zip, dest, caps, cores.min(MAX_UNPACK_THREADS))
}

/// [`unpack`] on at most `threads` threads (benches compare one with several).
pub fn unpack_on(
    zip: &[u8],
    dest: &Path,
    caps: Caps,
    threads: usize,
) -> Result<Unpacked, ToolError> {
    let entries = read_entries(zip, caps)?;
    // Folders first, so that the writers only create files.
    for entry in &entries {
        let target = dest.join(&entry.path);
        let folder = match entry.kind {
            Kind::Dir => Some(target.as_path()),
            Kind::File => target.parent(),
        };
        if let Some(folder) = folder {
            fs::create_dir_all(folder).map_err(|e| io_error("create", &entry.path, e))?;
        }
    }
    let files: Vec<&Entry> = entries.iter().filter(|e| e.kind == Kind::File).collect();
    let declared: u64 = files.iter().map(|e| e.size).sum();
    let threads = if declared < PARALLEL_MIN_BYTES {
        1
    } else {
        threads.clamp(1, files.len().max(1))
    };
    let inflated = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let written = if threads == 1 {
        write_files(zip, dest, caps, &files, &inflated, &failed)
    } else {
        // Whole entries to each thread, largest first to the least loaded.
        let mut by_size: Vec<&Entry> = files.clone();
        by_size.sort_by_key(|e| std::cmp::Reverse(e.compressed.max(e.size)));
        let mut shares: Vec<(u64, Vec<&Entry>)> = vec![(0, Vec::new()); threads];
        for entry in by_size {
            let least = shares
                .iter_mut()
                .min_by_key(|(load, _)| *load)
                .expect("at least one thread");
            least.0 += entry.compressed.max(entry.size);
            least.1.push(entry);
        }
        let (inflated, failed) = (&inflated, &failed);
        let results: Vec<Result<(), ToolError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = shares
                .iter()
                .map(|(_, share)| {
                    scope.spawn(move || write_files(zip, dest, caps, share, inflated, failed))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ToolError::internal("a skill unpacking thread panicked"))
                    })
                })
                .collect()
        });
        results.into_iter().collect::<Result<(), ToolError>>()
    };
    written?;
    Ok(Unpacked {
        files: files.iter().map(|e| e.path.clone()).collect(),
        bytes: inflated.into_inner(),
    })
}

fn io_error(what: &str, path: &str, e: std::io::Error) -> ToolError {
    ToolError::internal(format!(
        "cannot {what} '{path}' in the skill staging area: {e}"
    ))
}

/// Writes `files` under `dest`, adding what it inflates to `inflated` (the whole archive's
/// count, checked against the cap). Sets `failed` on its own failure, and stops early (`Ok`:
/// the failing thread reports) once another thread set it.
fn write_files(
    zip: &[u8],
    dest: &Path,
    caps: Caps,
    files: &[&Entry],
    inflated: &AtomicU64,
    failed: &AtomicBool,
) -> Result<(), ToolError> {
    let mut buf = vec![0u8; UNPACK_BUF];
    for entry in files {
        if failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Err(e) = write_file(zip, dest, caps, entry, inflated, &mut buf) {
            failed.store(true, Ordering::Relaxed);
            return Err(e);
        }
    }
    Ok(())
}

/// Writes one file entry, inflating it (counted) and checking its size and CRC.
fn write_file(
    zip: &[u8],
    dest: &Path,
    caps: Caps,
    entry: &Entry,
    inflated: &AtomicU64,
    buf: &mut [u8],
) -> Result<(), ToolError> {
    let start = entry.data_start as usize;
    let data = &zip[start..start + entry.compressed as usize];
    // `bufread` reads the slice in place: no copy of the compressed bytes.
    let mut reader: Box<dyn Read> = match entry.method {
        0 => Box::new(data),
        _ => Box::new(DeflateDecoder::new(data)),
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest.join(&entry.path))
        .map_err(|e| io_error("create", &entry.path, e))?;
    let mut crc = flate2::Crc::new();
    let mut written: u64 = 0;
    loop {
        let n = read_full(&mut reader, buf).map_err(|e| {
            ToolError::new(
                ErrorCode::InvalidSkill,
                format!(
                    "entry '{}' of the skill archive is corrupt: {e}",
                    entry.path
                ),
            )
        })?;
        if n == 0 {
            break;
        }
        written += n as u64;
        if inflated.fetch_add(n as u64, Ordering::Relaxed) + n as u64 > caps.max_bytes {
            return Err(unsafe_archive(format!(
                "the archive inflates past TOOLMESH_SKILL_MAX_BYTES ({} bytes)",
                caps.max_bytes
            )));
        }
        if written > entry.size {
            return Err(unsafe_archive(format!(
                "entry '{}' inflates past its declared size of {} bytes",
                entry.path, entry.size
            )));
        }
        crc.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| io_error("write", &entry.path, e))?;
    }
    if written != entry.size || crc.sum() != entry.crc {
        return Err(ToolError::new(
            ErrorCode::InvalidSkill,
            format!(
                "entry '{}' of the skill archive is corrupt (size or CRC differs from its header)",
                entry.path
            ),
        ));
    }
    set_mode(&file, entry.executable).map_err(|e| io_error("set the mode of", &entry.path, e))
}

/// Fills `buf` as far as `reader` goes (fewer, larger writes); 0 at the end.
fn read_full(reader: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(unix)]
fn set_mode(file: &fs::File, executable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(fs::Permissions::from_mode(if executable {
        0o755
    } else {
        0o644
    }))
}

#[cfg(not(unix))]
fn set_mode(_file: &fs::File, _executable: bool) -> std::io::Result<()> {
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Writing

/// One entry for [`ZipBuilder::entry`], with full control (tests build hostile archives).
#[derive(Debug, Clone)]
pub struct EntrySpec {
    pub name: Vec<u8>,
    pub data: Vec<u8>,
    pub deflate: bool,
    /// Unix mode with its type bits (`0o100644`, `0o120777` for a symlink, …); `None` writes a
    /// DOS entry.
    pub unix_mode: Option<u32>,
    /// General purpose flags (bit 0: encrypted).
    pub flags: u16,
}

impl EntrySpec {
    pub fn file(name: &str, data: &[u8]) -> Self {
        Self {
            name: name.as_bytes().to_vec(),
            data: data.to_vec(),
            deflate: true,
            unix_mode: Some(S_IFREG | 0o644),
            flags: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Central {
    name: Vec<u8>,
    flags: u16,
    method: u16,
    crc: u32,
    compressed: u32,
    size: u32,
    made_by: u16,
    external: u32,
    offset: u32,
}

/// Writes zips deterministically (fixed timestamps, entries in the order given).
#[derive(Debug, Default, Clone)]
pub struct ZipBuilder {
    body: Vec<u8>,
    central: Vec<Central>,
}

/// 1980-01-01 00:00, the DOS epoch.
const DOS_DATE: u16 = (1 << 5) | 1;

impl ZipBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A regular file (deflated, mode 0644).
    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.entry(EntrySpec::file(name, data))
    }

    /// A regular file with an explicit executable bit.
    pub fn file_mode(&mut self, name: &str, data: &[u8], executable: bool) -> &mut Self {
        let mut spec = EntrySpec::file(name, data);
        spec.unix_mode = Some(S_IFREG | if executable { 0o755 } else { 0o644 });
        self.entry(spec)
    }

    pub fn entry(&mut self, spec: EntrySpec) -> &mut Self {
        let (method, payload) = if spec.deflate {
            let mut enc =
                flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(&spec.data).expect("writing to a Vec");
            (8u16, enc.finish().expect("writing to a Vec"))
        } else {
            (0u16, spec.data.clone())
        };
        let mut crc = flate2::Crc::new();
        crc.update(&spec.data);
        let central = Central {
            name: spec.name,
            flags: spec.flags,
            method,
            crc: crc.sum(),
            compressed: payload.len() as u32,
            size: spec.data.len() as u32,
            made_by: if spec.unix_mode.is_some() {
                (3 << 8) | 20
            } else {
                20
            },
            external: spec.unix_mode.map_or(0, |m| m << 16),
            offset: self.body.len() as u32,
        };
        write_local(&mut self.body, &central);
        self.body.extend_from_slice(&payload);
        self.central.push(central);
        self
    }

    /// The overlapping-file bomb: a stored entry `outer` whose data is a whole entry `inner`
    /// (local header and data), and a central directory listing both, so that their byte ranges
    /// overlap.
    pub fn overlapping(&mut self, outer: &str, inner: &str, data: &[u8]) -> &mut Self {
        let mut nested = ZipBuilder::new();
        nested.entry(EntrySpec {
            deflate: false,
            ..EntrySpec::file(inner, data)
        });
        let mut inner_entry = nested.central.pop().expect("one entry");
        let nested_bytes = nested.body;
        let outer_offset = self.body.len() as u32;
        self.entry(EntrySpec {
            deflate: false,
            ..EntrySpec::file(outer, &nested_bytes)
        });
        inner_entry.offset = outer_offset + 30 + outer.len() as u32;
        self.central.push(inner_entry);
        self
    }

    pub fn finish(&self) -> Vec<u8> {
        let mut out = self.body.clone();
        let cd_start = out.len() as u32;
        for c in &self.central {
            out.extend_from_slice(&CENTRAL_SIG.to_le_bytes());
            out.extend_from_slice(&c.made_by.to_le_bytes());
            out.extend_from_slice(&20u16.to_le_bytes());
            out.extend_from_slice(&c.flags.to_le_bytes());
            out.extend_from_slice(&c.method.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&DOS_DATE.to_le_bytes());
            out.extend_from_slice(&c.crc.to_le_bytes());
            out.extend_from_slice(&c.compressed.to_le_bytes());
            out.extend_from_slice(&c.size.to_le_bytes());
            out.extend_from_slice(&(c.name.len() as u16).to_le_bytes());
            out.extend_from_slice(&[0; 8]); // extra, comment, disk, internal attributes
            out.extend_from_slice(&c.external.to_le_bytes());
            out.extend_from_slice(&c.offset.to_le_bytes());
            out.extend_from_slice(&c.name);
        }
        let cd_size = out.len() as u32 - cd_start;
        out.extend_from_slice(&EOCD_SIG.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        let n = self.central.len() as u16;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&cd_size.to_le_bytes());
        out.extend_from_slice(&cd_start.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }
}

fn write_local(out: &mut Vec<u8>, c: &Central) {
    out.extend_from_slice(&LOCAL_SIG.to_le_bytes());
    out.extend_from_slice(&20u16.to_le_bytes());
    out.extend_from_slice(&c.flags.to_le_bytes());
    out.extend_from_slice(&c.method.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&DOS_DATE.to_le_bytes());
    out.extend_from_slice(&c.crc.to_le_bytes());
    out.extend_from_slice(&c.compressed.to_le_bytes());
    out.extend_from_slice(&c.size.to_le_bytes());
    out.extend_from_slice(&(c.name.len() as u16).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&c.name);
}

/// Zips the regular files under `dir` (sorted, symlinks skipped, paths relative to `dir`)
/// deterministically: the same files give the same bytes.
pub fn zip_dir(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut files = Vec::new();
    walk(dir, "", &mut files)?;
    files.sort();
    let mut zip = ZipBuilder::new();
    for (path, executable) in files {
        let data = fs::read(dir.join(&path))?;
        zip.file_mode(&path, &data, executable);
    }
    Ok(zip.finish())
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, bool)>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let meta = fs::symlink_metadata(entry.path())?;
        if meta.is_dir() {
            walk(&entry.path(), &path, out)?;
        } else if meta.is_file() {
            out.push((path, is_executable(&meta)));
        }
    }
    Ok(())
}

#[cfg(unix)]
pub(crate) fn is_executable(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
pub(crate) fn is_executable(_meta: &fs::Metadata) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps {
        max_bytes: 1 << 20,
        max_entries: 100,
    };

    fn check(zip: &[u8], expect: Result<&[&str], ErrorCode>) {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("stage");
        fs::create_dir(&dest).unwrap();
        match (unpack(zip, &dest, CAPS), expect) {
            (Ok(got), Ok(files)) => assert_eq!(got.files, files),
            (Err(e), Err(code)) => {
                assert_eq!(e.code, code, "{e}");
                // Whatever happened, nothing is outside the staging folder.
                let outside: Vec<_> = fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .filter(|n| n != "stage")
                    .collect();
                assert!(outside.is_empty(), "{outside:?}");
            }
            (got, expect) => panic!("got {got:?}, expected {expect:?}"),
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
        let mut zip = ZipBuilder::new();
        zip.file("SKILL.md", b"a").file("SKILL.md", b"b");
        check(&zip.finish(), Err(ErrorCode::UnsafeArchive));
        let mut zip = ZipBuilder::new();
        zip.file("a/b", b"a").file("a\\b", b"b");
        check(&zip.finish(), Err(ErrorCode::UnsafeArchive));
        let mut zip = ZipBuilder::new();
        zip.file("a", b"a").file("a/b", b"b");
        check(&zip.finish(), Err(ErrorCode::UnsafeArchive));
        let mut zip = ZipBuilder::new();
        zip.file("a/b", b"a").file("a", b"b");
        check(&zip.finish(), Err(ErrorCode::UnsafeArchive));
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
        // A header that lies about the size is caught while inflating too.
        let mut lying = bytes.clone();
        let cd = u32_at(&lying, lying.len() - 6).unwrap() as usize;
        let second = cd + 46 + "SKILL.md".len();
        lying[second + 24..second + 28].copy_from_slice(&10u32.to_le_bytes());
        check(&lying, Err(ErrorCode::UnsafeArchive));
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
        let mut lying = zip.clone();
        let mut builder = big(16);
        for c in &mut builder.central[1..] {
            c.size = 512 << 10;
        }
        let under = builder.finish();
        for threads in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            let e = unpack_on(&under, dir.path(), tight, threads).unwrap_err();
            assert_eq!(e.code, ErrorCode::UnsafeArchive, "{e}");
        }
        // A corrupt entry fails the whole archive, whichever thread meets it.
        let cd = u32_at(&lying, lying.len() - 6).unwrap() as usize;
        let crc_at = cd + 16; // the first entry's CRC in the central directory
        lying[crc_at] ^= 0xff;
        for threads in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            let e = unpack_on(&lying, dir.path(), caps, threads).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidSkill, "{e}");
        }
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
}
