//! `narad serve` and `narad token`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use narad_journal::Journal;
use narad_localpg::{Cluster, Durability};
use narad_server::auth::{AuthSettings, JwksSource, Role, Verifier};
use narad_server::config::{Config, Secret};
use narad_server::{AppState, app, serve_on};

/// Starts the server and serves until SIGINT or SIGTERM. Without a
/// database URL it runs the embedded default: a private Postgres in the
/// home directory, and a development signing secret beside it.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let (url, embedded) = match config.database_url.clone() {
        Some(url) => (url, None),
        None => {
            let (url, cluster) = embedded_database(&config.home).await?;
            (url, Some(cluster))
        }
    };
    let served = serve_with(&config, &url, embedded.is_some()).await;
    if let Some(cluster) = embedded {
        match cluster.stop() {
            Ok(()) => println!(
                "the embedded database in {} stopped",
                cluster.dir().display()
            ),
            Err(e) => eprintln!("narad: stopping the embedded database: {e}"),
        }
    }
    served
}

async fn serve_with(config: &Config, url: &Secret, embedded: bool) -> anyhow::Result<()> {
    let http = config.http_settings().map_err(anyhow::Error::msg)?;
    let (requests, wait) = config.request_pool().map_err(anyhow::Error::msg)?;
    narad_journal::migrate(url.expose())
        .await
        .with_context(|| format!("migrating {url}"))?;
    narad_server::metrics::install();
    let runtime = Arc::new(config.runtime_settings().map_err(anyhow::Error::msg)?);
    let blob_store =
        narad_journal::BlobStore::from_url(&config.blob_store).map_err(anyhow::Error::msg)?;
    let journal = Journal::connect_waiting(url.expose(), requests, wait)?
        .with_work_defaults(runtime.defaults)
        .with_blob_store(blob_store);
    // Background tasks on connections of their own: they never starve
    // requests, and requests never starve them.
    let background = journal.background(narad_journal::BACKGROUND_CONNECTIONS)?;
    let mut settings = auth_settings(config)?;
    let mut dev_token = None;
    if embedded && settings.hs256_secret.is_none() && settings.jwks.is_none() {
        let secret = dev_secret(&config.home)?;
        dev_token = Some(
            narad_server::auth::mint_hs256(
                secret.as_bytes(),
                &settings.issuer,
                &settings.audience,
                "dev",
                "developer",
                &Role::ALL,
                Duration::from_secs(12 * 3600),
            )
            .map_err(anyhow::Error::msg)?,
        );
        settings.hs256_secret = Some(secret.into_bytes());
    }
    let verifier = Verifier::new(settings).await.map_err(anyhow::Error::msg)?;
    let hub = narad_server::hub::Hub::new(
        background.clone(),
        Duration::from_millis(config.watch_window_ms),
    );
    tokio::spawn(hub.clone().run());
    // The pool gauges are the request pool's.
    narad_server::gauges::spawn(journal.clone(), hub.clone());
    tokio::spawn(narad_server::hub::retain_outbox(
        background.clone(),
        Duration::from_secs(config.outbox_retention_seconds),
    ));
    let executors = Arc::new(config.executor_settings().map_err(anyhow::Error::msg)?);
    tokio::spawn(narad_server::executors::sweep(
        background.clone(),
        hub.clone(),
        executors.clone(),
    ));
    tokio::spawn(narad_server::runtime::sweep(
        background.clone(),
        hub.clone(),
        runtime.clone(),
    ));
    let quotas = Arc::new(narad_server::quotas::Quotas::new(
        journal.clone(),
        config.limit_defaults().map_err(anyhow::Error::msg)?,
    ));
    tokio::spawn(quotas.clone().heartbeat());
    tokio::spawn(narad_server::erasure::sweep(
        background.clone(),
        hub.clone(),
        quotas.clone(),
        runtime.clone(),
    ));
    let closed = narad_server::closed_tenants::ClosedTenants::watch(background).await;
    let state = AppState {
        closed,
        hub,
        quotas,
        journal,
        verifier: Arc::new(verifier),
        openapi: Arc::new(OnceLock::new()),
        executors,
        runtime,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, database = %url, "narad is serving");
    let console = format!("http://{addr}{}", narad_server::console::PATH);
    if let Some(token) = &dev_token {
        println!(
            "\ndevelopment token (org dev, every role, 12 hours; `narad token` mints more):\n\n  \
             export NARAD_TOKEN={token}\n\ntry:\n\n  \
             curl -s -X POST http://{addr}/v1/sessions -H \"Authorization: Bearer $NARAD_TOKEN\" \
             -d '{{\"title\": \"first\"}}'\n\n\
             the console, signed in as the developer (the token travels in the fragment, which \
             no server sees):\n\n  {console}#token={token}\n"
        );
    } else {
        println!("the console: {console}");
    }
    // Last: this line says the server is ready.
    println!("narad is serving on http://{addr}");
    let hub = state.hub.clone();
    let hub_sockets = state.hub.clone();
    let journal = state.journal.clone();
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
    let signalled_at = Arc::new(OnceLock::new());
    let mark = signalled_at.clone();
    let serving = serve_on(listener, app(state, &http), async move {
        shutdown_signal().await;
        let _ = mark.set(tokio::time::Instant::now());
        // No new connections from here; streams and executor sockets end
        // at a frame boundary (clients resume elsewhere), the sweepers and
        // the relay stop, requests in flight (appends among them) finish.
        hub.close();
        let _ = signalled.send(());
    });
    let deadline = async {
        if on_signal.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        served = serving => served?,
        () = deadline => tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "the shutdown grace ran out: the connections still open are cut"
        ),
    }
    // Executor sockets are upgraded connections the HTTP server no longer
    // tracks: they close themselves (1001) when the hub closes; wait for
    // their close frames, within what is left of the grace.
    let since = signalled_at
        .get()
        .map_or(Duration::ZERO, |at: &tokio::time::Instant| at.elapsed());
    let left = grace.saturating_sub(since);
    if tokio::time::timeout(left, hub_sockets.sockets_closed())
        .await
        .is_err()
    {
        tracing::warn!("executor sockets still open at the end of the grace are cut");
    }
    // The pool's connections end with a clean goodbye to Postgres.
    journal.pool().close();
    println!("narad stopped");
    Ok(())
}

/// The longest Unix socket path (`sun_path` holds 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Starts (initialising on first use) the private Postgres in `home` and
/// returns the URL of its `narad` database.
async fn embedded_database(home: &Path) -> anyhow::Result<(Secret, Cluster)> {
    let Some(bin) = narad_localpg::bindir() else {
        anyhow::bail!(
            "no database: NARAD_DATABASE_URL is not set, and this machine has no Postgres \
             binaries for the embedded default. Either\n  \
             - install PostgreSQL (e.g. apt install postgresql), and run narad serve again;\n  \
             - set NARAD_DATABASE_URL to a Postgres database narad may migrate; or\n  \
             - run `docker compose up` in the narad repository (Postgres and narad together)."
        );
    };
    std::fs::create_dir_all(home)
        .with_context(|| format!("cannot create NARAD_HOME {}", home.display()))?;
    let home = std::path::absolute(home)?;
    let dir = home.join("postgres");
    if dir.join(".s.PGSQL.5432").as_os_str().len() > MAX_SOCKET_PATH {
        anyhow::bail!(
            "NARAD_HOME {} is too long a path for the embedded database's Unix socket; \
             choose a shorter NARAD_HOME",
            home.display()
        );
    }
    let cluster = Cluster::new(&dir, &bin);
    let admin = cluster
        .start(Durability::Durable)
        .await
        .map_err(|e| anyhow::anyhow!("the embedded database in {}: {e}", dir.display()))?;
    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(conn);
    let exists = client
        .query_opt("select 1 from pg_database where datname = 'narad'", &[])
        .await?
        .is_some();
    if !exists {
        client.batch_execute("create database narad").await?;
    }
    drop(client);
    let _ = conn.await;
    println!(
        "embedded database: Postgres {} in {} (Unix socket only)",
        narad_localpg::version(&bin),
        dir.display()
    );
    let url: Secret = cluster
        .url("narad")
        .parse()
        .map_err(|e: std::convert::Infallible| anyhow::anyhow!("{e}"))?;
    Ok((url, cluster))
}

/// The file holding the development signing secret in `home`.
fn dev_secret_path(home: &Path) -> PathBuf {
    home.join("dev-jwt-secret")
}

/// The development signing secret of `home`, created on first use (only
/// the embedded default uses it; a configured server never does).
fn dev_secret(home: &Path) -> anyhow::Result<String> {
    let path = dev_secret_path(home);
    if let Ok(secret) = std::fs::read_to_string(&path) {
        return Ok(secret.trim().to_owned());
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let secret = hex::encode(bytes);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    std::io::Write::write_all(&mut file, secret.as_bytes())?;
    Ok(secret)
}

/// Token settings from the configuration.
fn auth_settings(config: &Config) -> anyhow::Result<AuthSettings> {
    Ok(AuthSettings {
        issuer: config.jwt_issuer.clone(),
        audience: config.jwt_audience.clone(),
        hs256_secret: config
            .jwt_hs256_secret
            .as_ref()
            .map(|s| s.expose().as_bytes().to_vec()),
        jwks: config
            .jwks
            .as_deref()
            .map(JwksSource::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        jwks_refetch_interval: narad_server::auth::JWKS_REFETCH_INTERVAL,
        jwks_refresh_interval: Duration::from_secs(config.jwks_refresh_seconds),
        operator_org: config
            .operator_org
            .as_deref()
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(str::to_owned),
    })
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("stopping: finishing the requests in flight");
}

/// Options of `narad token`.
#[derive(clap::Args)]
pub struct TokenArgs {
    /// The tenant (`org` claim).
    #[arg(long)]
    org: String,
    /// The subject (`sub` claim).
    #[arg(long)]
    sub: String,
    /// Roles, comma-separated: reader, writer, approver, backend, executor, admin.
    #[arg(long, value_delimiter = ',', required = true)]
    roles: Vec<String>,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
    /// Client executor ids the token may attach as (`executors` claim),
    /// comma-separated; without it, any.
    #[arg(long, value_delimiter = ',')]
    executors: Option<Vec<String>>,
    /// Sessions the token is limited to (`sessions` claim),
    /// comma-separated; without it, every session of the tenant.
    #[arg(long, value_delimiter = ',')]
    sessions: Option<Vec<String>>,
    /// The secret that signs (HS256); default: the embedded default's
    /// development secret in NARAD_HOME.
    #[arg(long, env = "NARAD_JWT_HS256_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// narad's home, for the development secret.
    #[arg(long, env = "NARAD_HOME", default_value = "./.narad")]
    home: PathBuf,
    /// The issuer (`iss`).
    #[arg(long, env = "NARAD_JWT_ISSUER", default_value = "narad")]
    issuer: String,
    /// The audience (`aud`).
    #[arg(long, env = "NARAD_JWT_AUDIENCE", default_value = "narad")]
    audience: String,
}

/// Prints a signed HS256 token.
pub fn token(args: &TokenArgs) -> anyhow::Result<()> {
    let roles = args
        .roles
        .iter()
        .map(|r| {
            Role::from_name(r).with_context(|| {
                format!(
                    "unknown role {r:?}; the roles are {}",
                    Role::ALL.map(Role::name).join(", ")
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let secret = match &args.secret {
        Some(s) => s.clone(),
        None => std::fs::read_to_string(dev_secret_path(&args.home))
            .map(|s| s.trim().to_owned())
            .with_context(|| {
                format!(
                    "no secret: set NARAD_JWT_HS256_SECRET, or run `narad serve` once with the \
                     embedded default so that {} exists",
                    dev_secret_path(&args.home).display()
                )
            })?,
    };
    let mut claims = narad_server::auth::Claims::new(
        &args.issuer,
        &args.audience,
        &args.org,
        &args.sub,
        &roles,
        Duration::from_secs(args.ttl),
    )
    .map_err(anyhow::Error::msg)?;
    claims.executors = args.executors.clone();
    claims.sessions = args.sessions.clone();
    let token =
        narad_server::auth::sign_hs256(secret.as_bytes(), &claims).map_err(anyhow::Error::msg)?;
    println!("{token}");
    Ok(())
}
