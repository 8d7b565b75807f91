//! A session's events: backends append batches of authority events; every
//! reader reads history (§10.2).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use narad_journal::append::MAX_BATCH;
use narad_journal::{AppendOptions, Appended, Fence, HistoryPage, HistoryQuery, JournalError};
use narad_protocol::ErrorCode;
use narad_protocol::engine::Issuer;
use narad_protocol::primitives::{MAX_SAFE_INTEGER, SessionId};
use serde_json::Value;

use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::{JsonBody, Query};
use crate::error::{ApiError, ApiResult};
use crate::signature::StreamCaller;

/// Appends a batch of proposed authority events, atomically.
#[utoipa::path(post, path = "/v1/sessions/{sessionId}/events", operation_id = "appendEvents", tag = "events",
    params(
        ("sessionId" = String, Path, description = "The session: the `sessionId` of every proposed event that names one"),
        ("Narad-Runtime-Lease" = Option<String>, Header, description = "The runtime lease of a claim (`lease.leaseId`): required for appends to a run journal held by an agent runtime"),
    ),
    request_body(content = ref("#/components/schemas/AppendRequest"), description = "`{events: [proposed authority events, without sequences], expectedSessionSequence?}`; each event names its eventId, which makes retries idempotent"),
    responses(
        (status = 201, description = "Appended: each event's sessionSequence (and sequence, workflowSequence)", body = Appended),
        (status = 200, description = "The whole batch had been appended before with the same bodies: the stored sequences (`duplicate: true`)", body = Appended),
        (status = 400, description = "NRD-0003, NRD-0004, NRD-0005: an event is not valid (`fields` points at it); NRD-0008: a bad sessionId or Narad-Runtime-Lease"),
        (status = 403, description = "NRD-0102: no `backend` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session"),
        (status = 409, description = "NRD-0201 with the rule id (the issuer.* rules too: a backend approves nothing, gives no client call its result, and stamps no actor), NRD-0202 eventId reused, NRD-0203 expectedSessionSequence, NRD-0501 a runtime lease that is not current, NRD-0502 a run held by a runtime appended to without its lease"),
    ),
    security(("bearer" = [])))]
pub async fn append(
    State(state): State<AppState>,
    principal: Principal,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Appended>)> {
    principal.require(Permission::Append)?;
    principal.require_session(&session_id)?;
    let lease = match headers.get(crate::routes::runtime::LEASE_HEADER) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| {
                    ApiError::new(
                        ErrorCode::InvalidParameter,
                        "Narad-Runtime-Lease: must be the leaseId of a claim",
                    )
                    .with_field("Narad-Runtime-Lease", "not text")
                })?
                .to_owned(),
        ),
    };
    let session = crate::body::parameter("sessionId", SessionId::new(session_id))?;
    let (events, expected_session_sequence) = batch(body).inspect_err(|_| {
        crate::metrics::append_refused(ErrorCode::InvalidObject);
    })?;
    state
        .quotas
        .take_events(&principal.tenant, events.len())
        .await
        .inspect_err(|e| {
            if let Some(code) = ErrorCode::from_code(e.code()) {
                crate::metrics::append_refused(code);
            }
        })?;
    let appended = state
        .journal
        .append(
            &principal.tenant,
            &session,
            &events,
            AppendOptions {
                expected_session_sequence,
                fence: Fence::Backend { lease },
                issuer: Issuer::Backend,
                work: None,
            },
        )
        .await
        .inspect_err(|e| {
            // Refused before the journal queued the batch, where every
            // other answer is counted.
            if matches!(
                e,
                JournalError::Invalid { .. } | JournalError::InvalidBody { .. }
            ) {
                crate::metrics::append_refused(e.code());
            }
        })?;
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(appended)))
}

/// The events and `expectedSessionSequence` of an append's body.
fn batch(body: Value) -> ApiResult<(Vec<Value>, Option<u64>)> {
    let Value::Object(mut body) = body else {
        return Err(invalid("", "the body is `{\"events\": [...]}`"));
    };
    let events = match body.remove("events") {
        Some(Value::Array(events)) => events,
        Some(_) => return Err(invalid("/events", "must be an array of proposed events")),
        None => return Err(invalid("/events", "missing: the batch of proposed events")),
    };
    if events.is_empty() || events.len() > MAX_BATCH {
        return Err(invalid(
            "/events",
            &format!(
                "a batch holds 1 to {MAX_BATCH} events, this one {}",
                events.len()
            ),
        ));
    }
    let expected_session_sequence = match body.remove("expectedSessionSequence") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| *n <= MAX_SAFE_INTEGER)
                .ok_or_else(|| {
                    invalid(
                        "/expectedSessionSequence",
                        "must be an integer from 0 to 2^53 - 1",
                    )
                })?,
        ),
    };
    if let Some(field) = body.keys().next() {
        return Err(invalid(
            &format!("/{field}"),
            "unknown field: the body holds events and expectedSessionSequence",
        ));
    }
    Ok((events, expected_session_sequence))
}

fn invalid(pointer: &str, problem: &str) -> ApiError {
    ApiError::new(ErrorCode::InvalidObject, format!("{pointer}: {problem}"))
        .with_field(pointer, problem)
}

/// Reads a page of the session's history.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/events", operation_id = "readHistory", tag = "events",
    params(
        ("sessionId" = String, Path, description = "The session"),
        ("afterSessionSequence" = Option<u64>, Query, maximum = 9007199254740991.0, description = "Events after this sessionSequence"),
        ("rootRunId" = Option<String>, Query, description = "Only this run journal's events"),
        ("afterSequence" = Option<u64>, Query, maximum = 9007199254740991.0, description = "With rootRunId: after this run-tree sequence"),
        ("workflowId" = Option<String>, Query, description = "Only this workflow's events"),
        ("afterWorkflowSequence" = Option<u64>, Query, maximum = 9007199254740991.0, description = "With workflowId: after this workflowSequence"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "The page size (default 100)"),
        super::openapi::SignatureHeaders,
    ),
    responses(
        (status = 200, description = "A page of history, with the cursors of the next page when more remain", body = HistoryPage),
        (status = 400, description = "NRD-0301: cursors that name different positions; NRD-0008: a bad parameter"),
        (status = 403, description = "NRD-0102: the credential does not reach this session"),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = []), ("extensionSignature" = [])))]
pub async fn history(
    State(state): State<AppState>,
    StreamCaller(principal): StreamCaller,
    Path(session_id): Path<String>,
    mut query: Query,
) -> ApiResult<Json<HistoryPage>> {
    principal.require(Permission::Read)?;
    principal.require_session(&session_id)?;
    let q = HistoryQuery {
        after_session_sequence: query.number("afterSessionSequence")?,
        root_run_id: query.text("rootRunId"),
        after_sequence: query.number("afterSequence")?,
        workflow_id: query.text("workflowId"),
        after_workflow_sequence: query.number("afterWorkflowSequence")?,
        limit: query
            .number("limit")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    };
    query.finish()?;
    Ok(Json(
        state
            .journal
            .history(&principal.tenant, &session_id, &q)
            .await?,
    ))
}
