//! Capabilities (§10.4), health, readiness and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use narad_journal::history;
use narad_protocol::{Profile, ProfileSet};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::Query;
use crate::error::ApiResult;

/// The capability document (§10.4), for a session when one is named.
#[utoipa::path(get, path = "/v1/capabilities", operation_id = "getCapabilities", tag = "meta",
    params(("sessionId" = Option<String>, Query, description = "A session: adds its current sequence and active execution")),
    responses(
        (status = 200, description = "The `capabilities` control message", body = ref("#/components/schemas/control.capabilities")),
        (status = 403, description = "NRD-0102: no `read` permission, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = [])))]
pub async fn capabilities(
    State(state): State<AppState>,
    principal: Principal,
    mut query: Query,
) -> ApiResult<Json<Value>> {
    principal.require(Permission::Read)?;
    let session_id = query.text("sessionId");
    query.finish()?;
    if let Some(s) = &session_id {
        principal.require_session(s)?;
    }
    Ok(Json(
        capability_document(&state, &principal.tenant, session_id.as_deref()).await?,
    ))
}

/// The `capabilities` control message, for a session when one is named.
pub async fn capability_document(
    state: &AppState,
    tenant: &narad_journal::TenantId,
    session_id: Option<&str>,
) -> ApiResult<Value> {
    let profiles: Vec<&str> = ProfileSet::all().iter().map(Profile::id).collect();
    let mut doc = json!({
        "type": "capabilities",
        "protocolVersion": "narad/v1",
        "activeProfiles": profiles,
        "history": {
            "maxPageSize": history::MAX_LIMIT,
            "defaultPageSize": history::DEFAULT_LIMIT,
        },
        "heartbeat": {
            "intervalMs": state.executors.heartbeat_interval.as_millis() as u64,
            "leaseTtlMs": state.executors.lease_ttl.as_millis() as u64,
        },
        "chatFrontEnds": {
            "agUi": {"path": "/v1/ag-ui", "protocolVersion": ag_ui::PROTOCOL_VERSION},
            "aiSdkUi": {"path": "/v1/chat", "resumePath": "/v1/chat/{sessionId}/stream", "protocol": "ui-message-stream/v1"},
        },
    });
    if let Some(id) = session_id {
        let session = state.journal.session(tenant, id).await?;
        doc["sessionId"] = json!(session.session_id);
        doc["currentSessionSequence"] = json!(session.session_sequence);
        if let Some(active) = session.active_execution {
            doc["activeExecution"] = active;
        }
    }
    Ok(doc)
}

/// Prometheus metrics of this process (text exposition format).
#[utoipa::path(get, path = "/metrics", operation_id = "getMetrics", tag = "meta",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
pub async fn metrics() -> ([(axum::http::header::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(),
    )
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", operation_id = "checkHealth", tag = "meta",
    responses((status = 200, description = "The process is up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: HealthStatus::Ok,
    })
}

/// The answer of `/healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: HealthStatus,
}

/// The one status of a live process.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// The process answers.
    Ok,
}

/// The answer of `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready`, or `unavailable` with a reason.
    pub status: ReadinessStatus,
    /// Why the server is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub reason: Option<&'static str>,
}

/// Whether the server takes traffic.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReadinessStatus {
    /// The database answers, with every migration.
    Ready,
    /// Not now; `reason` says why.
    Unavailable,
}

fn unavailable(reason: &'static str) -> (StatusCode, Json<Readiness>) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(Readiness {
            status: ReadinessStatus::Unavailable,
            reason: Some(reason),
        }),
    )
}

/// The database answers and holds every migration of this build.
#[utoipa::path(get, path = "/readyz", operation_id = "checkReadiness", tag = "meta",
    responses(
        (status = 200, description = "`{status: ready}`", body = Readiness),
        (status = 503, description = "`{status: unavailable, reason}`", body = Readiness),
    ))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.journal.migrations_applied().await {
        Ok(true) => (
            StatusCode::OK,
            Json(Readiness {
                status: ReadinessStatus::Ready,
                reason: None,
            }),
        ),
        Ok(false) => unavailable("migrations are not applied yet"),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: the database does not answer");
            unavailable("the database does not answer")
        }
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "getOpenApiDocument", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document of every route", body = ref("#/components/schemas/OpenApiDocument"))))]
pub async fn openapi(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        state.openapi.get().cloned().unwrap_or_default(),
    )
}
