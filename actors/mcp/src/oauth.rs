//! OAuth for the MCP front's HTTP side (PROTOCOL.md "Clients: Python, agent frameworks, OAuth";
//! MCP authorization): the front as an OAuth 2.1 resource server. With
//! `TOOLMESH_MCP_OAUTH_ISSUER` and `TOOLMESH_MCP_OAUTH_JWKS_URL` set, a bearer token that is not
//! in the tokens file is checked here as a JWT access token ([`Verifier::verify`]), and the
//! front serves the RFC 9728 document naming the issuer ([`routes`]).
//!
//! A token passes when all of this holds; anything else is HTTP 401 `invalid_token`:
//!
//! * its header names a key (`kid`) and no `crit`;
//! * its `alg` is RS256 or ES256 and is the algorithm of that key. The algorithm comes from
//!   the key (an RSA key of 2048 bits or more: RS256; a P-256 key: ES256), never from the
//!   token alone: `none`, HS256 "signed" with the public key (algorithm confusion) and every
//!   other algorithm are refused before any key is looked up;
//! * the signature verifies with that key of the issuer's key set (JWKS);
//! * `iss` is the issuer (the same string), `aud` is or holds the audience, `exp` has not
//!   passed and `nbf`, when present, has come, each with [`LEEWAY_S`] of clock skew; `exp`,
//!   `iss`, `aud` and `sub` are present;
//! * the account claim (`TOOLMESH_MCP_OAUTH_ACCOUNT_CLAIM`, [`DEFAULT_ACCOUNT_CLAIM`]) is an
//!   account (`[A-Za-z0-9_-]{1,64}`), and [`SESSION_CLAIM`], when present, a session id.
//!
//! Such a token grants what a tokens-file entry would: the claim's account with the profile
//! `default`, `sub` as each call's `user_id`, and the session of `toolmesh_session`, bound as a
//! token file's `"session"` is (an `X-Toolmesh-Session` header naming another is 403). Its name,
//! which an in-band decision records as `decided_by: "mcp:<name>"`, is `oauth.<sub>`, or
//! `oauth.` and the first 16 hex digits of the sha256 of `sub` when `oauth.<sub>` is not a
//! client name ([`toolmesh_kernel::wire::is_client_name`]); tokens-file names may not start
//! with `oauth.`.
//!
//! **The key set** is fetched from the JWKS URL (https, or http to a loopback host) when the
//! front starts and kept. A token naming a kid the set lacks fetches it again, and so does the
//! first token after [`JWKS_MAX_AGE`]; but two fetches are at least
//! `TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S` apart ([`DEFAULT_JWKS_REFRESH_S`]), so tokens with
//! made-up kids cannot make the node hammer the issuer, and the requests that wait for a fetch
//! share it. A failed fetch keeps the keys held; a key the issuer stops publishing stops
//! working at the next fetch.
//!
//! **The front's own URL** ([`Resource`]) is `TOOLMESH_MCP_PUBLIC_URL`, else `http://` and the
//! address the front listens on. The resource is that URL and `/mcp`, and the audience unless
//! `TOOLMESH_MCP_OAUTH_AUDIENCE` names another; a 401 names the metadata document,
//! `<front>/.well-known/oauth-protected-resource`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use toolmesh_kernel::error::DisplayChain;
use url::{Host, Url};

use toolmesh_kernel::config::{ConfigError, RawEnv};
use toolmesh_kernel::wire::{is_client_name, json_kind, MAX_PRINCIPAL_LEN};
use toolmesh_kernel::{Account, SessionId};

use crate::{Caller, Token};

/// The URL clients reach the front's root at (`https://mcp.example.com`).
pub const PUBLIC_URL_VAR: &str = "TOOLMESH_MCP_PUBLIC_URL";
/// The issuer: a token's `iss` must be this string.
pub const ISSUER_VAR: &str = "TOOLMESH_MCP_OAUTH_ISSUER";
/// Where the issuer publishes its signing keys (a JWK Set).
pub const JWKS_URL_VAR: &str = "TOOLMESH_MCP_OAUTH_JWKS_URL";
/// The audience a token's `aud` must hold (default: the resource, `<front>/mcp`).
pub const AUDIENCE_VAR: &str = "TOOLMESH_MCP_OAUTH_AUDIENCE";
/// The claim naming the account.
pub const ACCOUNT_CLAIM_VAR: &str = "TOOLMESH_MCP_OAUTH_ACCOUNT_CLAIM";
/// The least time between two fetches of the key set, in seconds.
pub const JWKS_REFRESH_VAR: &str = "TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S";

/// `TOOLMESH_MCP_OAUTH_ACCOUNT_CLAIM`'s default.
pub const DEFAULT_ACCOUNT_CLAIM: &str = "toolmesh_account";
/// The claim binding a token to a session.
pub const SESSION_CLAIM: &str = "toolmesh_session";
/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const LEEWAY_S: u64 = 60;
/// `TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S`'s default.
pub const DEFAULT_JWKS_REFRESH_S: u64 = 30;
/// The longest `TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S`.
pub const MAX_JWKS_REFRESH_S: u64 = 3600;
/// How long a fetched key set serves before the next token fetches it again.
pub const JWKS_MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// How long one fetch of the key set may take.
pub const JWKS_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest key set read.
pub const JWKS_MAX_BYTES: usize = 512 * 1024;
/// The smallest RSA modulus a key may have, in bytes (2048 bits).
pub const MIN_RSA_MODULUS_BYTES: usize = 256;
/// Where the protected-resource metadata is served (RFC 9728), and with `/mcp` after it.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// How an OAuth token's name begins; tokens-file names may not.
pub const NAME_PREFIX: &str = "oauth.";
/// The longest account claim name.
const MAX_CLAIM_NAME: usize = 256;

/// The OAuth settings, when `TOOLMESH_MCP_OAUTH_ISSUER` and `TOOLMESH_MCP_OAUTH_JWKS_URL` are
/// set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthConfig {
    pub issuer: String,
    pub jwks_url: Url,
    /// `TOOLMESH_MCP_OAUTH_AUDIENCE`; `None`: the resource, `<front>/mcp`.
    pub audience: Option<String>,
    pub account_claim: String,
    /// The least time between two fetches of the key set.
    pub jwks_refresh: Duration,
}

fn invalid(key: &'static str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

fn setting<'a>(env: &'a RawEnv, key: &str) -> Option<&'a str> {
    env.get(key).map(str::trim).filter(|v| !v.is_empty())
}

impl OAuthConfig {
    /// `None` when neither the issuer nor the JWKS URL is set; one without the other, or
    /// another OAuth variable without them, is an error naming it.
    pub fn from_env(env: &RawEnv) -> Result<Option<OAuthConfig>, ConfigError> {
        let (issuer, jwks) = match (setting(env, ISSUER_VAR), setting(env, JWKS_URL_VAR)) {
            (Some(issuer), Some(jwks)) => (issuer, jwks),
            (Some(issuer), None) => {
                return Err(invalid(
                    ISSUER_VAR,
                    issuer,
                    format!("set {JWKS_URL_VAR} too: the issuer's keys come from there"),
                ))
            }
            (None, Some(jwks)) => {
                return Err(invalid(
                    JWKS_URL_VAR,
                    jwks,
                    format!("set {ISSUER_VAR} too: a token's iss must name it"),
                ))
            }
            (None, None) => {
                for key in [AUDIENCE_VAR, ACCOUNT_CLAIM_VAR, JWKS_REFRESH_VAR] {
                    if let Some(value) = setting(env, key) {
                        return Err(invalid(
                            key,
                            value,
                            format!("OAuth is off: set {ISSUER_VAR} and {JWKS_URL_VAR} too"),
                        ));
                    }
                }
                return Ok(None);
            }
        };
        let jwks_url = jwks_url(jwks).map_err(|reason| invalid(JWKS_URL_VAR, jwks, reason))?;
        let account_claim = setting(env, ACCOUNT_CLAIM_VAR).unwrap_or(DEFAULT_ACCOUNT_CLAIM);
        let plain = |c: char| c.is_ascii_graphic() && c != '"' && c != '\\';
        if account_claim.len() > MAX_CLAIM_NAME || !account_claim.chars().all(plain) {
            return Err(invalid(
                ACCOUNT_CLAIM_VAR,
                account_claim,
                format!(
                    "use 1 to {MAX_CLAIM_NAME} visible ASCII characters, no quote or backslash"
                ),
            ));
        }
        let jwks_refresh = match setting(env, JWKS_REFRESH_VAR) {
            None => DEFAULT_JWKS_REFRESH_S,
            Some(raw) => raw
                .parse::<u64>()
                .ok()
                .filter(|s| (1..=MAX_JWKS_REFRESH_S).contains(s))
                .ok_or_else(|| {
                    invalid(
                        JWKS_REFRESH_VAR,
                        raw,
                        format!("use whole seconds from 1 to {MAX_JWKS_REFRESH_S}"),
                    )
                })?,
        };
        Ok(Some(OAuthConfig {
            issuer: issuer.to_owned(),
            jwks_url,
            audience: setting(env, AUDIENCE_VAR).map(str::to_owned),
            account_claim: account_claim.to_owned(),
            jwks_refresh: Duration::from_secs(jwks_refresh),
        }))
    }
}

/// The JWKS URL: https, or http to a loopback host (a key set fetched in the clear anywhere
/// else could be anyone's).
fn jwks_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
    let loopback = match url.host() {
        Some(Host::Ipv4(ip)) => ip.is_loopback(),
        Some(Host::Ipv6(ip)) => ip.is_loopback(),
        Some(Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => return Err("the URL names no host".into()),
    };
    match url.scheme() {
        "https" => Ok(url),
        "http" if loopback => Ok(url),
        "http" => Err("use https (http only to a loopback host)".into()),
        other => Err(format!("{other}: use https")),
    }
}

/// `TOOLMESH_MCP_PUBLIC_URL`: an http(s) URL with no query or fragment.
pub fn public_url(env: &RawEnv) -> Result<Option<Url>, ConfigError> {
    let Some(text) = setting(env, PUBLIC_URL_VAR) else {
        return Ok(None);
    };
    let bad = |reason: &str| invalid(PUBLIC_URL_VAR, text, reason);
    let url = Url::parse(text).map_err(|e| bad(&format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(bad("use http(s)://host[:port][/path]"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a query or fragment has no place here"));
    }
    Ok(Some(url))
}

/// The front's own URL, and what is named after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// No trailing slash.
    front: String,
}

impl Resource {
    /// `public` (`TOOLMESH_MCP_PUBLIC_URL`), else `http://<listen>`.
    pub fn new(public: Option<&Url>, listen: SocketAddr) -> Resource {
        let front = match public {
            Some(url) => url.as_str().trim_end_matches('/').to_owned(),
            None => format!("http://{listen}"),
        };
        Resource { front }
    }

    /// The front's URL, no trailing slash.
    pub fn front(&self) -> &str {
        &self.front
    }

    /// The protected resource, `<front>/mcp`: the default audience.
    pub fn resource(&self) -> String {
        format!("{}/mcp", self.front)
    }

    /// The metadata document's URL, `<front>/.well-known/oauth-protected-resource`.
    pub fn metadata_url(&self) -> String {
        format!("{}{METADATA_PATH}", self.front)
    }
}

/// Why a token was refused; each keeps its cause until the HTTP edge logs it.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("the token is not a JWS in compact form: {reason}")]
    Malformed { reason: &'static str },
    #[error("the token's algorithm {alg:?} is not accepted (RS256 and ES256 only)")]
    Algorithm { alg: String },
    #[error("the token's algorithm {alg:?} is not its key's, {key:?}")]
    KeyAlgorithm { alg: String, key: Algorithm },
    #[error("the token names critical header parameters ({names}), which are not understood")]
    Critical { names: String },
    #[error("the token names no key (kid)")]
    NoKeyId,
    #[error("the issuer's key set has no key {kid:?}")]
    UnknownKey { kid: String },
    #[error("the issuer's key set could not be fetched")]
    Jwks(#[source] JwksError),
    #[error("the token does not verify")]
    Refused(#[source] jsonwebtoken::errors::Error),
    #[error("the token has no {claim} claim")]
    MissingClaim { claim: String },
    #[error("the token's {claim} claim is not valid")]
    BadClaim {
        claim: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl OAuthError {
    /// The `error_description` of the 401: says what is wrong, never what the token holds.
    pub fn description(&self) -> String {
        use jsonwebtoken::errors::ErrorKind as Jwt;
        match self {
            OAuthError::Malformed { .. } => {
                "the bearer token is neither a known token nor a JWT access token".into()
            }
            OAuthError::Algorithm { .. } | OAuthError::KeyAlgorithm { .. } => {
                "the access token must be signed RS256 or ES256 with a key of the issuer".into()
            }
            OAuthError::Critical { .. } => "the access token has critical header parameters".into(),
            OAuthError::NoKeyId => "the access token names no key (kid)".into(),
            OAuthError::UnknownKey { .. } => "the access token's key is not the issuer's".into(),
            OAuthError::Jwks(_) => "the issuer's keys are out of reach; try again later".into(),
            OAuthError::Refused(e) => match e.kind() {
                Jwt::ExpiredSignature => "the access token has expired".into(),
                Jwt::ImmatureSignature => "the access token is not valid yet (nbf)".into(),
                Jwt::InvalidIssuer => "the access token is another issuer's".into(),
                Jwt::InvalidAudience => "the access token is for another audience".into(),
                Jwt::InvalidSignature => "the access token's signature does not verify".into(),
                Jwt::MissingRequiredClaim(claim) | Jwt::InvalidClaimFormat(claim) => {
                    format!("the access token's {claim} claim is missing or malformed")
                }
                _ => "the access token does not verify".into(),
            },
            OAuthError::MissingClaim { claim } => format!("the access token has no {claim} claim"),
            OAuthError::BadClaim { claim, .. } => {
                format!("the access token's {claim} claim is not valid")
            }
        }
    }
}

/// Why the key set could not be had.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("GET {url}")]
    Send {
        url: Url,
        #[source]
        source: reqwest::Error,
    },
    #[error("GET {url} answered HTTP {status}")]
    Status {
        url: Url,
        status: reqwest::StatusCode,
    },
    #[error("the key set of {url} is larger than {JWKS_MAX_BYTES} bytes")]
    TooLarge { url: Url },
    #[error("the key set of {url} is not a JWK Set")]
    Syntax {
        url: Url,
        #[source]
        source: serde_json::Error,
    },
    #[error("the key set of {url} has no RS256 or ES256 signing key with a kid")]
    NoKeys { url: Url },
}

/// A key of the set, with the one algorithm it verifies.
struct Key {
    alg: Algorithm,
    decoding: DecodingKey,
}

/// The keys of one fetch, by kid.
struct KeySet {
    keys: HashMap<String, Arc<Key>>,
    fetched: Instant,
}

/// The issuer's keys, fetched as [the module](self) says.
struct KeyCache {
    url: Url,
    http: reqwest::Client,
    /// The least time between two fetches.
    floor: Duration,
    max_age: Duration,
    held: RwLock<Option<Arc<KeySet>>>,
    /// When the last fetch began; held while a fetch runs, so waiting requests share it.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl KeyCache {
    fn held(&self) -> Option<Arc<KeySet>> {
        self.held.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The key `kid` of a fresh set, else of a set fetched now, when the floor allows a fetch.
    async fn key(&self, kid: &str) -> Result<Arc<Key>, OAuthError> {
        let fresh = |set: &KeySet| set.fetched.elapsed() < self.max_age;
        if let Some(set) = self.held().filter(|s| fresh(s)) {
            if let Some(key) = set.keys.get(kid) {
                return Ok(key.clone());
            }
        }
        let mut last = self.last_fetch.lock().await;
        // A fetch another request made while this one waited may have brought the key.
        let held = self.held();
        if let Some(key) = held
            .as_ref()
            .filter(|s| fresh(s))
            .and_then(|s| s.keys.get(kid))
        {
            return Ok(key.clone());
        }
        let unknown = || OAuthError::UnknownKey {
            kid: toolmesh_kernel::text::display_safe(kid).into_owned(),
        };
        if last.is_some_and(|at| at.elapsed() < self.floor) {
            // Too soon for another fetch: what is held (a stale key still verifies).
            return held
                .and_then(|s| s.keys.get(kid).cloned())
                .ok_or_else(unknown);
        }
        match self.fetch(&mut last).await {
            Ok(set) => set.keys.get(kid).cloned().ok_or_else(unknown),
            Err(e) => {
                tracing::warn!(error = %DisplayChain(&e), "cannot fetch the OAuth issuer's keys; keeping those held");
                match held.and_then(|s| s.keys.get(kid).cloned()) {
                    Some(key) => Ok(key),
                    None => Err(OAuthError::Jwks(e)),
                }
            }
        }
    }

    /// Fetches the set now (`last` is the fetch lock, held) and holds it.
    async fn fetch(&self, last: &mut Option<Instant>) -> Result<Arc<KeySet>, JwksError> {
        *last = Some(Instant::now());
        let body = self.download().await?;
        let keys = parse_jwks(&body).map_err(|source| JwksError::Syntax {
            url: self.url.clone(),
            source,
        })?;
        if keys.is_empty() {
            return Err(JwksError::NoKeys {
                url: self.url.clone(),
            });
        }
        tracing::info!(url = %self.url, keys = keys.len(), "fetched the OAuth issuer's keys");
        let set = Arc::new(KeySet {
            keys,
            fetched: Instant::now(),
        });
        *self.held.write().unwrap_or_else(|e| e.into_inner()) = Some(set.clone());
        Ok(set)
    }

    async fn download(&self) -> Result<Vec<u8>, JwksError> {
        let url = &self.url;
        let send = |source| JwksError::Send {
            url: url.clone(),
            source,
        };
        let mut response = self
            .http
            .get(url.clone())
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(send)?;
        let status = response.status();
        if !status.is_success() {
            return Err(JwksError::Status {
                url: url.clone(),
                status,
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(send)? {
            if body.len() + chunk.len() > JWKS_MAX_BYTES {
                return Err(JwksError::TooLarge { url: url.clone() });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// The usable keys of a JWK Set: signing keys (no `use`, or `sig`) with a kid that are RSA of
/// 2048 bits or more (RS256) or P-256 (ES256), where `alg`, when given, says the same. Others
/// are skipped (an encryption key, a PS256 key, an HMAC key); for a kid listed twice the first
/// usable key counts.
fn parse_jwks(body: &[u8]) -> Result<HashMap<String, Arc<Key>>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Set {
        keys: Vec<Value>,
    }
    let set: Set = serde_json::from_slice(body)?;
    let mut keys = HashMap::new();
    for value in set.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        let Some(kid) = jwk.common.key_id.clone() else {
            continue;
        };
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != PublicKeyUse::Signature)
        {
            continue;
        }
        let Some(alg) = key_algorithm(&jwk) else {
            continue;
        };
        let Ok(decoding) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        keys.entry(kid)
            .or_insert_with(|| Arc::new(Key { alg, decoding }));
    }
    Ok(keys)
}

/// The one algorithm a key verifies, from its type (and `alg`, when the key gives one).
fn key_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    let (alg, given) = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            let modulus = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(rsa.n.trim_end_matches('='))
                .ok()?;
            let significant = modulus.iter().skip_while(|b| **b == 0).count();
            if significant < MIN_RSA_MODULUS_BYTES {
                return None;
            }
            (Algorithm::RS256, KeyAlgorithm::RS256)
        }
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            (Algorithm::ES256, KeyAlgorithm::ES256)
        }
        _ => return None,
    };
    match jwk.common.key_algorithm {
        None => Some(alg),
        Some(stated) if stated == given => Some(alg),
        Some(_) => None,
    }
}

/// The `alg` of the algorithms a key may verify.
fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::RS256 => "RS256",
        Algorithm::ES256 => "ES256",
        _ => "another",
    }
}

/// What the header of a compact JWS says that matters here.
struct TokenHeader {
    alg: String,
    kid: Option<String>,
}

fn read_header(token: &str) -> Result<TokenHeader, OAuthError> {
    let malformed = |reason| OAuthError::Malformed { reason };
    let mut parts = token.split('.');
    let (Some(head), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("it is not three parts joined by dots"));
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| malformed("its header is not base64url"))?;
    let header: Map<String, Value> =
        serde_json::from_slice(&bytes).map_err(|_| malformed("its header is not a JSON object"))?;
    let Some(Value::String(alg)) = header.get("alg") else {
        return Err(malformed("its header names no alg"));
    };
    if !matches!(alg.as_str(), "RS256" | "ES256") {
        return Err(OAuthError::Algorithm {
            alg: toolmesh_kernel::text::display_safe(alg).into_owned(),
        });
    }
    if let Some(crit) = header.get("crit") {
        return Err(OAuthError::Critical {
            names: toolmesh_kernel::text::display_safe(&crit.to_string()).into_owned(),
        });
    }
    let kid = match header.get("kid") {
        None | Some(Value::Null) => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(malformed("its kid is not a string")),
    };
    Ok(TokenHeader {
        alg: alg.clone(),
        kid,
    })
}

/// Checks access tokens of one issuer ([the module](self)).
pub struct Verifier {
    issuer: String,
    audience: String,
    account_claim: String,
    resource: Resource,
    keys: KeyCache,
}

impl Verifier {
    /// A verifier for the front at `resource`; its HTTP client may fail to build (TLS).
    pub fn new(config: &OAuthConfig, resource: Resource) -> Result<Verifier, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(JWKS_TIMEOUT)
            .https_only(config.jwks_url.scheme() == "https")
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()?;
        Ok(Verifier {
            issuer: config.issuer.clone(),
            audience: config
                .audience
                .clone()
                .unwrap_or_else(|| resource.resource()),
            account_claim: config.account_claim.clone(),
            resource,
            keys: KeyCache {
                url: config.jwks_url.clone(),
                http,
                floor: config.jwks_refresh,
                max_age: JWKS_MAX_AGE,
                held: RwLock::new(None),
                last_fetch: tokio::sync::Mutex::new(None),
            },
        })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn audience(&self) -> &str {
        &self.audience
    }

    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    /// Fetches the key set once (at start-up), so the first token need not wait for it; a
    /// failure is logged and the first token tries again.
    pub async fn prefetch(&self) {
        let mut last = self.keys.last_fetch.lock().await;
        if self.keys.held().is_some() {
            // A token came first and fetched it.
            return;
        }
        if let Err(e) = self.keys.fetch(&mut last).await {
            tracing::warn!(error = %DisplayChain(&e), "cannot fetch the OAuth issuer's keys yet");
        }
    }

    /// The grant of access token `token`, or why it has none.
    pub async fn verify(&self, token: &str) -> Result<Token, OAuthError> {
        let header = read_header(token)?;
        let kid = header.kid.ok_or(OAuthError::NoKeyId)?;
        let key = self.keys.key(&kid).await?;
        // The algorithm is the key's: a header naming another is refused, whatever it says.
        if header.alg != alg_name(key.alg) {
            return Err(OAuthError::KeyAlgorithm {
                alg: header.alg,
                key: key.alg,
            });
        }
        let mut validation = Validation::new(key.alg);
        validation.leeway = LEEWAY_S;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
            .map_err(OAuthError::Refused)?
            .claims;
        self.grant(&claims)
    }

    /// What verified claims grant.
    fn grant(&self, claims: &Map<String, Value>) -> Result<Token, OAuthError> {
        let bad =
            |claim: &str, source: Box<dyn std::error::Error + Send + Sync>| OAuthError::BadClaim {
                claim: claim.to_owned(),
                source,
            };
        let string = |claim: &str| match claims.get(claim) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(bad(
                claim,
                format!("a {} where a string belongs", json_kind(other)).into(),
            )),
        };
        let sub = string("sub")?.ok_or_else(|| OAuthError::MissingClaim {
            claim: "sub".into(),
        })?;
        if sub.is_empty() || sub.len() > MAX_PRINCIPAL_LEN {
            return Err(bad(
                "sub",
                format!("use 1 to {MAX_PRINCIPAL_LEN} bytes").into(),
            ));
        }
        let claim = &self.account_claim;
        let account = string(claim)?.ok_or_else(|| OAuthError::MissingClaim {
            claim: claim.clone(),
        })?;
        let account = Account::parse(account).map_err(|e| bad(claim, Box::new(e)))?;
        let session = string(SESSION_CLAIM)?
            .map(|s| {
                SessionId::parse(s.clone())
                    .map(|_| s)
                    .map_err(|e| bad(SESSION_CLAIM, Box::new(e)))
            })
            .transpose()?;
        Ok(Token {
            caller: Caller {
                account,
                profile: "default".to_owned(),
                session,
                name: Some(token_name(&sub)),
                user_id: Some(sub),
            },
            any_session: false,
        })
    }

    /// The `WWW-Authenticate` of a 401: the metadata document, and `invalid_token` with a
    /// description when a token was refused.
    pub fn challenge(&self, refused: Option<&OAuthError>) -> String {
        let metadata = self.resource.metadata_url();
        match refused {
            None => format!("Bearer resource_metadata=\"{metadata}\""),
            Some(e) => format!(
                "Bearer resource_metadata=\"{metadata}\", error=\"invalid_token\", error_description=\"{}\"",
                e.description()
            ),
        }
    }

    /// The protected-resource metadata (RFC 9728).
    pub fn metadata(&self) -> Value {
        json!({
            "resource": self.resource.resource(),
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "toolmesh",
        })
    }
}

/// The name of the token of `sub` ([the module](self)).
fn token_name(sub: &str) -> String {
    let plain = format!("{NAME_PREFIX}{sub}");
    if is_client_name(&plain) {
        plain
    } else {
        let hash = toolmesh_kernel::canonical::sha256_hex(sub.as_bytes());
        format!("{NAME_PREFIX}{}", &hash[..16])
    }
}

/// The metadata document at [`METADATA_PATH`] and at [`METADATA_PATH`]`/mcp` (RFC 9728
/// §3.1, for the resource `<front>/mcp`), served without a token.
pub fn routes(verifier: &Verifier) -> axum::Router {
    let document: Arc<str> = verifier.metadata().to_string().into();
    let serve = move || {
        let document = document.clone();
        async move {
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                document.to_string(),
            )
        }
    };
    axum::Router::new()
        .route(METADATA_PATH, axum::routing::get(serve.clone()))
        .route(&format!("{METADATA_PATH}/mcp"), axum::routing::get(serve))
}

#[cfg(test)]
#[path = "oauth_tests.rs"]
mod tests;
