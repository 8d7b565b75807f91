//! Stream tickets: `POST /v1/stream-tickets` gives a browser page a
//! credential it can put in a stream's URL, because its `EventSource`
//! cannot send an `Authorization` header; and in a blob's URL, for an
//! `<img src>` or a download link.
//!
//! A ticket is good for [`TICKET_LIFETIME`] to open the one stream it
//! names and to reconnect to it (an `EventSource` reconnects by itself,
//! with `Last-Event-ID`); a stream opened with it ends when the token that
//! asked for it would be refused. It carries that token's tenant, subject,
//! roles and `sessions` limit, is accepted by no other route, and is kept
//! only as a SHA-256. URLs end up in browser history and proxy logs, so a
//! ticket is short-lived and narrow by design; narad logs paths without
//! their query.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::request::Parts;
use narad_journal::tickets::TicketGrant;
use narad_protocol::ErrorCode;
use narad_protocol::primitives::SessionId;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::{Permission, Principal, Role};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};

/// How long a ticket opens (and reopens) its stream.
pub const TICKET_LIFETIME: Duration = Duration::from_secs(60);

/// The query parameter that carries a ticket.
pub const PARAMETER: &str = "ticket";

/// A ticket request: the stream it opens. Its schema in the OpenAPI
/// document is [`request_schema`] (utoipa leaves the variants of a tagged
/// enum open; this one refuses unknown members).
#[derive(Debug, Deserialize)]
#[serde(tag = "stream", rename_all = "lowercase", deny_unknown_fields)]
pub enum TicketRequest {
    /// `GET /v1/sessions/{sessionId}/stream`.
    Session {
        /// The session whose stream it opens.
        #[serde(rename = "sessionId")]
        session_id: SessionId,
    },
    /// `GET /v1/events`, the tenant stream (filter it with `?sessionId=`
    /// on the stream itself).
    Events {},
    /// `GET /v1/blobs/{blobId}`: a blob's bytes for a plain URL (an `<img>`,
    /// a download link), where a browser sends no `Authorization`.
    Blob {
        /// The blob it reads.
        #[serde(rename = "blobId")]
        blob_id: String,
    },
    /// `POST /v1/ag-ui` for one thread (session): an AG-UI client that
    /// cannot send `Authorization`. The POST still needs the `writer` role.
    #[serde(rename = "ag-ui")]
    AgUi {
        /// The session (AG-UI `threadId`) it opens.
        #[serde(rename = "sessionId")]
        session_id: SessionId,
    },
}

/// A ticket, and where to use it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamTicket {
    /// The ticket: pass it as `?ticket=` on the stream's URL. Keep it out
    /// of logs; it opens the stream for anyone until it expires.
    pub ticket: String,
    /// Until when it opens (and reopens) the stream.
    #[schema(schema_with = narad_journal::openapi::timestamp)]
    pub expires_at: String,
    /// The stream's path with the ticket, relative to the server's URL
    /// (add `&profiles=…` or `&lastEventId=…` as needed).
    pub url: String,
}

/// Issues a ticket that opens one stream from a browser's `EventSource`
/// (which cannot send `Authorization`), or reads one blob from a plain URL
/// (`<img src>`, a download link): for a minute, bound to this token's
/// tenant, subject, roles and sessions, accepted on that URL only.
/// Reconnects (and range requests) within the minute reuse it; later ones
/// need a new one (resume a stream with `lastEventId`).
#[utoipa::path(post, path = "/v1/stream-tickets", operation_id = "createStreamTicket", tag = "events",
    request_body(content = ref("#/components/schemas/TicketRequest"), description = "`{stream: session, sessionId}`, `{stream: events}` or `{stream: blob, blobId}`"),
    responses(
        (status = 201, description = "The ticket and the URL with it", body = StreamTicket),
        (status = 403, description = "NRD-0102: no `reader` role, or the token does not reach the session"),
        (status = 404, description = "NRD-0007: no such blob (stored) in this organisation"),
    ),
    security(("bearer" = [])))]
pub async fn issue(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<StreamTicket>)> {
    principal.require(Permission::Read)?;
    let request: TicketRequest = crate::body::typed(body)?;
    let (stream, url) = match &request {
        TicketRequest::Session { session_id } => {
            principal.require_session(session_id.as_str())?;
            (
                format!("session:{}", session_id.as_str()),
                format!("/v1/sessions/{}/stream", path_segment(session_id.as_str())),
            )
        }
        TicketRequest::Events {} => ("events".to_owned(), "/v1/events".to_owned()),
        TicketRequest::AgUi { session_id } => {
            principal.require_session(session_id.as_str())?;
            (
                format!("ag-ui:{}", session_id.as_str()),
                "/v1/ag-ui".to_owned(),
            )
        }
        TicketRequest::Blob { blob_id } => {
            let blob = state
                .journal
                .blob(&principal.tenant, blob_id)
                .await?
                .filter(|b| b.stored)
                .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no blob has this id here"))?;
            principal.require_session(&blob.session_id)?;
            (
                format!("blob:{blob_id}"),
                format!("/v1/blobs/{}", path_segment(blob_id)),
            )
        }
    };
    let grant = TicketGrant {
        tenant: principal.tenant.clone(),
        subject: principal.subject.clone(),
        roles: principal
            .roles
            .iter()
            .map(|r| r.name().to_owned())
            .collect(),
        sessions: principal.sessions.clone(),
        stream,
        valid_until: principal.valid_until,
    };
    let (ticket, expires_at) = state
        .journal
        .issue_stream_ticket(&grant, TICKET_LIFETIME)
        .await?;
    let url = format!("{url}?{PARAMETER}={ticket}");
    Ok((
        StatusCode::CREATED,
        Json(StreamTicket {
            ticket,
            expires_at,
            url,
        }),
    ))
}

/// The OpenAPI schema of [`TicketRequest`], component `TicketRequest`.
pub fn request_schema() -> serde_json::Value {
    serde_json::json!({
        "description": "What a ticket opens: a session's stream, the tenant's (filter that one with `?sessionId=` on the stream itself), a blob's bytes, or `POST /v1/ag-ui` for one thread.",
        "oneOf": [
            {
                "type": "object",
                "required": ["stream", "sessionId"],
                "properties": {
                    "stream": { "const": "session" },
                    "sessionId": { "$ref": "#/components/schemas/defs.id" },
                },
                "additionalProperties": false,
            },
            {
                "type": "object",
                "required": ["stream"],
                "properties": { "stream": { "const": "events" } },
                "additionalProperties": false,
            },
            {
                "type": "object",
                "required": ["stream", "sessionId"],
                "properties": {
                    "stream": { "const": "ag-ui" },
                    "sessionId": { "$ref": "#/components/schemas/defs.id" },
                },
                "additionalProperties": false,
            },
            {
                "type": "object",
                "required": ["stream", "blobId"],
                "properties": {
                    "stream": { "const": "blob" },
                    "blobId": { "type": "string", "minLength": 1, "maxLength": 256 },
                },
                "additionalProperties": false,
            },
        ],
    })
}

/// `id` as one path segment: percent-encoded but for RFC 3986's
/// unreserved characters.
fn path_segment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What a request's path opens, as tickets name it; `None` on every other
/// route.
fn stream_of(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split('/').collect();
    let decoded = |id: &str| String::from_utf8(crate::body::percent_decode(id.as_bytes())).ok();
    match segments[..] {
        ["", "v1", "events"] => Some("events".to_owned()),
        ["", "v1", "sessions", id, "stream"] if !id.is_empty() => {
            Some(format!("session:{}", decoded(id)?))
        }
        ["", "v1", "blobs", id] if !id.is_empty() => Some(format!("blob:{}", decoded(id)?)),
        _ => None,
    }
}

/// The ticket of a request's query, when it has one (read as every query
/// is, by [`crate::body::Query`]).
pub fn ticket_of(parts: &Parts) -> Option<String> {
    crate::body::Query::parse(parts.uri.query()?)
        .ok()?
        .text(PARAMETER)
}

/// The principal a ticket stands for, on the stream it names. Every cause
/// of refusal (unknown, expired, another stream, another route) answers
/// the same 401.
pub async fn verify(parts: &Parts, state: &AppState, ticket: &str) -> ApiResult<Principal> {
    let refused = || {
        ApiError::new(
            ErrorCode::Unauthenticated,
            "the stream ticket is unknown, expired or for another stream; ask for a new one \
             (POST /v1/stream-tickets) and resume with lastEventId",
        )
    };
    let Some(stream) = stream_of(parts.uri.path()) else {
        return Err(refused());
    };
    verify_for(state, ticket, &stream).await
}

/// The principal a ticket stands for, when it was issued for `stream`
/// (`ag-ui:<sessionId>` for `POST /v1/ag-ui`, whose session is in the
/// body); the same 401 as [`verify`] otherwise.
pub async fn verify_for(state: &AppState, ticket: &str, stream: &str) -> ApiResult<Principal> {
    let refused = || {
        ApiError::new(
            ErrorCode::Unauthenticated,
            "the stream ticket is unknown, expired or for another stream; ask for a new one \
             (POST /v1/stream-tickets) and resume with lastEventId",
        )
    };
    let Some(grant) = state.journal.stream_ticket(ticket).await? else {
        return Err(refused());
    };
    if grant.stream != stream {
        return Err(refused());
    }
    Principal {
        tenant: grant.tenant,
        subject: grant.subject,
        roles: grant
            .roles
            .iter()
            .filter_map(|r| Role::from_name(r))
            .collect(),
        executors: None,
        sessions: grant.sessions,
        valid_until: grant.valid_until,
        extension: None,
    }
    .admitted(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written schema and the type read the same bodies.
    #[test]
    fn the_request_schema_is_the_type() {
        let doc = crate::routes::openapi::document();
        let mut root = doc.clone();
        root["$ref"] = serde_json::json!("#/components/schemas/TicketRequest");
        let schema = jsonschema::draft202012::new(&root).unwrap();
        for body in [
            serde_json::json!({"stream": "session", "sessionId": "s1"}),
            serde_json::json!({"stream": "events"}),
            serde_json::json!({"stream": "events", "sessionId": "s1"}),
            serde_json::json!({"stream": "session"}),
            serde_json::json!({"stream": "session", "sessionId": "s1", "x": 1}),
            serde_json::json!({"stream": "graph"}),
            serde_json::json!({"sessionId": "s1"}),
            serde_json::json!({"stream": "session", "sessionId": ""}),
            serde_json::json!({"stream": "blob", "blobId": "b1"}),
            serde_json::json!({"stream": "blob"}),
            serde_json::json!({"stream": "blob", "blobId": "b1", "sessionId": "s1"}),
            serde_json::json!({"stream": "ag-ui", "sessionId": "s1"}),
            serde_json::json!({"stream": "ag-ui"}),
        ] {
            let typed = serde_json::from_value::<TicketRequest>(body.clone()).is_ok();
            assert_eq!(schema.is_valid(&body), typed, "{body}");
        }
    }

    #[test]
    fn tickets_name_the_two_streams_and_blobs_only() {
        assert_eq!(stream_of("/v1/events").as_deref(), Some("events"));
        assert_eq!(stream_of("/v1/blobs/b%201").as_deref(), Some("blob:b 1"));
        assert_eq!(
            stream_of("/v1/sessions/a%20b/stream").as_deref(),
            Some("session:a b")
        );
        for other in [
            "/v1/sessions/s1/events",
            "/v1/sessions//stream",
            "/v1/sessions",
            "/v1/blobs/b1/upload",
            "/v1/blobs/",
            "/healthz",
        ] {
            assert_eq!(stream_of(other), None, "{other}");
        }
        assert_eq!(path_segment("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(
            stream_of(&format!("/v1/sessions/{}/stream", path_segment("a b/ü"))).as_deref(),
            Some("session:a b/ü")
        );
    }
}
