//! OAuth access tokens on the MCP front (`actors/mcp/src/oauth.rs`, PROTOCOL.md "Clients:
//! Python, agent frameworks, OAuth"): a real node with the OAuth variables, and the test as the
//! issuer (RSA and P-256 keys made here, its key set served on loopback). MCP goes over real
//! HTTP: the official Python client (`tests/python/mcp_client.py`) for initialize, tools/list
//! and tools/call, raw JSON-RPC POSTs where a status or a header is the point.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use futures::StreamExt as _;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, get_current_timestamp, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use toolmesh_testkit::wait_until;

use crate::mcp::{client, reply};
use crate::support::{mcp_body, tokens_file, Cluster, Recorder};

/// The issuer the node trusts (a name only: its keys come from [`Issuer::jwks`]).
const ISSUER: &str = "https://login.test/realms/tools";
/// How often the node may fetch the key set: short, so the rotation test is quick.
const REFRESH_S: &str = "1";
/// How long a request may take to be answered.
const WITHIN: Duration = Duration::from_secs(30);

/// A signing key: its kid and algorithm, the private half, the public JWK and the public key's
/// DER (the HMAC secret of the algorithm-confusion attack).
struct SigningKey {
    kid: &'static str,
    alg: Algorithm,
    private: EncodingKey,
    jwk: Value,
    public_der: Vec<u8>,
}

impl SigningKey {
    fn rsa(kid: &'static str) -> SigningKey {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        use rsa::pkcs8::EncodePublicKey as _;
        let key = rsa::PrivateKey::new(&mut rand::rng(), 2048).expect("an RSA key");
        let public_der = key.to_public_key().to_public_key_der().unwrap();
        let private = EncodingKey::from_rsa_der(key.to_pkcs1_der().unwrap().as_bytes());
        Self::new(kid, Algorithm::RS256, private, public_der.as_bytes())
    }

    fn p256(kid: &'static str) -> SigningKey {
        use p256::elliptic_curve::Generate as _;
        use p256::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _};
        let key = p256::SecretKey::generate_from_rng(&mut rand::rng());
        let public_der = key.public_key().to_public_key_der().unwrap();
        let private = EncodingKey::from_ec_der(key.to_pkcs8_der().unwrap().as_bytes());
        Self::new(kid, Algorithm::ES256, private, public_der.as_bytes())
    }

    fn new(kid: &'static str, alg: Algorithm, private: EncodingKey, public: &[u8]) -> SigningKey {
        let mut jwk = Jwk::from_encoding_key(&private, alg).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        SigningKey {
            kid,
            alg,
            private,
            jwk: serde_json::to_value(jwk).unwrap(),
            public_der: public.to_vec(),
        }
    }

    /// `claims` signed with this key, the header naming its kid.
    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.to_owned());
        encode(&header, claims, &self.private).unwrap()
    }
}

/// The test's issuer: its keys, and its key set served over HTTP (each fetch recorded).
struct Issuer {
    rsa: SigningKey,
    ec: SigningKey,
    served: Arc<Mutex<Vec<Value>>>,
    jwks: Recorder<()>,
}

impl Issuer {
    async fn start() -> Issuer {
        let (rsa, ec) = (SigningKey::rsa("rsa-1"), SigningKey::p256("ec-1"));
        let served = Arc::new(Mutex::new(vec![rsa.jwk.clone(), ec.jwk.clone()]));
        let keys = served.clone();
        let jwks = Recorder::serve(move |fetches| {
            axum::Router::new().route(
                "/realms/tools/protocol/openid-connect/certs",
                axum::routing::get(move || {
                    fetches.lock().unwrap().push(());
                    let body = json!({"keys": *keys.lock().unwrap()}).to_string();
                    async move { ([("content-type", "application/json")], body) }
                }),
            )
        })
        .await;
        Issuer {
            rsa,
            ec,
            served,
            jwks,
        }
    }

    fn jwks_url(&self) -> String {
        format!(
            "{}/realms/tools/protocol/openid-connect/certs",
            self.jwks.base
        )
    }

    /// Publishes `key` beside the others.
    fn publish(&self, key: &SigningKey) {
        self.served.lock().unwrap().push(key.jwk.clone());
    }

    fn fetches(&self) -> usize {
        self.jwks.records().len()
    }
}

/// A node serving MCP with OAuth on (the audience its own URL, the default), the issuer, and
/// the tokens file's `tok-a` (acme) beside it.
struct Front {
    c: Cluster,
    issuer: Issuer,
    /// `http://127.0.0.1:<port>`: the front's own URL.
    base: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Front {
    async fn start() -> Front {
        let issuer = Issuer::start().await;
        let (dir, tokens) = tokens_file(&json!({"tok-a": {"account": "acme", "name": "static"}}));
        let jwks_url = issuer.jwks_url();
        let mut c = Cluster::servers().await;
        let env = [
            ("TOOLMESH_MCP_OAUTH_ISSUER", ISSUER),
            ("TOOLMESH_MCP_OAUTH_JWKS_URL", jwks_url.as_str()),
            ("TOOLMESH_MCP_OAUTH_JWKS_REFRESH_S", REFRESH_S),
        ];
        let url = c
            .start_mcp_front("gateway,approval,workspace,mcp", &tokens, &env)
            .await;
        let base = url.strip_suffix("/mcp").unwrap().to_owned();
        Front {
            c,
            issuer,
            base,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    fn metadata_url(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource", self.base)
    }

    /// Claims that pass (account globex, sub alice), with `changes` applied (a `null`
    /// removes the claim).
    fn claims(&self, changes: Value) -> Value {
        let now = get_current_timestamp();
        let mut claims = json!({
            "iss": ISSUER, "aud": ["account", self.url()], "sub": "alice", "iat": now,
            "exp": now + 600, "toolmesh_account": "globex", "azp": "agent-cli",
        });
        for (name, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(name);
            } else {
                claims[name] = value.clone();
            }
        }
        claims
    }

    /// One JSON-RPC POST to `/mcp` (a stateless 2025-11-25 request) with `token` and
    /// `session`: its status, `WWW-Authenticate` and body.
    async fn post(
        &self,
        message: &Value,
        token: Option<&str>,
        session: Option<&str>,
    ) -> (u16, String, Value) {
        let mut request = self
            .http
            .post(self.url())
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2025-11-25")
            .body(message.to_string());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(session) = session {
            request = request.header("x-toolmesh-session", session);
        }
        let response = tokio::time::timeout(WITHIN, request.send())
            .await
            .expect("the front answers in time")
            .expect("the front answers");
        let status = response.status().as_u16();
        let challenge = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(mcp_body(&text)).unwrap_or(Value::String(text.clone()));
        (status, challenge, body)
    }

    /// `workspace_status` called with `token` and `session`: the status and the ToolReply
    /// (or, for a refusal, the body).
    async fn workspace_status(&self, token: &str, session: Option<&str>) -> (u16, Value) {
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                          "params": {"name": "workspace_status", "arguments": {}}});
        let (status, _, body) = self.post(&call, Some(token), session).await;
        let reply = match body["result"]["structuredContent"].clone() {
            Value::Null => body,
            reply => reply,
        };
        (status, reply)
    }

    /// The MCP spec of the Python client for `token` and `session`.
    fn client(&self, token: &str, session: &str) -> Value {
        json!({"http": self.url(), "token": token, "session": session})
    }
}

/// An `initialize` request, a client's first message.
fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "oauth-test", "version": "0"}}})
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

/// The RunEvents of the next `workspace_status` call among `events`, up to its `finished`.
async fn status_events(events: &mut async_nats::Subscriber) -> Vec<Value> {
    let mut seen = Vec::new();
    let finished = tokio::time::timeout(WITHIN, async {
        while let Some(msg) = events.next().await {
            let event: Value = serde_json::from_slice(&msg.payload).unwrap();
            if event["tool"] == "workspace_status" {
                let done = event["kind"] == "finished";
                seen.push(event);
                if done {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(
        finished,
        Ok(true),
        "no finished workspace_status: {seen:#?}"
    );
    seen
}

/// The workspace root a `workspace_status` reply names: `…/accounts/<a>/sessions/<s>/workspace`.
fn root(reply: &Value) -> &str {
    reply["root"]
        .as_str()
        .unwrap_or_else(|| panic!("no workspace root: {reply:#}"))
}

#[tokio::test]
async fn the_front_names_its_issuer_and_refuses_every_other_token_with_a_challenge() {
    let f = Front::start().await;
    let metadata = f.metadata_url();

    // RFC 9728: the document, at both places, to anyone.
    for path in [metadata.clone(), format!("{metadata}/mcp")] {
        let response = f.http.get(&path).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let document: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(document["resource"], f.url(), "{document:#}");
        assert_eq!(document["authorization_servers"], json!([ISSUER]));
        assert_eq!(document["bearer_methods_supported"], json!(["header"]));
    }

    // No token: 401 naming the document, with no error (RFC 6750 §3.1).
    let (status, challenge, _) = f.post(&initialize(), None, None).await;
    assert_eq!(status, 401);
    assert_eq!(
        challenge,
        format!("Bearer resource_metadata=\"{metadata}\"")
    );

    let now = get_current_timestamp();
    let rsa = &f.issuer.rsa;
    let header = |alg: &str, kid: &str| json!({"alg": alg, "typ": "JWT", "kid": kid});
    let good = f.claims(json!({}));
    // The attack: HS256 "signed" with the RSA public key as the HMAC secret, for a verifier
    // that takes the algorithm from the token.
    let confused = {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(rsa.kid.to_owned());
        let secret = EncodingKey::from_secret(&rsa.public_der).unwrap();
        encode(&header, &good, &secret).unwrap()
    };
    let signature = rsa.sign(&good).rsplit('.').next().unwrap().to_owned();
    let refused = [
        (
            "an unknown static token",
            "nope".to_owned(),
            "neither a known token",
        ),
        (
            "expired",
            rsa.sign(&f.claims(json!({"exp": now - 3600}))),
            "expired",
        ),
        (
            "another audience",
            rsa.sign(&f.claims(json!({"aud": "http://elsewhere.test/mcp"}))),
            "another audience",
        ),
        (
            "another issuer",
            rsa.sign(&f.claims(json!({"iss": "https://evil.test"}))),
            "another issuer",
        ),
        (
            "nbf in the future",
            rsa.sign(&f.claims(json!({"nbf": now + 3600}))),
            "not valid yet",
        ),
        (
            "no account claim",
            rsa.sign(&f.claims(json!({"toolmesh_account": null}))),
            "no toolmesh_account claim",
        ),
        (
            "a bad account",
            rsa.sign(&f.claims(json!({"toolmesh_account": "a b"}))),
            "toolmesh_account claim is not valid",
        ),
        ("HS256 with the public key", confused, "RS256 or ES256"),
        (
            "alg none",
            format!("{}.{}.", b64(&header("none", "rsa-1")), b64(&good)),
            "RS256 or ES256",
        ),
        (
            "ES256 on the RSA key",
            format!(
                "{}.{}.{signature}",
                b64(&header("ES256", "rsa-1")),
                b64(&good)
            ),
            "RS256 or ES256",
        ),
        (
            "claims changed after signing",
            format!(
                "{}.{}.{signature}",
                b64(&header("RS256", "rsa-1")),
                b64(&f.claims(json!({"toolmesh_account": "acme"})))
            ),
            "signature",
        ),
    ];
    for (case, token, says) in refused {
        let (status, challenge, body) = f.post(&initialize(), Some(&token), None).await;
        assert_eq!(status, 401, "{case}: {body}");
        assert!(
            challenge.starts_with(&format!(
                "Bearer resource_metadata=\"{metadata}\", error=\"invalid_token\", error_description=\""
            )),
            "{case}: {challenge}"
        );
        assert!(challenge.contains(says), "{case}: {challenge}");
        assert_eq!(body["error"], "invalid_token", "{case}: {body}");
    }

    // The same token unforged, and a tokens-file token beside OAuth, are served.
    for token in [rsa.sign(&good), "tok-a".to_owned()] {
        let (status, _, body) = f.post(&initialize(), Some(&token), None).await;
        assert_eq!(status, 200, "{body}");
        assert!(body["result"]["protocolVersion"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn rs256_and_es256_access_tokens_list_and_call_tools_as_their_claims_say() {
    let f = Front::start().await;
    let rs256 = f.issuer.rsa.sign(&f.claims(json!({})));
    let es256 = f.issuer.ec.sign(&f.claims(json!({"sub": "bob"})));
    let mut events = f.c.watch("toolmesh.v1.events.globex.*").await;

    // RS256, with the initialize handshake: list, then call.
    let lines = client(
        f.client(&rs256, "s1"),
        json!({"mode": "legacy", "steps": [{"list": true}, {"call": "workspace_status"}]}),
    )
    .await;
    let listed = lines
        .iter()
        .find(|l| l["step"] == 0)
        .and_then(|l| l["tools"].as_array())
        .unwrap_or_else(|| panic!("no tool list: {lines:#?}"));
    assert!(
        listed.iter().any(|t| t["name"] == "workspace_status"),
        "{listed:#?}"
    );
    let status = reply(&lines, 1);
    assert_eq!(status["ok"], true, "{status:#}");
    assert!(
        root(&status).ends_with("accounts/globex/sessions/s1/workspace"),
        "the account is the claim's: {status:#}"
    );
    // `sub` is the call's user_id.
    let seen = status_events(&mut events).await;
    assert!(seen.iter().all(|e| e["user_id"] == "alice"), "{seen:#?}");

    // ES256, as a 2026-07-28 client.
    let status = one_status(&f, &es256, "s2").await;
    assert!(
        root(&status).ends_with("accounts/globex/sessions/s2/workspace"),
        "{status:#}"
    );
    let seen = status_events(&mut events).await;
    assert!(seen.iter().all(|e| e["user_id"] == "bob"), "{seen:#?}");

    // The tokens file's token still works, as its own account.
    let status = one_status(&f, "tok-a", "s3").await;
    assert!(
        root(&status).ends_with("accounts/acme/sessions/s3/workspace"),
        "{status:#}"
    );
}

#[tokio::test]
async fn a_session_claim_binds_the_token_to_its_session() {
    let f = Front::start().await;
    let bound = f
        .issuer
        .rsa
        .sign(&f.claims(json!({"toolmesh_session": "own"})));
    // The attack: the bound token names another session.
    let (status, body) = f.workspace_status(&bound, Some("victim")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "forbidden", "{body}");
    // Its own session, named or not, is served.
    for session in [Some("own"), None] {
        let (status, reply) = f.workspace_status(&bound, session).await;
        assert_eq!(status, 200, "{session:?}: {reply}");
        assert!(
            root(&reply).ends_with("accounts/globex/sessions/own/workspace"),
            "{session:?}: {reply:#}"
        );
    }
    // A token without the claim may name any session: the 403 above is the binding.
    let free = f.issuer.ec.sign(&f.claims(json!({})));
    let (status, reply) = f.workspace_status(&free, Some("victim")).await;
    assert_eq!(status, 200, "{reply}");
    assert!(
        root(&reply).ends_with("accounts/globex/sessions/victim/workspace"),
        "{reply:#}"
    );
}

#[tokio::test]
async fn a_new_signing_key_is_fetched_on_its_first_token_and_made_up_kids_cannot_hammer_the_issuer()
{
    let f = Front::start().await;
    let floor = Duration::from_secs(REFRESH_S.parse().unwrap());
    let first = f.issuer.rsa.sign(&f.claims(json!({})));
    let (status, _) = f.workspace_status(&first, Some("r1")).await;
    assert_eq!(status, 200);
    assert_eq!(
        f.issuer.fetches(),
        1,
        "the key set is fetched once, at start-up"
    );

    // The issuer rotates to a new key; the node learns of it from the first token naming it.
    let next = SigningKey::rsa("rsa-2");
    f.issuer.publish(&next);
    let rotated = next.sign(&f.claims(json!({"sub": "carol"})));
    let accepted = wait_until(WITHIN, || async {
        f.workspace_status(&rotated, Some("r1")).await.0 == 200
    })
    .await;
    assert!(
        accepted,
        "a token of the new key is taken once the floor has passed"
    );
    assert_eq!(f.issuer.fetches(), 2, "one more fetch brought the new key");

    // Tokens naming made-up kids: each refused, and the fetches they cause are bounded by the
    // floor, not by their number.
    let began = Instant::now();
    for i in 0..40 {
        let header = json!({"alg": "RS256", "kid": format!("made-up-{i}")});
        let token = format!("{}.{}.c2ln", b64(&header), b64(&f.claims(json!({}))));
        let (status, _) = f.workspace_status(&token, None).await;
        assert_eq!(status, 401);
    }
    let elapsed = began.elapsed();
    let fetched = f.issuer.fetches() - 2;
    let allowed = (elapsed.as_secs_f64() / floor.as_secs_f64()).floor() as usize + 1;
    assert!(
        fetched <= allowed,
        "{fetched} fetches for 40 made-up kids in {elapsed:?}, at most {allowed} allowed"
    );
    // Both keys still serve.
    for token in [&first, &rotated] {
        assert_eq!(f.workspace_status(token, Some("r1")).await.0, 200);
    }
}

/// The reply of `workspace_status`, the one step of a client run with `token` and `session`.
async fn one_status(f: &Front, token: &str, session: &str) -> Value {
    let steps = json!({"steps": [{"call": "workspace_status"}]});
    reply(&client(f.client(token, session), steps).await, 0)
}
