//! The `Idempotency-Key` request header (the IETF httpapi draft's header,
//! with Stripe's semantics): a client that lost an answer sends the same
//! request again with the same key and gets the first answer again,
//! marked `Idempotent-Replayed: true`, instead of a second effect.
//!
//! One mechanism for every operation that takes a key ([`OPERATIONS`]):
//! [`layer`] wraps the routes, and the OpenAPI document is completed from
//! the same list ([`document`]), so that no keyed route can skip it.
//!
//! - The first answer is kept per tenant and key for
//!   `NARAD_IDEMPOTENCY_KEEP_HOURS` (24 by default), with a fingerprint of
//!   the request: method, path and query, media type, the caller (subject
//!   and extension) and the body's bytes (for an upload, whose bytes are
//!   not held twice, its announced lengths instead). Answers of the server
//!   failing (5xx) or of a tenant limit (429) are not kept: nothing was
//!   done, and the key is free again.
//! - The same key with another request is refused 422 NRD-0211; a request
//!   while the first with its key is still running (on any replica) is
//!   refused 409 NRD-0212 with `Retry-After`.
//! - A keyed request runs to its end even when its client goes away (the
//!   answer is kept for the retry). A replica that dies while running one
//!   holds the key for at most [`HOLD`]; then the request runs again.
//! - Keys are erased with their session (or their tenant), replays are in
//!   the audit log (`replayed: true`), and every keyed request is counted
//!   in `narad_idempotency_keys_total` by outcome.

use std::time::Duration;

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use narad_journal::{KeptAnswer, KeyClaim, TenantId};
use narad_protocol::ErrorCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::Instrument;

use crate::AppState;
use crate::audit::RequestId;
use crate::auth::Principal;
use crate::error::ApiError;

/// The request header that carries the key.
pub const KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header that marks a replayed answer.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How long a first answer is kept by default.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(24 * 3600);

/// How long a replica holds a key while its request runs, unless it
/// pushes on (every [`HOLD`] / 3); a replica that died lets it go after
/// this.
pub const HOLD: Duration = Duration::from_secs(30);

/// The longest key, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// What a request's fingerprint covers beside its method, path, query,
/// media type and caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Covers {
    /// The body's bytes (a JSON body, held whole anyway).
    Body,
    /// The lengths it announces (`Content-Length`, `Upload-Length`): an
    /// upload's bytes stream through and are not held twice.
    Lengths,
}

/// An operation that takes an `Idempotency-Key`.
#[derive(Debug, Clone, Copy)]
pub struct KeyedOperation {
    /// Its `operationId`.
    pub operation_id: &'static str,
    /// Its path, as routed (`{sessionId}` for a parameter).
    pub path: &'static str,
    /// What its fingerprint covers.
    pub covers: Covers,
}

const fn post(operation_id: &'static str, path: &'static str) -> KeyedOperation {
    KeyedOperation {
        operation_id,
        path,
        covers: Covers::Body,
    }
}

/// Every operation that takes an `Idempotency-Key` (all `POST`): the
/// commands, session creation, blob uploads and stream tickets. Appends
/// need none (their eventIds make a resend a duplicate), nor do reads,
/// deletes, or lease traffic.
pub const OPERATIONS: &[KeyedOperation] = &[
    post("createSession", "/v1/sessions"),
    KeyedOperation {
        operation_id: "uploadBlob",
        path: "/v1/sessions/{sessionId}/blobs",
        covers: Covers::Lengths,
    },
    post("createSessionCommand", "/v1/commands/create-session"),
    post("startRun", "/v1/commands/start-run"),
    post("stopRun", "/v1/commands/stop-run"),
    post("resolveInterrupt", "/v1/commands/resolve-interrupt"),
    post(
        "resolveInterruptAtSpecPath",
        "/api/narad/v1/commands/resolve-interrupt",
    ),
    post("recordUserMessage", "/v1/commands/record-user-message"),
    post("startWorkflow", "/v1/commands/start-workflow"),
    post("cancelWorkflow", "/v1/commands/cancel-workflow"),
    post("redactMessage", "/v1/commands/redact-message"),
    post("updateSession", "/v1/commands/update-session"),
    post("archiveSession", "/v1/commands/archive-session"),
    post("createStreamTicket", "/v1/stream-tickets"),
];

/// The keyed operation a request was routed to, if it is one.
fn operation_of(request: &Request) -> Option<&'static KeyedOperation> {
    if request.method() != Method::POST {
        return None;
    }
    let path = request.extensions().get::<MatchedPath>()?.as_str();
    OPERATIONS.iter().find(|op| op.path == path)
}

/// What the layer needs: the application, and how long answers are kept.
#[derive(Clone)]
pub struct Keyed {
    state: AppState,
    keep: Duration,
    max_body: usize,
}

impl Keyed {
    /// The layer's state for `app`.
    pub fn new(state: AppState, http: &crate::HttpSettings) -> Keyed {
        Keyed {
            state,
            keep: http.idempotency_keep,
            max_body: http.max_body_bytes,
        }
    }
}

/// The key a request carries: 1 to [`MAX_KEY_LEN`] printable ASCII
/// characters without spaces, bare or as a structured-field string
/// (`"…"`, as the draft writes it; the quotes are not part of the key).
/// [`KEY_PATTERN`] says the same for the OpenAPI document.
fn key_of(value: &HeaderValue) -> Result<String, ApiError> {
    let refused = || {
        ApiError::new(
            ErrorCode::InvalidParameter,
            format!(
                "Idempotency-Key must be 1 to {MAX_KEY_LEN} printable ASCII characters without \
                 spaces (a UUID is a good key), bare or in double quotes"
            ),
        )
        .with_field(
            "Idempotency-Key",
            "1 to 255 printable ASCII characters, no spaces",
        )
    };
    let text = value.as_bytes();
    let quoted = text.len() >= 3 && text.starts_with(b"\"") && text.ends_with(b"\"");
    let key = if quoted {
        &text[1..text.len() - 1]
    } else {
        text
    };
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.iter().all(u8::is_ascii_graphic) {
        return Err(refused());
    }
    Ok(String::from_utf8_lossy(key).into_owned())
}

/// The keys the server takes, as a pattern of the header's value (the
/// OpenAPI document states it on every keyed operation).
pub const KEY_PATTERN: &str = "^(?:[!-~]{1,255}|\"[!-~]{1,255}\")$";

/// The request's fingerprint: what must be the same for a repeat to be
/// the same request.
fn fingerprint(parts: &Parts, principal: &Principal, body: Option<&[u8]>) -> Vec<u8> {
    let mut hash = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    field(parts.method.as_str().as_bytes());
    field(
        parts
            .uri
            .path_and_query()
            .map_or("", |p| p.as_str())
            .as_bytes(),
    );
    field(principal.tenant.as_str().as_bytes());
    field(principal.subject.as_bytes());
    let extension = principal
        .extension
        .as_ref()
        .map(|(p, n)| format!("{p}/{n}"))
        .unwrap_or_default();
    field(extension.as_bytes());
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map_or(&b""[..], HeaderValue::as_bytes)
    };
    field(header("content-type"));
    match body {
        Some(body) => field(body),
        None => {
            field(header("content-length"));
            field(header("upload-length"));
        }
    }
    hash.finalize().to_vec()
}

/// Runs a keyed request once per key: the first time through, later as
/// the first answer again. A request without a key, or to an operation
/// that takes none, passes untouched.
pub async fn layer(State(keyed): State<Keyed>, request: Request, next: Next) -> Response {
    let Some(operation) = operation_of(&request) else {
        return next.run(request).await;
    };
    let Some(value) = request.headers().get(KEY) else {
        return next.run(request).await;
    };
    let key = match key_of(value) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let (mut parts, body) = request.into_parts();
    // The key is the tenant's: the caller is known first (a credential
    // refused here is refused as the route would).
    let principal = match Principal::from_request_parts(&mut parts, &keyed.state).await {
        Ok(principal) => principal,
        Err(refused) => return refused.into_response(),
    };
    parts.extensions.insert(principal.clone());
    let (held, body) = match operation.covers {
        Covers::Body => match to_bytes(body, keyed.max_body).await {
            Ok(bytes) => (Some(bytes.clone()), Body::from(bytes)),
            Err(_) => {
                return ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    format!(
                        "the body exceeds {} bytes (NARAD_MAX_BODY_BYTES), or was cut off",
                        keyed.max_body
                    ),
                )
                .into_response();
            }
        },
        Covers::Lengths => (None, body),
    };
    let print = fingerprint(&parts, &principal, held.as_deref());
    let journal = &keyed.state.journal;
    let claim = journal
        .idempotency_begin(&principal.tenant, &key, &print, HOLD, keyed.keep)
        .await;
    match claim {
        Err(e) => ApiError::from(e).into_response(),
        Ok(KeyClaim::Reused) => {
            crate::metrics::idempotency_key("reused");
            ApiError::new(
                ErrorCode::IdempotencyKeyReused,
                "this Idempotency-Key was sent before with another request (route, body, query, \
                 media type or caller); nothing was done. Use a new key for a new request",
            )
            .with_field("Idempotency-Key", "used before with another request")
            .into_response()
        }
        Ok(KeyClaim::InFlight { held_for }) => {
            crate::metrics::idempotency_key("in_flight");
            ApiError::new(
                ErrorCode::IdempotentRequestInFlight,
                "the first request with this Idempotency-Key has not answered yet; nothing was \
                 done. Send it again after Retry-After to get its answer",
            )
            .with_retry_after(held_for.as_secs().clamp(1, 2))
            .into_response()
        }
        Ok(KeyClaim::Answered(kept)) => {
            crate::metrics::idempotency_key("replayed");
            replay(&keyed.state, &principal, &parts, operation, kept).await
        }
        Ok(KeyClaim::Claimed) => {
            crate::metrics::idempotency_key("first");
            let session = session_named(&parts, held.as_deref());
            let first = First {
                journal: journal.clone(),
                tenant: principal.tenant.clone(),
                key,
                session,
            };
            // Spawned: the request runs to its end, and its answer is
            // kept, even when its client goes away meanwhile.
            let running = tokio::spawn(
                first
                    .run(next, Request::from_parts(parts, body))
                    .in_current_span(),
            );
            match running.await {
                Ok(response) => response,
                Err(e) => {
                    ApiError::internal(format!("a keyed request failed: {e}")).into_response()
                }
            }
        }
    }
}

/// The session a request names (in its path, or its JSON body's
/// `sessionId`), when it names one.
fn session_named(parts: &Parts, body: Option<&[u8]>) -> Option<String> {
    let path = parts.uri.path();
    if let Some(rest) = path.strip_prefix("/v1/sessions/") {
        return rest.split('/').next().map(str::to_owned);
    }
    body.and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .and_then(|v| v["sessionId"].as_str().map(str::to_owned))
}

/// A keyed request running for the first time.
struct First {
    journal: narad_journal::Journal,
    tenant: TenantId,
    key: String,
    session: Option<String>,
}

impl First {
    /// Runs the request while holding its key, and keeps its answer (or
    /// lets the key go when the answer is not one to keep).
    async fn run(self, next: Next, request: Request) -> Response {
        let holder = {
            let (journal, tenant, key) =
                (self.journal.clone(), self.tenant.clone(), self.key.clone());
            AbortOnDrop(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(HOLD / 3).await;
                    if let Err(e) = journal.idempotency_hold(&tenant, &key, HOLD).await {
                        tracing::warn!(error = %e, "an idempotency key in flight could not be held on");
                    }
                }
            }))
        };
        let response = next.run(request).await;
        drop(holder);
        let status = response.status();
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            // Nothing to keep: the server failed, or a limit refused the
            // request before anything was done. The key is free again.
            self.abandon().await;
            return response;
        }
        let (parts, body) = response.into_parts();
        let bytes = match to_bytes(body, usize::MAX).await {
            Ok(bytes) => bytes,
            Err(e) => {
                self.abandon().await;
                return ApiError::internal(format!("an answer could not be read: {e}"))
                    .into_response();
            }
        };
        let answer = KeptAnswer {
            status: status.as_u16(),
            body: bytes.to_vec(),
            content_type: parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        };
        let session = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["sessionId"].as_str().map(str::to_owned))
            .or(self.session.clone());
        if let Err(e) = self
            .journal
            .idempotency_complete(&self.tenant, &self.key, &answer, session.as_deref())
            .await
        {
            // The answer goes out; a retry of it waits for the key's hold
            // to lapse and then runs again.
            tracing::error!(error = %e, "the answer to an idempotency key could not be kept");
        }
        Response::from_parts(parts, Body::from(bytes))
    }

    async fn abandon(&self) {
        if let Err(e) = self
            .journal
            .idempotency_abandon(&self.tenant, &self.key)
            .await
        {
            tracing::warn!(error = %e, "an idempotency key could not be let go; it lapses");
        }
    }
}

/// Aborts a task when dropped (the holder of a key in flight ends with
/// its request, however that ends).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The kept answer, again, marked as a replay and recorded in the audit
/// log as one.
async fn replay(
    state: &AppState,
    principal: &Principal,
    parts: &Parts,
    operation: &KeyedOperation,
    kept: KeptAnswer,
) -> Response {
    let status = StatusCode::from_u16(kept.status).unwrap_or(StatusCode::OK);
    let answer: Value = serde_json::from_slice(&kept.body).unwrap_or(Value::Null);
    if let Some(action) = crate::audit::action_of(operation.operation_id) {
        let request = RequestId(
            parts
                .headers
                .get(crate::REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        );
        let session = answer["sessionId"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| session_named(parts, None));
        crate::audit::record_replay(state, principal, &request, action, session, status, &answer)
            .await;
    }
    let mut response = Response::new(Body::from(Bytes::from(kept.body)));
    *response.status_mut() = status;
    if let Some(content_type) = kept
        .content_type
        .and_then(|c| HeaderValue::from_str(&c).ok())
    {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Documents the key on a keyed operation of the OpenAPI document: the
/// header parameter, the replay header on its answers, and the refusals
/// of a reused key and of a key in flight.
pub fn document(op: &mut Value) {
    let Some(id) = op["operationId"].as_str() else {
        return;
    };
    let Some(operation) = OPERATIONS.iter().find(|o| o.operation_id == id) else {
        return;
    };
    let covers = match operation.covers {
        Covers::Body => "its body",
        Covers::Lengths => "its announced lengths (Content-Length, Upload-Length; not its bytes)",
    };
    let parameters = op
        .as_object_mut()
        .expect("an operation is an object")
        .entry("parameters")
        .or_insert_with(|| json!([]));
    parameters
        .as_array_mut()
        .expect("parameters are a list")
        .push(json!({
            "name": "Idempotency-Key",
            "in": "header",
            "required": false,
            "description": format!(
                "Makes the request safe to send again: the first answer is kept for 24 hours \
                 (NARAD_IDEMPOTENCY_KEEP_HOURS) with a fingerprint of the request (method, path \
                 and query, media type, caller and {covers}), and the same request with the same \
                 key answers it again with `Idempotent-Replayed: true` instead of acting twice. \
                 1 to 255 printable ASCII characters without spaces, bare or in double quotes; a \
                 UUID per request is a good key. Answers of 5xx and 429 are not kept."
            ),
            "schema": {"type": "string", "minLength": 1, "maxLength": 257, "pattern": KEY_PATTERN},
        }));
    let responses = op["responses"]
        .as_object_mut()
        .expect("an operation has responses");
    for (status, response) in responses.iter_mut() {
        if status.starts_with('2') {
            response
                .as_object_mut()
                .expect("a response is an object")
                .entry("headers")
                .or_insert_with(|| json!({}))["Idempotent-Replayed"] = json!({
                "description": "`true` when this is the kept answer of an earlier request with \
                                the same Idempotency-Key (nothing was done again)",
                "schema": {"type": "string", "enum": ["true"]},
            });
        }
    }
    let in_flight = "NRD-0212: the first request with this Idempotency-Key has not answered yet \
                     (`Retry-After`)";
    match responses.get_mut("409") {
        Some(conflict) => {
            let description = conflict["description"].as_str().unwrap_or_default();
            conflict["description"] = json!(format!("{description}; {in_flight}"));
        }
        None => {
            responses.insert("409".into(), json!({ "description": in_flight }));
        }
    }
    responses.insert(
        "422".into(),
        json!({"description": "NRD-0211: this Idempotency-Key was used before with another request"}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_printable_ascii_bare_or_quoted() {
        let key = |s: &str| key_of(&HeaderValue::from_str(s).expect("a header value"));
        assert_eq!(key("abc-123").expect("bare"), "abc-123");
        assert_eq!(key("\"abc-123\"").expect("quoted"), "abc-123");
        assert_eq!(key("\"\"").expect("two quotes are a key"), "\"\"");
        assert_eq!(key("\"abc").expect("one quote is part of it"), "\"abc");
        assert!(key("").is_err());
        assert!(key("\" \"").is_err());
        assert!(key("a b").is_err());
        assert!(key(&"k".repeat(256)).is_err());
        assert!(key(&"k".repeat(255)).is_ok());
        assert!(key(&format!("\"{}\"", "k".repeat(255))).is_ok());
        assert!(key("tab\there").is_err());
    }

    /// The document's pattern takes exactly the keys the server takes, so
    /// that a schema-valid key is never refused and an invalid one never
    /// taken.
    #[test]
    fn the_documented_pattern_is_the_servers_rule() {
        let schema = json!({"type": "string", "pattern": KEY_PATTERN});
        let validator = jsonschema::validator_for(&schema).expect("a schema");
        let long = "k".repeat(255);
        let longer = "k".repeat(256);
        for text in [
            "abc-123".to_owned(),
            "\"abc-123\"".to_owned(),
            "\"\"".to_owned(),
            "\"abc".to_owned(),
            String::new(),
            "\" \"".to_owned(),
            "a b".to_owned(),
            "tab\there".to_owned(),
            "é".to_owned(),
            long.clone(),
            longer.clone(),
            format!("\"{long}\""),
            format!("\"{longer}\""),
        ] {
            let taken = HeaderValue::from_str(&text).is_ok_and(|v| key_of(&v).is_ok());
            assert_eq!(validator.is_valid(&json!(text)), taken, "{text:?}");
        }
    }

    /// Every keyed operation is a write the audit list knows, so a replay
    /// is recorded under the action its first request was.
    #[test]
    fn every_keyed_operation_is_a_write_operation() {
        for op in OPERATIONS {
            assert!(
                crate::audit::WRITES
                    .iter()
                    .any(|(id, _)| *id == op.operation_id),
                "{} is not in audit::WRITES",
                op.operation_id
            );
        }
    }

    /// The document says which operations take a key, from the same list
    /// the layer uses: exactly those, each with the replay header and the
    /// two refusals.
    #[test]
    fn the_document_names_the_key_on_exactly_the_keyed_operations() {
        let doc = crate::routes::openapi::document();
        let mut keyed = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("an item") {
                let takes = op["parameters"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["name"] == "Idempotency-Key"));
                if !takes {
                    continue;
                }
                keyed.push(op["operationId"].as_str().expect("an id").to_owned());
                assert_eq!(method, "post", "{path}");
                let listed = OPERATIONS
                    .iter()
                    .find(|o| o.operation_id == op["operationId"])
                    .expect("listed");
                assert_eq!(listed.path, path);
                assert!(op["responses"]["422"].is_object(), "{path}");
                assert!(
                    op["responses"]["409"]["description"]
                        .as_str()
                        .is_some_and(|d| d.contains("NRD-0212")),
                    "{path}"
                );
                let ok = op["responses"]
                    .as_object()
                    .expect("responses")
                    .iter()
                    .filter(|(status, _)| status.starts_with('2'));
                for (_, answer) in ok {
                    assert!(
                        answer["headers"]["Idempotent-Replayed"].is_object(),
                        "{path}"
                    );
                }
            }
        }
        keyed.sort_unstable();
        let mut listed: Vec<String> = OPERATIONS
            .iter()
            .map(|o| o.operation_id.to_owned())
            .collect();
        listed.sort_unstable();
        assert_eq!(keyed, listed);
    }
}
