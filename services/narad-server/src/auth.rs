//! Who is calling, and what they may do.
//!
//! Callers present a bearer JWT. HS256 tokens are checked with a shared
//! secret (development); RS256, ES256 and EdDSA tokens against a JSON Web
//! Key Set, each key used only with its own algorithm, so that a token
//! cannot pick the algorithm its key is read with (an HS256 token "signed"
//! with a public key is refused, and so is `alg: none`). The checked claims
//! are `iss`, `aud`, `exp` and `nbf` (with a small leeway), `sub`, and
//! `org`, which is the tenant. `roles` grants permissions (DESIGN.md §6).
//!
//! The key set is kept current by one mechanism for a file and a URL
//! (`KeySet`): it is read again when a token names a key id the set
//! lacks (at most once per [`AuthSettings::jwks_refetch_interval`]), and
//! every [`AuthSettings::jwks_refresh_interval`] in any case; a file is
//! also looked at (its size, modification time and inode) every second
//! and read again as soon as it changed. A read replaces the whole set, so
//! a key removed from it is refused from then on; a read that fails keeps
//! the last good set and logs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use narad_journal::{Caller, TenantId};
use narad_protocol::ErrorCode;
use narad_protocol::authority::{Actor, ActorKind};
use narad_protocol::primitives::NonEmptyString;
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

    /// `Ok` when the principal may see the session; a 403 otherwise (the
    /// same answer a command gets for a session it may not act on).
    pub fn require_session(&self, session_id: &str) -> Result<(), ApiError> {
        if self.may_see(session_id) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Forbidden,
            narad_journal::access::session_refused(session_id),
        ))
    }

    /// The principal as a command's caller: its tenant, its `sessions`
    /// limit, and the actor the events of its commands record (§7.7).
    pub fn caller(&self) -> Caller {
        let sub = NonEmptyString::new(self.subject.clone())
            .unwrap_or_else(|_| NonEmptyString::new("unknown").expect("not empty"));
        let actor = match &self.extension {
            None => Actor {
                kind: ActorKind::User,
                sub,
                extension: None,
            },
            Some((publisher, name)) => Actor {
                kind: ActorKind::Extension,
                sub,
                extension: NonEmptyString::new(format!("{publisher}/{name}")).ok(),
            },
        };
        Caller {
            tenant: self.tenant.clone(),
            actor,
            sessions: self.sessions.clone(),
        }
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
    /// A file: read at start, again as soon as it changes (looked at every
    /// [`JWKS_FILE_CHECK`]), and as a URL is (below).
    File(PathBuf),
    /// An `https://` URL (or `http://` to this machine's loopback), fetched
    /// at start, again when a token names a key id the set lacks (at most
    /// once per [`AuthSettings::jwks_refetch_interval`]), and every
    /// [`AuthSettings::jwks_refresh_interval`].
    Url(String),
}

/// The least time between two reads of a key set for tokens naming an
/// unknown key id, by default.
pub const JWKS_REFETCH_INTERVAL: Duration = Duration::from_secs(10);
/// How often a key set is read again in any case, by default: a key
/// removed at the issuer is refused at most this long after.
pub const JWKS_REFRESH_INTERVAL: Duration = Duration::from_secs(300);
/// How often a key set file's size, modification time and inode are
/// looked at (one `stat`): a changed file is read again at once.
pub const JWKS_FILE_CHECK: Duration = Duration::from_secs(1);

/// Whether `url` may carry keys and tokens: an `https://` URL, or an
/// `http://` URL of this machine's loopback (127.0.0.1, `[::1]`, localhost).
pub fn https_or_loopback(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    ["127.0.0.1", "[::1]", "localhost"].contains(&host)
}

impl JwksSource {
    /// Reads `NARAD_JWKS`: an `https://` URL, an `http://` URL of the
    /// loopback (127.0.0.1, `[::1]`, localhost), or a file path.
    pub fn parse(s: &str) -> Result<JwksSource, String> {
        if https_or_loopback(s) {
            return Ok(JwksSource::Url(s.to_owned()));
        }
        if s.starts_with("http://") {
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
    /// The least time between two reads of the key set caused by tokens
    /// naming a key id it lacks.
    pub jwks_refetch_interval: Duration,
    /// How often the key set is read again in any case (a file is also
    /// read as soon as it changes).
    pub jwks_refresh_interval: Duration,
    /// The operator organisation (`NARAD_OPERATOR_ORG`): its admins set
    /// other organisations' limits. None: nobody does.
    pub operator_org: Option<String>,
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
    /// The key set, when one is configured.
    jwks: Option<Arc<KeySet>>,
}

/// A key set and how it is kept current: every read goes through
/// [`KeySet::read`], whatever asked for it (a token naming an unknown key
/// id, the periodic refresh, a changed file).
struct KeySet {
    source: JwksSource,
    /// The client that fetches a URL.
    client: Option<reqwest::Client>,
    keys: RwLock<Vec<Key>>,
    /// When the source was last read, and what the file looked like then;
    /// held while a read runs, so that reads never overlap.
    reads: tokio::sync::Mutex<Reads>,
    refetch_interval: Duration,
    refresh_interval: Duration,
}

struct Reads {
    /// The last read (successful or not).
    at: Instant,
    /// The file's stamp at the last read.
    stamp: Option<FileStamp>,
}

/// What changes when a file is written or replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl FileStamp {
    /// The stamp of the file at `path` (following symbolic links, as a
    /// mounted Kubernetes secret needs); `None` when it cannot be read.
    fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Some(FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        })
    }
}

impl KeySet {
    /// The keys of the source, and the file's stamp before it was read.
    async fn load(&self) -> Result<(Vec<Key>, Option<FileStamp>), String> {
        match (&self.source, &self.client) {
            (JwksSource::File(path), _) => {
                let stamp = FileStamp::of(path);
                let text = tokio::fs::read_to_string(path)
                    .await
                    .map_err(|e| format!("NARAD_JWKS: cannot read {}: {e}", path.display()))?;
                Ok((parse_keys(&text, &path.display().to_string())?, stamp))
            }
            (JwksSource::Url(url), Some(client)) => Ok((fetch_keys(client, url).await?, None)),
            (JwksSource::Url(_), None) => Err("NARAD_JWKS: no HTTP client".to_owned()),
        }
    }

    /// Reads the source again and replaces the whole set (keys it no
    /// longer holds are refused from now on); a failed read keeps the last
    /// good set and logs. The caller holds `reads`.
    async fn read(&self, reads: &mut Reads, why: &'static str) {
        reads.at = Instant::now();
        match self.load().await {
            Ok((keys, stamp)) => {
                reads.stamp = stamp;
                tracing::info!(keys = keys.len(), why, "the key set was read again");
                *self.keys.write().expect("the key set") = keys;
            }
            Err(e) => {
                // The stamp of a broken file is remembered too: it is read
                // again when it changes (or is due), not every second.
                if let JwksSource::File(path) = &self.source {
                    reads.stamp = FileStamp::of(path);
                }
                tracing::warn!(error = %e, why, "the key set could not be read again; the last one read stays in use");
            }
        }
    }

    /// A token named a key id the set lacks: reads the set again, unless
    /// it was read within the refetch interval.
    async fn unknown_key_id(&self) {
        let mut reads = self.reads.lock().await;
        if reads.at.elapsed() >= self.refetch_interval {
            self.read(&mut reads, "a token named a key id the set lacks")
                .await;
        }
    }

    /// One look: reads the set again when the refresh interval has passed
    /// or the file changed.
    async fn check(&self) {
        let mut reads = self.reads.lock().await;
        if reads.at.elapsed() >= self.refresh_interval {
            self.read(&mut reads, "the refresh interval passed").await;
        } else if let JwksSource::File(path) = &self.source
            && FileStamp::of(path) != reads.stamp
        {
            self.read(&mut reads, "the file changed").await;
        }
    }

    /// Looks at the set every [`JWKS_FILE_CHECK`] (or the refresh
    /// interval, when shorter) until the set is dropped with its verifier.
    fn watch(set: Weak<KeySet>, every: Duration) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(set) = set.upgrade() else { return };
                set.check().await;
            }
        });
    }
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
    /// Whether `tenant` is the operator organisation, whose admins set
    /// other organisations' limits.
    pub fn is_operator(&self, tenant: &TenantId) -> bool {
        self.settings.operator_org.as_deref() == Some(tenant.as_str())
    }

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
        let jwks = match &settings.jwks {
            Some(source) => {
                let client = match source {
                    JwksSource::File(_) => None,
                    JwksSource::Url(_) => {
                        install_tls_provider();
                        Some(
                            reqwest::Client::builder()
                                .timeout(Duration::from_secs(10))
                                // A key set is fetched from where it was
                                // configured, never from where a redirect
                                // points.
                                .redirect(reqwest::redirect::Policy::none())
                                .build()
                                .map_err(|e| format!("NARAD_JWKS: no HTTP client: {e}"))?,
                        )
                    }
                };
                let mut set = KeySet {
                    source: source.clone(),
                    client,
                    keys: RwLock::new(Vec::new()),
                    reads: tokio::sync::Mutex::new(Reads {
                        at: Instant::now(),
                        stamp: None,
                    }),
                    refetch_interval: settings.jwks_refetch_interval,
                    refresh_interval: settings.jwks_refresh_interval,
                };
                // At start a key set that cannot be read stops the server.
                let (keys, stamp) = set.load().await?;
                set.keys = RwLock::new(keys);
                set.reads.get_mut().stamp = stamp;
                let set = Arc::new(set);
                let every = JWKS_FILE_CHECK.min(settings.jwks_refresh_interval);
                KeySet::watch(Arc::downgrade(&set), every.max(Duration::from_millis(10)));
                Some(set)
            }
            None => None,
        };
        Ok(Verifier {
            settings,
            hs256,
            jwks,
        })
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
                match (self.decode_with_set(token, &header), &self.jwks) {
                    (Err(TokenError::UnknownKey), Some(set)) if header.kid.is_some() => {
                        // Read again (or being read by another request):
                        // look once more either way.
                        set.unknown_key_id().await;
                        self.decode_with_set(token, &header)?
                    }
                    (other, _) => other?,
                }
            }
            _ => return Err(TokenError::Malformed),
        };
        principal(claims)
    }

    /// Decodes with the one key of the set that matches the token's
    /// algorithm and key id.
    fn decode_with_set(&self, token: &str, header: &Header) -> Result<Claims, TokenError> {
        let Some(set) = &self.jwks else {
            return Err(TokenError::UnknownKey);
        };
        let keys = set.keys.read().expect("the key set");
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
        // Authenticated before the handler, by a layer that needed the
        // caller first (the Idempotency-Key layer): the token is not
        // verified twice.
        if let Some(known) = parts.extensions.get::<Principal>() {
            return Ok(known.clone());
        }
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
        Principal::from_token(state, token).await
    }
}

impl Principal {
    /// The principal of a bearer token, verified as the `Authorization`
    /// header's is (for credentials a browser sends elsewhere).
    pub async fn from_token(state: &AppState, token: &str) -> Result<Principal, ApiError> {
        let principal = state.verifier.verify(token).await.map_err(|e| {
            tracing::debug!(error = %e, "a token was refused");
            ApiError::from(e)
        })?;
        principal.admitted(state)
    }

    /// The principal, unless its organisation is closed by an erasure
    /// ([`crate::closed_tenants`]). Every credential (token, stream ticket,
    /// extension signature) passes here before it becomes a principal.
    pub fn admitted(self, state: &AppState) -> Result<Principal, ApiError> {
        state.closed.admit(&self.tenant)?;
        Ok(self)
    }
}
