//! A small Skill Service: PROTOCOL.md's "Skill Service" HTTP contract, served from memory.
//!
//! `toolmesh skill-service --dir DIR` builds a [`ServiceCatalog`] from a folder of skill folders
//! ([`ServiceCatalog::from_dir`]: each folder holding `SKILL.md` is zipped deterministically and
//! hashed) and serves it; tests build catalogs by hand (hostile archives, wrong hashes, archives
//! on another origin). Routes:
//!
//! * `GET /v1/spaces/{space}/skills` → `{"skills": [manifest…]}` (inactive ones included, as a
//!   real service would list them; the loader filters)
//! * `GET /v1/spaces/{space}/skills/{name}/download` → `{"url", "sha256"}`
//! * `GET /archives/{space}/{name}.zip` → the archive
//!
//! With a token, every route answers 401 unless `Authorization: Bearer <token>` is sent. Every
//! request is recorded (path and `Authorization`) for tests.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use toolmesh_kernel::canonical::sha256_hex;
use toolmesh_kernel::skills::is_skill_name;

use crate::archive::zip_dir;
use crate::catalog::{DownloadInfo, ManifestList, SkillManifest};
use crate::frontmatter;

/// One skill the service serves.
#[derive(Debug, Clone)]
pub struct ServedSkill {
    pub manifest: SkillManifest,
    pub archive: Bytes,
    /// The sha256 the download route announces (normally the archive's).
    pub sha256: String,
    /// An absolute archive URL to announce instead of this service's own.
    pub archive_url: Option<String>,
}

impl ServedSkill {
    /// A skill whose announced hash is its archive's.
    pub fn new(manifest: SkillManifest, archive: Vec<u8>) -> Self {
        let sha256 = sha256_hex(&archive);
        Self {
            manifest,
            archive: Bytes::from(archive),
            sha256,
            archive_url: None,
        }
    }
}

/// Spaces and their skills.
#[derive(Debug, Clone, Default)]
pub struct ServiceCatalog {
    pub spaces: BTreeMap<String, Vec<ServedSkill>>,
}

impl ServiceCatalog {
    pub fn add(&mut self, space: &str, mut skill: ServedSkill) -> &mut Self {
        skill.manifest.space_id = space.to_owned();
        self.spaces.entry(space.to_owned()).or_default().push(skill);
        self
    }

    /// Every folder under `dir` holding `SKILL.md`, in space `space`: name, description,
    /// version, tags, aliases, examples and status from the front matter (the name defaults
    /// to the folder's), the folder zipped deterministically.
    pub fn from_dir(dir: &Path, space: &str) -> Result<ServiceCatalog, String> {
        let mut catalog = ServiceCatalog::default();
        catalog.spaces.insert(space.to_owned(), Vec::new());
        let mut folders: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        folders.sort();
        for folder in folders {
            let skill_md = folder.join("SKILL.md");
            if !skill_md.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&skill_md)
                .map_err(|e| format!("cannot read {}: {e}", skill_md.display()))?;
            let doc = frontmatter::parse(&text)
                .map_err(|why| format!("{}: {why}", skill_md.display()))?;
            let folder_name = folder
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            let name = doc.name.clone().unwrap_or(folder_name);
            if !is_skill_name(&name) {
                return Err(format!(
                    "{}: {name:?} is not a valid skill name",
                    folder.display()
                ));
            }
            let archive =
                zip_dir(&folder).map_err(|e| format!("cannot zip {}: {e}", folder.display()))?;
            catalog.add(
                space,
                ServedSkill::new(
                    SkillManifest {
                        name,
                        description: doc.description.unwrap_or_default(),
                        version: doc.version.unwrap_or_default(),
                        space_id: space.to_owned(),
                        status: doc.status.unwrap_or_else(|| "active".into()),
                        tags: doc.tags,
                        aliases: doc.aliases,
                        examples: doc.examples,
                    },
                    archive,
                ),
            );
        }
        Ok(catalog)
    }
}

/// Options of a running service.
#[derive(Debug, Clone, Default)]
pub struct ServiceOptions {
    /// Required bearer token, if any.
    pub token: Option<String>,
    /// The base URL download links use (default: `http://` + the request's `Host`).
    pub public_url: Option<String>,
}

/// A request the service saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    pub path: String,
    pub authorization: Option<String>,
}

struct Shared {
    catalog: ServiceCatalog,
    options: ServiceOptions,
    seen: Mutex<Vec<SeenRequest>>,
}

type AppState = Arc<Shared>;

/// The routes, over a catalog.
fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/spaces/{space}/skills", get(list))
        .route("/v1/spaces/{space}/skills/{name}/download", get(download))
        .route("/archives/{space}/{file}", get(archive))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// Every request to a route is recorded; one without the required token goes no further.
async fn authorize(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if !record(&state, request.uri(), request.headers()) {
        return unauthorized();
    }
    next.run(request).await
}

/// Records the request; `false` when it lacks the required token.
fn record(state: &Shared, uri: &Uri, headers: &HeaderMap) -> bool {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    state.seen.lock().expect("seen lock").push(SeenRequest {
        path: uri.path().to_owned(),
        authorization: authorization.clone(),
    });
    match &state.options.token {
        Some(token) => authorization.as_deref() == Some(&format!("Bearer {token}")),
        None => true,
    }
}

fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, "a bearer token is required")
}

fn error(status: StatusCode, message: &str) -> Response {
    json(status, &serde_json::json!({ "error": message }))
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(value).expect("a reply serializes"),
    )
        .into_response()
}

fn find<'a>(state: &'a Shared, space: &str, name: &str) -> Option<&'a ServedSkill> {
    state
        .catalog
        .spaces
        .get(space)?
        .iter()
        .find(|s| s.manifest.name == name)
}

async fn list(State(state): State<AppState>, UrlPath(space): UrlPath<String>) -> Response {
    match state.catalog.spaces.get(&space) {
        None => error(StatusCode::NOT_FOUND, "no such space"),
        Some(skills) => json(
            StatusCode::OK,
            &ManifestList {
                skills: skills.iter().map(|s| s.manifest.clone()).collect(),
            },
        ),
    }
}

async fn download(
    State(state): State<AppState>,
    UrlPath((space, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(skill) = find(&state, &space, &name) else {
        return error(StatusCode::NOT_FOUND, "no such skill");
    };
    let url = match &skill.archive_url {
        Some(url) => url.clone(),
        None => {
            let base = match &state.options.public_url {
                Some(base) => base.trim_end_matches('/').to_owned(),
                None => match headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
                    Some(host) => format!("http://{host}"),
                    None => String::new(),
                },
            };
            format!("{base}/archives/{space}/{name}.zip")
        }
    };
    json(
        StatusCode::OK,
        &DownloadInfo {
            url,
            sha256: skill.sha256.clone(),
        },
    )
}

async fn archive(
    State(state): State<AppState>,
    UrlPath((space, file)): UrlPath<(String, String)>,
) -> Response {
    let Some(skill) = file
        .strip_suffix(".zip")
        .and_then(|name| find(&state, &space, name))
    else {
        return error(StatusCode::NOT_FOUND, "no such archive");
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/zip")],
        skill.archive.clone(),
    )
        .into_response()
}

/// Serves `catalog` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    catalog: ServiceCatalog,
    options: ServiceOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = Arc::new(Shared {
        catalog,
        options,
        seen: Mutex::new(Vec::new()),
    });
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// A service running in this process on a free loopback port (tests, demos); stops on drop.
#[derive(Debug)]
pub struct RunningService {
    pub addr: SocketAddr,
    seen: Arc<Shared>,
    _stop: tokio_util::sync::DropGuard,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl RunningService {
    /// Binds `127.0.0.1:0` and serves `catalog` on a task of the current runtime.
    pub async fn start(
        catalog: ServiceCatalog,
        options: ServiceOptions,
    ) -> std::io::Result<RunningService> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Shared {
            catalog,
            options,
            seen: Mutex::new(Vec::new()),
        });
        let stop = tokio_util::sync::CancellationToken::new();
        let app = router(state.clone());
        let cancelled = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { cancelled.cancelled().await })
                .await;
        });
        Ok(RunningService {
            addr,
            seen: state,
            _stop: stop.drop_guard(),
        })
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request seen so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.seen.lock().expect("seen lock").clone()
    }
}

/// `toolmesh skill-service`: serves the skill folders under `dir` as space `space` on
/// `listen` until `shutdown` resolves. Says where it listens on standard error's log.
pub async fn run_from_dir(
    dir: &Path,
    listen: SocketAddr,
    space: &str,
    options: ServiceOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let catalog = ServiceCatalog::from_dir(dir, space)?;
    let count = catalog.spaces.get(space).map_or(0, Vec::len);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    tracing::info!(
        url = %format!("http://{addr}"),
        space,
        skills = count,
        token = options.token.is_some(),
        "skill service listening"
    );
    serve(listener, catalog, options, shutdown)
        .await
        .map_err(|e| format!("the skill service stopped: {e}"))
}
