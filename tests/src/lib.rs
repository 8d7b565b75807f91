//! End-to-end tests of narad: the real server, on a random port, against a
//! real Postgres, one fresh database per test (narad-testkit finds the
//! server). This library is the harness; the tests are in `tests/`.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use narad_journal::{Journal, MIGRATOR};
use narad_server::auth::{AuthSettings, Claims, JwksSource, Role, Verifier};
use narad_server::executors::ExecutorSettings;
use narad_server::quotas::LimitValues;
pub use narad_server::runtime::RuntimeSettings;
use narad_server::{AppState, HttpSettings, app, serve_on};
use narad_testkit::TestDatabase;
use serde_json::Value;

/// The HS256 secret of test servers.
pub const SECRET: &[u8] = b"narad-tests-hs256-secret-of-32-bytes-or-more";
/// The issuer test servers expect.
pub const ISSUER: &str = "https://issuer.narad.test";
/// The audience test servers expect.
pub const AUDIENCE: &str = "narad-tests";
/// The body limit of test servers.
pub const MAX_BODY: usize = 64 * 1024;

/// The HTTP settings of a test server: a [`MAX_BODY`] limit, no CORS.
fn http() -> HttpSettings {
    HttpSettings {
        max_body_bytes: MAX_BODY,
        idempotency_keep: narad_server::idempotency::DEFAULT_KEEP,
        cors_origins: Vec::new(),
        console_oidc: None,
        console_prices: None,
    }
}

/// A running server with its own database.
pub struct Server {
    /// The server's base URL, `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its database (shared with its replicas).
    pub db: Arc<TestDatabase>,
    /// An HTTP client.
    pub http: reqwest::Client,
    /// The server's fan-out hub.
    pub hub: Arc<narad_server::hub::Hub>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    bucket: Option<Arc<TestBucket>>,
}

/// Where a test server writes blob bytes: the same tests run on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobBackend {
    /// Rows in the server's database (the default).
    Postgres,
    /// A bucket of a real S3-compatible server (moto) started for the test.
    S3,
}

/// A moto server and the bucket a test server writes to.
struct TestBucket {
    server: narad_testkit::S3Server,
    name: String,
}

impl TestBucket {
    /// The prefix narad's objects go under in the bucket.
    const PREFIX: &'static str = "narad/blobs";

    async fn start() -> TestBucket {
        let server = narad_testkit::S3Server::start().await;
        let name = "narad-test".to_owned();
        server.create_bucket(&name).await;
        TestBucket { server, name }
    }

    /// The store `NARAD_BLOB_STORE=s3://{bucket}/{prefix}` names, reached
    /// with the moto server's variables.
    fn store(&self) -> narad_journal::BlobStore {
        let url = format!("s3://{}/{}", self.name, TestBucket::PREFIX);
        narad_journal::BlobStore::from_url_in(&url, self.server.env()).expect("a blob store")
    }
}

/// A test private key and the algorithm it signs with.
pub struct TestKey {
    /// The key id in the test key set.
    pub kid: &'static str,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// The private key.
    pub key: EncodingKey,
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The test keys: RSA (RS256), P-256 (ES256), Ed25519 (EdDSA).
pub fn test_keys() -> Vec<TestKey> {
    let read = |name: &str| std::fs::read(fixture(name)).expect("a test key");
    vec![
        TestKey {
            kid: "rsa-1",
            algorithm: Algorithm::RS256,
            key: EncodingKey::from_rsa_pem(&read("keys/rsa.pem")).expect("rsa"),
        },
        TestKey {
            kid: "ec-1",
            algorithm: Algorithm::ES256,
            key: EncodingKey::from_ec_pem(&read("keys/ec.pem")).expect("ec"),
        },
        TestKey {
            kid: "ed-1",
            algorithm: Algorithm::EdDSA,
            key: EncodingKey::from_ed_pem(&read("keys/ed25519.pem")).expect("ed25519"),
        },
    ]
}

/// Writes the public key set of [`test_keys`] to a file, once per process.
fn jwks_file() -> PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let keys = test_keys().iter().map(|k| public_jwk(k, k.kid)).collect();
        let path =
            std::env::temp_dir().join(format!("narad-tests-jwks-{}.json", std::process::id()));
        std::fs::write(
            &path,
            serde_json::to_vec(&JwkSet { keys }).expect("serialises"),
        )
        .expect("writes the key set");
        path
    })
    .clone()
}

/// The token settings of test servers: the test secret, the test key set
/// file, the test issuer and audience.
pub fn test_auth() -> AuthSettings {
    AuthSettings {
        issuer: ISSUER.to_owned(),
        audience: AUDIENCE.to_owned(),
        hs256_secret: Some(SECRET.to_vec()),
        jwks: Some(JwksSource::File(jwks_file())),
        jwks_refetch_interval: Duration::from_secs(10),
        jwks_refresh_interval: Duration::from_secs(300),
        operator_org: Some(OPERATOR_ORG.to_owned()),
    }
}

/// The operator organisation of test servers.
pub const OPERATOR_ORG: &str = "operator";

/// The public JWK of a test key under `kid`.
pub fn public_jwk(key: &TestKey, kid: &str) -> Jwk {
    let mut jwk = Jwk::from_encoding_key(&key.key, key.algorithm).expect("a public jwk");
    jwk.common.key_id = Some(kid.to_owned());
    jwk
}

impl Server {
    /// Starts a server on a fresh database.
    pub async fn start() -> Server {
        Server::start_on(Arc::new(TestDatabase::new(&MIGRATOR).await), test_auth()).await
    }

    /// Starts a server on a fresh database with token settings of its own.
    pub async fn start_with(auth: AuthSettings) -> Server {
        Server::start_on(Arc::new(TestDatabase::new(&MIGRATOR).await), auth).await
    }

    /// Starts a second server (another replica) on this server's database.
    pub async fn replica(&self) -> Server {
        Server::start_on(self.db.clone(), test_auth()).await
    }

    /// Starts a server on a database of the caller's (a cluster it
    /// controls, say).
    pub async fn start_on_database(db: Arc<TestDatabase>) -> Server {
        Server::start_on(db, test_auth()).await
    }

    /// Starts a server on a fresh database with executor timing of its own.
    pub async fn start_with_executors(settings: ExecutorSettings) -> Server {
        let db = Arc::new(TestDatabase::new(&MIGRATOR).await);
        Server::start_full(db, test_auth(), settings).await
    }

    /// Starts a second server on this server's database with executor
    /// timing of its own.
    pub async fn replica_with_executors(&self, settings: ExecutorSettings) -> Server {
        Server::start_full(self.db.clone(), test_auth(), settings).await
    }

    /// Starts a server on a fresh database with runtime timing of its own.
    pub async fn start_with_runtime(settings: RuntimeSettings) -> Server {
        let db = Arc::new(TestDatabase::new(&MIGRATOR).await);
        Server::start_full_with(
            db,
            test_auth(),
            ExecutorSettings::default(),
            settings,
            http(),
            LimitValues::default(),
            None,
        )
        .await
    }

    /// Starts a second server on this server's database with runtime
    /// timing of its own.
    pub async fn replica_with_runtime(&self, settings: RuntimeSettings) -> Server {
        Server::start_full_with(
            self.db.clone(),
            test_auth(),
            ExecutorSettings::default(),
            settings,
            http(),
            LimitValues::default(),
            None,
        )
        .await
    }

    async fn start_on(db: Arc<TestDatabase>, auth: AuthSettings) -> Server {
        Server::start_full(db, auth, ExecutorSettings::default()).await
    }

    async fn start_full(
        db: Arc<TestDatabase>,
        auth: AuthSettings,
        executors: ExecutorSettings,
    ) -> Server {
        Server::start_full_with(
            db,
            auth,
            executors,
            RuntimeSettings::default(),
            http(),
            LimitValues::default(),
            None,
        )
        .await
    }

    /// Starts a server on a fresh database whose organisations have
    /// `limits` by default.
    pub async fn start_with_limits(limits: LimitValues) -> Server {
        let db = Arc::new(TestDatabase::new(&MIGRATOR).await);
        Server::start_full_with(
            db,
            test_auth(),
            ExecutorSettings::default(),
            RuntimeSettings::default(),
            http(),
            limits,
            None,
        )
        .await
    }

    /// Starts another replica on this server's database whose
    /// organisations have `limits` by default.
    pub async fn replica_with_limits(&self, limits: LimitValues) -> Server {
        Server::start_full_with(
            self.db.clone(),
            test_auth(),
            ExecutorSettings::default(),
            RuntimeSettings::default(),
            http(),
            limits,
            None,
        )
        .await
    }

    /// Starts a server on a fresh database whose console signs people in
    /// with `oidc`.
    pub async fn start_with_console_oidc(oidc: narad_server::console::Oidc) -> Server {
        Server::start_with_http(HttpSettings {
            console_oidc: Some(oidc),
            ..http()
        })
        .await
    }

    /// Starts a server on a fresh database whose console prices usage with
    /// `prices`.
    pub async fn start_with_console_prices(prices: narad_server::prices::Prices) -> Server {
        Server::start_with_http(HttpSettings {
            console_prices: Some(prices),
            ..http()
        })
        .await
    }

    /// Starts a server on a fresh database with HTTP settings of its own.
    async fn start_with_http(http: HttpSettings) -> Server {
        let db = Arc::new(TestDatabase::new(&MIGRATOR).await);
        Server::start_full_with(
            db,
            test_auth(),
            ExecutorSettings::default(),
            RuntimeSettings::default(),
            http,
            LimitValues::default(),
            None,
        )
        .await
    }

    /// Starts a server on a fresh database taking bodies of up to `bytes`
    /// (instead of [`MAX_BODY`]).
    pub async fn start_with_max_body(bytes: usize) -> Server {
        Server::start_with_http(HttpSettings {
            max_body_bytes: bytes,
            ..http()
        })
        .await
    }

    /// Starts a server on a fresh database that lets pages of `origins`
    /// call it (CORS).
    pub async fn start_with_cors(origins: &[&str]) -> Server {
        let origins: Vec<String> = origins.iter().map(|o| (*o).to_owned()).collect();
        Server::start_with_http(HttpSettings {
            cors_origins: narad_server::cors::parse_origins(&origins).expect("origins"),
            ..http()
        })
        .await
    }

    /// Starts a server on a fresh database writing blob bytes to
    /// `backend`, with runtime timing and limits of its own.
    pub async fn start_with_blobs(
        backend: BlobBackend,
        runtime: RuntimeSettings,
        limits: LimitValues,
    ) -> Server {
        let db = Arc::new(TestDatabase::new(&MIGRATOR).await);
        let bucket = match backend {
            BlobBackend::Postgres => None,
            BlobBackend::S3 => Some(Arc::new(TestBucket::start().await)),
        };
        Server::start_full_with(
            db,
            test_auth(),
            ExecutorSettings::default(),
            runtime,
            http(),
            limits,
            bucket,
        )
        .await
    }

    /// The chunk size of the blobs this server writes.
    pub fn blob_chunk(&self) -> usize {
        match &self.bucket {
            None => narad_journal::blob_store::POSTGRES_CHUNK,
            Some(_) => narad_journal::blob_store::OBJECT_CHUNK,
        }
    }

    /// Ends the S3-compatible server this server writes blob bytes to (an
    /// outage of the store).
    pub fn kill_blob_store(&self) {
        if let Some(b) = &self.bucket {
            b.server.kill();
        }
    }

    /// The objects this server's blob store holds for `tenant` (none
    /// without one).
    pub async fn stored_objects(&self, tenant: &str) -> usize {
        match &self.bucket {
            None => 0,
            Some(b) => {
                b.server
                    .count_objects(&b.name, &format!("{}/{tenant}/", TestBucket::PREFIX))
                    .await
            }
        }
    }

    async fn start_full_with(
        db: Arc<TestDatabase>,
        auth: AuthSettings,
        executors: ExecutorSettings,
        runtime: RuntimeSettings,
        http: HttpSettings,
        limits: LimitValues,
        bucket: Option<Arc<TestBucket>>,
    ) -> Server {
        narad_server::metrics::install();
        let blob_store = match &bucket {
            None => narad_journal::BlobStore::Postgres,
            Some(b) => b.store(),
        };
        let journal = Journal::connect(db.url(), 16)
            .expect("a journal")
            .with_work_defaults(runtime.defaults)
            .with_blob_store(blob_store);
        // As `narad serve` does: background tasks on a pool of their own.
        let background = journal
            .background(narad_journal::BACKGROUND_CONNECTIONS)
            .expect("a background pool");
        let verifier = Verifier::new(auth).await.expect("a verifier");
        let hub =
            narad_server::hub::Hub::new(background.clone(), narad_server::coalesce::DEFAULT_WINDOW);
        let relay = tokio::spawn(hub.clone().run());
        narad_server::gauges::spawn(journal.clone(), hub.clone());
        let executors = Arc::new(executors);
        let sweeper = tokio::spawn(narad_server::executors::sweep(
            background.clone(),
            hub.clone(),
            executors.clone(),
        ));
        let runtime = Arc::new(runtime);
        let runtime_sweeper = tokio::spawn(narad_server::runtime::sweep(
            background.clone(),
            hub.clone(),
            runtime.clone(),
        ));
        let closing = hub.clone();
        // One configuration gives both, as `narad serve`'s does.
        let expiry = narad_server::quotas::Limit::InterruptDefaultExpirySeconds;
        let limits = match limits.get(expiry) {
            Some(_) => limits,
            None => limits.with(
                expiry,
                runtime.interrupt_default_expiry.map(|d| d.as_secs()),
            ),
        };
        let quotas = Arc::new(narad_server::quotas::Quotas::new(journal.clone(), limits));
        let heartbeat = tokio::spawn(quotas.clone().heartbeat());
        let erasure_sweeper = tokio::spawn(narad_server::erasure::sweep(
            background.clone(),
            hub.clone(),
            quotas.clone(),
            runtime.clone(),
        ));
        let closed = narad_server::closed_tenants::ClosedTenants::watch(background).await;
        let state = AppState {
            closed,
            quotas,
            hub: hub.clone(),
            journal,
            verifier: Arc::new(verifier),
            openapi: Arc::new(OnceLock::new()),
            executors,
            runtime,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            serve_on(listener, app(state, &http), async move {
                let _ = stopped.await;
                closing.close();
            })
            .await
            .expect("serves");
            relay.abort();
            sweeper.abort();
            runtime_sweeper.abort();
            heartbeat.abort();
            erasure_sweeper.abort();
        });
        Server {
            base,
            db,
            hub,
            http: {
                narad_server::auth::install_tls_provider();
                reqwest::Client::new()
            },
            stop: Some(stop),
            task: Some(task),
            bucket,
        }
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }

    /// A superuser connection to the server's database, past row-level
    /// security: what is really stored.
    pub async fn admin_db(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(self.db.url(), tokio_postgres::NoTls)
            .await
            .expect("a connection");
        tokio::spawn(conn);
        client
    }

    /// Sends a request and returns its status, `x-request-id` and JSON
    /// body (`Value::Null` when empty).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        Answer::of(req.send().await.expect("the server answers")).await
    }

    /// GET with a token.
    pub async fn get(&self, path: &str, token: &str) -> Answer {
        self.call(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    /// POST of a JSON value with a token and extra headers.
    pub async fn post_with(
        &self,
        path: &str,
        token: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).expect("serialises"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        Answer::of(req.send().await.expect("the server answers")).await
    }

    /// Appends `events` to `session` as one batch; it must be accepted.
    pub async fn append(&self, token: &str, session: &str, events: &[Value]) {
        self.post(
            &format!("/v1/sessions/{session}/events"),
            token,
            &serde_json::json!({ "events": events }),
        )
        .await
        .expect(201);
    }

    /// POST of a JSON value with a token.
    pub async fn post(&self, path: &str, token: &str, body: &Value) -> Answer {
        self.call(
            reqwest::Method::POST,
            path,
            Some(token),
            Some(serde_json::to_vec(body).expect("serialises")),
        )
        .await
    }
}

/// An answer of the server.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The `x-request-id` header.
    pub request_id: Option<String>,
    /// The `Retry-After` header, in seconds.
    pub retry_after: Option<u64>,
    /// Whether the answer says it is a replay (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// The JSON body.
    pub body: Value,
}

impl Answer {
    /// Reads a response: status, `x-request-id`, JSON body (`Null` when
    /// empty, a string when not JSON).
    pub async fn of(res: reqwest::Response) -> Answer {
        let status = res.status().as_u16();
        let request_id = res
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let retry_after = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let replayed = res
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let bytes = res.bytes().await.expect("a body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Answer {
            status,
            request_id,
            retry_after,
            replayed,
            body,
        }
    }

    /// The error code of an error answer.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }

    /// Asserts the status, showing the body when it differs.
    #[track_caller]
    pub fn expect(&self, status: u16) -> &Value {
        assert_eq!(self.status, status, "{:#}", self.body);
        &self.body
    }
}

/// Claims for `org`/`sub` with `roles`, valid for an hour, from the test
/// issuer to the test audience.
pub fn claims(org: &str, sub: &str, roles: &[Role]) -> Claims {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    Claims {
        iss: ISSUER.to_owned(),
        aud: narad_server::auth::Audience::One(AUDIENCE.to_owned()),
        sub: sub.to_owned(),
        org: org.to_owned(),
        exp: now + 3600,
        nbf: None,
        iat: Some(now),
        roles: roles.iter().map(|r| r.name().to_owned()).collect(),
        executors: None,
        sessions: None,
    }
}

/// Signs `claims` with HS256 and the test secret.
pub fn hs256(claims: &Claims) -> String {
    sign(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(SECRET).expect("a key"),
    )
}

/// Signs `claims` with `header` and `key`.
pub fn sign(header: &Header, claims: &Claims, key: &EncodingKey) -> String {
    jsonwebtoken::encode(header, claims, key).expect("signs")
}

/// A proposed run-tree event of run `run` (its own root): `type`, `eventId`
/// `id`, and the members of `extra`.
pub fn run_event(id: &str, ty: &str, run: &str, extra: Value) -> Value {
    let mut e = serde_json::json!({"protocolVersion": "narad/v1", "type": ty, "eventId": id,
        "rootRunId": run, "runId": run});
    for (k, v) in extra.as_object().expect("an object") {
        e[k] = v.clone();
    }
    e
}

/// Creates session `session` (with the fields of `session_fields`), starts
/// run `<session>-r` in it by command and appends, as its backend, an
/// `interrupt.requested` for `interrupt` (wait `w`, actions approve and
/// deny, plus the fields of `request`) and the `run.paused` that waits on it.
pub async fn waiting_on_interrupt(
    s: &Server,
    token: &str,
    session: &str,
    session_fields: Value,
    interrupt: &str,
    request: Value,
) {
    let mut body = serde_json::json!({ "sessionId": session });
    for (k, v) in session_fields.as_object().expect("an object") {
        body[k] = v.clone();
    }
    s.post("/v1/sessions", token, &body).await.expect(201);
    let run = format!("{session}-r");
    s.post(
        "/v1/commands/start-run",
        token,
        &serde_json::json!({"sessionId": session, "runId": run}),
    )
    .await
    .expect(201);
    let mut asked = serde_json::json!({"interruptId": interrupt, "waitId": "w",
        "kind": "tool.approval", "actions": ["approve", "deny"]});
    for (k, v) in request.as_object().expect("an object") {
        asked[k] = v.clone();
    }
    s.append(
        token,
        session,
        &[
            run_event(
                &format!("{interrupt}-q"),
                "interrupt.requested",
                &run,
                asked,
            ),
            run_event(
                &format!("{interrupt}-p"),
                "run.paused",
                &run,
                serde_json::json!({"waitId": "w", "reason": "interrupt", "resumeMode": "command",
                    "interruptId": interrupt}),
            ),
        ],
    )
    .await;
}

/// A token of tenant `org` with `roles`.
pub fn token(org: &str, roles: &[Role]) -> String {
    hs256(&claims(org, "tester", roles))
}

/// A signed extension call's parts (all four headers, each changeable).
#[derive(Debug, Clone)]
pub struct Signed {
    /// `Narad-Extension`.
    pub extension: String,
    /// The secret that signs.
    pub secret: Vec<u8>,
    /// `Narad-Timestamp` (seconds since the epoch).
    pub timestamp: u64,
    /// `Narad-Request-Id`.
    pub request_id: String,
    /// The path and query the MAC covers (default: the one requested).
    pub signed_path: Option<String>,
}

impl Signed {
    /// A call signed now with a fresh request id.
    pub fn now(extension: &str, secret_hex: &str) -> Signed {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Signed {
            extension: extension.to_owned(),
            secret: hex::decode(secret_hex).expect("a hex secret"),
            timestamp: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs(),
            request_id: format!(
                "req-{}-{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            signed_path: None,
        }
    }
}

impl Server {
    /// A GET signed as `signed` says.
    pub async fn signed_get(&self, path: &str, signed: &Signed) -> Answer {
        self.signed_call(path, signed, b"", b"").await
    }

    /// A GET that sends `body` under a MAC computed over `signed_body`.
    pub async fn signed_call(
        &self,
        path: &str,
        signed: &Signed,
        body: &[u8],
        signed_body: &[u8],
    ) -> Answer {
        let req = self.signed_request(path, signed, body, signed_body);
        Answer::of(req.send().await.expect("the server answers")).await
    }

    /// Opens a stream with a signed GET (it must answer 200).
    pub async fn signed_stream(&self, path: &str, signed: &Signed) -> SseStream {
        let response = self
            .signed_request(path, signed, b"", b"")
            .send()
            .await
            .expect("the server answers");
        assert_eq!(response.status(), 200, "{path}");
        SseStream {
            response,
            buffer: String::new(),
            read: 0,
        }
    }

    fn signed_request(
        &self,
        path: &str,
        signed: &Signed,
        body: &[u8],
        signed_body: &[u8],
    ) -> reqwest::RequestBuilder {
        let ts = signed.timestamp.to_string();
        let bytes = narad_server::signature::signed_bytes(
            "GET",
            signed.signed_path.as_deref().unwrap_or(path),
            &ts,
            &signed.request_id,
            signed_body,
        );
        let mut req = self
            .http
            .get(format!("{}{path}", self.base))
            .header(
                "narad-signature",
                narad_server::signature::sign(&signed.secret, &bytes),
            )
            .header("narad-timestamp", ts)
            .header("narad-request-id", &signed.request_id)
            .header("narad-extension", &signed.extension);
        if !body.is_empty() {
            req = req.body(body.to_vec());
        }
        req
    }
}

/// One frame of an SSE stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// `event:`, when given.
    pub event: Option<String>,
    /// `id:`, when given.
    pub id: Option<String>,
    /// `data:`, parsed.
    pub data: Value,
}

/// An open SSE stream.
pub struct SseStream {
    response: reqwest::Response,
    buffer: String,
    /// Where the next frame starts in `buffer`.
    read: usize,
}

impl SseStream {
    /// The next frame (comments skipped); `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer[self.read..].find("\n\n") {
                // Frames are read in place and the buffer compacted now and
                // then: draining each frame off the front moved everything
                // behind it, which made a reader that fell behind by a few
                // thousand frames quadratically slower.
                let start = self.read;
                self.read += end + 2;
                let block = self.buffer[start..self.read].to_owned();
                if self.read > 64 * 1024 && self.read * 2 > self.buffer.len() {
                    self.buffer.drain(..self.read);
                    self.read = 0;
                }
                let (mut event, mut id, mut data) = (None, None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Some(Frame {
                    event,
                    id,
                    data: serde_json::from_str(&data).expect("frames carry JSON"),
                });
            }
            let chunk = self.response.chunk().await.ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Authority events until one with `sessionSequence` `upto` arrives,
    /// within `seconds`.
    pub async fn events_until(&mut self, upto: u64, seconds: u64) -> Vec<Value> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
        while got
            .last()
            .is_none_or(|e: &Value| e["sessionSequence"].as_u64() != Some(upto))
        {
            let frame = tokio::time::timeout_at(deadline, self.next())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no sessionSequence {upto} within {seconds} s; got {}",
                        got.len()
                    )
                })
                .expect("the stream stays open");
            if frame.event.is_none() {
                assert_eq!(
                    frame.id.as_deref(),
                    frame.data["eventId"].as_str(),
                    "id is the eventId"
                );
                // Authority only (watch events carry a revision instead).
                if frame.data.get("sessionSequence").is_some() {
                    got.push(frame.data);
                }
            }
        }
        got
    }
}

impl Server {
    /// Opens `path` as an SSE stream, with extra headers.
    pub async fn stream(&self, path: &str, token: &str, headers: &[(&str, &str)]) -> SseStream {
        SseStream::open(&self.http, &format!("{}{path}", self.base), token, headers).await
    }
}

impl SseStream {
    /// The stream of an answer (it must be 200 and an event stream).
    pub fn of(response: reqwest::Response) -> SseStream {
        assert_eq!(response.status(), 200, "{}", response.url());
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        SseStream {
            response,
            buffer: String::new(),
            read: 0,
        }
    }

    /// Opens `url` as an SSE stream, with extra headers.
    pub async fn open(
        http: &reqwest::Client,
        url: &str,
        token: &str,
        headers: &[(&str, &str)],
    ) -> SseStream {
        let path = url;
        let mut req = http.get(url).bearer_auth(token);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let response = req.send().await.expect("the server answers");
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{path}"
        );
        SseStream {
            response,
            buffer: String::new(),
            read: 0,
        }
    }
}

/// Creates session `session` with top-level run `run` started, bound to
/// `executor` when one is named.
pub async fn session_with_run(
    s: &Server,
    token: &str,
    session: &str,
    run: &str,
    executor: Option<&str>,
) {
    s.post(
        "/v1/sessions",
        token,
        &serde_json::json!({ "sessionId": session }),
    )
    .await
    .expect(201);
    let mut start = serde_json::json!({"sessionId": session, "runId": run});
    if let Some(e) = executor {
        start["clientExecutorId"] = serde_json::json!(e);
    }
    s.post("/v1/commands/start-run", token, &start)
        .await
        .expect(201);
}

/// Parses stored or streamed events as authority events (panics on
/// anything else: tests hand it history).
pub fn authority(events: &[Value]) -> Vec<narad_protocol::AuthorityEvent> {
    use narad_protocol::{Classified, Reader, WireObject};
    events
        .iter()
        .map(|e| match Reader::all_profiles().classify(e) {
            Ok(Classified::Accepted(o)) => match *o {
                WireObject::Authority(a) => a,
                other => panic!("not an authority event: {other:?}"),
            },
            other => panic!("not accepted: {other:?}"),
        })
        .collect()
}

/// A session's whole history, page after page.
pub async fn whole_history(s: &Server, token: &str, session: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let path = format!("/v1/sessions/{session}/events?limit=1000&afterSessionSequence={after}");
        let page = s.get(&path, token).await;
        let page = page.expect(200);
        all.extend(page["events"].as_array().expect("events").iter().cloned());
        match page["nextSessionSequence"].as_u64() {
            Some(next) => after = next,
            None => return all,
        }
    }
}

/// A `message.text.delta` of run r1's open message m1 (see
/// [`open_session`]).
pub fn delta(id: &str) -> Value {
    serde_json::json!({"protocolVersion": "narad/v1", "type": "message.text.delta",
        "eventId": id, "rootRunId": "r1", "runId": "r1", "messageId": "m1", "delta": "x"})
}

/// Creates session `id` with run r1 running and message m1 open
/// (sequences 1 and 2; the message's start has eventId `start-{id}`), so
/// that [`delta`]s can be appended to it.
pub async fn open_session(s: &Server, token: &str, id: &str) {
    s.post(
        "/v1/sessions",
        token,
        &serde_json::json!({ "sessionId": id }),
    )
    .await
    .expect(201);
    s.post(
        "/v1/commands/start-run",
        token,
        &serde_json::json!({"sessionId": id, "runId": "r1"}),
    )
    .await
    .expect(201);
    s.post(
        &format!("/v1/sessions/{id}/events"),
        token,
        &serde_json::json!({"events": [{"protocolVersion": "narad/v1",
            "type": "message.text.started", "eventId": format!("start-{id}"),
            "rootRunId": "r1", "runId": "r1", "messageId": "m1", "role": "assistant",
            "messageScope": "run"}]}),
    )
    .await
    .expect(201);
}

/// A scrape of `/metrics`: the text, and each series' value by its name
/// and labels as rendered (`name{label="value"}`).
pub struct Scrape {
    /// The exposition text.
    pub text: String,
    /// Each series' value.
    pub series: std::collections::BTreeMap<String, f64>,
}

impl Scrape {
    /// Scrapes `s`.
    pub async fn of(s: &Server) -> Scrape {
        let text = s
            .http
            .get(format!("{}/metrics", s.base))
            .send()
            .await
            .expect("answers")
            .text()
            .await
            .expect("text");
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse::<f64>().ok()?))
            })
            .collect();
        Scrape { text, series }
    }

    /// A series' value; 0 when it is not there yet.
    pub fn get(&self, series: &str) -> f64 {
        self.series.get(series).copied().unwrap_or(0.0)
    }

    /// Whether a series is there.
    pub fn has(&self, series: &str) -> bool {
        self.series.contains_key(series)
    }
}
