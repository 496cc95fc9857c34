//! The claim checks of [`super::Verifier`] against real keys (RSA 2048 and P-256 made here) and
//! a real key set served over HTTP on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind as Jwt;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, get_current_timestamp, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::*;

const ISSUER: &str = "https://kc.example/realms/acme";
/// The default audience of a front listening on [`LISTEN`].
const AUDIENCE: &str = "http://127.0.0.1:8931/mcp";
const LISTEN: &str = "127.0.0.1:8931";

/// A signing key of the test issuer: the private half, its public JWK and the public key's
/// DER (what an algorithm-confusion attacker uses as an HMAC secret).
struct SigningKey {
    kid: &'static str,
    alg: Algorithm,
    private: EncodingKey,
    jwk: Value,
    public_der: Vec<u8>,
}

fn rsa_key(kid: &'static str) -> SigningKey {
    use rsa::pkcs1::EncodeRsaPrivateKey as _;
    use rsa::pkcs8::EncodePublicKey as _;
    let key = rsa::PrivateKey::new(&mut rand::rng(), 2048).expect("an RSA key");
    let der = key.to_pkcs1_der().unwrap();
    let public_der = key
        .to_public_key()
        .to_public_key_der()
        .unwrap()
        .as_bytes()
        .to_vec();
    signing_key(
        kid,
        Algorithm::RS256,
        EncodingKey::from_rsa_der(der.as_bytes()),
        public_der,
    )
}

fn ec_key(kid: &'static str) -> SigningKey {
    use p256::elliptic_curve::Generate as _;
    use p256::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _};
    let key = p256::SecretKey::generate_from_rng(&mut rand::rng());
    let der = key.to_pkcs8_der().unwrap();
    let public_der = key
        .public_key()
        .to_public_key_der()
        .unwrap()
        .as_bytes()
        .to_vec();
    signing_key(
        kid,
        Algorithm::ES256,
        EncodingKey::from_ec_der(der.as_bytes()),
        public_der,
    )
}

fn signing_key(
    kid: &'static str,
    alg: Algorithm,
    private: EncodingKey,
    public_der: Vec<u8>,
) -> SigningKey {
    let mut jwk = Jwk::from_encoding_key(&private, alg).unwrap();
    jwk.common.key_id = Some(kid.to_owned());
    SigningKey {
        kid,
        alg,
        private,
        jwk: serde_json::to_value(jwk).unwrap(),
        public_der,
    }
}

/// The issuer's keys, made once: an RSA key takes a while to make in a debug build.
static RSA: LazyLock<SigningKey> = LazyLock::new(|| rsa_key("rsa-1"));
static RSA_NEXT: LazyLock<SigningKey> = LazyLock::new(|| rsa_key("rsa-2"));
static EC: LazyLock<SigningKey> = LazyLock::new(|| ec_key("ec-1"));

/// Claims that pass, with `changes` applied (a `null` removes the claim).
fn claims(changes: Value) -> Value {
    let now = get_current_timestamp();
    let mut claims = json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "exp": now + 300, "iat": now,
        "toolmesh_account": "acme",
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

/// `claims` signed by `key`, the header naming its kid.
fn token(key: &SigningKey, claims: &Value) -> String {
    let mut header = Header::new(key.alg);
    header.kid = Some(key.kid.to_owned());
    encode(&header, claims, &key.private).unwrap()
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

/// A token of `header` and `claims` with `signature` bytes, made by hand.
fn forged(header: Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        b64(&header),
        b64(claims),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// HS256 over the token's header and claims with `secret`.
fn hs256(header: &Value, claims: &Value, secret: &[u8]) -> String {
    let message = format!("{}.{}", b64(header), b64(claims));
    let signature = jsonwebtoken::crypto::sign(
        message.as_bytes(),
        &EncodingKey::from_secret(secret).unwrap(),
        Algorithm::HS256,
    )
    .unwrap();
    format!("{message}.{signature}")
}

/// A key set served on loopback: what it serves can change, and it counts the fetches.
struct Jwks {
    url: Url,
    served: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Jwks {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Jwks {
    async fn serve(keys: &[&SigningKey]) -> Jwks {
        let served = Arc::new(Mutex::new(Value::Null));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (set, count) = (served.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/certs",
            axum::routing::get(move || {
                count.fetch_add(1, Ordering::SeqCst);
                let body = set.lock().unwrap().to_string();
                async move { body }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/certs", listener.local_addr().unwrap())).unwrap();
        let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let jwks = Jwks {
            url,
            served,
            fetches,
            task,
        };
        jwks.set(keys);
        jwks
    }

    fn set(&self, keys: &[&SigningKey]) {
        let keys: Vec<&Value> = keys.iter().map(|k| &k.jwk).collect();
        *self.served.lock().unwrap() = json!({ "keys": keys });
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// A verifier of this set, fetching it at most once per `floor`.
    fn verifier(&self, floor: Duration) -> Verifier {
        let config = OAuthConfig {
            issuer: ISSUER.to_owned(),
            jwks_url: self.url.clone(),
            audience: None,
            account_claim: DEFAULT_ACCOUNT_CLAIM.to_owned(),
            jwks_refresh: floor,
        };
        Verifier::new(&config, Resource::new(None, LISTEN.parse().unwrap())).unwrap()
    }
}

/// Whether a refusal is the one a case expects.
type Refusal = fn(&OAuthError) -> bool;

/// A case: its name, the token, and the refusal it must get.
type Case = (&'static str, String, Box<dyn Fn(&OAuthError) -> bool>);

/// Each case's token is refused, and as the case says.
async fn check(verifier: &Verifier, cases: Vec<Case>) {
    for (case, token, refused) in cases {
        match verifier.verify(&token).await {
            Ok(grant) => panic!("{case}: accepted as {:?}", grant.caller),
            Err(e) => assert!(
                refused(&e),
                "{case}: refused for another reason: {}",
                DisplayChain(&e)
            ),
        }
    }
}

fn refused_as(kind: Jwt) -> impl Fn(&OAuthError) -> bool {
    move |e| matches!(e, OAuthError::Refused(e) if *e.kind() == kind)
}

#[tokio::test]
async fn rs256_and_es256_tokens_grant_the_account_user_and_session_of_their_claims() {
    let jwks = Jwks::serve(&[&RSA, &EC]).await;
    let verifier = jwks.verifier(Duration::from_secs(3600));
    let now = get_current_timestamp();
    for (key, changes) in [
        (&*RSA, json!({})),
        (&*EC, json!({})),
        // `aud` as a list holding the audience; `nbf` passed.
        (
            &*RSA,
            json!({"aud": ["account", AUDIENCE], "nbf": now - 10}),
        ),
        // Expired 30 s ago, `nbf` 30 s ahead: within the leeway.
        (&*EC, json!({"exp": now - 30, "nbf": now + 30})),
    ] {
        let grant = verifier.verify(&token(key, &claims(changes.clone()))).await;
        let grant = grant.unwrap_or_else(|e| panic!("{changes}: {}", DisplayChain(&e)));
        let caller = &grant.caller;
        assert_eq!(caller.account.as_str(), "acme");
        assert_eq!(caller.user_id.as_deref(), Some("user-1"));
        assert_eq!(caller.name.as_deref(), Some("oauth.user-1"));
        assert_eq!(caller.profile, "default");
        assert_eq!(caller.session, None);
        assert!(!grant.any_session);
    }
    let bound = token(&RSA, &claims(json!({"toolmesh_session": "s-7"})));
    let grant = verifier.verify(&bound).await.unwrap();
    assert_eq!(grant.caller.session.as_deref(), Some("s-7"));
    assert!(!grant.any_session, "a session claim binds the token to it");
    // One fetch served every token.
    assert_eq!(jwks.fetches(), 1);
}

#[tokio::test]
async fn tokens_failing_a_claim_check_are_refused() {
    let jwks = Jwks::serve(&[&RSA, &EC]).await;
    let verifier = jwks.verifier(Duration::from_secs(3600));
    let now = get_current_timestamp();
    let signed = |changes| token(&RSA, &claims(changes));
    let missing = |claim: &'static str| move |e: &OAuthError| matches!(e, OAuthError::MissingClaim { claim: c } if c == claim);
    let bad = |claim: &'static str| move |e: &OAuthError| matches!(e, OAuthError::BadClaim { claim: c, .. } if c == claim);
    let missing_spec = |claim: &'static str| {
        move |e: &OAuthError| {
            matches!(e, OAuthError::Refused(e)
                if matches!(e.kind(), Jwt::MissingRequiredClaim(c) | Jwt::InvalidClaimFormat(c) if c == claim))
        }
    };
    let cases: Vec<Case> = vec![
        (
            "wrong iss",
            signed(json!({"iss": "https://evil.example"})),
            Box::new(refused_as(Jwt::InvalidIssuer)),
        ),
        (
            "iss with a trailing slash",
            signed(json!({"iss": format!("{ISSUER}/")})),
            Box::new(refused_as(Jwt::InvalidIssuer)),
        ),
        (
            "wrong aud",
            signed(json!({"aud": "http://127.0.0.1:8931/other"})),
            Box::new(refused_as(Jwt::InvalidAudience)),
        ),
        (
            "aud list without ours",
            signed(json!({"aud": ["account", "api"]})),
            Box::new(refused_as(Jwt::InvalidAudience)),
        ),
        (
            "no aud",
            signed(json!({"aud": null})),
            Box::new(missing_spec("aud")),
        ),
        (
            "no iss",
            signed(json!({"iss": null})),
            Box::new(missing_spec("iss")),
        ),
        (
            "expired past the leeway",
            signed(json!({"exp": now - 2 * LEEWAY_S})),
            Box::new(refused_as(Jwt::ExpiredSignature)),
        ),
        (
            "nbf in the future",
            signed(json!({"nbf": now + 2 * LEEWAY_S})),
            Box::new(refused_as(Jwt::ImmatureSignature)),
        ),
        (
            "no exp",
            signed(json!({"exp": null})),
            Box::new(missing_spec("exp")),
        ),
        (
            "exp a string",
            signed(json!({"exp": "99999999999"})),
            Box::new(missing_spec("exp")),
        ),
        (
            "nbf a string",
            signed(json!({"nbf": "99999999999"})),
            Box::new(missing_spec("nbf")),
        ),
        (
            "no sub",
            signed(json!({"sub": null})),
            Box::new(missing_spec("sub")),
        ),
        (
            "empty sub",
            signed(json!({"sub": ""})),
            Box::new(bad("sub")),
        ),
        (
            "no account claim",
            signed(json!({"toolmesh_account": null})),
            Box::new(missing("toolmesh_account")),
        ),
        (
            "account of bad syntax",
            signed(json!({"toolmesh_account": "Not An Account"})),
            Box::new(bad("toolmesh_account")),
        ),
        (
            "account too long",
            signed(json!({"toolmesh_account": "a".repeat(65)})),
            Box::new(bad("toolmesh_account")),
        ),
        (
            "account a number",
            signed(json!({"toolmesh_account": 7})),
            Box::new(bad("toolmesh_account")),
        ),
        (
            "session of bad syntax",
            signed(json!({"toolmesh_session": "bad id"})),
            Box::new(bad("toolmesh_session")),
        ),
        (
            "session a list",
            signed(json!({"toolmesh_session": ["s1"]})),
            Box::new(bad("toolmesh_session")),
        ),
    ];
    check(&verifier, cases).await;
}

#[tokio::test]
async fn only_the_algorithm_of_the_key_is_taken_so_none_and_hmac_confusion_are_refused() {
    let jwks = Jwks::serve(&[&RSA, &EC]).await;
    let verifier = jwks.verifier(Duration::from_secs(3600));
    let good = claims(json!({}));
    let header = |alg: &str, kid: &str| json!({"alg": alg, "typ": "JWT", "kid": kid});
    // The algorithm-confusion attack: HS256 with the RSA (or EC) public key's bytes as the
    // HMAC secret, as a verifier that took the algorithm from the token would check it.
    let mut cases: Vec<(&str, String, Refusal)> = Vec::new();
    let algorithm: Refusal = |e| matches!(e, OAuthError::Algorithm { .. });
    for key in [&*RSA, &*EC] {
        let jwk_text = key.jwk.to_string();
        for secret in [&key.public_der[..], jwk_text.as_bytes()] {
            let forged = hs256(&header("HS256", key.kid), &good, secret);
            cases.push(("HS256 signed with the public key", forged, algorithm));
        }
    }
    let stolen = token(&RSA, &good);
    let signature = URL_SAFE_NO_PAD
        .decode(stolen.rsplit('.').next().unwrap())
        .unwrap();
    let (head, _) = stolen.rsplit_once('.').unwrap();
    let mut tampered = signature.clone();
    tampered[10] ^= 1;
    cases.extend([
        (
            "alg none, no signature",
            forged(header("none", "rsa-1"), &good, b""),
            algorithm,
        ),
        (
            "alg None",
            forged(header("None", "rsa-1"), &good, b""),
            algorithm,
        ),
        (
            "PS256",
            forged(header("PS256", "rsa-1"), &good, &signature),
            algorithm,
        ),
        (
            "RS384",
            forged(header("RS384", "rsa-1"), &good, &signature),
            algorithm,
        ),
        // An algorithm of the list, but not the key's.
        (
            "ES256 on the RSA key",
            forged(header("ES256", "rsa-1"), &good, &signature),
            |e| {
                matches!(
                    e,
                    OAuthError::KeyAlgorithm {
                        key: Algorithm::RS256,
                        ..
                    }
                )
            },
        ),
        (
            "RS256 on the EC key",
            forged(header("RS256", "ec-1"), &good, &signature),
            |e| {
                matches!(
                    e,
                    OAuthError::KeyAlgorithm {
                        key: Algorithm::ES256,
                        ..
                    }
                )
            },
        ),
        (
            "no kid",
            forged(json!({"alg": "RS256"}), &good, &signature),
            |e| matches!(e, OAuthError::NoKeyId),
        ),
        (
            "unknown kid",
            forged(header("RS256", "nobody"), &good, &signature),
            |e| matches!(e, OAuthError::UnknownKey { kid } if kid == "nobody"),
        ),
        (
            "a crit header",
            forged(
                json!({"alg": "RS256", "kid": "rsa-1", "crit": ["exp"]}),
                &good,
                &signature,
            ),
            |e| matches!(e, OAuthError::Critical { .. }),
        ),
        // Claims changed after signing; the signature changed.
        (
            "other claims",
            format!(
                "{}.{}.{}",
                b64(&header("RS256", "rsa-1")),
                b64(&claims(json!({"toolmesh_account": "globex"}))),
                stolen.rsplit('.').next().unwrap()
            ),
            |e| matches!(e, OAuthError::Refused(e) if *e.kind() == Jwt::InvalidSignature),
        ),
        (
            "a bit flipped",
            format!("{head}.{}", URL_SAFE_NO_PAD.encode(&tampered)),
            |e| matches!(e, OAuthError::Refused(e) if *e.kind() == Jwt::InvalidSignature),
        ),
        ("a tokens-file token", "tok-a".to_owned(), |e| {
            matches!(e, OAuthError::Malformed { .. })
        }),
        ("four parts", format!("{stolen}.x"), |e| {
            matches!(e, OAuthError::Malformed { .. })
        }),
        (
            "a header of no JSON",
            format!("bm9wZQ.{}", &stolen[stolen.find('.').unwrap() + 1..]),
            |e| matches!(e, OAuthError::Malformed { .. }),
        ),
    ]);
    let cases = cases
        .into_iter()
        .map(|(case, token, refused)| (case, token, Box::new(refused) as _))
        .collect();
    check(&verifier, cases).await;
    // Refusals for the algorithm come before any key is looked up, and the unknown kid came
    // within the floor: one fetch, for the first token that named a key.
    assert_eq!(jwks.fetches(), 1);
    // The unforged token passes: the refusals above are the forgeries'.
    assert!(verifier.verify(&stolen).await.is_ok());
}

#[tokio::test]
async fn an_unknown_kid_fetches_the_key_set_again_at_most_once_per_floor() {
    let jwks = Jwks::serve(&[&RSA]).await;
    let patient = jwks.verifier(Duration::from_secs(3600));
    patient.prefetch().await;
    assert_eq!(jwks.fetches(), 1);
    // The issuer rotates: a token of the new key comes before the floor has passed.
    jwks.set(&[&RSA, &RSA_NEXT]);
    let rotated = token(&RSA_NEXT, &claims(json!({})));
    for kid in ["rsa-2", "made-up-1", "made-up-2", "rsa-2"] {
        let token = if kid == "rsa-2" {
            rotated.clone()
        } else {
            forged(
                json!({"alg": "RS256", "kid": kid}),
                &claims(json!({})),
                b"x",
            )
        };
        let refused = patient.verify(&token).await.unwrap_err();
        assert!(
            matches!(refused, OAuthError::UnknownKey { .. }),
            "{kid}: {}",
            DisplayChain(&refused)
        );
    }
    assert_eq!(jwks.fetches(), 1, "no fetch before the floor has passed");
    assert!(patient
        .verify(&token(&RSA, &claims(json!({}))))
        .await
        .is_ok());

    // Past the floor (none here), the unknown kid fetches the set once and passes.
    jwks.set(&[&RSA]);
    let eager = jwks.verifier(Duration::ZERO);
    eager.prefetch().await;
    assert_eq!(jwks.fetches(), 2);
    jwks.set(&[&RSA_NEXT]);
    assert!(eager.verify(&rotated).await.is_ok());
    assert_eq!(jwks.fetches(), 3);
    // The key the issuer stopped publishing stops working once the set is fetched again.
    let old = token(&RSA, &claims(json!({})));
    let refused = eager.verify(&old).await.unwrap_err();
    assert!(
        matches!(refused, OAuthError::UnknownKey { .. }),
        "{}",
        DisplayChain(&refused).to_string()
    );
}

#[tokio::test]
async fn requests_waiting_for_a_fetch_share_it() {
    let jwks = Jwks::serve(&[&RSA]).await;
    let verifier = Arc::new(jwks.verifier(Duration::from_secs(3600)));
    let token = token(&RSA, &claims(json!({})));
    let mut waiting = Vec::new();
    for _ in 0..8 {
        let (verifier, token) = (verifier.clone(), token.clone());
        waiting.push(tokio::spawn(async move {
            verifier.verify(&token).await.is_ok()
        }));
    }
    for one in waiting {
        assert!(one.await.unwrap());
    }
    assert_eq!(jwks.fetches(), 1);
}

#[tokio::test]
async fn an_unreachable_key_set_refuses_and_keeps_the_keys_held() {
    let jwks = Jwks::serve(&[&RSA]).await;
    let verifier = jwks.verifier(Duration::ZERO);
    let token = token(&RSA, &claims(json!({})));
    assert!(verifier.verify(&token).await.is_ok());
    // The issuer answers garbage: a known kid still verifies with the key held, an unknown
    // one is refused naming the failed fetch.
    *jwks.served.lock().unwrap() = json!("not a key set");
    let unknown = forged(
        json!({"alg": "RS256", "kid": "rsa-9"}),
        &claims(json!({})),
        b"x",
    );
    let refused = verifier.verify(&unknown).await.unwrap_err();
    assert!(
        matches!(&refused, OAuthError::Jwks(JwksError::Syntax { .. })),
        "{}",
        DisplayChain(&refused).to_string()
    );
    assert!(
        DisplayChain(&refused)
            .to_string()
            .contains(jwks.url.as_str()),
        "{}",
        DisplayChain(&refused).to_string()
    );
    assert!(verifier.verify(&token).await.is_ok());
}

#[test]
fn only_signing_keys_of_rs256_of_2048_bits_or_es256_are_taken() {
    let rsa = &RSA.jwk;
    let ec = &EC.jwk;
    let with = |jwk: &Value, changes: Value| {
        let mut jwk = jwk.clone();
        for (k, v) in changes.as_object().unwrap() {
            if v.is_null() {
                jwk.as_object_mut().unwrap().remove(k);
            } else {
                jwk[k] = v.clone();
            }
        }
        jwk
    };
    let short_n = URL_SAFE_NO_PAD.encode([0xC5u8; 128]);
    let set = json!({"keys": [
        with(rsa, json!({"kid": "rsa", "alg": null})),
        with(rsa, json!({"kid": "rsa-rs256", "alg": "RS256", "use": "sig"})),
        with(ec, json!({"kid": "ec", "alg": "ES256"})),
        with(rsa, json!({"kid": "enc", "use": "enc", "alg": "RSA-OAEP"})),
        with(rsa, json!({"kid": "ps256", "alg": "PS256"})),
        with(rsa, json!({"kid": "weak", "n": short_n})),
        with(ec, json!({"kid": "p384", "crv": "P-384"})),
        with(ec, json!({"kid": "ec-as-rs", "alg": "RS256"})),
        with(rsa, json!({"kid": null})),
        {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0", "alg": "HS256"},
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
        {"kty": "weird", "kid": "weird"},
    ]});
    let keys = parse_jwks(set.to_string().as_bytes()).unwrap();
    let mut kids: Vec<(&str, Algorithm)> = keys.iter().map(|(k, v)| (k.as_str(), v.alg)).collect();
    kids.sort_by_key(|(k, _)| *k);
    assert_eq!(
        kids,
        [
            ("ec", Algorithm::ES256),
            ("rsa", Algorithm::RS256),
            ("rsa-rs256", Algorithm::RS256)
        ]
    );
    assert!(parse_jwks(b"[]").is_err());
}

#[test]
fn an_oauth_token_is_named_by_its_sub_or_its_hash() {
    assert_eq!(token_name("user-1"), "oauth.user-1");
    assert_eq!(
        token_name("4b1c2d3e-aaaa-bbbb-cccc-0123456789ab"),
        "oauth.4b1c2d3e-aaaa-bbbb-cccc-0123456789ab"
    );
    for sub in ["auth0|abc", "two words", &"x".repeat(60)] {
        let hash = toolmesh_kernel::canonical::sha256_hex(sub.as_bytes());
        assert_eq!(token_name(sub), format!("oauth.{}", &hash[..16]), "{sub}");
        assert!(is_client_name(&token_name(sub)));
    }
}

#[test]
fn the_front_url_names_the_resource_the_audience_and_the_metadata() {
    let listen: SocketAddr = LISTEN.parse().unwrap();
    let local = Resource::new(None, listen);
    assert_eq!(local.resource(), AUDIENCE);
    assert_eq!(
        local.metadata_url(),
        "http://127.0.0.1:8931/.well-known/oauth-protected-resource"
    );
    let public = Url::parse("https://tools.example.com/").unwrap();
    let behind = Resource::new(Some(&public), listen);
    assert_eq!(behind.resource(), "https://tools.example.com/mcp");
    let config = OAuthConfig {
        issuer: ISSUER.to_owned(),
        jwks_url: Url::parse("https://kc.example/certs").unwrap(),
        audience: None,
        account_claim: DEFAULT_ACCOUNT_CLAIM.to_owned(),
        jwks_refresh: Duration::from_secs(DEFAULT_JWKS_REFRESH_S),
    };
    let verifier = Verifier::new(&config, behind).unwrap();
    assert_eq!(verifier.audience(), "https://tools.example.com/mcp");
    assert_eq!(
        verifier.metadata(),
        json!({"resource": "https://tools.example.com/mcp", "authorization_servers": [ISSUER],
               "bearer_methods_supported": ["header"], "resource_name": "toolmesh"})
    );
    assert_eq!(
        verifier.challenge(None),
        "Bearer resource_metadata=\"https://tools.example.com/.well-known/oauth-protected-resource\""
    );
    let named = OAuthConfig {
        audience: Some("toolmesh".into()),
        ..config
    };
    let verifier = Verifier::new(&named, Resource::new(None, listen)).unwrap();
    assert_eq!(verifier.audience(), "toolmesh");
}

#[test]
fn oauth_settings_are_checked_naming_the_variable() {
    let on = [
        (ISSUER_VAR, ISSUER),
        (
            JWKS_URL_VAR,
            "https://kc.example/realms/acme/protocol/openid-connect/certs",
        ),
    ];
    let read = |extra: &[(&'static str, &str)]| {
        let mut env = RawEnv::from_pairs(on);
        for (k, v) in extra {
            env = env.with(k, v);
        }
        OAuthConfig::from_env(&env)
    };
    let config = read(&[]).unwrap().unwrap();
    assert_eq!(config.account_claim, DEFAULT_ACCOUNT_CLAIM);
    assert_eq!(
        config.jwks_refresh,
        Duration::from_secs(DEFAULT_JWKS_REFRESH_S)
    );
    assert_eq!(config.audience, None);
    for url in [
        "http://127.0.0.1:9/certs",
        "http://localhost/certs",
        "http://[::1]:8/c",
    ] {
        assert!(read(&[(JWKS_URL_VAR, url)]).is_ok(), "{url}");
    }
    let custom = read(&[
        (ACCOUNT_CLAIM_VAR, "https://toolmesh.example/account"),
        (JWKS_REFRESH_VAR, "5"),
        (AUDIENCE_VAR, "toolmesh"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(custom.account_claim, "https://toolmesh.example/account");
    assert_eq!(custom.jwks_refresh, Duration::from_secs(5));
    assert_eq!(custom.audience.as_deref(), Some("toolmesh"));

    for (key, value) in [
        (JWKS_URL_VAR, "http://kc.example/certs"),
        (JWKS_URL_VAR, "ftp://kc.example/certs"),
        (JWKS_URL_VAR, "not a url"),
        (JWKS_REFRESH_VAR, "0"),
        (JWKS_REFRESH_VAR, "3601"),
        (ACCOUNT_CLAIM_VAR, "a\"b"),
        (ACCOUNT_CLAIM_VAR, "two words"),
    ] {
        let err = read(&[(key, value)]).unwrap_err().to_string();
        assert!(err.contains(key), "{key}={value}: {err}");
    }
    // Half a configuration is refused, naming what is missing.
    for (set, names) in [
        (ISSUER_VAR, JWKS_URL_VAR),
        (JWKS_URL_VAR, ISSUER_VAR),
        (AUDIENCE_VAR, ISSUER_VAR),
        (ACCOUNT_CLAIM_VAR, ISSUER_VAR),
    ] {
        let env = RawEnv::from_pairs([(set, "https://kc.example/x")]);
        let err = OAuthConfig::from_env(&env).unwrap_err().to_string();
        assert!(err.contains(set) && err.contains(names), "{set}: {err}");
    }
    assert_eq!(OAuthConfig::from_env(&RawEnv::default()).unwrap(), None);

    for bad in ["ftp://x.example", "https://x.example/?q=1", "/relative"] {
        let err = public_url(&RawEnv::from_pairs([(PUBLIC_URL_VAR, bad)])).unwrap_err();
        assert!(err.to_string().contains(PUBLIC_URL_VAR), "{bad}: {err}");
    }
}
