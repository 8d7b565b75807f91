//! Who is calling, and what they may do.
//!
//! Callers present a bearer JWT. HS256 tokens are checked with a shared
//! secret (development); RS256, ES256 and EdDSA tokens against a JSON Web
//! Key Set, each key used only with its own algorithm, so that a token
//! cannot pick the algorithm its key is read with (an HS256 token "signed"
//! with a public key is refused, and so is `alg: none`). The checked claims
//! are `iss`, `aud`, `exp` and `nbf` (with a small leeway), `sub`, and
//! `org`, which is the tenant. `roles` grants permissions (DESIGN.md §6).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use narad_journal::TenantId;
use narad_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::error::ApiError;

/// Seconds of clock skew tolerated on `exp` and `nbf`: the one value both
/// the check of a request's token and the end of a stream opened with it
/// ([`Principal::valid_until`]) use.
pub const LEEWAY_SECONDS: u64 = 30;

/// A role a token's `roles` claim may grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads sessions, history and capabilities, and watches streams.
    Reader,
    /// Sends commands (start, stop, say, …) and creates sessions.
    Writer,
    /// Resolves interrupts.
    Approver,
    /// Appends authority events (agent runtimes), and reads what it needs.
    Backend,
    /// Attaches as a client executor.
    Executor,
    /// Manages extensions and tenant settings.
    Admin,
}

impl Role {
    /// Every role, in the order of the documentation.
    pub const ALL: [Role; 6] = [
        Role::Reader,
        Role::Writer,
        Role::Approver,
        Role::Backend,
        Role::Executor,
        Role::Admin,
    ];

    /// The role's name in the `roles` claim.
    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Approver => "approver",
            Role::Backend => "backend",
            Role::Executor => "executor",
            Role::Admin => "admin",
        }
    }

    /// The role named `name`.
    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Read sessions, history, capabilities, streams.
    Read,
    /// Send commands and create or archive sessions.
    Command,
    /// Resolve interrupts.
    Approve,
    /// Append authority events.
    Append,
    /// Attach as a client executor.
    Execute,
    /// Manage extensions.
    Admin,
}

impl Permission {
    /// The roles that grant this permission.
    pub fn granted_by(self) -> &'static [Role] {
        match self {
            Permission::Read => &[Role::Reader, Role::Backend],
            Permission::Command => &[Role::Writer],
            Permission::Approve => &[Role::Approver],
            Permission::Append => &[Role::Backend],
            Permission::Execute => &[Role::Executor],
            Permission::Admin => &[Role::Admin],
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant (`org`).
    pub tenant: TenantId,
    /// The subject (`sub`).
    pub subject: String,
    /// The roles granted.
    pub roles: BTreeSet<Role>,
    /// The client executor ids this principal may attach as, when the
    /// token limits them.
    pub executors: Option<Vec<String>>,
    /// The sessions this principal may read, when the token limits them.
    pub sessions: Option<Vec<String>>,
    /// The last second (since the epoch) in which its credential is still
    /// accepted: the token's `exp` plus [`LEEWAY_SECONDS`], as the verifier
    /// checks it. A stream opened with it ends at the start of that second
    /// ([`until_invalid`]), no later than a new request with the same token
    /// is refused. `None` for a signed extension call.
    pub valid_until: Option<u64>,
    /// The registered extension (publisher, name) a signed call came
    /// from; `None` for a token.
    pub extension: Option<(String, String)>,
}

impl Principal {
    /// Whether the principal may see the session's events at all.
    pub fn may_see(&self, session_id: &str) -> bool {
        self.sessions
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|s| s == session_id))
    }

    /// `Ok` when the principal may see the session; a 403 otherwise.
    pub fn require_session(&self, session_id: &str) -> Result<(), ApiError> {
        if self.may_see(session_id) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "this token is limited to other sessions (its `sessions` claim does not \
                 name {session_id:?}); ask for a token that names it"
            ),
        ))
    }

    /// `Ok` when a role of the principal grants `permission`; a 403
    /// naming the roles that would otherwise.
    pub fn require(&self, permission: Permission) -> Result<(), ApiError> {
        let granted_by = permission.granted_by();
        if granted_by.iter().any(|r| self.roles.contains(r)) {
            return Ok(());
        }
        let names: Vec<&str> = granted_by.iter().map(|r| r.name()).collect();
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "this needs a token with the role {}; this token grants [{}]",
                names.join(" or "),
                self.roles
                    .iter()
                    .map(|r| r.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    }
}

/// The claims narad reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: Audience,
    /// Subject.
    pub sub: String,
    /// Tenant.
    pub org: String,
    /// Expiry (seconds since the epoch).
    pub exp: u64,
    /// Not before (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Issued at (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    /// Role names.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Client executor ids the principal may attach as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executors: Option<Vec<String>>,
    /// The sessions the principal may read, when the token limits them
    /// (a token shared for one conversation, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Vec<String>>,
}

/// `aud`: one audience or several.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Where the JSON Web Key Set comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A file, read at start.
    File(PathBuf),
    /// An `https://` URL (or `http://` to this machine's loopback), fetched
    /// at start and again when a token names a key id the set lacks (at
    /// most once per [`AuthSettings::jwks_refetch_interval`]).
    Url(String),
}

/// The least time between two fetches of a key set URL, by default.
pub const JWKS_REFETCH_INTERVAL: Duration = Duration::from_secs(10);

impl JwksSource {
    /// Reads `NARAD_JWKS`: an `https://` URL, an `http://` URL of the
    /// loopback (127.0.0.1, `[::1]`, localhost), or a file path.
    pub fn parse(s: &str) -> Result<JwksSource, String> {
        if s.starts_with("https://") {
            return Ok(JwksSource::Url(s.to_owned()));
        }
        if let Some(rest) = s.strip_prefix("http://") {
            let host = rest.split(['/', '?']).next().unwrap_or("");
            let host = host.rsplit_once(':').map_or(host, |(h, port)| {
                if port.bytes().all(|b| b.is_ascii_digit()) {
                    h
                } else {
                    host
                }
            });
            if ["127.0.0.1", "[::1]", "localhost"].contains(&host) {
                return Ok(JwksSource::Url(s.to_owned()));
            }
            return Err(format!(
                "NARAD_JWKS={s}: a key set travels over https (http only to this machine's loopback)"
            ));
        }
        Ok(JwksSource::File(PathBuf::from(s)))
    }
}

/// How tokens are checked.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// The issuer tokens must name.
    pub issuer: String,
    /// The audience tokens must name.
    pub audience: String,
    /// The HS256 secret, when HS256 tokens are accepted.
    pub hs256_secret: Option<Vec<u8>>,
    /// The key set for RS256, ES256 and EdDSA tokens.
    pub jwks: Option<JwksSource>,
    /// The least time between two fetches of a key set URL.
    pub jwks_refetch_interval: Duration,
}

/// One verification key of the key set, with the one algorithm it checks.
struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// Checks bearer tokens.
pub struct Verifier {
    settings: AuthSettings,
    hs256: Option<DecodingKey>,
    keys: RwLock<Vec<Key>>,
    /// The client that fetches a key set URL, and when it last did.
    fetcher: Option<(reqwest::Client, tokio::sync::Mutex<Instant>)>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("issuer", &self.settings.issuer)
            .field("audience", &self.settings.audience)
            .field("hs256", &self.hs256.is_some())
            .field("jwks", &self.settings.jwks)
            .finish()
    }
}

/// Why a token was refused; each reads to the caller as a 401 message.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// No `Authorization: Bearer` header.
    #[error("send a bearer token: Authorization: Bearer <JWT>")]
    Missing,
    /// Not a JWT, or an algorithm narad does not accept (such as `none`).
    #[error("the bearer token is not a JWT signed with HS256, RS256, ES256 or EdDSA")]
    Malformed,
    /// No key for the token's algorithm or key id.
    #[error("no key of this server verifies the token (algorithm or key id unknown)")]
    UnknownKey,
    /// The signature or a claim failed.
    #[error("the token was refused: {0}")]
    Invalid(&'static str),
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> ApiError {
        ApiError::new(ErrorCode::Unauthenticated, e.to_string())
    }
}

impl Verifier {
    /// A verifier for `settings`, with the key set loaded (fetched, for a
    /// URL).
    pub async fn new(settings: AuthSettings) -> Result<Verifier, String> {
        if settings.hs256_secret.is_none() && settings.jwks.is_none() {
            return Err(
                "no way to check tokens: set NARAD_JWKS (a key set) or NARAD_JWT_HS256_SECRET"
                    .to_owned(),
            );
        }
        let hs256 = match &settings.hs256_secret {
            Some(secret) if secret.len() < 32 => {
                return Err("NARAD_JWT_HS256_SECRET must hold at least 32 bytes".to_owned());
            }
            Some(secret) => Some(
                DecodingKey::from_secret(secret)
                    .map_err(|e| format!("NARAD_JWT_HS256_SECRET: {e}"))?,
            ),
            None => None,
        };
        let (keys, fetcher) = match &settings.jwks {
            Some(JwksSource::File(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("NARAD_JWKS: cannot read {}: {e}", path.display()))?;
                (parse_keys(&text, &path.display().to_string())?, None)
            }
            Some(JwksSource::Url(url)) => {
                install_tls_provider();
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    // A key set is fetched from where it was configured,
                    // never from where a redirect points.
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| format!("NARAD_JWKS: no HTTP client: {e}"))?;
                let keys = fetch_keys(&client, url).await?;
                (
                    keys,
                    Some((client, tokio::sync::Mutex::new(Instant::now()))),
                )
            }
            None => (Vec::new(), None),
        };
        Ok(Verifier {
            settings,
            hs256,
            keys: RwLock::new(keys),
            fetcher,
        })
    }

    /// Fetches the key set URL again, unless it was fetched within the
    /// refetch interval; `true` when the keys were replaced.
    async fn refetch(&self) -> bool {
        let (Some((client, last)), Some(JwksSource::Url(url))) =
            (&self.fetcher, &self.settings.jwks)
        else {
            return false;
        };
        let mut last = last.lock().await;
        if last.elapsed() < self.settings.jwks_refetch_interval {
            return false;
        }
        *last = Instant::now();
        match fetch_keys(client, url).await {
            Ok(keys) => {
                *self.keys.write().expect("the key set") = keys;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "the key set could not be fetched again");
                false
            }
        }
    }

    /// Checks a bearer token and returns its principal.
    pub async fn verify(&self, token: &str) -> Result<Principal, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let claims = match header.alg {
            Algorithm::HS256 => {
                let key = self.hs256.as_ref().ok_or(TokenError::UnknownKey)?;
                self.decode(token, key, Algorithm::HS256)?
            }
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA => {
                match self.decode_with_set(token, &header) {
                    Err(TokenError::UnknownKey) if header.kid.is_some() && self.refetch().await => {
                        self.decode_with_set(token, &header)?
                    }
                    other => other?,
                }
            }
            _ => return Err(TokenError::Malformed),
        };
        principal(claims)
    }

    /// Decodes with the one key of the set that matches the token's
    /// algorithm and key id.
    fn decode_with_set(&self, token: &str, header: &Header) -> Result<Claims, TokenError> {
        let keys = self.keys.read().expect("the key set");
        let candidates: Vec<&Key> = keys
            .iter()
            .filter(|k| k.algorithm == header.alg)
            .filter(|k| match &header.kid {
                Some(kid) => k.kid.as_deref() == Some(kid.as_str()),
                None => true,
            })
            .collect();
        let [key] = candidates[..] else {
            return Err(TokenError::UnknownKey);
        };
        self.decode(token, &key.key, key.algorithm)
    }

    fn decode(
        &self,
        token: &str,
        key: &DecodingKey,
        algorithm: Algorithm,
    ) -> Result<Claims, TokenError> {
        let mut validation = Validation::new(algorithm);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECONDS;
        jsonwebtoken::decode::<Claims>(token, key, &validation)
            .map(|data| data.claims)
            .map_err(|e| {
                use jsonwebtoken::errors::ErrorKind as K;
                TokenError::Invalid(match e.kind() {
                    K::ExpiredSignature => "it has expired",
                    K::ImmatureSignature => "it is not valid yet (nbf)",
                    K::InvalidIssuer => "it names another issuer (iss)",
                    K::InvalidAudience => "it names another audience (aud)",
                    K::InvalidSignature => "its signature does not verify",
                    K::MissingRequiredClaim(_) => "it lacks a required claim (exp, iss, aud, sub)",
                    K::InvalidAlgorithm => "its algorithm does not match its key",
                    _ => "it is malformed",
                })
            })
    }
}

fn principal(claims: Claims) -> Result<Principal, TokenError> {
    if claims.sub.is_empty() {
        return Err(TokenError::Invalid("its subject (sub) is empty"));
    }
    let tenant = TenantId::new(claims.org)
        .map_err(|_| TokenError::Invalid("it names no organisation (org)"))?;
    Ok(Principal {
        tenant,
        subject: claims.sub,
        roles: claims
            .roles
            .iter()
            .filter_map(|r| Role::from_name(r))
            .collect(),
        executors: claims.executors,
        sessions: claims.sessions,
        valid_until: Some(claims.exp.saturating_add(LEEWAY_SECONDS)),
        extension: None,
    })
}

/// Completes at the start of the second `valid_until` (see
/// [`Principal::valid_until`]); never for `None`. Streams and executor
/// sockets end with it.
pub async fn until_invalid(valid_until: Option<u64>) {
    let Some(at) = valid_until else {
        return std::future::pending().await;
    };
    let end = UNIX_EPOCH + Duration::from_secs(at);
    let left = end
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    tokio::time::sleep(left).await;
}

/// Installs the process's TLS crypto provider (ring), once: narad's HTTP
/// client is built without one of its own. Call before building any
/// `reqwest::Client` in a process that links narad-server.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Fetches a key set.
async fn fetch_keys(client: &reqwest::Client, url: &str) -> Result<Vec<Key>, String> {
    let response = client
        .get(url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("NARAD_JWKS: cannot fetch {url}: {e}"))?;
    let text = response
        .text()
        .await
        .map_err(|e| format!("NARAD_JWKS: cannot read {url}: {e}"))?;
    parse_keys(&text, url)
}

/// Reads a key set, keeping each key with the one algorithm it may check.
fn parse_keys(text: &str, origin: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet = serde_json::from_str(text)
        .map_err(|e| format!("NARAD_JWKS: {origin} is not a JSON Web Key Set: {e}"))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                Algorithm::EdDSA
            }
            // Symmetric keys in a published key set, and other curves, are
            // not used.
            _ => continue,
        };
        if let Some(declared) = jwk.common.key_algorithm
            && declared.to_string().parse::<Algorithm>().ok() != Some(algorithm)
        {
            continue;
        }
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
        {
            continue;
        }
        let key = match DecodingKey::from_jwk(jwk) {
            Ok(key) => key,
            Err(e) => {
                tracing::warn!(kid = ?jwk.common.key_id, "{origin}: a key of the set cannot be used: {e}");
                continue;
            }
        };
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            algorithm,
            key,
        });
    }
    if keys.is_empty() {
        return Err(format!(
            "NARAD_JWKS: {origin} holds no RSA, P-256 or Ed25519 public key"
        ));
    }
    Ok(keys)
}

/// Signs an HS256 token for `org`/`sub` with `roles`, valid for `ttl`
/// (`narad token`, tests).
pub fn mint_hs256(
    secret: &[u8],
    issuer: &str,
    audience: &str,
    org: &str,
    sub: &str,
    roles: &[Role],
    ttl: Duration,
) -> Result<String, String> {
    sign_hs256(
        secret,
        &Claims::new(issuer, audience, org, sub, roles, ttl)?,
    )
}

/// Signs `claims` with HS256 and `secret`.
pub fn sign_hs256(secret: &[u8], claims: &Claims) -> Result<String, String> {
    let key = EncodingKey::from_secret(secret).map_err(|e| e.to_string())?;
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key).map_err(|e| e.to_string())
}

impl Claims {
    /// Claims for `org`/`sub` with `roles`, issued now and valid for `ttl`,
    /// without `executors` or `sessions` limits.
    pub fn new(
        issuer: &str,
        audience: &str,
        org: &str,
        sub: &str,
        roles: &[Role],
        ttl: Duration,
    ) -> Result<Claims, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_secs();
        Ok(Claims {
            iss: issuer.to_owned(),
            aud: Audience::One(audience.to_owned()),
            sub: sub.to_owned(),
            org: org.to_owned(),
            exp: now + ttl.as_secs(),
            nbf: None,
            iat: Some(now),
            roles: roles.iter().map(|r| r.name().to_owned()).collect(),
            executors: None,
            sessions: None,
        })
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Principal, ApiError> {
        if crate::signature::is_signed(&parts.headers) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "signed extension calls reach only the streaming endpoints; \
                 this route needs a bearer token",
            ));
        }
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or(TokenError::Missing)?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| {
                // The scheme name is case-insensitive (RFC 9110 §11.1).
                let (scheme, token) = h.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(token)
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(TokenError::Missing)?;
        state.verifier.verify(token).await.map_err(|e| {
            tracing::debug!(error = %e, "a token was refused");
            ApiError::from(e)
        })
    }
}
