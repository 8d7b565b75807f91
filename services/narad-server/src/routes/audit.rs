//! The audit log: every command and admin action of the tenant.

use axum::Json;
use axum::extract::State;
use narad_journal::{AuditEntry, AuditFilter};
use serde::Serialize;
use utoipa::ToSchema;

use super::{page_limit, query_time};
use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::Query;
use crate::error::ApiResult;

/// The default and largest page of `GET /v1/audit`.
pub const AUDIT_PAGE: (u32, u32) = (100, 1000);

/// A page of the audit log.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    /// Recorded actions, oldest first.
    pub entries: Vec<AuditEntry>,
    /// The `after` of the next page, when more remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub next_after: Option<String>,
}

/// Lists the tenant's commands and admin actions, oldest first: who acted
/// (`actor`), the request id, the outcome (`status`, and `code` when
/// refused) and the eventIds appended. Role `admin`.
#[utoipa::path(get, path = "/v1/audit", operation_id = "listAudit", tag = "operations",
    params(
        ("sessionId" = Option<String>, Query, description = "Only actions on this session"),
        ("sub" = Option<String>, Query, description = "Only actions of this subject"),
        ("action" = Option<String>, Query, description = "Only this command or admin action, e.g. resolve-interrupt"),
        ("since" = Option<String>, Query, format = DateTime, description = "Only actions recorded at or after this time"),
        ("until" = Option<String>, Query, format = DateTime, description = "Only actions recorded before this time"),
        ("after" = Option<String>, Query, pattern = r"^[0-9]{1,15}$", description = "The `nextAfter` of the previous page"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "The page size (default 100)"),
    ),
    responses(
        (status = 200, description = "A page of the audit log", body = AuditPage),
        (status = 400, description = "NRD-0008: a parameter is malformed"),
        (status = 403, description = "NRD-0102: no `admin` role"),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    mut query: Query,
) -> ApiResult<Json<AuditPage>> {
    principal.require(Permission::Admin)?;
    let since = query_time(&mut query, "since")?;
    let until = query_time(&mut query, "until")?;
    let after = query.number("after")?;
    let filter = AuditFilter {
        session_id: query.text("sessionId"),
        sub: query.text("sub"),
        action: query.text("action"),
        since,
        until,
        after: after.map(|a| i64::try_from(a).unwrap_or(i64::MAX)),
    };
    let limit = page_limit(query.number("limit")?, AUDIT_PAGE)?;
    query.finish()?;
    let mut entries = state
        .journal
        .audit_page(&principal.tenant, &filter, limit + 1)
        .await?;
    let next_after = if entries.len() > limit as usize {
        entries.truncate(limit as usize);
        entries.last().map(|e| e.position.to_string())
    } else {
        None
    };
    // A token limited to sessions sees the actions on them alone.
    entries.retain(|e| match (&e.session_id, &principal.sessions) {
        (_, None) => true,
        (Some(session), Some(_)) => principal.may_see(session),
        (None, Some(_)) => false,
    });
    Ok(Json(AuditPage {
        entries,
        next_after,
    }))
}
