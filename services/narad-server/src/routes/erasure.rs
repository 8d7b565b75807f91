//! Erasure and retention: `DELETE /v1/sessions/{sessionId}` (an
//! organisation's admin), `DELETE /v1/admin/tenants/{org}` and its
//! progress (admins of the operator organisation), and the dry run of an
//! organisation's retention policy.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_journal::{ErasureReason, TenantErasure, TenantId};
use narad_protocol::ErrorCode;
use serde::Serialize;
use utoipa::ToSchema;

use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::Query;
use crate::error::{ApiError, ApiResult};
use crate::quotas::Limit;

/// What `DELETE /v1/sessions/{sessionId}` erased.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionErased {
    /// The session, now erased.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub session_id: String,
    /// How many events were erased with it.
    pub events_erased: u64,
}

/// Erases a session: its events, documents, queued starts, work items,
/// client calls and the audit entries naming it, in one transaction. Its
/// streams end; afterwards it answers 410 (NRD-0208), its id cannot name
/// a new session and its events' ids cannot be appended again. The
/// tenant stream carries a `session-erased` frame (no content).
#[utoipa::path(delete, path = "/v1/sessions/{sessionId}", operation_id = "eraseSession", tag = "sessions",
    params(("sessionId" = String, Path, description = "The session")),
    responses(
        (status = 200, description = "The session is erased", body = SessionErased),
        (status = 403, description = "NRD-0102: not an admin, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session"),
        (status = 410, description = "NRD-0208: the session was erased before"),
    ),
    security(("bearer" = [])))]
pub async fn erase_session(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path(session_id): Path<String>,
) -> ApiResult<Json<SessionErased>> {
    let outcome = async {
        principal.require(Permission::Admin)?;
        principal.require_session(&session_id)?;
        let events_erased = state
            .journal
            .erase_session(&principal.tenant, &session_id, ErasureReason::Request)
            .await?;
        crate::metrics::session_erased(ErasureReason::Request);
        Ok((
            StatusCode::OK,
            Json(SessionErased {
                session_id: session_id.clone(),
                events_erased,
            }),
        ))
    }
    .await;
    // The record of the erasure names the session; it is written after
    // the erasure, and so outlives it.
    crate::audit::record(
        &state,
        &principal,
        &request,
        "erase-session",
        Some(&session_id),
        &outcome,
        None,
    )
    .await;
    outcome.map(|(_, answer)| answer)
}

/// Where an organisation's erasure stands.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantErasureStatus {
    /// The organisation.
    pub org: String,
    /// `erasing` or `erased`.
    pub state: String,
    /// When the erasure was asked for.
    pub requested_at: String,
    /// The operator admin who asked.
    pub requested_by: String,
    /// Sessions erased so far.
    pub sessions_erased: u64,
    /// When it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

impl TenantErasureStatus {
    fn of(org: &TenantId, e: TenantErasure) -> TenantErasureStatus {
        TenantErasureStatus {
            org: org.to_string(),
            state: if e.finished_at.is_some() {
                "erased"
            } else {
                "erasing"
            }
            .into(),
            requested_at: e.requested_at,
            requested_by: e.requested_by,
            sessions_erased: e.sessions_erased,
            finished_at: e.finished_at,
        }
    }
}

fn org_of(org: &str) -> ApiResult<TenantId> {
    TenantId::new(org).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidParameter,
            format!("path parameter org: {e}"),
        )
        .with_field("org", "1 to 256 characters")
    })
}

fn require_operator(state: &AppState, principal: &Principal, what: &str) -> ApiResult<()> {
    principal.require(Permission::Admin)?;
    if !state.verifier.is_operator(&principal.tenant) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("only admins of the operator organisation (NARAD_OPERATOR_ORG) {what}"),
        ));
    }
    Ok(())
}

/// Erases an organisation: every session (in batches of 100, each in its
/// own transaction, resumed after a crash), then its executors,
/// extensions, limits and audit log. Answers at once; the erasure goes on
/// in the background (`GET /v1/admin/tenants/{org}/erasure`). From this
/// answer on, the organisation is closed for good: its credentials are
/// refused (410 `NRD-0210`) and no session is created for it.
#[utoipa::path(delete, path = "/v1/admin/tenants/{org}", operation_id = "eraseTenant", tag = "operations",
    params(("org" = String, Path, min_length = 1, max_length = 256, description = "The organisation (a token's `org`)")),
    responses(
        (status = 202, description = "The erasure is under way", body = TenantErasureStatus),
        (status = 403, description = "NRD-0102: not an admin of the operator organisation"),
    ),
    security(("bearer" = [])))]
pub async fn erase_tenant(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path(org): Path<String>,
) -> ApiResult<(StatusCode, Json<TenantErasureStatus>)> {
    let outcome = async {
        require_operator(&state, &principal, "erase organisations")?;
        let org = org_of(&org)?;
        let erasure = state
            .journal
            .request_tenant_erasure(&org, &principal.subject)
            .await?;
        state.closed.close(&org);
        Ok((
            StatusCode::ACCEPTED,
            Json(TenantErasureStatus::of(&org, erasure)),
        ))
    }
    .await;
    crate::audit::record(
        &state,
        &principal,
        &request,
        "erase-tenant",
        None,
        &outcome,
        None,
    )
    .await;
    outcome
}

/// Where an organisation's erasure stands.
#[utoipa::path(get, path = "/v1/admin/tenants/{org}/erasure", operation_id = "getTenantErasure", tag = "operations",
    params(("org" = String, Path, min_length = 1, max_length = 256, description = "The organisation (a token's `org`)")),
    responses(
        (status = 200, description = "The erasure's progress", body = TenantErasureStatus),
        (status = 403, description = "NRD-0102: not an admin of the operator organisation"),
        (status = 404, description = "NRD-0007: no erasure of this organisation was asked for"),
    ),
    security(("bearer" = [])))]
pub async fn tenant_erasure(
    State(state): State<AppState>,
    principal: Principal,
    Path(org): Path<String>,
) -> ApiResult<Json<TenantErasureStatus>> {
    require_operator(&state, &principal, "read erasures")?;
    let org = org_of(&org)?;
    match state.journal.tenant_erasure(&org).await? {
        Some(e) => Ok(Json(TenantErasureStatus::of(&org, e))),
        None => Err(ApiError::new(
            ErrorCode::NotFound,
            "no erasure of this organisation was asked for",
        )),
    }
}

/// A session the retention policy would erase now.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionCandidate {
    /// The session.
    pub session_id: String,
    /// When it was archived, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archived_at: Option<String>,
    /// Its last event, or its creation.
    pub last_activity_at: String,
}

/// The dry run of an organisation's retention policy.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPreview {
    /// The organisation.
    pub org: String,
    /// Its retention in effect (`null`: sessions are kept until erased by
    /// hand).
    pub retention_days: Option<u64>,
    /// The retention `due` was listed for: `?days=`, or the one in effect.
    pub preview_days: Option<u64>,
    /// The sessions a retention of `previewDays` would erase now (at most
    /// 500): with the policy in effect, what its next pass erases.
    pub due: Vec<RetentionCandidate>,
}

/// What a retention policy would erase now, erasing nothing: sessions
/// archived, or without activity, for longer than `retentionDays` (the
/// policy in effect), or than `?days=` — a policy not yet set, so that an
/// operator reads the list before anything can be erased. Operator admins,
/// or the organisation's own admins.
#[utoipa::path(get, path = "/v1/admin/tenants/{org}/retention", operation_id = "previewRetention", tag = "operations",
    params(
        ("org" = String, Path, min_length = 1, max_length = 256, description = "The organisation (a token's `org`)"),
        ("days" = Option<u64>, Query, minimum = 1, maximum = 36500, description = "Preview this retention instead of the one in effect (none need be set)"),
    ),
    responses(
        (status = 200, description = "The sessions due", body = RetentionPreview),
        (status = 403, description = "NRD-0102: not an admin of the operator organisation or of this one"),
    ),
    security(("bearer" = [])))]
pub async fn preview_retention(
    State(state): State<AppState>,
    principal: Principal,
    Path(org): Path<String>,
    mut query: Query,
) -> ApiResult<Json<RetentionPreview>> {
    principal.require(Permission::Admin)?;
    let org = org_of(&org)?;
    let asked = query.number("days")?;
    query.finish()?;
    let max_days = Limit::RetentionDays.max();
    if let Some(d) = asked.filter(|d| !(1..=max_days).contains(d)) {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!("days is {d}: it takes 1 to {max_days}"),
        )
        .with_field("days", format!("1 to {max_days}")));
    }
    if org != principal.tenant && !state.verifier.is_operator(&principal.tenant) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "only admins of the operator organisation (NARAD_OPERATOR_ORG) read another organisation's retention",
        ));
    }
    let days = state
        .quotas
        .effective(&org)
        .await?
        .get(Limit::RetentionDays);
    let preview_days = asked.or(days);
    let due = match preview_days {
        None => Vec::new(),
        Some(days) => state
            .journal
            .retention_due(&org, days as f64, 500)
            .await?
            .into_iter()
            .map(|d| RetentionCandidate {
                session_id: d.session_id,
                archived_at: d.archived_at,
                last_activity_at: d.last_activity_at,
            })
            .collect(),
    };
    Ok(Json(RetentionPreview {
        org: org.to_string(),
        retention_days: days,
        preview_days,
        due,
    }))
}
