//! Recording commands and admin actions in the tenant's audit log
//! (`GET /v1/audit`): who acted, the request id, the outcome and the events
//! appended. Recorded after the action's answer is known; a failure to
//! record is logged and counted, never turned into a failure of an action
//! that already took effect.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
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

/// An action's answer, as far as the audit log keeps it: its status.
pub trait Answered {
    /// The status the action answered with.
    fn answered(&self) -> StatusCode;
}

impl<T> Answered for (StatusCode, T) {
    fn answered(&self) -> StatusCode {
        self.0
    }
}

impl Answered for axum::response::Response {
    fn answered(&self) -> StatusCode {
        self.status()
    }
}

/// Records `action` by `principal` on `session` with its `outcome` (the
/// status and answer, or the refusal); `answer` gives the eventIds it
/// appended (`appended.events`). What it keeps is taken before the
/// returned future runs, so an answer that cannot be shared between
/// threads (a streamed response) is not held across its wait.
pub fn record<'a>(
    state: &'a AppState,
    principal: &'a Principal,
    request: &RequestId,
    action: &str,
    session: Option<&str>,
    outcome: &ApiResult<impl Answered>,
    answer: Option<&Value>,
) -> impl Future<Output = ()> + Send + 'a {
    let (status, code) = match outcome {
        Ok(answered) => (answered.answered().as_u16(), None),
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
        replayed: false,
    };
    write(state, principal, record)
}

/// Records the replay of `action`'s kept answer (`status`, `answer`, the
/// error envelope's `code` for a refusal) to a request that came again
/// with its `Idempotency-Key`: nothing was done again.
pub fn record_replay<'a>(
    state: &'a AppState,
    principal: &'a Principal,
    request: &RequestId,
    action: &str,
    session: Option<String>,
    status: StatusCode,
    answer: &Value,
) -> impl Future<Output = ()> + Send + 'a {
    let refused = status.is_client_error() || status.is_server_error();
    let record = AuditRecord {
        session_id: session,
        actor: actor_of(principal),
        action: action.to_owned(),
        request_id: request.0.clone(),
        status: status.as_u16(),
        code: refused
            .then(|| answer["code"].as_str().map(str::to_owned))
            .flatten(),
        event_ids: if refused {
            Vec::new()
        } else {
            appended_ids(answer)
        },
        replayed: true,
    };
    write(state, principal, record)
}

async fn write(state: &AppState, principal: &Principal, record: AuditRecord) {
    if let Err(e) = state.journal.record_audit(&principal.tenant, &record).await {
        metrics::counter!("narad_audit_write_failures_total").increment(1);
        tracing::error!(
            error = %e,
            action = record.action,
            "an action could not be recorded in the audit log"
        );
    }
}

/// Whether a write operation is in the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audited {
    /// Recorded under this action name.
    As(&'static str),
    /// Not recorded, for this reason.
    Not(&'static str),
}

const LEASES: &str = "lease traffic of a program narad hands work to; what the work changes \
                      is in the session's history";

/// Every write operation of the API (by `operationId`) and what the audit
/// log records it as, or why it does not. A test holds this list to the
/// OpenAPI document, so a new write route has to take a side.
pub const WRITES: &[(&str, Audited)] = &[
    ("createSession", Audited::As("create-session")),
    ("eraseSession", Audited::As("erase-session")),
    ("withdrawQueuedStart", Audited::As("withdraw-queued-start")),
    ("uploadBlob", Audited::As("upload-blob")),
    ("resumeUpload", Audited::As("resume-upload")),
    ("createSessionCommand", Audited::As("create-session")),
    ("updateSession", Audited::As("update-session")),
    ("archiveSession", Audited::As("archive-session")),
    ("startRun", Audited::As("start-run")),
    ("stopRun", Audited::As("stop-run")),
    ("resolveInterrupt", Audited::As("resolve-interrupt")),
    (
        "resolveInterruptAtSpecPath",
        Audited::As("resolve-interrupt"),
    ),
    ("recordUserMessage", Audited::As("record-user-message")),
    ("redactMessage", Audited::As("redact-message")),
    ("startWorkflow", Audited::As("start-workflow")),
    ("cancelWorkflow", Audited::As("cancel-workflow")),
    ("registerExtension", Audited::As("register-extension")),
    ("updateExtension", Audited::As("update-extension")),
    ("setTenantLimits", Audited::As("set-tenant-limits")),
    ("eraseTenant", Audited::As("erase-tenant")),
    (
        "appendEvents",
        Audited::Not(
            "the journal is its own record: every appended event is kept in history with its \
             eventId, sequence and provenance",
        ),
    ),
    ("attachExecutor", Audited::Not(LEASES)),
    ("renewExecutorLease", Audited::Not(LEASES)),
    ("finishClientToolCall", Audited::Not(LEASES)),
    ("claimRun", Audited::Not(LEASES)),
    ("renewRuntimeLease", Audited::Not(LEASES)),
    ("releaseRun", Audited::Not(LEASES)),
    (
        "runAgUi",
        Audited::Not(
            "each write it makes is recorded under its own command: create-session, \
             record-user-message, resolve-interrupt, start-run (a client tool's answer is \
             lease traffic, as finishClientToolCall)",
        ),
    ),
    (
        "chat",
        Audited::Not(
            "each write it makes is recorded under its own command: create-session, \
             record-user-message, resolve-interrupt, start-run (a client tool's answer is \
             lease traffic, as finishClientToolCall)",
        ),
    ),
    (
        "createStreamTicket",
        Audited::Not("a short-lived read credential: it writes nothing a session holds"),
    ),
];

/// The action the audit log records operation `operation_id` as, when it
/// records it.
pub fn action_of(operation_id: &str) -> Option<&'static str> {
    WRITES.iter().find_map(|(id, audited)| match audited {
        Audited::As(action) if *id == operation_id => Some(*action),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every write operation of the document takes a side, once.
    #[test]
    fn every_write_operation_is_audited_or_says_why_not() {
        let doc = crate::routes::openapi::document();
        let mut writes: Vec<String> = Vec::new();
        for (_, item) in doc["paths"].as_object().expect("paths") {
            for method in ["post", "put", "patch", "delete"] {
                if let Some(id) = item[method]["operationId"].as_str() {
                    writes.push(id.to_owned());
                }
            }
        }
        writes.sort_unstable();
        let mut listed: Vec<String> = WRITES.iter().map(|(id, _)| (*id).to_owned()).collect();
        listed.sort_unstable();
        assert_eq!(listed, writes);
    }
}
