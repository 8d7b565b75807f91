//! Sessions: create, list, read; queued starts.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_journal::{QueuedStart, SessionDocuments, SessionRecord};
use narad_protocol::commands::Command;
use serde::Serialize;
use utoipa::ToSchema;

use super::{page_limit, parse_command};
use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::{JsonBody, Query};
use crate::error::ApiResult;

/// The default and largest page of `GET /v1/sessions`.
pub const SESSION_PAGE: (u32, u32) = (50, 500);

/// Creates a session (the `create-session` command).
#[utoipa::path(post, path = "/v1/sessions", operation_id = "createSession", tag = "sessions",
    request_body(content = ref("#/components/schemas/commands.create-session"), description = "`{sessionId?, title?, metadata?}` (schema/commands/create-session.json)"),
    responses(
        (status = 201, description = "The session", body = SessionRecord),
        (status = 403, description = "NRD-0102: no `command` role, or a token limited to sessions (it could not name the new one)"),
        (status = 409, description = "NRD-0206: a session with this id exists"),
    ),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<SessionRecord>)> {
    // Over the command rate: refused before anything, not audited (see
    // `commands::execute`).
    state.quotas.take_command(&principal.tenant).await?;
    let outcome = async {
        principal.require(Permission::Command)?;
        let Command::CreateSession(cmd) = parse_command("create-session", &body)? else {
            unreachable!("create-session parses as itself")
        };
        let record = super::commands::create_session_within_limit(&state, &principal, cmd).await?;
        Ok((StatusCode::CREATED, Json(record)))
    }
    .await;
    let answer = outcome
        .as_ref()
        .ok()
        .map(|(_, Json(record))| serde_json::to_value(record).unwrap_or_default());
    crate::audit::record(
        &state,
        &principal,
        &request,
        "create-session",
        None,
        &outcome,
        answer.as_ref(),
    )
    .await;
    outcome
}

/// A page of sessions.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPage {
    /// The sessions, oldest first.
    pub sessions: Vec<SessionRecord>,
    /// The `after` of the next page, when more remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = narad_journal::openapi::id)]
    pub next_after: Option<String>,
}

/// Lists the tenant's sessions, oldest first.
#[utoipa::path(get, path = "/v1/sessions", operation_id = "listSessions", tag = "sessions",
    params(
        ("after" = Option<String>, Query, description = "The `nextAfter` of the previous page (an opaque session id)"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "The page size (default 50)"),
    ),
    responses((status = 200, description = "A page of sessions", body = SessionPage)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    mut query: Query,
) -> ApiResult<Json<SessionPage>> {
    principal.require(Permission::Read)?;
    let after = query.text("after");
    let limit = page_limit(query.number("limit")?, SESSION_PAGE)?;
    query.finish()?;
    let mut sessions = state
        .journal
        .sessions(&principal.tenant, after.as_deref(), limit + 1)
        .await?;
    let next_after = if sessions.len() > limit as usize {
        sessions.truncate(limit as usize);
        sessions.last().map(|s| s.session_id.clone())
    } else {
        None
    };
    // A token limited to sessions lists only those.
    sessions.retain(|s| principal.may_see(&s.session_id));
    Ok(Json(SessionPage {
        sessions,
        next_after,
    }))
}

/// A session's state and UI documents (§9.6), current through
/// `coversThroughSessionSequence`: read them, then stream with
/// `afterSessionSequence` set to it, and no change is missed.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/documents", operation_id = "getSessionDocuments", tag = "sessions",
    params(("sessionId" = String, Path, description = "The session")),
    responses(
        (status = 200, description = "The documents, and the sessionSequence they are current through", body = SessionDocuments),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = [])))]
pub async fn documents(
    State(state): State<AppState>,
    principal: Principal,
    Path(session_id): Path<String>,
) -> ApiResult<Json<SessionDocuments>> {
    principal.require(Permission::Read)?;
    principal.require_session(&session_id)?;
    Ok(Json(
        state
            .journal
            .documents(&principal.tenant, &session_id)
            .await?,
    ))
}

/// Reads a session.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}", operation_id = "getSession", tag = "sessions",
    params(("sessionId" = String, Path, description = "The session")),
    responses(
        (status = 200, description = "The session, with its sequence and active execution", body = SessionRecord),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<AppState>,
    principal: Principal,
    Path(session_id): Path<String>,
) -> ApiResult<Json<SessionRecord>> {
    principal.require(Permission::Read)?;
    principal.require_session(&session_id)?;
    Ok(Json(
        state
            .journal
            .session(&principal.tenant, &session_id)
            .await?,
    ))
}

/// Lists the starts waiting for the session's slot, in the order they will
/// start.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/queued-starts", operation_id = "listQueuedStarts", tag = "sessions",
    params(("sessionId" = String, Path, description = "The session")),
    responses(
        (status = 200, description = "The queued starts, in the order they will start", body = QueuedStarts),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = [])))]
pub async fn queued_starts(
    State(state): State<AppState>,
    principal: Principal,
    Path(session_id): Path<String>,
) -> ApiResult<Json<QueuedStarts>> {
    principal.require(Permission::Read)?;
    principal.require_session(&session_id)?;
    state
        .journal
        .session(&principal.tenant, &session_id)
        .await?;
    let queued_starts = state
        .journal
        .queued_starts(&principal.tenant, &session_id)
        .await?;
    Ok(Json(QueuedStarts { queued_starts }))
}

/// The starts waiting for a session's slot.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedStarts {
    /// In the order they will start.
    pub queued_starts: Vec<QueuedStart>,
}

/// Withdraws a queued start.
#[utoipa::path(delete, path = "/v1/sessions/{sessionId}/queued-starts/{queueId}", operation_id = "withdrawQueuedStart", tag = "sessions",
    params(
        ("sessionId" = String, Path, description = "The session"),
        ("queueId" = String, Path, description = "The queued start"),
    ),
    responses(
        (status = 204, description = "Withdrawn"),
        (status = 404, description = "NRD-0007: no such queued start (it may have started)"),
    ),
    security(("bearer" = [])))]
pub async fn withdraw_start(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path((session_id, queue_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let outcome = async {
        principal.require(Permission::Command)?;
        principal.require_session(&session_id)?;
        state
            .journal
            .withdraw_start(&principal.tenant, &session_id, &queue_id)
            .await?;
        Ok((StatusCode::NO_CONTENT, ()))
    }
    .await;
    crate::audit::record(
        &state,
        &principal,
        &request,
        "withdraw-queued-start",
        Some(&session_id),
        &outcome,
        None,
    )
    .await;
    outcome.map(|(status, ())| status)
}
