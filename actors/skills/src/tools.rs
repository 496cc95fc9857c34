//! The skill tools (`list_skills`, `search_skills`, `load_skill`) and the bundle subject's
//! server side ([`toolmesh_kernel::skills`]).

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde_json::{json, Map, Value};
use toolmesh_kernel::budget::{self, insert_budgeted};
use toolmesh_kernel::skills::{
    BundleChunk, BundleChunkHeader, BundleCursor, BundlePage, BundleRequest, SkillHead,
    BUNDLE_CONTENT_BUDGET,
};
use toolmesh_kernel::tools::args::{LoadSkillArgs, SearchSkillsArgs};
use toolmesh_kernel::wire::ActorCall;
use toolmesh_kernel::{ErrorCode, ToolError};

use crate::archive::Caps;
use crate::cache::{self, LoadedSkill, Loader};
use crate::catalog::{self, Catalog, Source};
use crate::search;

/// Instructions sent in the skill heads of a bundle's first page, at most (all skills).
const BUNDLE_INSTRUCTIONS_BUDGET: usize = 128 * 1024;
/// Chunk heads of one bundle page, at most (estimated JSON bytes).
const BUNDLE_HEADS_BUDGET: usize = 192 * 1024;

/// Everything the tools need.
#[derive(Debug, Clone)]
pub struct SkillsService {
    pub skills_dir: PathBuf,
    pub loader: Loader,
    pub budget_chars: usize,
}

fn arguments<T: serde::de::DeserializeOwned>(call: &ActorCall) -> Result<T, ToolError> {
    serde_json::from_value(call.arguments.clone())
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, format!("arguments: {e}")))
}

fn fields(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

impl SkillsService {
    pub async fn catalog(&self) -> Catalog {
        catalog::catalog(&self.skills_dir, &self.loader.service).await
    }

    /// Runs one routed call; `fields_limit` ([`budget::fields_limit`]) is what the lists of
    /// `list_skills` and `search_skills` are cut to, with `truncated: true`.
    pub async fn run(
        &self,
        call: &ActorCall,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        match call.tool.as_str() {
            "list_skills" => self.list_skills(fields_limit).await,
            "search_skills" => self.search_skills(arguments(call)?, fields_limit).await,
            "load_skill" => self.load_skill(arguments(call)?).await,
            other => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the skills actor does not run '{other}'"),
            )),
        }
    }

    async fn list_skills(&self, fields_limit: usize) -> Result<Map<String, Value>, ToolError> {
        let catalog = self.catalog().await;
        let skills: Vec<_> = catalog.skills.iter().map(|s| &s.manifest).collect();
        let mut out = fields(json!({
            "skills": skills,
            "skill_space_ids": self.loader.service.space_ids(),
            "warnings": catalog.warnings,
        }));
        budget::fit_list(&mut out, "skills", fields_limit);
        Ok(out)
    }

    async fn search_skills(
        &self,
        args: SearchSkillsArgs,
        fields_limit: usize,
    ) -> Result<Map<String, Value>, ToolError> {
        if args.query.trim().is_empty() {
            return Err(ToolError::invalid_argument(
                "/query",
                "the query is empty; say what the skill should do",
            ));
        }
        let catalog = self.catalog().await;
        let hits = search::search(
            &args.query,
            catalog.skills.iter().map(|s| &s.manifest),
            usize::try_from(args.max_results).unwrap_or(usize::MAX),
        );
        let mut out = fields(json!({
            "query": args.query,
            "results": hits,
            "warnings": catalog.warnings,
        }));
        budget::fit_list(&mut out, "results", fields_limit);
        Ok(out)
    }

    async fn resolve(&self, catalog: &Catalog, name: &str) -> Result<LoadedSkill, ToolError> {
        let skill = catalog.get(name).ok_or_else(|| catalog.not_found(name))?;
        self.loader.load(skill).await
    }

    async fn load_skill(&self, args: LoadSkillArgs) -> Result<Map<String, Value>, ToolError> {
        let catalog = self.catalog().await;
        let loaded = self.resolve(&catalog, args.skill_name.trim()).await?;
        let root = loaded.root.clone();
        let caps = self.loader.caps;
        let files = tokio::task::spawn_blocking(move || list_files(&root, caps))
            .await
            .map_err(|e| ToolError::internal(format!("listing task failed: {e}")))??;
        let script_files: Vec<&str> = files
            .iter()
            .map(|(p, _)| p.as_str())
            .filter(|p| p.starts_with("scripts/"))
            .collect();
        let has_scripts_dir = loaded.root.join("scripts").is_dir();
        let manifest = &loaded.skill.manifest;
        let version = if manifest.version.is_empty() {
            loaded.doc.version.clone().unwrap_or_default()
        } else {
            manifest.version.clone()
        };
        let description = if manifest.description.is_empty() {
            loaded.doc.description.clone().unwrap_or_default()
        } else {
            manifest.description.clone()
        };
        let mut out = Map::new();
        out.insert("name".into(), json!(manifest.name));
        out.insert("version".into(), json!(version));
        out.insert("description".into(), json!(description));
        out.insert("space_id".into(), json!(manifest.space_id));
        out.insert("sha256".into(), json!(loaded.sha256));
        insert_budgeted(
            &mut out,
            "instructions",
            &loaded.doc.instructions,
            self.budget_chars,
        );
        out.insert(
            "tags".into(),
            json!(if loaded.doc.tags.is_empty() {
                &manifest.tags
            } else {
                &loaded.doc.tags
            }),
        );
        out.insert(
            "requires_sandbox".into(),
            json!(loaded.doc.requires_sandbox),
        );
        out.insert("root_dir".into(), json!(loaded.root.display().to_string()));
        out.insert("has_scripts_dir".into(), json!(has_scripts_dir));
        out.insert("script_files".into(), json!(script_files));
        out.insert("cache_hit".into(), json!(loaded.cache_hit));
        out.insert(
            "usage".into(),
            json!(format!(
                "Follow these instructions in your own context. To run the skill's scripts in an isolated runtime, call execute_skills with skill_names [\"{}\"] and your original workflow prompt.",
                manifest.name
            )),
        );
        out.insert("warnings".into(), json!(loaded.warnings));
        Ok(out)
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
                return Err(catalog.not_found(name));
            }
        }
        let mut loaded = Vec::with_capacity(request.names.len());
        for name in &request.names {
            loaded.push(self.resolve(&catalog, name).await?);
        }
        let caps = self.loader.caps;
        let first = request.continue_from.is_none();
        let cursor = request.continue_from.unwrap_or_default();
        tokio::task::spawn_blocking(move || page(&loaded, caps, first, cursor))
            .await
            .map_err(|e| ToolError::internal(format!("bundle task failed: {e}")))?
    }
}

/// The regular files under `root` (no symlinks followed), sorted, with their metadata; caps
/// apply to their count and total size.
pub fn list_files(root: &Path, caps: Caps) -> Result<Vec<(String, fs::Metadata)>, ToolError> {
    let mut out = Vec::new();
    let mut total: u64 = 0;
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| {
            ToolError::internal(format!(
                "cannot read the skill folder {}: {e}",
                dir.display()
            ))
        })?;
        for entry in entries.filter_map(Result::ok) {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
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
                    return Err(ToolError::new(
                        ErrorCode::UnsafeArchive,
                        format!(
                            "the skill folder {} has more than TOOLMESH_SKILL_MAX_ENTRIES ({}) files or TOOLMESH_SKILL_MAX_BYTES ({}) bytes",
                            root.display(),
                            caps.max_entries,
                            caps.max_bytes
                        ),
                    ));
                }
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn page(
    loaded: &[LoadedSkill],
    caps: Caps,
    first: bool,
    cursor: BundleCursor,
) -> Result<BundlePage, ToolError> {
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

fn read_range(path: &Path, offset: u64, len: usize) -> Result<Bytes, ToolError> {
    let fail = |e: std::io::Error| {
        ToolError::internal(format!("cannot read skill file {}: {e}", path.display()))
    };
    let mut file = fs::File::open(path).map_err(fail)?;
    file.seek(SeekFrom::Start(offset)).map_err(fail)?;
    let mut buf = Vec::with_capacity(len);
    file.take(len as u64).read_to_end(&mut buf).map_err(fail)?;
    Ok(Bytes::from(buf))
}
