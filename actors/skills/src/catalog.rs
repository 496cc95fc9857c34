//! The skills an account can see: local skill folders merged with the manifests of the
//! configured Skill Service spaces (PROTOCOL.md "Skill Service").
//!
//! Merge order: local skills first (`space_id: "local"`, winning a name clash), then each space
//! in `TOOLMESH_SKILL_SPACE_IDS` order; only active skills; the first of a name wins; a space
//! with an allow-list (`TOOLMESH_SKILL_SPACE_ALLOWLISTS`) shows only the skills it names. A
//! space the service cannot list is left out with a line in `warnings`.
//!
//! The bearer token goes to the Skill Service's own origin only: an archive URL (or a redirect)
//! on another scheme, host or port is fetched without it.
//!
//! Every request goes through the kernel's egress policy ([`toolmesh_kernel::egress`]):
//! redirects are followed by hand (at most [`MAX_REDIRECTS`]), each hop checked before it is
//! requested. The Skill Service's own origin is exempt (it may run on loopback or a private
//! network); any other address that is not public is refused (`blocked_url` with `reason`)
//! unless `TOOLMESH_SKILL_ALLOWED_NETWORKS` names its network.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolmesh_kernel::config::Secret;
use toolmesh_kernel::egress::{Egress, FetchError};
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::skills::{is_skill_name, LOCAL_SPACE_ID};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{ErrorCode, ToolError};
use url::Url;

use crate::config::SkillsConfig;

use crate::frontmatter;

/// A manifest entry, as the Skill Service lists it (and as `list_skills` answers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillManifest {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub space_id: String,
    #[serde(default = "active")]
    pub status: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub examples: Vec<String>,
}

fn active() -> String {
    "active".into()
}

impl SkillManifest {
    /// An active skill's manifest naming it and nothing else: what a listing's `{"name": …}`
    /// reads as.
    pub fn new(name: impl Into<String>) -> SkillManifest {
        SkillManifest {
            name: name.into(),
            description: String::new(),
            version: String::new(),
            space_id: String::new(),
            status: active(),
            tags: Vec::new(),
            aliases: Vec::new(),
            examples: Vec::new(),
        }
    }

    pub fn is_active(&self) -> bool {
        self.status == "active"
    }
}

/// `GET …/skills` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestList {
    pub skills: Vec<SkillManifest>,
}

/// `GET …/download` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DownloadInfo {
    pub url: String,
    pub sha256: String,
}

/// Where a skill comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A folder under `TOOLMESH_SKILLS_DIR` holding `SKILL.md`.
    Local(PathBuf),
    /// A space of the Skill Service.
    Remote,
}

/// A skill of the merged catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogSkill {
    pub manifest: SkillManifest,
    pub source: Source,
}

/// The merged catalog of one moment.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub skills: Vec<CatalogSkill>,
    pub warnings: Vec<String>,
}

impl Catalog {
    pub fn get(&self, name: &str) -> Option<&CatalogSkill> {
        self.skills.iter().find(|s| s.manifest.name == name)
    }

    pub fn names(&self) -> Vec<String> {
        self.skills
            .iter()
            .map(|s| s.manifest.name.clone())
            .collect()
    }

    /// `skill_not_found` with `available_skills`.
    pub fn not_found(&self, name: &str) -> CatalogError {
        CatalogError::SkillNotFound {
            name: name.to_owned(),
            available: self.names(),
            warnings: self.warnings.clone(),
        }
    }
}

/// Reads the local skills: each folder directly under `dir` that holds a regular `SKILL.md`
/// (symlinks are not followed). The name is the front matter's when it is a valid skill name,
/// else the folder's. A folder whose `SKILL.md` is unreadable is left out with a warning.
pub fn local_skills(dir: &Path, warnings: &mut Vec<String>) -> Vec<CatalogSkill> {
    let Ok(read) = fs::read_dir(dir) else {
        return Vec::new(); // no local skills folder: no local skills
    };
    let mut folders: Vec<(String, PathBuf)> = read
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
        .collect();
    folders.sort();
    let mut out: Vec<CatalogSkill> = Vec::new();
    for (folder, path) in folders {
        let skill_md = path.join("SKILL.md");
        match fs::symlink_metadata(&skill_md) {
            Ok(meta) if meta.is_file() => {}
            _ => continue,
        }
        let doc = match fs::read_to_string(&skill_md)
            .map_err(|e| e.to_string())
            .and_then(|text| frontmatter::parse(&text))
        {
            Ok(doc) => doc,
            Err(why) => {
                warnings.push(format!(
                    "local skill '{folder}' is left out: SKILL.md {why}"
                ));
                continue;
            }
        };
        let name = match doc.name.as_deref() {
            Some(n) if is_skill_name(n) => n.to_owned(),
            _ if is_skill_name(&folder) => folder.clone(),
            _ => {
                warnings.push(format!(
                    "local skill folder {folder:?} is left out: not a valid skill name"
                ));
                continue;
            }
        };
        if doc.status.as_deref().is_some_and(|s| s != "active") {
            continue;
        }
        if out.iter().any(|s| s.manifest.name == name) {
            continue;
        }
        out.push(CatalogSkill {
            manifest: SkillManifest {
                name,
                description: doc.description.unwrap_or_default(),
                version: doc.version.unwrap_or_default(),
                space_id: LOCAL_SPACE_ID.into(),
                status: "active".into(),
                tags: doc.tags,
                aliases: doc.aliases,
                examples: doc.examples,
            },
            source: Source::Local(path),
        });
    }
    out
}

/// Why a Skill Service request (a list, a download's whereabouts, an archive) brought nothing
/// usable back.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// No skill of the catalog has that name; `warnings` says which spaces could not be listed.
    #[error(
        "no active skill is named '{name}'; pick one of available_skills (list_skills shows them){}",
        unlisted(.warnings)
    )]
    SkillNotFound {
        name: String,
        available: Vec<String>,
        warnings: Vec<String>,
    },
    #[error("no Skill Service is configured (TOOLMESH_SKILL_SERVICE_URL)")]
    NotConfigured,
    #[error("the Skill Service URL cannot take a path")]
    BaseUrl,
    /// A hop was refused, unresolved or failed, or the body could not be read.
    #[error("could not fetch {what}")]
    Fetch {
        what: String,
        #[source]
        source: Box<FetchError>,
    },
    #[error("fetching {what} answered HTTP {status}")]
    Status {
        what: String,
        status: reqwest::StatusCode,
    },
    #[error("{what} is larger than TOOLMESH_SKILL_MAX_BYTES ({cap} bytes)")]
    TooBig { what: String, cap: u64 },
    #[error("the Skill Service answered {what} with unreadable JSON: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the Skill Service gave skill '{name}' an unusable archive URL: {source}")]
    ArchiveUrl {
        name: String,
        #[source]
        source: url::ParseError,
    },
    #[error("the archive URL of skill '{name}' is not http or https")]
    ArchiveScheme { name: String },
    #[error("the Skill Service gave skill '{name}' a malformed sha256")]
    Sha256 { name: String },
}

/// The end of a `skill_not_found` message when some spaces could not be listed.
fn unlisted(warnings: &[String]) -> String {
    if warnings.is_empty() {
        String::new()
    } else {
        format!(
            " — some skill spaces could not be listed: {}",
            warnings.join("; ")
        )
    }
}

/// What kind of [`CatalogError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogErrorKind {
    /// No skill has the name: `skill_not_found`.
    SkillNotFound,
    /// No Skill Service is configured: `unavailable`.
    Unavailable,
    /// The egress policy refused a hop: `blocked_url`.
    Blocked,
    /// A hop timed out: `timeout`.
    TimedOut,
    /// The service answered 404: `not_found`.
    NotFound,
    /// The body passed the byte cap: `unsafe_archive`.
    TooBig,
    /// Anything else the service or the network did: `fetch_failed`.
    Failed,
    /// A fault of this node's configuration: `internal`.
    Internal,
}

impl CatalogError {
    pub fn kind(&self) -> CatalogErrorKind {
        match self {
            CatalogError::SkillNotFound { .. } => CatalogErrorKind::SkillNotFound,
            CatalogError::NotConfigured => CatalogErrorKind::Unavailable,
            CatalogError::BaseUrl => CatalogErrorKind::Internal,
            CatalogError::Fetch { source, .. } => match **source {
                FetchError::Refused { .. } => CatalogErrorKind::Blocked,
                FetchError::Send { ref error, .. } if error.is_timeout() => {
                    CatalogErrorKind::TimedOut
                }
                _ => CatalogErrorKind::Failed,
            },
            CatalogError::Status { status, .. } if *status == reqwest::StatusCode::NOT_FOUND => {
                CatalogErrorKind::NotFound
            }
            CatalogError::TooBig { .. } => CatalogErrorKind::TooBig,
            CatalogError::Status { .. }
            | CatalogError::Json { .. }
            | CatalogError::ArchiveUrl { .. }
            | CatalogError::ArchiveScheme { .. }
            | CatalogError::Sha256 { .. } => CatalogErrorKind::Failed,
        }
    }

    /// The wire's sentence: a fetch failure's own (the egress policy's reason, a timeout) after
    /// what was fetched.
    pub fn message(&self) -> String {
        match self {
            CatalogError::Fetch { what, source } => {
                format!("could not fetch {what}: {}", source.to_tool_error().message)
            }
            other => other.to_string(),
        }
    }
}

/// PROTOCOL.md's code and sentence (a refusal keeps the egress policy's `reason`); an
/// `unavailable` or `internal` one logs its cause here.
impl From<CatalogError> for ToolError {
    fn from(e: CatalogError) -> Self {
        if let CatalogError::Fetch { source, .. } = &e {
            let mut error = source.to_tool_error();
            error.message = e.message();
            return error;
        }
        if let CatalogError::SkillNotFound { available, .. } = &e {
            return ToolError::new(ErrorCode::SkillNotFound, e.to_string())
                .with("available_skills", available.clone());
        }
        let code = match e.kind() {
            CatalogErrorKind::SkillNotFound => ErrorCode::SkillNotFound,
            CatalogErrorKind::Unavailable => ErrorCode::Unavailable,
            CatalogErrorKind::NotFound => ErrorCode::NotFound,
            CatalogErrorKind::TooBig => ErrorCode::UnsafeArchive,
            CatalogErrorKind::Internal => ErrorCode::Internal,
            CatalogErrorKind::Blocked => ErrorCode::BlockedUrl,
            CatalogErrorKind::TimedOut => ErrorCode::Timeout,
            CatalogErrorKind::Failed => ErrorCode::FetchFailed,
        };
        if matches!(code, ErrorCode::Unavailable | ErrorCode::Internal) {
            tracing::warn!(error = %DisplayChain(&e), "the Skill Service cannot be asked");
        }
        ToolError::new(code, e.message())
    }
}

/// Redirects a Skill Service request or archive download follows at most.
pub const MAX_REDIRECTS: usize = 5;

/// The Skill Service client.
#[derive(Debug, Clone)]
pub struct ServiceClient {
    http: reqwest::Client,
    egress: Arc<Egress>,
    base: Option<Url>,
    token: Option<Secret>,
    space_ids: Vec<String>,
    allowlists: Vec<(String, Vec<String>)>,
    pub max_download_bytes: u64,
}

impl ServiceClient {
    pub fn new(config: &SkillsConfig) -> Result<Self, String> {
        let base = match &config.service_url {
            None => None,
            Some(raw) => {
                let mut url = Url::parse(raw)
                    .map_err(|e| format!("TOOLMESH_SKILL_SERVICE_URL={raw:?} is not a URL: {e}"))?;
                if !url.path().ends_with('/') {
                    let path = format!("{}/", url.path());
                    url.set_path(&path);
                }
                Some(url)
            }
        };
        let mut egress = Egress::new(&config.allowed_networks)
            .map_err(|e| format!("TOOLMESH_SKILL_ALLOWED_NETWORKS: {e}"))?;
        if let Some(base) = &base {
            egress = egress.allow_origin(base);
        }
        let egress = Arc::new(egress);
        let http = egress
            .client_builder()
            .timeout(config.download_timeout)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            http,
            egress,
            base,
            token: config.service_token.clone(),
            space_ids: config.space_ids.clone(),
            allowlists: config.space_allowlists.clone(),
            max_download_bytes: config.max_bytes,
        })
    }

    pub fn space_ids(&self) -> &[String] {
        &self.space_ids
    }

    fn endpoint(&self, space: &str, rest: &[&str]) -> Result<Url, CatalogError> {
        let base = self.base.as_ref().ok_or(CatalogError::NotConfigured)?;
        let mut url = base.clone();
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|()| CatalogError::BaseUrl)?;
            segments
                .pop_if_empty()
                .extend(["v1", "spaces", space, "skills"]);
            segments.extend(rest);
        }
        Ok(url)
    }

    /// Whether `url` is on the Skill Service's own origin (and so may carry the token).
    pub fn same_origin(&self, url: &Url) -> bool {
        self.base
            .as_ref()
            .is_some_and(|base| base.origin() == url.origin())
    }

    /// The request of one hop: with the token on the service's own origin only.
    fn request(&self, client: &reqwest::Client, url: &Url) -> reqwest::RequestBuilder {
        let request = client.get(url.clone());
        match &self.token {
            Some(token) if self.same_origin(url) => request.bearer_auth(token.expose()),
            _ => request,
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: Url,
        what: &str,
    ) -> Result<T, CatalogError> {
        let body = self.get_bytes(url, what, 4 * 1024 * 1024).await?;
        serde_json::from_slice(&body).map_err(|source| CatalogError::Json {
            what: what.to_owned(),
            source,
        })
    }

    /// A GET, its body capped at `cap` bytes (counted as it arrives).
    pub async fn get_bytes(&self, url: Url, what: &str, cap: u64) -> Result<Vec<u8>, CatalogError> {
        let failed = |source: FetchError| CatalogError::Fetch {
            what: what.to_owned(),
            source: Box::new(source),
        };
        let fetched = self
            .egress
            .get(&self.http, url, MAX_REDIRECTS, |client, url| {
                self.request(client, url)
            })
            .await
            .map_err(failed)?;
        let (final_url, hops, mut response) = (fetched.url, fetched.redirects, fetched.response);
        let status = response.status();
        if !status.is_success() {
            return Err(CatalogError::Status {
                what: what.to_owned(),
                status,
            });
        }
        if response.content_length().is_some_and(|n| n > cap) {
            return Err(too_big(what, cap));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| failed(FetchError::send(e, final_url.clone(), hops)))?
        {
            if (body.len() + chunk.len()) as u64 > cap {
                return Err(too_big(what, cap));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The active manifests of one space (allow-list applied, invalid names left out).
    pub async fn list_space(&self, space: &str) -> Result<Vec<SkillManifest>, CatalogError> {
        let url = self.endpoint(space, &[])?;
        let list: ManifestList = self
            .get_json(url, &format!("the skills of space '{space}'"))
            .await?;
        let allow = self
            .allowlists
            .iter()
            .find(|(s, _)| s == space)
            .map(|(_, names)| names);
        Ok(list
            .skills
            .into_iter()
            .filter(|m| m.is_active() && is_skill_name(&m.name))
            .filter(|m| allow.is_none_or(|names| names.contains(&m.name)))
            .map(|mut m| {
                m.space_id = space.to_owned();
                m
            })
            .collect())
    }

    /// Where to download a skill's archive, and its sha256.
    pub async fn download_info(
        &self,
        space: &str,
        name: &str,
    ) -> Result<(Url, String), CatalogError> {
        let url = self.endpoint(space, &[name, "download"])?;
        let info: DownloadInfo = self
            .get_json(url.clone(), &format!("the download of skill '{name}'"))
            .await?;
        let archive = url
            .join(&info.url)
            .map_err(|source| CatalogError::ArchiveUrl {
                name: name.to_owned(),
                source,
            })?;
        if !matches!(archive.scheme(), "http" | "https") {
            return Err(CatalogError::ArchiveScheme {
                name: name.to_owned(),
            });
        }
        let sha256 = info.sha256.trim().to_ascii_lowercase();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CatalogError::Sha256 {
                name: name.to_owned(),
            });
        }
        Ok((archive, sha256))
    }
}

fn too_big(what: &str, cap: u64) -> CatalogError {
    CatalogError::TooBig {
        what: what.to_owned(),
        cap,
    }
}

/// Builds the merged catalog (see the module docs).
pub async fn catalog(skills_dir: &Path, service: &ServiceClient) -> Catalog {
    let mut warnings = Vec::new();
    let mut skills = local_skills(skills_dir, &mut warnings);
    if !service.space_ids.is_empty() && service.base.is_none() {
        warnings.push(
            "TOOLMESH_SKILL_SPACE_IDS is set but TOOLMESH_SKILL_SERVICE_URL is not: remote skills are not listed".into(),
        );
    } else {
        let lists = futures::future::join_all(
            service
                .space_ids
                .iter()
                .map(|space| async move { (space, service.list_space(space).await) }),
        )
        .await;
        for (space, list) in lists {
            match list {
                Ok(manifests) => {
                    for manifest in manifests {
                        if !skills.iter().any(|s| s.manifest.name == manifest.name) {
                            skills.push(CatalogSkill {
                                manifest,
                                source: Source::Remote,
                            });
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(space = %DisplaySafe(space), error = %DisplayChain(&e), "a skill space is left out");
                    warnings.push(format!("space '{space}': {}", e.message()))
                }
            }
        }
    }
    Catalog { skills, warnings }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_manifest_is_a_listing_entry_with_only_a_name() {
        let listed: SkillManifest = serde_json::from_str(r#"{"name": "pie"}"#).unwrap();
        assert_eq!(SkillManifest::new("pie"), listed);
        assert!(listed.is_active());
    }
}
