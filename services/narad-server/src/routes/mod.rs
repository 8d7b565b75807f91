//! The HTTP routes, each documented where it is registered: the router and
//! the OpenAPI document come from the same list.

pub mod ag_ui;
pub mod ai_sdk_ui;
pub mod audit;
pub mod blobs;
pub mod commands;
pub mod erasure;
pub mod events;
pub mod executors;
pub mod extensions;
pub mod front_end;
pub mod front_end_caller;
pub mod graph_feed;
pub mod interrupts;
pub mod limits;
pub mod meta;
pub mod openapi;
pub mod operations;
pub mod resumable;
pub mod runtime;
pub mod search;
pub mod sessions;
pub mod sse;
pub mod stream;
pub mod tenant_stream;
pub mod tickets;
pub mod usage;

use axum::routing::post;
use narad_protocol::commands::Command;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::error::ApiError;

/// The document's frame: title, version, the bearer scheme.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "narad",
        description = "The narad/v1 server: durable journal, rule keeper and live delivery for agent sessions. Errors are always `{code, title, message, fields?, rule?, details?}` (docs/errors.md). Text in a request body, in any string or object key, may not hold U+0000 (Postgres, where narad keeps everything, cannot store it): such a body is refused whole with 400 NRD-0003 naming its JSON pointer. Integers may be written `3`, `3.0` or `3e0` (JSON Schema's integer); they are at most 2^53 − 1. An integer literal no 64-bit integer holds is refused anywhere in a body (400 NRD-0003 with its pointer) rather than rounded to a float: send such a value as a string."
    ),
    modifiers(&BearerScheme)
)]
struct ApiDoc;

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "extensionSignature",
            SecurityScheme::ApiKey(utoipa::openapi::security::ApiKey::Header(
                utoipa::openapi::security::ApiKeyValue::with_description(
                    "Narad-Signature",
                    "A registered extension's signed call: Narad-Signature (hmac-sha256,<hex>), \
                     Narad-Timestamp, Narad-Request-Id and Narad-Extension (publisher/name) travel \
                     together; the MAC covers method, path and query, timestamp, request id and the \
                     hex SHA-256 of the body, each followed by a newline. Accepted on streaming \
                     endpoints only.",
                ),
            )),
        );
        components.add_security_scheme(
            "streamTicket",
            SecurityScheme::ApiKey(utoipa::openapi::security::ApiKey::Query(
                utoipa::openapi::security::ApiKeyValue::with_description(
                    "ticket",
                    "A stream ticket (POST /v1/stream-tickets): opens the one stream it names for \
                     a minute, for a browser's EventSource, which cannot send Authorization.",
                ),
            )),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
    }
}

/// Every route, with its documentation.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(sessions::create, sessions::list))
        .routes(routes!(sessions::read, erasure::erase_session))
        .routes(routes!(blobs::upload))
        .routes(routes!(blobs::download, resumable::resume))
        .routes(routes!(resumable::upload_progress))
        .routes(routes!(erasure::erase_tenant))
        .routes(routes!(erasure::tenant_erasure))
        .routes(routes!(erasure::preview_retention))
        .routes(routes!(interrupts::open))
        .routes(routes!(operations::read))
        .routes(routes!(audit::list))
        .routes(routes!(limits::get, limits::set))
        .routes(routes!(search::search))
        .routes(routes!(usage::read))
        .routes(routes!(sessions::documents))
        .routes(routes!(sessions::queued_starts))
        .routes(routes!(sessions::withdraw_start))
        .routes(routes!(commands::create_session))
        .routes(routes!(commands::start_run))
        .routes(routes!(commands::stop_run))
        .routes(routes!(commands::resolve_interrupt))
        .routes(routes!(commands::record_user_message))
        .routes(routes!(commands::start_workflow))
        .routes(routes!(commands::cancel_workflow))
        .routes(routes!(commands::redact_message))
        .routes(routes!(commands::update_session))
        .routes(routes!(commands::archive_session))
        // Names that are not commands: a 404 naming the commands.
        .route("/v1/commands/{command}", post(commands::run))
        .routes(routes!(commands::resolve_interrupt_alias))
        .routes(routes!(events::append, events::history))
        .routes(routes!(stream::stream))
        .routes(routes!(ag_ui::run))
        .routes(routes!(ai_sdk_ui::chat))
        .routes(routes!(ai_sdk_ui::resume))
        .routes(routes!(tenant_stream::events))
        .routes(routes!(tickets::issue))
        .routes(routes!(extensions::register, extensions::list))
        .routes(routes!(extensions::update))
        .routes(routes!(meta::capabilities))
        .routes(routes!(meta::healthz))
        .routes(routes!(meta::metrics))
        .routes(routes!(meta::readyz))
        .routes(routes!(executors::connect))
        .routes(routes!(executors::attach))
        .routes(routes!(executors::heartbeat))
        .routes(routes!(executors::finish))
        .routes(routes!(executors::controls))
        .routes(routes!(runtime::claim))
        .routes(routes!(runtime::heartbeat))
        .routes(routes!(runtime::release))
        .routes(routes!(runtime::controls))
        .routes(routes!(meta::openapi))
}

/// A page size from the `limit` query parameter: `bounds.0` when absent,
/// 1 to `bounds.1` when given.
pub(crate) fn page_limit(limit: Option<u64>, bounds: (u32, u32)) -> Result<u32, ApiError> {
    match limit {
        None => Ok(bounds.0),
        Some(n) if (1..=u64::from(bounds.1)).contains(&n) => Ok(n as u32),
        Some(n) => Err(ApiError::new(
            narad_protocol::ErrorCode::InvalidParameter,
            format!("query parameter limit must be 1 to {}, got {n}", bounds.1),
        )
        .with_field("limit", "out of range")),
    }
}

/// An RFC 3339 time from query parameter `name`, in microseconds since the
/// epoch (any year RFC 3339 can write).
pub(crate) fn query_time(
    query: &mut crate::body::Query,
    name: &str,
) -> Result<Option<i64>, ApiError> {
    query
        .text(name)
        .map(|t| {
            narad_protocol::primitives::Timestamp::parse(t.as_str())
                .map(|t| t.to_utc().timestamp_micros())
                .map_err(|e| {
                    ApiError::new(
                        narad_protocol::ErrorCode::InvalidParameter,
                        format!("query parameter {name}: {e}"),
                    )
                    .with_field(name, "an RFC 3339 date-time, e.g. 2026-12-01T00:00:00Z")
                })
        })
        .transpose()
}

/// Parses the body of command `name`, with the API's errors.
pub(crate) fn parse_command(name: &str, body: &Value) -> Result<Command, ApiError> {
    match Command::parse(name, body) {
        Some(parsed) => parsed.map_err(|e| ApiError::from_body((&e).into())),
        None => Err(ApiError::internal(format!("{name} is not a command"))),
    }
}
