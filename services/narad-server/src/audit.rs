//! Recording commands and admin actions in the tenant's audit log
//! (`GET /v1/audit`): who acted, the request id, the outcome and the events
//! appended. Recorded after the action's answer is known; a failure to
//! record is logged and counted, never turned into a failure of an action
//! that already took effect.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use narad_journal::AuditRecord;
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiResult;

/// The request's `x-request-id` (set by the server when the client sent none).
#[derive(Debug, Clone, Default)]
pub struct RequestId(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<RequestId, Infallible> {
        Ok(RequestId(
            parts
                .headers
                .get(crate::REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        ))
    }
}

/// Who acted, as the audit log names them.
pub fn actor_of(principal: &Principal) -> Value {
    match &principal.extension {
        Some((publisher, name)) => {
            json!({"kind": "extension", "sub": principal.subject, "extension": format!("{publisher}/{name}")})
        }
        None => json!({"kind": "user", "sub": principal.subject}),
    }
}

/// The eventIds an answer reports as appended (`appended.events`).
fn appended_ids(answer: &Value) -> Vec<String> {
    answer["appended"]["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter_map(|e| e["eventId"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Records `action` by `principal` on `session` with its `outcome` (the
/// status and answer, or the refusal).
pub async fn record<T>(
    state: &AppState,
    principal: &Principal,
    request: &RequestId,
    action: &str,
    session: Option<&str>,
    outcome: &ApiResult<(axum::http::StatusCode, T)>,
    answer: Option<&Value>,
) {
    let (status, code) = match outcome {
        Ok((status, _)) => (status.as_u16(), None),
        Err(e) => (e.status().as_u16(), Some(e.code().to_owned())),
    };
    let session = session
        .map(str::to_owned)
        .or_else(|| answer.and_then(|a| a["sessionId"].as_str().map(str::to_owned)));
    let record = AuditRecord {
        session_id: session,
        actor: actor_of(principal),
        action: action.to_owned(),
        request_id: request.0.clone(),
        status,
        code,
        event_ids: answer.map(appended_ids).unwrap_or_default(),
    };
    if let Err(e) = state.journal.record_audit(&principal.tenant, &record).await {
        metrics::counter!("narad_audit_write_failures_total").increment(1);
        tracing::error!(error = %e, action, "an action could not be recorded in the audit log");
    }
}
