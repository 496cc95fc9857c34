//! What the skill tools and the bundle subject share: the [`SkillsService`] (the skills folder
//! and the loader), the catalog, bundle pages and the definitions' base (`SKILLS`). The tools
//! themselves are `tools/`, one file each.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use toolmesh_kernel::tools::args::Profile;
use toolmesh_kernel::tools::{BuiltinGroup, ToolDef};
use toolmesh_kernel::Role;

use bytes::Bytes;
use serde_json::{Map, Value};
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::skills::{
    BundleChunk, BundleChunkHeader, BundleCursor, BundlePage, BundleRequest, SkillHead,
    BUNDLE_CONTENT_BUDGET,
};
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::archive::Caps;
use crate::cache::{self, LoadedSkill, Loader};
use crate::catalog::{self, Catalog, Source};

/// What a skill tool's definition says unless it says otherwise: the skills group and role, low
/// risk, no side effect, no session, the `focused` and `coding` profiles.
pub(crate) const SKILLS: ToolDef = ToolDef {
    profiles: &[Profile::Focused, Profile::Coding],
    ..ToolDef::of(BuiltinGroup::Skills, Role::Skills)
};

/// Instructions sent in the skill heads of a bundle's first page, at most (all skills).
pub(crate) const BUNDLE_INSTRUCTIONS_BUDGET: usize = 128 * 1024;
/// Chunk heads of one bundle page, at most (estimated JSON bytes).
pub(crate) const BUNDLE_HEADS_BUDGET: usize = 192 * 1024;

/// Everything the tools need.
#[derive(Debug, Clone)]
pub struct SkillsService {
    pub skills_dir: PathBuf,
    pub loader: Loader,
}

/// Why the files of a loaded skill could not be listed or read.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("cannot read the skill folder {}: {source}", .dir.display())]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the skill folder {} has more than TOOLMESH_SKILL_MAX_ENTRIES ({}) files or TOOLMESH_SKILL_MAX_BYTES ({}) bytes",
        .root.display(),
        .caps.max_entries,
        .caps.max_bytes
    )]
    TooMany { root: PathBuf, caps: Caps },
    #[error("cannot read skill file {}: {source}", .path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The blocking task listing or reading them failed (it panicked).
    #[error("{what} task failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// What kind of [`FilesError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilesErrorKind {
    /// Past a cap: `unsafe_archive`.
    TooMany,
    /// A fault of this node (its disk, a task): `internal`.
    Internal,
}

impl FilesError {
    pub fn kind(&self) -> FilesErrorKind {
        match self {
            FilesError::TooMany { .. } => FilesErrorKind::TooMany,
            _ => FilesErrorKind::Internal,
        }
    }
}

/// PROTOCOL.md's code and sentence; an `internal` one logs its cause here.
impl From<FilesError> for ToolError {
    fn from(e: FilesError) -> Self {
        match e.kind() {
            FilesErrorKind::TooMany => ToolError::new(ErrorCode::UnsafeArchive, e.to_string()),
            FilesErrorKind::Internal => {
                tracing::warn!(error = %DisplayChain(&e), "cannot read a skill's files");
                ToolError::internal(e.to_string())
            }
        }
    }
}

pub(crate) fn fields(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

impl SkillsService {
    pub async fn catalog(&self) -> Catalog {
        catalog::catalog(&self.skills_dir, &self.loader.service).await
    }

    pub(crate) async fn resolve(
        &self,
        catalog: &Catalog,
        name: &str,
    ) -> Result<LoadedSkill, ToolError> {
        let skill = catalog.get(name).ok_or_else(|| catalog.not_found(name))?;
        Ok(self.loader.load(skill).await?)
    }

    /// One page of a bundle (see [`toolmesh_kernel::skills`]).
    pub async fn bundle(&self, request: BundleRequest) -> Result<BundlePage, ToolError> {
        if request.names.is_empty() {
            return Ok(BundlePage::default());
        }
        let catalog = self.catalog().await;
        // Unknown names first, so a typo costs no download.
        for name in &request.names {
            if catalog.get(name).is_none() {
                return Err(catalog.not_found(name).into());
            }
        }
        let mut loaded = Vec::with_capacity(request.names.len());
        for name in &request.names {
            loaded.push(self.resolve(&catalog, name).await?);
        }
        let caps = self.loader.caps;
        let first = request.continue_from.is_none();
        let cursor = request.continue_from.unwrap_or_default();
        let heads_only = request.heads_only;
        let page = tokio::task::spawn_blocking(move || {
            let mut page = page(&loaded, caps, first && !heads_only, cursor)?;
            if heads_only {
                page.chunks.clear();
                page.next = None;
            }
            Ok::<_, FilesError>(page)
        })
        .await
        .map_err(|source| FilesError::Task {
            what: "bundle",
            source,
        })??;
        Ok(page)
    }
}

/// The regular files under `root` (no symlinks followed), sorted, with their metadata; caps
/// apply to their count and total size.
pub fn list_files(root: &Path, caps: Caps) -> Result<Vec<(String, fs::Metadata)>, FilesError> {
    let mut out = Vec::new();
    let mut total: u64 = 0;
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|source| FilesError::ReadDir {
            dir: dir.clone(),
            source,
        })?;
        for entry in entries.filter_map(Result::ok) {
            let Some(path) = crate::archive::path_below(&prefix, &entry) else {
                continue;
            };
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                stack.push((entry.path(), path));
            } else if meta.is_file() {
                total += meta.len();
                out.push((path, meta));
                if out.len() as u64 > caps.max_entries || total > caps.max_bytes {
                    return Err(FilesError::TooMany {
                        root: root.to_path_buf(),
                        caps,
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

pub(crate) fn page(
    loaded: &[LoadedSkill],
    caps: Caps,
    first: bool,
    cursor: BundleCursor,
) -> Result<BundlePage, FilesError> {
    let mut skills = Vec::with_capacity(loaded.len());
    let mut flat: Vec<(usize, String, fs::Metadata)> = Vec::new();
    let mut instructions_left = BUNDLE_INSTRUCTIONS_BUDGET;
    for (i, skill) in loaded.iter().enumerate() {
        let files = list_files(&skill.root, caps)?;
        let fingerprint = match skill.skill.source {
            Source::Local(_) => cache::fingerprint(&files),
            Source::Remote => skill.sha256.clone(),
        };
        let instructions =
            (first && skill.doc.instructions.len() <= instructions_left).then(|| {
                instructions_left -= skill.doc.instructions.len();
                skill.doc.instructions.clone()
            });
        let manifest = &skill.skill.manifest;
        skills.push(SkillHead {
            name: manifest.name.clone(),
            version: if manifest.version.is_empty() {
                skill.doc.version.clone().unwrap_or_default()
            } else {
                manifest.version.clone()
            },
            sha256: skill.sha256.clone(),
            space_id: manifest.space_id.clone(),
            fingerprint,
            instructions,
            file_count: files.len() as u64,
            total_bytes: files.iter().map(|(_, m)| m.len()).sum(),
            sandbox_template: skill.doc.sandbox_template.clone(),
        });
        flat.extend(files.into_iter().map(|(p, m)| (i, p, m)));
    }
    let mut chunks = Vec::new();
    let mut content_left = BUNDLE_CONTENT_BUDGET;
    let mut heads_left = BUNDLE_HEADS_BUDGET;
    let mut at = usize::try_from(cursor.file).unwrap_or(usize::MAX);
    let mut offset = cursor.offset;
    let mut next = None;
    while at < flat.len() {
        let (skill_index, path, meta) = &flat[at];
        let skill = &loaded[*skill_index];
        let head_cost = path.len() + skill.skill.manifest.name.len() + 120;
        if head_cost > heads_left || (content_left == 0 && meta.len() > offset) {
            next = Some(BundleCursor {
                file: at as u64,
                offset,
            });
            break;
        }
        heads_left -= head_cost;
        let size = meta.len();
        let want = usize::try_from(size.saturating_sub(offset))
            .unwrap_or(usize::MAX)
            .min(content_left);
        let content = read_range(&skill.root.join(path), offset, want)?;
        let len = content.len() as u64;
        content_left -= content.len();
        chunks.push(BundleChunk {
            head: BundleChunkHeader {
                skill: skill.skill.manifest.name.clone(),
                path: path.clone(),
                mode: if crate::archive::is_executable(meta) {
                    0o755
                } else {
                    0o644
                },
                offset,
                len,
                size,
            },
            content,
        });
        if offset + len < size && len > 0 {
            offset += len;
            next = Some(BundleCursor {
                file: at as u64,
                offset,
            });
            break;
        }
        // The file is whole (or shrank under us: its fingerprint tells the client).
        at += 1;
        offset = 0;
    }
    Ok(BundlePage {
        skills,
        chunks,
        next,
    })
}

pub(crate) fn read_range(path: &Path, offset: u64, len: usize) -> Result<Bytes, FilesError> {
    let fail = |source: std::io::Error| FilesError::ReadFile {
        path: path.to_path_buf(),
        source,
    };
    let mut file = fs::File::open(path).map_err(fail)?;
    file.seek(SeekFrom::Start(offset)).map_err(fail)?;
    let mut buf = Vec::with_capacity(len);
    file.take(len as u64).read_to_end(&mut buf).map_err(fail)?;
    Ok(Bytes::from(buf))
}
