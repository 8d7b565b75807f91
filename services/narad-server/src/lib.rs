//! The narad server: the HTTP API on axum, its access control, and the
//! process that serves it.
//!
//! Modules:
//! - [`config`]: settings from flags and `NARAD_*` environment variables;
//! - [`auth`]: bearer JWTs, roles and permissions;
//! - [`closed_tenants`]: organisations closed by their erasure, refused on
//!   every replica;
//! - [`routes`]: every route, documented where it is registered;
//! - [`hub`]: the relay and fan-out of committed events to live streams;
//! - [`metrics`]: the Prometheus recorder behind `/metrics` (a leaf: owners
//!   push their values into it);
//! - [`gauges`]: the task that samples the gauges no event moves;
//! - [`executors`]: client executors' channels and the sweeper (§11);
//! - [`runtime`]: agent runtimes' settings and the sweeper that repairs lost runs;
//! - [`signature`]: signed calls of registered extensions;
//! - [`body`]: request bodies and query strings, with the API's errors;
//! - [`idempotency`]: the `Idempotency-Key` of commands, session creation,
//!   uploads and stream tickets: the first answer, again;
//! - [`input`]: checks of paths, headers and announced lengths that every
//!   request passes before its handler;
//! - [`error`]: the error envelope as an HTTP answer;
//! - [`console`]: the console's files and its `config.json`;
//! - [`prices`]: the operator's price table the console prices usage with.

pub mod audit;
pub mod auth;
pub mod body;
pub mod closed_tenants;
pub mod coalesce;
pub mod config;
pub mod console;
pub mod cors;
pub mod erasure;
pub mod error;
pub mod executors;
pub mod expiry;
pub mod gauges;
pub mod hub;
pub mod idempotency;
pub mod input;
pub mod metrics;
pub mod prices;
pub mod quotas;
pub mod routes;
pub mod runtime;
pub mod signature;
pub mod wide_integers;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request};
use axum::middleware::{from_fn, from_fn_with_state};
use narad_journal::Journal;
use narad_protocol::ErrorCode;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::auth::Verifier;
use crate::error::ApiError;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The journal.
    pub journal: Journal,
    /// The token checker.
    pub verifier: Arc<Verifier>,
    /// The OpenAPI document, as served.
    pub openapi: Arc<OnceLock<String>>,
    /// Live subscribers and the relay that feeds them.
    pub hub: Arc<hub::Hub>,
    /// How client executors are timed.
    pub executors: Arc<executors::ExecutorSettings>,
    /// How agent runtimes are timed.
    pub runtime: Arc<runtime::RuntimeSettings>,
    /// Per-tenant limits and their enforcement.
    pub quotas: Arc<quotas::Quotas>,
    /// The organisations closed by an erasure.
    pub closed: Arc<closed_tenants::ClosedTenants>,
}

/// The header that carries the request id, in requests and answers.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How the HTTP layer treats requests, beyond the routes.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// The largest request body, in bytes (`NARAD_MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// How long the first answer to an `Idempotency-Key` is kept
    /// (`NARAD_IDEMPOTENCY_KEEP_HOURS`, 24 hours by default).
    pub idempotency_keep: Duration,
    /// The origins whose pages may call the API (`NARAD_CORS_ORIGINS`,
    /// checked by [`cors::parse_origins`]); none by default.
    pub cors_origins: Vec<axum::http::HeaderValue>,
    /// The identity provider the console signs people in with
    /// (`NARAD_CONSOLE_*`); none by default.
    pub console_oidc: Option<console::Oidc>,
    /// The price table the console prices usage with
    /// (`NARAD_CONSOLE_PRICES`); none by default.
    pub console_prices: Option<prices::Prices>,
}

impl Default for HttpSettings {
    fn default() -> HttpSettings {
        HttpSettings {
            max_body_bytes: config::DEFAULT_MAX_BODY_BYTES,
            idempotency_keep: idempotency::DEFAULT_KEEP,
            cors_origins: Vec::new(),
            console_oidc: None,
            console_prices: None,
        }
    }
}

/// The whole application: every route, with request ids, the body limit,
/// CORS and the error envelope for unknown routes.
pub fn app(state: AppState, http: &HttpSettings) -> Router {
    let max_body_bytes = http.max_body_bytes;
    let (router, api) = routes::router().split_for_parts();
    let document = routes::openapi::complete(&api);
    let cors = Arc::new(cors::Cors::new(http.cors_origins.clone(), &document));
    let _ = state
        .openapi
        .set(serde_json::to_string_pretty(&document).expect("the OpenAPI document serialises"));
    let keyed = idempotency::Keyed::new(state.clone(), http);
    router
        .route_layer(from_fn_with_state(keyed, idempotency::layer))
        .route_layer(from_fn(input::path_params))
        .merge(console::router(http.console_oidc.clone(), http.console_prices.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(from_fn(signature::streaming_only))
        .layer(from_fn(input::headers))
        .layer(from_fn_with_state(
            max_body_bytes,
            input::announced_length,
        ))
        .layer(CatchPanicLayer::custom(panicked))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &Request<_>| {
                let id = req
                    .headers()
                    .get(REQUEST_ID)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
            }),
        )
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(from_fn(input::request_id))
        .layer(from_fn_with_state(cors, cors::layer))
}

/// A handler that panicked answers the internal-error envelope (the panic
/// is logged inside the request's span), and the server goes on.
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic");
    axum::response::IntoResponse::into_response(ApiError::internal(format!(
        "a handler panicked: {detail}"
    )))
}

async fn not_found() -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        "no route here; GET /openapi.json lists every route",
    )
}

/// A route asked with a method it does not take: 405, and axum adds the
/// `Allow` header listing the methods it does take.
async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this route does not take this method; the Allow header lists the methods it takes",
    )
}

/// How long a stopping server waits for requests in flight by default
/// (`NARAD_SHUTDOWN_GRACE_MS`).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Serves `app` on `listener` until `shutdown` completes, then lets the
/// requests in flight finish. Every connection has `TCP_NODELAY`: a stream's
/// frames leave when written, not when the client's delayed ACK of the
/// previous one arrives (Nagle's algorithm held frames for tens of
/// milliseconds under load; BENCHMARKS.md).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
    });
    // Routes resolved once, shared by every connection: served as a plain
    // `Router`, axum rebuilt its route table for each accepted connection
    // (about 18 KiB held by every open stream; BENCHMARKS.md).
    let app = app.with_state(()).into_make_service();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
