//! Zip archives, read defensively and written deterministically.
//!
//! [`unpack`] is the only code that turns an untrusted archive into files. The `zip` crate
//! parses the archive (end of central directory, zip64 records, central and local headers);
//! this module never uses the crate's extraction (`ZipArchive::extract` re-roots absolute names
//! and has had a symlink escape, CVE-2025-29787). It checks the whole archive before the first
//! byte is written:
//!
//! * the entry count stays within `max_entries`, bounded before the crate reads the directory
//!   (the central directory headers the archive can hold at most, see [`entry_bound`]) and
//!   counted after;
//! * every name is UTF-8, relative, free of NUL, `:` and `..` components (with `/` or `\` as the
//!   separator), and names at most one thing (a duplicate, or a file that is also a folder of
//!   another entry, is refused);
//! * every entry is a regular file or a folder: symlinks, devices, FIFOs and sockets (Unix mode
//!   in the external attributes) are refused, and so are encrypted entries;
//! * no two entries' byte ranges (local header through compressed data) overlap, nor reach into
//!   the central directory (the overlapping-file bomb), and every local header agrees with the
//!   central directory (name, sizes, CRC, method), with no local header hidden between entries;
//! * the bytes really inflated (counted while inflating, never taken from headers) stay within
//!   `max_bytes`, and within each entry's declared size.
//!
//! Any refusal is `unsafe_archive`; a zip that cannot be parsed (or uses a method other than
//! stored and deflate) is `invalid_skill`. Zip64 archives (over 65,535 entries, or sizes and
//! offsets past 4 GiB) are read like any other. Files are created with `create_new` under a
//! destination the caller made fresh, so nothing is written outside it.

use std::collections::HashSet;
use std::fs;
use std::io::{Cursor, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use flate2::bufread::DeflateDecoder;
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::{ErrorCode, ToolError};
use zip::result::ZipError;
use zip::{CompressionMethod, System, ZipArchive};

const LOCAL_SIG: u32 = 0x0403_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const EOCD_SIG: u32 = 0x0605_4b50;
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;
/// General purpose flags: encrypted, strong encryption.
const ENCRYPTED_FLAGS: u16 = 0x0001 | 0x0040;

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

/// Why [`unpack`] refused or failed an archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A check refused the archive (a name, a type, an overlap, a cap): `unsafe_archive`.
    #[error("{0}")]
    Unsafe(String),
    /// The zip cannot be read as one (a structure or method this reader does not take).
    #[error("the skill archive is not a readable zip: {0}")]
    Unreadable(String),
    /// The `zip` crate could not parse the archive.
    #[error("the skill archive is not a readable zip: {0}")]
    Zip(#[source] ZipError),
    /// An entry's data does not inflate.
    #[error("entry '{path}' of the skill archive is corrupt: {source}")]
    Corrupt {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An entry's size or CRC differs from its header.
    #[error("entry '{0}' of the skill archive is corrupt (size or CRC differs from its header)")]
    Mismatch(String),
    /// The staging folder could not be written.
    #[error("cannot {what} '{path}' in the skill staging area: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A writing thread panicked.
    #[error("a skill unpacking thread panicked")]
    Panicked,
}

/// What kind of [`ArchiveError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveErrorKind {
    /// Refused by a check: `unsafe_archive`.
    Unsafe,
    /// Not a readable zip, or corrupt: `invalid_skill`.
    Invalid,
    /// A fault of this node (its disk, a thread): `internal`.
    Internal,
}

impl ArchiveError {
    pub fn kind(&self) -> ArchiveErrorKind {
        match self {
            ArchiveError::Unsafe(_) => ArchiveErrorKind::Unsafe,
            ArchiveError::Unreadable(_)
            | ArchiveError::Zip(_)
            | ArchiveError::Corrupt { .. }
            | ArchiveError::Mismatch(_) => ArchiveErrorKind::Invalid,
            ArchiveError::Io { .. } | ArchiveError::Panicked => ArchiveErrorKind::Internal,
        }
    }
}

/// PROTOCOL.md's code and sentence; an `internal` one logs its cause here.
impl From<ArchiveError> for ToolError {
    fn from(e: ArchiveError) -> Self {
        let code = match e.kind() {
            ArchiveErrorKind::Unsafe => ErrorCode::UnsafeArchive,
            ArchiveErrorKind::Invalid => ErrorCode::InvalidSkill,
            ArchiveErrorKind::Internal => {
                tracing::warn!(error = %DisplayChain(&e), "cannot unpack a skill archive");
                ErrorCode::Internal
            }
        };
        ToolError::new(code, e.to_string())
    }
}

fn unsafe_archive(message: impl Into<String>) -> ArchiveError {
    ArchiveError::Unsafe(message.into())
}

fn unreadable(message: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::Unreadable(message.to_string())
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
    deflated: bool,
    crc: u32,
    compressed: u64,
    size: u64,
    executable: bool,
    data_start: u64,
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

/// The most entries `zip` can list: every central directory header starts with its signature
/// at its own offset, so the signatures in the archive bound the entries. Counted before the
/// crate reads the directory, so an archive cannot make it hold millions of entries in memory
/// only to be refused after. Stored data that happens to hold signatures (a stored zip inside
/// the skill) counts too: the bound is never lower than the truth.
pub fn entry_bound(zip: &[u8]) -> u64 {
    memchr::memmem::find_iter(zip, &CENTRAL_SIG.to_le_bytes()).count() as u64
}

/// The type of an entry from its Unix mode, or why it is refused.
fn entry_kind(
    shown: &str,
    raw_name: &[u8],
    mode: Option<u32>,
    dos_dir: bool,
) -> Result<Kind, ArchiveError> {
    let named_dir = raw_name.ends_with(b"/") || raw_name.ends_with(b"\\") || dos_dir;
    match mode.map(|m| m & S_IFMT) {
        Some(S_IFLNK) => Err(unsafe_archive(format!(
            "entry {shown:?} is a symlink; symlinks are refused"
        ))),
        Some(S_IFDIR) => Ok(Kind::Dir),
        Some(S_IFREG) | Some(0) | None => Ok(if named_dir { Kind::Dir } else { Kind::File }),
        Some(other) => Err(unsafe_archive(format!(
            "entry {shown:?} is a {} and only files and folders may be unpacked",
            match other {
                0o010_000 => "FIFO",
                0o020_000 => "character device",
                0o060_000 => "block device",
                0o140_000 => "socket",
                _ => "special file",
            }
        ))),
    }
}

/// Tracks the names seen so far: one name, one thing.
#[derive(Default)]
struct Names {
    files: HashSet<String>,
    /// Folders named by an entry.
    dirs: HashSet<String>,
    /// Folders implied by a path.
    parents: HashSet<String>,
}

impl Names {
    fn add(&mut self, shown: &str, path: &str, kind: Kind) -> Result<(), ArchiveError> {
        let clash = match kind {
            Kind::File => {
                self.files.contains(path) || self.dirs.contains(path) || self.parents.contains(path)
            }
            Kind::Dir => self.dirs.contains(path) || self.files.contains(path),
        };
        if clash {
            return Err(unsafe_archive(format!(
                "entry {shown:?} names a path another entry already names (duplicate name)"
            )));
        }
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.files.contains(&prefix) {
                return Err(unsafe_archive(format!(
                    "entry {shown:?} lies under {prefix:?}, which is a file (duplicate name)"
                )));
            }
            self.parents.insert(prefix.clone());
        }
        match kind {
            Kind::File => self.files.insert(path.to_owned()),
            Kind::Dir => self.dirs.insert(path.to_owned()),
        };
        Ok(())
    }
}

/// Reads and checks the whole directory of `zip` (nothing is inflated).
fn read_entries(zip: &[u8], caps: Caps) -> Result<Vec<Entry>, ArchiveError> {
    let too_many = |count: u64| {
        unsafe_archive(format!(
            "the archive has {count} entries, more than TOOLMESH_SKILL_MAX_ENTRIES ({})",
            caps.max_entries
        ))
    };
    let bound = entry_bound(zip);
    if bound > caps.max_entries {
        return Err(too_many(bound));
    }
    let mut archive = ZipArchive::new(Cursor::new(zip)).map_err(ArchiveError::Zip)?;
    if archive.has_duplicate_names() {
        return Err(unsafe_archive(
            "two entries have the same name (duplicate name)",
        ));
    }
    let count = archive.len() as u64;
    if count > caps.max_entries {
        return Err(too_many(count));
    }

    let mut entries = Vec::with_capacity(archive.len());
    // (local header, end of data) of each entry.
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(archive.len());
    let mut names = Names::default();
    let mut declared: u64 = 0;
    for index in 0..archive.len() {
        let file = archive.by_index_raw(index).map_err(ArchiveError::Zip)?;
        let raw_name = file.name_raw();
        let shown = String::from_utf8_lossy(raw_name).escape_debug().to_string();
        if file.encrypted() || file.flags().as_u16() & ENCRYPTED_FLAGS != 0 {
            return Err(unsafe_archive(format!("entry {shown:?} is encrypted")));
        }
        let checked = check_name(raw_name).map_err(unsafe_archive)?;
        // The mode as the archive's writer set it; DOS entries have none (their folder bit
        // and a trailing '/' make a folder).
        let unix_mode = (file.system() == System::Unix)
            .then(|| file.external_attributes() >> 16)
            .filter(|m| *m != 0);
        if file.is_symlink() {
            return Err(unsafe_archive(format!(
                "entry {shown:?} is a symlink; symlinks are refused"
            )));
        }
        let dos_dir = file.external_attributes() & 0x10 != 0;
        let kind = entry_kind(&shown, raw_name, unix_mode, dos_dir)?;
        let Some(path) = checked else {
            if kind == Kind::Dir {
                continue; // "./": the root itself
            }
            return Err(unsafe_archive(format!("entry {shown:?} names no file")));
        };
        let deflated = match file.compression() {
            CompressionMethod::Stored => false,
            CompressionMethod::Deflated => true,
            _ if kind == Kind::Dir => false,
            other => {
                return Err(unreadable(format!(
                    "entry {shown:?} uses compression method {other:?}; only stored and deflate are supported"
                )))
            }
        };
        names.add(&shown, &path, kind)?;
        let data_start = file
            .data_start()
            .ok_or_else(|| unreadable(format!("entry {shown:?} has no local header")))?;
        let data_end = data_start
            .checked_add(file.compressed_size())
            .filter(|end| *end <= zip.len() as u64)
            .ok_or_else(|| unreadable(format!("entry {shown:?} runs past the archive")))?;
        ranges.push((file.header_start(), data_end));
        declared = declared.saturating_add(file.size());
        entries.push(Entry {
            path,
            kind,
            deflated,
            crc: file.crc32(),
            compressed: file.compressed_size(),
            size: file.size(),
            executable: unix_mode.is_some_and(|m| m & 0o111 != 0),
            data_start,
        });
    }
    ranges.sort_unstable();
    let directory = archive.central_directory_start();
    if ranges.iter().any(|(_, end)| *end > directory) {
        return Err(unsafe_archive(
            "an entry reaches into the central directory (an overlapping-file bomb)",
        ));
    }
    if ranges.windows(2).any(|pair| pair[1].0 < pair[0].1) {
        return Err(unsafe_archive(
            "two entries share bytes of the archive (an overlapping-file bomb)",
        ));
    }
    // Local headers that disagree with the central directory show other tools another archive.
    match archive.validate_header_consistency() {
        Ok(()) => {}
        Err(ZipError::InvalidArchive(why)) => {
            return Err(unsafe_archive(format!(
                "the archive's local headers disagree with its central directory: {why}"
            )))
        }
        Err(other) => return Err(ArchiveError::Zip(other)),
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
pub fn unpack(zip: &[u8], dest: &Path, caps: Caps) -> Result<Unpacked, ArchiveError> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    unpack_on(zip, dest, caps, cores.min(MAX_UNPACK_THREADS))
}

/// [`unpack`] on at most `threads` threads (benches compare one with several).
pub fn unpack_on(
    zip: &[u8],
    dest: &Path,
    caps: Caps,
    threads: usize,
) -> Result<Unpacked, ArchiveError> {
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
        let results: Vec<Result<(), ArchiveError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = shares
                .iter()
                .map(|(_, share)| {
                    scope.spawn(move || write_files(zip, dest, caps, share, inflated, failed))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(ArchiveError::Panicked)))
                .collect()
        });
        results.into_iter().collect::<Result<(), ArchiveError>>()
    };
    written?;
    Ok(Unpacked {
        files: files.iter().map(|e| e.path.clone()).collect(),
        bytes: inflated.into_inner(),
    })
}

fn io_error(what: &'static str, path: &str, source: std::io::Error) -> ArchiveError {
    ArchiveError::Io {
        what,
        path: path.to_owned(),
        source,
    }
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
) -> Result<(), ArchiveError> {
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
) -> Result<(), ArchiveError> {
    let start = entry.data_start as usize;
    let data = &zip[start..start + entry.compressed as usize];
    // `bufread` reads the slice in place: no copy of the compressed bytes.
    let mut reader: Box<dyn Read> = if entry.deflated {
        Box::new(DeflateDecoder::new(data))
    } else {
        Box::new(data)
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest.join(&entry.path))
        .map_err(|e| io_error("create", &entry.path, e))?;
    let mut crc = flate2::Crc::new();
    let mut written: u64 = 0;
    loop {
        let n = read_full(&mut reader, buf).map_err(|source| ArchiveError::Corrupt {
            path: entry.path.clone(),
            source,
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
        return Err(ArchiveError::Mismatch(entry.path.clone()));
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

/// One entry for [`ZipBuilder::entry`], with full control: tests build hostile archives that
/// the `zip` crate's writer refuses to write (symlinks to anywhere, devices, encrypted flags
/// without encryption, overlapping entries, sizes that lie).
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
    /// The uncompressed size both headers declare instead of the real one (a lie the
    /// central directory and the local header agree on).
    pub declared_size: Option<u32>,
}

impl EntrySpec {
    pub fn file(name: &str, data: &[u8]) -> Self {
        Self {
            name: name.as_bytes().to_vec(),
            data: data.to_vec(),
            deflate: true,
            unix_mode: Some(S_IFREG | 0o644),
            flags: 0,
            declared_size: None,
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
            size: spec.declared_size.unwrap_or(spec.data.len() as u32),
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
            write_shared(&mut out, c);
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
    write_shared(out, c);
    out.extend_from_slice(&0u16.to_le_bytes()); // extra field length
    out.extend_from_slice(&c.name);
}

/// The fields a local header and its central directory record both hold, in the same order:
/// version needed, flags, method, time, date, CRC-32, sizes, the name's length.
fn write_shared(out: &mut Vec<u8>, c: &Central) {
    out.extend_from_slice(&20u16.to_le_bytes());
    out.extend_from_slice(&c.flags.to_le_bytes());
    out.extend_from_slice(&c.method.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&DOS_DATE.to_le_bytes());
    out.extend_from_slice(&c.crc.to_le_bytes());
    out.extend_from_slice(&c.compressed.to_le_bytes());
    out.extend_from_slice(&c.size.to_le_bytes());
    out.extend_from_slice(&(c.name.len() as u16).to_le_bytes());
}

/// Zips the regular files under `dir` (sorted, symlinks skipped, paths relative to `dir`)
/// deterministically with the `zip` crate: deflated, mode 0755 or 0644, the DOS epoch as
/// every timestamp, so the same files give the same bytes.
pub fn zip_dir(dir: &Path) -> std::io::Result<Vec<u8>> {
    use zip::write::SimpleFileOptions;
    let mut files = Vec::new();
    walk(dir, "", &mut files)?;
    files.sort();
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Deflated)
        .last_modified_time(zip::DateTime::default());
    for (path, executable) in files {
        let data = fs::read(dir.join(&path))?;
        zip.start_file(
            path.as_str(),
            options.unix_permissions(if executable { 0o755 } else { 0o644 }),
        )
        .map_err(std::io::Error::other)?;
        zip.write_all(&data)?;
    }
    Ok(zip.finish().map_err(std::io::Error::other)?.into_inner())
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, bool)>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Some(path) = path_below(prefix, &entry) else {
            continue;
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

/// The path of a folder's `entry` below the walk's root, where the folder is `prefix` (empty:
/// the root itself); `None` for a name that is not UTF-8.
pub(crate) fn path_below(prefix: &str, entry: &fs::DirEntry) -> Option<String> {
    let name = entry.file_name().to_str()?.to_owned();
    Some(if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    })
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
#[path = "archive_tests.rs"]
mod tests;
