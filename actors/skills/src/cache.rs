//! Loading a skill: a local folder as it is, a remote one through the archive cache
//! `$TOOLMESH_DATA_DIR/skills-cache/<sha256>/`.
//!
//! A remote archive is downloaded (capped at `TOOLMESH_SKILL_MAX_BYTES`, timed out), its sha256
//! checked against the Skill Service's (`hash_mismatch`, or a warning with
//! `TOOLMESH_SKILL_ALLOW_HASH_MISMATCH=1`), unpacked by [`crate::archive::unpack`] into a fresh
//! staging folder `skills-cache/.staging/<uuid>/`, checked for `SKILL.md`, and only then renamed
//! to `skills-cache/<sha256>/` (the hash of the bytes actually downloaded). A refusal removes the
//! staging folder, so the cache only ever holds whole, checked skills; a rename that loses a race
//! with another node (the folder exists) keeps the other's copy, which is the same content.
//!
//! Each install logs its phases at debug level (`skill archive installed`: lookup, download,
//! hash, extract, check and rename times in µs; lookup is the download info and the cache
//! check), which `benches/skills.rs` reads.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::skills::LOCAL_SHA256;
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::archive::{self, ArchiveError, Caps};
use crate::catalog::{CatalogError, CatalogSkill, ServiceClient, Source};
use crate::frontmatter::{self, SkillDoc};

/// The cache folder under the data dir.
pub const CACHE_DIR: &str = "skills-cache";
/// Staging folders, under the cache folder.
pub const STAGING_DIR: &str = ".staging";

/// Why a skill could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The Skill Service could not say where the archive is, or it could not be downloaded.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The archive was refused or could not be unpacked.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(
        "the archive of skill '{name}' has sha256 {actual}, but the Skill Service says {expected}; it was not unpacked"
    )]
    HashMismatch {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("the skill archive holds no SKILL.md at its root or in a single top folder")]
    NoSkillMd,
    #[error("cannot read SKILL.md of the skill: {0}")]
    ReadSkillMd(#[source] std::io::Error),
    #[error("SKILL.md is not UTF-8")]
    NotUtf8(#[source] std::string::FromUtf8Error),
    #[error("the front matter of SKILL.md is unreadable: {0}")]
    FrontMatter(String),
    /// The cache folder could not be written or read.
    #[error("cannot {what} in the skill cache {}: {source}", .dir.display())]
    Cache {
        what: &'static str,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A folder that should hold a skill could not be listed.
    #[error("cannot read {}: {source}", .dir.display())]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A blocking task of the load failed (it panicked).
    #[error("skill loading task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// What kind of [`LoadError`] it is (a Skill Service or archive failure says more through its
/// own kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadErrorKind {
    /// The Skill Service or the download failed: see [`CatalogError::kind`].
    Catalog,
    /// The archive was refused or unreadable: see [`ArchiveError::kind`].
    Archive,
    /// The archive is not the one the Skill Service named: `hash_mismatch`.
    HashMismatch,
    /// The skill's SKILL.md is missing or unreadable: `invalid_skill`.
    Invalid,
    /// A fault of this node (its disk, a task): `internal`.
    Internal,
}

impl LoadError {
    pub fn kind(&self) -> LoadErrorKind {
        match self {
            LoadError::Catalog(_) => LoadErrorKind::Catalog,
            LoadError::Archive(_) => LoadErrorKind::Archive,
            LoadError::HashMismatch { .. } => LoadErrorKind::HashMismatch,
            LoadError::NoSkillMd
            | LoadError::ReadSkillMd(_)
            | LoadError::NotUtf8(_)
            | LoadError::FrontMatter(_) => LoadErrorKind::Invalid,
            LoadError::Cache { .. } | LoadError::ReadDir { .. } | LoadError::Task(_) => {
                LoadErrorKind::Internal
            }
        }
    }
}

/// PROTOCOL.md's code and sentence (`hash_mismatch` with both hashes); an `internal` one logs
/// its cause here.
impl From<LoadError> for ToolError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Catalog(e) => e.into(),
            LoadError::Archive(e) => e.into(),
            LoadError::HashMismatch {
                ref expected,
                ref actual,
                ..
            } => ToolError::new(ErrorCode::HashMismatch, e.to_string())
                .with("expected_sha256", expected.clone())
                .with("actual_sha256", actual.clone()),
            _ if e.kind() == LoadErrorKind::Invalid => {
                ToolError::new(ErrorCode::InvalidSkill, e.to_string())
            }
            _ => {
                tracing::warn!(error = %DisplayChain(&e), "cannot load a skill");
                ToolError::internal(e.to_string())
            }
        }
    }
}

/// A skill ready to use: its files are under `root`.
#[derive(Debug, Clone)]
pub struct LoadedSkill {
    pub skill: CatalogSkill,
    /// The folder holding `SKILL.md`.
    pub root: PathBuf,
    pub doc: SkillDoc,
    /// The archive's sha256, or `local`.
    pub sha256: String,
    pub cache_hit: bool,
    pub warnings: Vec<String>,
}

/// What loading needs.
#[derive(Debug, Clone)]
pub struct Loader {
    pub cache_dir: PathBuf,
    pub service: ServiceClient,
    pub allow_hash_mismatch: bool,
    pub caps: Caps,
}

impl Loader {
    pub fn new(
        data_dir: &Path,
        service: ServiceClient,
        allow_hash_mismatch: bool,
        caps: Caps,
    ) -> Self {
        Self {
            cache_dir: data_dir.join(CACHE_DIR),
            service,
            allow_hash_mismatch,
            caps,
        }
    }

    pub async fn load(&self, skill: &CatalogSkill) -> Result<LoadedSkill, LoadError> {
        match &skill.source {
            Source::Local(dir) => {
                let dir = dir.clone();
                let doc = tokio::task::spawn_blocking(move || read_doc(&dir))
                    .await
                    .map_err(LoadError::Task)??;
                let Source::Local(root) = &skill.source else {
                    unreachable!()
                };
                Ok(LoadedSkill {
                    skill: skill.clone(),
                    root: root.clone(),
                    doc,
                    sha256: LOCAL_SHA256.into(),
                    cache_hit: false,
                    warnings: Vec::new(),
                })
            }
            Source::Remote => self.load_remote(skill).await,
        }
    }

    async fn load_remote(&self, skill: &CatalogSkill) -> Result<LoadedSkill, LoadError> {
        let name = &skill.manifest.name;
        let started = Instant::now();
        let (url, expected) = self
            .service
            .download_info(&skill.manifest.space_id, name)
            .await?;
        let cached = self.cache_dir.join(&expected);
        if let Some((root, doc)) = blocking(move || cached_skill(&cached)).await? {
            return Ok(LoadedSkill {
                skill: skill.clone(),
                root,
                doc,
                sha256: expected,
                cache_hit: true,
                warnings: Vec::new(),
            });
        }
        let looked_up = Instant::now();
        let bytes = self
            .service
            .get_bytes(
                url,
                &format!("the archive of skill '{name}'"),
                self.service.max_download_bytes,
            )
            .await?;
        let downloaded = Instant::now();
        // ~30 ms for 50 MB even with SHA-NI: off the async worker.
        let (bytes, actual, hashed) = blocking(move || {
            let actual = sha256_hex(&bytes);
            Ok((bytes, actual, Instant::now()))
        })
        .await?;
        let mut warnings = Vec::new();
        if actual != expected {
            if !self.allow_hash_mismatch {
                return Err(LoadError::HashMismatch {
                    name: name.clone(),
                    expected,
                    actual,
                });
            }
            warnings.push(format!(
                "sha256 mismatch for skill '{name}': expected {expected}, got {actual}; loaded anyway because TOOLMESH_SKILL_ALLOW_HASH_MISMATCH=1"
            ));
        }
        let cache_dir = self.cache_dir.clone();
        let caps = self.caps;
        let key = actual.clone();
        let archive_bytes = bytes.len();
        let (root, doc, times) = blocking(move || install(&cache_dir, &key, &bytes, caps)).await?;
        let us = |d: Duration| d.as_micros() as u64;
        tracing::debug!(
            skill = %DisplaySafe(name),
            archive_bytes,
            inflated_bytes = times.inflated_bytes,
            lookup_us = us(looked_up - started),
            download_us = us(downloaded - looked_up),
            hash_us = us(hashed - downloaded),
            extract_us = us(times.extract),
            check_us = us(times.check),
            rename_us = us(times.rename),
            total_us = us(started.elapsed()),
            "skill archive installed"
        );
        Ok(LoadedSkill {
            skill: skill.clone(),
            root,
            doc,
            sha256: actual,
            cache_hit: false,
            warnings,
        })
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, LoadError> + Send + 'static,
) -> Result<T, LoadError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(LoadError::Task)?
}

/// A cached skill, if the cache holds one under that folder.
fn cached_skill(dir: &Path) -> Result<Option<(PathBuf, SkillDoc)>, LoadError> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        _ => return Ok(None),
    }
    let root = skill_root(dir)?;
    let doc = read_doc(&root)?;
    Ok(Some((root, doc)))
}

/// How long the phases of [`install`] took.
#[derive(Debug, Clone, Copy, Default)]
struct InstallTimes {
    extract: Duration,
    check: Duration,
    rename: Duration,
    inflated_bytes: u64,
}

/// Unpacks into staging, checks, renames into the cache.
fn install(
    cache_dir: &Path,
    key: &str,
    zip: &[u8],
    caps: Caps,
) -> Result<(PathBuf, SkillDoc, InstallTimes), LoadError> {
    let io = |what: &'static str, source: std::io::Error| LoadError::Cache {
        what,
        dir: cache_dir.to_path_buf(),
        source,
    };
    let staging_parent = cache_dir.join(STAGING_DIR);
    fs::create_dir_all(&staging_parent).map_err(|e| io("create the staging folder", e))?;
    let staging = staging_parent.join(uuid::Uuid::new_v4().simple().to_string());
    fs::create_dir(&staging).map_err(|e| io("create a staging folder", e))?;
    let mut times = InstallTimes::default();
    let extracting = Instant::now();
    let checked = archive::unpack(zip, &staging, caps)
        .map_err(LoadError::from)
        .and_then(|unpacked| {
            times.inflated_bytes = unpacked.bytes;
            times.extract = extracting.elapsed();
            let checking = Instant::now();
            let root = skill_root(&staging)?;
            let doc = read_doc(&root)?;
            times.check = checking.elapsed();
            Ok((
                root.strip_prefix(&staging)
                    .map(Path::to_path_buf)
                    .unwrap_or_default(),
                doc,
            ))
        });
    let (relative_root, doc) = match checked {
        Ok(found) => found,
        Err(e) => {
            if let Err(rm) = fs::remove_dir_all(&staging) {
                tracing::warn!(error = %rm, path = %staging.display(), "could not remove a refused skill's staging folder");
            }
            return Err(e);
        }
    };
    let target = cache_dir.join(key);
    let renaming = Instant::now();
    if let Err(e) = fs::rename(&staging, &target) {
        let _ = fs::remove_dir_all(&staging);
        if !target.is_dir() {
            return Err(io("move a skill into place", e));
        }
        // Another node (or call) put the same archive there first.
    }
    times.rename = renaming.elapsed();
    Ok((target.join(relative_root), doc, times))
}

/// The folder holding `SKILL.md`: the root, or its single top folder (`__MACOSX` aside).
pub fn skill_root(dir: &Path) -> Result<PathBuf, LoadError> {
    let is_skill_md =
        |p: &Path| fs::symlink_metadata(p.join("SKILL.md")).is_ok_and(|m| m.is_file());
    if is_skill_md(dir) {
        return Ok(dir.to_path_buf());
    }
    let tops: Vec<_> = fs::read_dir(dir)
        .map_err(|source| LoadError::ReadDir {
            dir: dir.to_path_buf(),
            source,
        })?
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != "__MACOSX")
        .collect();
    if let [only] = &tops[..] {
        if only.file_type().is_ok_and(|t| t.is_dir()) && is_skill_md(&only.path()) {
            return Ok(only.path());
        }
    }
    Err(LoadError::NoSkillMd)
}

/// Reads and parses `root/SKILL.md`.
pub fn read_doc(root: &Path) -> Result<SkillDoc, LoadError> {
    let path = root.join("SKILL.md");
    let text = fs::read(&path).map_err(LoadError::ReadSkillMd)?;
    let text = String::from_utf8(text).map_err(LoadError::NotUtf8)?;
    frontmatter::parse(&text).map_err(LoadError::FrontMatter)
}

/// A content fingerprint of a local skill folder: the hash of its file list with sizes, modes
/// and mtimes.
pub fn fingerprint(files: &[(String, fs::Metadata)]) -> String {
    let mut text = String::new();
    for (path, meta) in files {
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        text.push_str(&format!(
            "{path}\0{}\0{mtime}\0{}\n",
            meta.len(),
            archive::is_executable(meta)
        ));
    }
    sha256_hex(text.as_bytes())
}
