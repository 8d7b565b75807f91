//! The approvals inbox: every open interrupt of the tenant.

use axum::Json;
use axum::extract::State;
use narad_journal::{InterruptCursor, OpenInterrupt};
use serde::Serialize;
use utoipa::ToSchema;

use super::page_limit;
use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::Query;
use crate::error::{ApiError, ApiResult};

/// The default and largest page of `GET /v1/interrupts`.
pub const INTERRUPT_PAGE: (u32, u32) = (100, 500);

/// A page of open interrupts.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterruptPage {
    /// Open interrupts, the longest waiting first.
    pub interrupts: Vec<OpenInterrupt>,
    /// The `after` of the next page, when more remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub next_after: Option<String>,
}

/// Lists the tenant's open interrupts (requested, not yet resolved) across
/// its sessions, or one session's (`sessionId`), the longest waiting first:
/// an approvals inbox. A token limited to sessions sees only theirs.
#[utoipa::path(get, path = "/v1/interrupts", operation_id = "listOpenInterrupts", tag = "sessions",
    params(
        ("after" = Option<String>, Query, pattern = r"^[0-9]{1,18}\.[0-9]{1,18}\..+$", description = "The `nextAfter` of the previous page (opaque)"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "The page size (default 100)"),
        ("sessionId" = Option<String>, Query, min_length = 1, max_length = 256, description = "Only this session's open interrupts"),
    ),
    responses(
        (status = 200, description = "A page of open interrupts", body = InterruptPage),
        (status = 400, description = "NRD-0008: `after` is not a cursor this route gave out, or `limit` is out of range"),
        (status = 403, description = "NRD-0102: no `reader` role, or `sessionId` names a session the token is not limited to"),
    ),
    security(("bearer" = [])))]
pub async fn open(
    State(state): State<AppState>,
    principal: Principal,
    mut query: Query,
) -> ApiResult<Json<InterruptPage>> {
    principal.require(Permission::Read)?;
    let after = query.text("after");
    let limit = page_limit(query.number("limit")?, INTERRUPT_PAGE)?;
    let session = query.text("sessionId");
    query.finish()?;
    if let Some(session) = &session {
        crate::body::parameter(
            "sessionId",
            narad_protocol::primitives::SessionId::new(session.clone()),
        )?;
        principal.require_session(session)?;
    }
    let after = match after.as_deref() {
        None => None,
        Some(text) => Some(InterruptCursor::parse(text).ok_or_else(|| {
            ApiError::new(
                narad_protocol::ErrorCode::InvalidParameter,
                "query parameter after must be the nextAfter of a previous page",
            )
            .with_field("after", "not a cursor of this route")
        })?),
    };
    let mut page = state
        .journal
        .open_interrupts(
            &principal.tenant,
            session.as_deref(),
            after.as_ref(),
            limit + 1,
        )
        .await?;
    let next_after = if page.len() > limit as usize {
        page.truncate(limit as usize);
        page.last().map(|(_, cursor)| cursor.encode())
    } else {
        None
    };
    Ok(Json(InterruptPage {
        interrupts: page
            .into_iter()
            .map(|(interrupt, _)| interrupt)
            .filter(|i| principal.may_see(&i.session_id))
            .collect(),
        next_after,
    }))
}
