//! `narad serve` and `narad token`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use narad_journal::Journal;
use narad_server::auth::{AuthSettings, JwksSource, Role, Verifier};
use narad_server::config::Config;
use narad_server::{AppState, app, serve_on};

/// Starts the server and serves until SIGINT or SIGTERM.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let Some(url) = config.database_url.clone() else {
        anyhow::bail!(
            "no database: set NARAD_DATABASE_URL (or --database-url) to a Postgres database"
        );
    };
    narad_journal::migrate(url.expose())
        .await
        .with_context(|| format!("migrating {url}"))?;
    let journal = Journal::connect(url.expose(), config.database_pool)?;
    let verifier = Verifier::new(auth_settings(&config)?).map_err(anyhow::Error::msg)?;
    let state = AppState {
        journal,
        verifier: Arc::new(verifier),
        openapi: Arc::new(OnceLock::new()),
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, database = %url, "narad is serving");
    println!("narad is serving on http://{addr}");
    serve_on(
        listener,
        app(state, config.max_body_bytes),
        shutdown_signal(),
    )
    .await?;
    println!("narad stopped");
    Ok(())
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
    /// The secret that signs (HS256).
    #[arg(long, env = "NARAD_JWT_HS256_SECRET", hide_env_values = true)]
    secret: String,
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
    let token = narad_server::auth::mint_hs256(
        args.secret.as_bytes(),
        &args.issuer,
        &args.audience,
        &args.org,
        &args.sub,
        &roles,
        Duration::from_secs(args.ttl),
    )
    .map_err(anyhow::Error::msg)?;
    println!("{token}");
    Ok(())
}
