//! Server configuration, read from command-line flags and `NARAD_*`
//! environment variables (flags win). Secrets are wrapped so that they
//! never print.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Serialize;

/// The default request body limit: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// Settings of `narad serve`.
#[derive(Debug, Clone, clap::Args, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "NARAD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Postgres connection URL. Without one, narad runs a private database
    /// in its home directory.
    #[arg(long, env = "NARAD_DATABASE_URL")]
    pub database_url: Option<Secret>,

    /// Home directory for the embedded database and development secrets.
    #[arg(long, env = "NARAD_HOME", default_value = "./.narad")]
    pub home: PathBuf,

    /// Largest accepted request body, in bytes.
    #[arg(long, env = "NARAD_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,

    /// How long the first answer to an `Idempotency-Key` is kept, in
    /// hours (1 to 720): within it the same request sent again gets that
    /// answer again instead of a second effect.
    #[arg(long, env = "NARAD_IDEMPOTENCY_KEEP_HOURS", default_value_t = 24)]
    pub idempotency_keep_hours: u64,

    /// Origins whose pages may call the API from a browser (CORS), exact
    /// and separated by commas (`https://console.example.com`); none by
    /// default, and never `*`.
    #[arg(long, env = "NARAD_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// The OpenID Connect issuer the console signs people in with
    /// (authorization code with PKCE); without it, the console takes a
    /// pasted token. Its access tokens must be JWTs this server verifies
    /// (`NARAD_JWKS`, `NARAD_JWT_ISSUER`, `NARAD_JWT_AUDIENCE`).
    #[arg(long, env = "NARAD_CONSOLE_ISSUER")]
    pub console_issuer: Option<String>,

    /// The console's client id at `NARAD_CONSOLE_ISSUER` (a public client:
    /// no secret; its redirect URI is this server's `/console/`).
    #[arg(long, env = "NARAD_CONSOLE_CLIENT_ID")]
    pub console_client_id: Option<String>,

    /// The scopes the console asks the issuer for, separated by spaces.
    #[arg(long, env = "NARAD_CONSOLE_SCOPES", default_value = "openid")]
    pub console_scopes: String,

    /// The price table the console prices token usage with, JSON: per
    /// model (`*` for any other), each usage counter's price per million
    /// (`{"gpt-4o": {"inputTokens": 2.5, "outputTokens": 10}}`); without
    /// it, the console shows usage without cost.
    #[arg(long, env = "NARAD_CONSOLE_PRICES")]
    pub console_prices: Option<String>,

    /// The currency of `NARAD_CONSOLE_PRICES` (ISO 4217).
    #[arg(long, env = "NARAD_CONSOLE_CURRENCY", default_value = "USD")]
    pub console_currency: String,

    /// JSON Web Key Set that verifies RS256, ES256 and EdDSA tokens: a file
    /// path, or an `https://` URL (`http://` only to the loopback), read at
    /// start, again when a token names an unknown key id (at most every
    /// 10 s), every `jwks_refresh_seconds`, and (a file) when it changes.
    #[arg(long, env = "NARAD_JWKS")]
    pub jwks: Option<String>,

    /// How often the key set is read again in any case, in seconds (a
    /// file is also read as soon as it changes).
    #[arg(long, env = "NARAD_JWKS_REFRESH_SECONDS",
          default_value_t = crate::auth::JWKS_REFRESH_INTERVAL.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    pub jwks_refresh_seconds: u64,

    /// Shared secret that verifies HS256 tokens (development).
    #[arg(long, env = "NARAD_JWT_HS256_SECRET")]
    pub jwt_hs256_secret: Option<Secret>,

    /// The issuer (`iss`) tokens must name.
    #[arg(long, env = "NARAD_JWT_ISSUER", default_value = "narad")]
    pub jwt_issuer: String,

    /// The audience (`aud`) tokens must name.
    #[arg(long, env = "NARAD_JWT_AUDIENCE", default_value = "narad")]
    pub jwt_audience: String,

    /// How long delivered events stay in the outbox for stream replays, in
    /// seconds (history keeps them for good).
    #[arg(long, env = "NARAD_OUTBOX_RETENTION_SECONDS", default_value_t = 24 * 3600)]
    pub outbox_retention_seconds: u64,
    /// At most one watch event per scope this often, in milliseconds.
    #[arg(long, env = "NARAD_WATCH_WINDOW_MS", default_value_t = 50)]
    pub watch_window_ms: u64,

    /// Connections narad opens to the database in all (beside the relay's
    /// one listening connection): [`narad_journal::BACKGROUND_CONNECTIONS`]
    /// of them reserved for background tasks, the rest for requests; at
    /// least [`MIN_REQUEST_CONNECTIONS`] more than the reserve.
    #[arg(long, env = "NARAD_DATABASE_POOL", default_value_t = 32)]
    pub database_pool: usize,

    /// How long a request waits for a database connection when all are
    /// busy, in milliseconds, before it is answered 503 `NRD-0901`.
    #[arg(long, env = "NARAD_DATABASE_WAIT_MS", default_value_t = 5_000)]
    pub database_wait_ms: u64,

    /// How often client executors and the server send heartbeats, in
    /// milliseconds (§11.2).
    #[arg(long, env = "NARAD_EXECUTOR_HEARTBEAT_MS", default_value_t = 15_000)]
    pub executor_heartbeat_ms: u64,
    /// How long an executor lease lives without a heartbeat, in
    /// milliseconds; an executor without a live lease is unavailable.
    #[arg(long, env = "NARAD_EXECUTOR_LEASE_TTL_MS", default_value_t = 45_000)]
    pub executor_lease_ttl_ms: u64,
    /// How long an execution token is valid after delivery, in
    /// milliseconds; a call unfinished by then is closed
    /// `client_execution_expired`.
    #[arg(long, env = "NARAD_EXECUTION_TOKEN_TTL_MS", default_value_t = 60_000)]
    pub execution_token_ttl_ms: u64,
    /// How long a client call may wait for its executor to attach, in
    /// milliseconds, before it is closed `client_unavailable`.
    #[arg(
        long,
        env = "NARAD_EXECUTOR_DELIVERY_TIMEOUT_MS",
        default_value_t = 120_000
    )]
    pub executor_delivery_timeout_ms: u64,
    /// How often the executor sweeper looks for lapsed tokens and absent
    /// executors, in milliseconds (one replica at a time sweeps).
    #[arg(long, env = "NARAD_EXECUTOR_SWEEP_MS", default_value_t = 1_000)]
    pub executor_sweep_ms: u64,

    /// How long a stopping server (SIGTERM, Ctrl-C) waits for requests in
    /// flight and open streams to end, in milliseconds; then it stops
    /// anyway.
    #[arg(long, env = "NARAD_SHUTDOWN_GRACE_MS", default_value_t = 20_000)]
    pub shutdown_grace_ms: u64,

    /// How long an agent runtime's lease lives without a heartbeat, in
    /// milliseconds; then its run is repaired (retried or closed).
    #[arg(long, env = "NARAD_RUNTIME_LEASE_TTL_MS", default_value_t = 30_000)]
    pub runtime_lease_ttl_ms: u64,
    /// How often the runtime sweeper looks for lapsed leases, stops no
    /// runtime holds and interrupts past their deadline, in milliseconds
    /// (one replica at a time sweeps).
    #[arg(long, env = "NARAD_RUNTIME_SWEEP_MS", default_value_t = 1_000)]
    pub runtime_sweep_ms: u64,
    /// How long a run asked to stop that no runtime holds (started without
    /// one) may go without any event before the server closes it with
    /// `run.cancelled` (`stop_unanswered`), in seconds.
    #[arg(long, env = "NARAD_STOP_GRACE_SECONDS", default_value_t = 30)]
    pub stop_grace_seconds: u64,
    /// How long after a chat front end's stream broke off (`useChat`'s
    /// `stop()`, AG-UI's `abortRun()`: the transport's abort) its run is
    /// asked to stop, unless a front end came back to the session
    /// meanwhile (a reload with `resume: true`, a rejoin), in milliseconds;
    /// 0: a broken-off stream stops nothing.
    #[arg(long, env = "NARAD_CHAT_ABORT_GRACE_MS", default_value_t = 5_000)]
    pub chat_abort_grace_ms: u64,
    /// What happens to a queued run whose runtime is lost, unless its
    /// start-run says: `retry` (another runtime takes it) or `fail` (it is
    /// closed with run.error runtime_lost).
    #[arg(long, env = "NARAD_RUNTIME_ON_LOST", default_value = "retry")]
    pub runtime_on_lost: String,
    /// How many runtimes may hold a queued run in turn (retry policy),
    /// unless its start-run says: 1 to 100.
    #[arg(long, env = "NARAD_RUNTIME_MAX_ATTEMPTS", default_value_t = 3)]
    pub runtime_max_attempts: u32,
    /// How long an interrupt that names no `expiresAt` may wait for a
    /// decision, in seconds; then the server resolves it `expired`. Unset:
    /// such interrupts wait as long as it takes.
    #[arg(long, env = "NARAD_INTERRUPT_DEFAULT_EXPIRY_SECONDS")]
    pub interrupt_default_expiry_seconds: Option<u64>,
    /// Appended events per second an organisation may send, over every
    /// replica (a token bucket); unset: no limit. Overridden per
    /// organisation by `PUT /v1/admin/tenants/{org}/limits`.
    #[arg(long, env = "NARAD_LIMIT_EVENTS_PER_SECOND")]
    pub limit_events_per_second: Option<u64>,
    /// Events an organisation may append at once above its rate; unset:
    /// twice the rate.
    #[arg(long, env = "NARAD_LIMIT_EVENTS_BURST")]
    pub limit_events_burst: Option<u64>,
    /// Commands per second an organisation may send; unset: no limit.
    #[arg(long, env = "NARAD_LIMIT_COMMANDS_PER_SECOND")]
    pub limit_commands_per_second: Option<u64>,
    /// Commands an organisation may send at once above its rate; unset:
    /// twice the rate.
    #[arg(long, env = "NARAD_LIMIT_COMMANDS_BURST")]
    pub limit_commands_burst: Option<u64>,
    /// Streams (session and tenant) an organisation may have open at once;
    /// unset: no limit.
    #[arg(long, env = "NARAD_LIMIT_OPEN_STREAMS")]
    pub limit_open_streams: Option<u64>,
    /// Client executors an organisation may have attached at once; unset:
    /// no limit.
    #[arg(long, env = "NARAD_LIMIT_ATTACHED_EXECUTORS")]
    pub limit_attached_executors: Option<u64>,
    /// Sessions an organisation may hold; unset: no limit.
    #[arg(long, env = "NARAD_LIMIT_SESSIONS")]
    pub limit_sessions: Option<u64>,
    /// Where blob bytes (attachments, artifacts) are written: `postgres`
    /// (the default: rows in the journal's database) or an S3-compatible
    /// bucket, `s3://bucket/prefix`, reached with the usual `AWS_*`
    /// variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`).
    #[arg(long, env = "NARAD_BLOB_STORE", default_value = "postgres")]
    pub blob_store: String,
    /// The largest blob (attachment or artifact bytes) one upload may hold,
    /// on this server: an organisation's `blobMaxBytes` may lower it, never
    /// raise it.
    #[arg(long, env = "NARAD_BLOB_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub blob_max_bytes: u64,
    /// How long an uploaded blob may go unreferenced by any event before it
    /// is collected, in seconds.
    #[arg(
        long,
        env = "NARAD_BLOB_UNREFERENCED_SECONDS",
        default_value_t = 86_400
    )]
    pub blob_unreferenced_seconds: u64,
    /// The bytes an organisation's blobs may hold together; unset: no limit.
    #[arg(long, env = "NARAD_LIMIT_STORED_BYTES")]
    pub limit_stored_bytes: Option<u64>,
    /// Sessions archived, or idle, for longer than this many days are
    /// erased (unset: kept until erased by hand). Overridden per
    /// organisation (`retentionDays`).
    #[arg(long, env = "NARAD_RETENTION_DAYS")]
    pub retention_days: Option<u64>,
    /// How often the erasure sweeper applies retention policies, in
    /// seconds (one replica at a time).
    #[arg(long, env = "NARAD_RETENTION_SWEEP_SECONDS", default_value_t = 300)]
    pub retention_sweep_seconds: u64,
    /// The operator organisation: its admins read and set every
    /// organisation's limits (`/v1/admin/tenants/{org}/limits`). Unset:
    /// limits are the configured defaults for everyone.
    #[arg(long, env = "NARAD_OPERATOR_ORG")]
    pub operator_org: Option<String>,
}

/// The fewest connections requests may have: one a request holds while
/// another takes its turn.
pub const MIN_REQUEST_CONNECTIONS: usize = 2;

impl Config {
    /// The request pool's size and wait, checked: `NARAD_DATABASE_POOL`
    /// less the background reserve, refused when too small to run.
    pub fn request_pool(&self) -> Result<(usize, std::time::Duration), String> {
        let reserve = narad_journal::BACKGROUND_CONNECTIONS;
        let needed = reserve + MIN_REQUEST_CONNECTIONS;
        if self.database_pool < needed {
            return Err(format!(
                "NARAD_DATABASE_POOL is {}: narad needs at least {needed} database connections, \
                 {reserve} for its background tasks (the relay, the sweepers, the gauges) and \
                 {MIN_REQUEST_CONNECTIONS} or more for requests; set it to {needed} or more",
                self.database_pool
            ));
        }
        if self.database_wait_ms == 0 {
            return Err(
                "NARAD_DATABASE_WAIT_MS is 0: a request must be able to wait for a \
                        connection at least a millisecond"
                    .to_owned(),
            );
        }
        Ok((
            self.database_pool - reserve,
            std::time::Duration::from_millis(self.database_wait_ms),
        ))
    }

    /// The HTTP layer's settings, checked.
    pub fn http_settings(&self) -> Result<crate::HttpSettings, String> {
        if !(1..=720).contains(&self.idempotency_keep_hours) {
            return Err(format!(
                "NARAD_IDEMPOTENCY_KEEP_HOURS is {}: it takes 1 to 720 hours",
                self.idempotency_keep_hours
            ));
        }
        Ok(crate::HttpSettings {
            max_body_bytes: self.max_body_bytes,
            idempotency_keep: std::time::Duration::from_secs(self.idempotency_keep_hours * 3600),
            cors_origins: crate::cors::parse_origins(&self.cors_origins)?,
            console_oidc: crate::console::Oidc::from_settings(
                self.console_issuer.as_deref(),
                self.console_client_id.as_deref(),
                &self.console_scopes,
                &self.jwt_audience,
            )?,
            console_prices: crate::prices::Prices::from_settings(
                self.console_prices.as_deref(),
                &self.console_currency,
            )?,
        })
    }

    /// The default limits of every organisation, checked.
    pub fn limit_defaults(&self) -> Result<crate::quotas::LimitValues, String> {
        use crate::quotas::{Limit, LimitValues};
        let mut values = LimitValues::default();
        for (limit, value, variable) in [
            (
                Limit::EventsPerSecond,
                self.limit_events_per_second,
                "NARAD_LIMIT_EVENTS_PER_SECOND",
            ),
            (
                Limit::EventsBurst,
                self.limit_events_burst,
                "NARAD_LIMIT_EVENTS_BURST",
            ),
            (
                Limit::CommandsPerSecond,
                self.limit_commands_per_second,
                "NARAD_LIMIT_COMMANDS_PER_SECOND",
            ),
            (
                Limit::CommandsBurst,
                self.limit_commands_burst,
                "NARAD_LIMIT_COMMANDS_BURST",
            ),
            (
                Limit::OpenStreams,
                self.limit_open_streams,
                "NARAD_LIMIT_OPEN_STREAMS",
            ),
            (
                Limit::AttachedExecutors,
                self.limit_attached_executors,
                "NARAD_LIMIT_ATTACHED_EXECUTORS",
            ),
            (Limit::Sessions, self.limit_sessions, "NARAD_LIMIT_SESSIONS"),
            (
                Limit::RetentionDays,
                self.retention_days,
                "NARAD_RETENTION_DAYS",
            ),
            (
                Limit::InterruptDefaultExpirySeconds,
                self.interrupt_default_expiry_seconds,
                "NARAD_INTERRUPT_DEFAULT_EXPIRY_SECONDS",
            ),
            (
                Limit::BlobMaxBytes,
                Some(self.blob_max_bytes),
                "NARAD_BLOB_MAX_BYTES",
            ),
            (
                Limit::StoredBytes,
                self.limit_stored_bytes,
                "NARAD_LIMIT_STORED_BYTES",
            ),
        ] {
            if let Some(v) = value
                && !(1..=limit.max()).contains(&v)
            {
                return Err(format!(
                    "{variable} is {v}: it takes 1 to {} (leave it unset for no limit)",
                    limit.max()
                ));
            }
            values.set(limit, value);
        }
        Ok(values)
    }

    /// The runtime timing and defaults these settings describe, checked.
    pub fn runtime_settings(&self) -> Result<crate::runtime::RuntimeSettings, String> {
        use std::time::Duration;
        let settings = crate::runtime::RuntimeSettings {
            lease_ttl: Duration::from_millis(self.runtime_lease_ttl_ms),
            sweep_interval: Duration::from_millis(self.runtime_sweep_ms),
            stop_grace: Duration::from_secs(self.stop_grace_seconds),
            front_end_abort_grace: (self.chat_abort_grace_ms > 0)
                .then(|| Duration::from_millis(self.chat_abort_grace_ms)),
            defaults: narad_journal::WorkDefaults {
                on_lost: crate::runtime::RuntimeSettings::parse_on_lost(&self.runtime_on_lost)?,
                max_attempts: self.runtime_max_attempts,
            },
            interrupt_default_expiry: self
                .interrupt_default_expiry_seconds
                .map(Duration::from_secs),
            retention_sweep: Duration::from_secs(self.retention_sweep_seconds),
            blob_unreferenced_after: Duration::from_secs(self.blob_unreferenced_seconds),
            ..crate::runtime::RuntimeSettings::default()
        };
        settings.validate()?;
        Ok(settings)
    }

    /// The executor timing these settings describe, checked.
    pub fn executor_settings(&self) -> Result<crate::executors::ExecutorSettings, String> {
        use std::time::Duration;
        let settings = crate::executors::ExecutorSettings {
            heartbeat_interval: Duration::from_millis(self.executor_heartbeat_ms),
            lease_ttl: Duration::from_millis(self.executor_lease_ttl_ms),
            token_ttl: Duration::from_millis(self.execution_token_ttl_ms),
            delivery_timeout: Duration::from_millis(self.executor_delivery_timeout_ms),
            sweep_interval: Duration::from_millis(self.executor_sweep_ms),
        };
        settings.validate()?;
        Ok(settings)
    }
}

/// A secret setting (a URL with a password, a key): `Debug`, `Display` and
/// serialisation show it with any password replaced by `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the code that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The text with the password of a `scheme://user:password@host` URL
    /// replaced by `***`; anything that is not such a URL is hidden whole.
    pub fn redacted(&self) -> String {
        let s = &self.0;
        let Some(scheme_end) = s.find("://") else {
            return "***".to_owned();
        };
        let rest = &s[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        match rest[..authority_end].rfind('@') {
            Some(at) => match rest[..at].find(':') {
                Some(colon) => format!(
                    "{}://{}:***{}",
                    &s[..scheme_end],
                    &rest[..colon],
                    &rest[at..]
                ),
                None => s.clone(),
            },
            None => s.clone(),
        }
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.redacted())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every limit variable reaches the defaults, the blob limits among
    /// them (they were once read and never used).
    #[test]
    fn limit_variables_are_the_defaults() {
        use crate::quotas::Limit;
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            config: Config,
        }
        let parse = |args: &[&str]| {
            let mut argv = vec!["narad"];
            argv.extend_from_slice(args);
            <Serve as clap::Parser>::try_parse_from(argv)
                .expect("parses")
                .config
        };
        let defaults = parse(&[]).limit_defaults().unwrap();
        assert_eq!(defaults.get(Limit::BlobMaxBytes), Some(256 * 1024 * 1024));
        assert_eq!(defaults.get(Limit::StoredBytes), None);
        let set = parse(&[
            "--blob-max-bytes",
            "4194304",
            "--limit-stored-bytes",
            "1000000",
        ])
        .limit_defaults()
        .unwrap();
        assert_eq!(set.get(Limit::BlobMaxBytes), Some(4_194_304));
        assert_eq!(set.get(Limit::StoredBytes), Some(1_000_000));
        assert!(parse(&["--blob-max-bytes", "0"]).limit_defaults().is_err());
    }

    /// A pool too small to run is refused with the number needed; the
    /// background reserve comes out of it.
    #[test]
    fn the_pool_holds_the_background_reserve_and_requests() {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            config: Config,
        }
        let pool = |n: &str| {
            <Serve as clap::Parser>::try_parse_from(["narad", "--database-pool", n])
                .expect("parses")
                .config
                .request_pool()
        };
        let needed = narad_journal::BACKGROUND_CONNECTIONS + MIN_REQUEST_CONNECTIONS;
        let refused = pool("2").unwrap_err();
        assert!(refused.contains(&format!("at least {needed}")), "{refused}");
        assert_eq!(
            pool(&needed.to_string()).unwrap().0,
            MIN_REQUEST_CONNECTIONS
        );
        assert_eq!(
            pool("32").unwrap(),
            (
                32 - narad_journal::BACKGROUND_CONNECTIONS,
                std::time::Duration::from_secs(5)
            )
        );
    }

    #[test]
    fn passwords_never_print() {
        let s: Secret = "postgres://narad:hunter2@db:5432/narad".parse().unwrap();
        assert_eq!(s.to_string(), "postgres://narad:***@db:5432/narad");
        assert!(!format!("{s:?}").contains("hunter2"));
        let no_password: Secret = "postgres://narad@db/narad".parse().unwrap();
        assert_eq!(no_password.to_string(), "postgres://narad@db/narad");
        let opaque: Secret = "s3cr3t".parse().unwrap();
        assert_eq!(opaque.to_string(), "***");
        let at_in_path: Secret = "postgres://u:p@h/db@x".parse().unwrap();
        assert_eq!(at_in_path.to_string(), "postgres://u:***@h/db@x");
    }
}
