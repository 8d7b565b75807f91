//! Checks every request passes before a handler sees it, so that no route
//! can skip them, each answering with the error envelope:
//!
//! - [`request_id`] keeps a client's `x-request-id` only when it is 1 to
//!   [`MAX_REQUEST_ID`] printable ASCII characters; any other is dropped
//!   (and a fresh id made), so that logs and answers never carry a
//!   client's control bytes or kilobytes;
//! - [`announced_length`] answers 413 at once when `Content-Length`
//!   announces a body over the limit, instead of after reading it;
//! - [`headers`] refuses a `Last-Event-ID` that is not text;
//! - [`path_params`] (a route layer: it needs the matched route) refuses a
//!   path parameter that is not UTF-8 or holds U+0000 once
//!   percent-decoded, naming the parameter (axum's own `Path` rejection
//!   is plain text, and Postgres cannot store U+0000).
//!
//! Query strings and bodies are checked where every handler reads them,
//! in [`crate::body`].

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use narad_protocol::ErrorCode;

use crate::REQUEST_ID;
use crate::body::{percent_decode, too_large};
use crate::error::ApiError;

/// The longest `x-request-id` kept from a client.
pub const MAX_REQUEST_ID: usize = 128;

/// Whether a client's request id is kept: 1 to [`MAX_REQUEST_ID`]
/// characters, each printable ASCII other than a space.
pub fn acceptable_request_id(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_REQUEST_ID && bytes.iter().all(u8::is_ascii_graphic)
}

/// Drops a client's `x-request-id` that is not acceptable; the layer
/// inside makes a fresh one.
pub async fn request_id(mut req: Request, next: Next) -> Response {
    if req
        .headers()
        .get_all(REQUEST_ID)
        .iter()
        .any(|v| !acceptable_request_id(v))
        || req.headers().get_all(REQUEST_ID).iter().count() > 1
    {
        req.headers_mut().remove(REQUEST_ID);
    }
    next.run(req).await
}

/// Answers 413 before reading a body whose `Content-Length` is over
/// `limit`. A body without a length (chunked) is still cut off at the limit
/// where it is read.
pub async fn announced_length(State(limit): State<usize>, req: Request, next: Next) -> Response {
    // A blob upload streams its body, under limits of its own.
    if is_blob_upload(&req) {
        return next.run(req).await;
    }
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return too_large().into_response();
    }
    next.run(req).await
}

/// Whether `req` is a blob upload (`POST /v1/sessions/{id}/blobs`, or a
/// resumed one, `PATCH /v1/blobs/{id}`), whose
/// body is streamed and limited by `blobMaxBytes`, not the body limit.
pub fn is_blob_upload(req: &Request) -> bool {
    let path = req.uri().path();
    let one_segment = |id: &str| !id.is_empty() && !id.contains('/');
    match *req.method() {
        axum::http::Method::POST => path
            .strip_prefix("/v1/sessions/")
            .and_then(|rest| rest.strip_suffix("/blobs"))
            .is_some_and(one_segment),
        axum::http::Method::PATCH => path.strip_prefix("/v1/blobs/").is_some_and(one_segment),
        _ => false,
    }
}

/// Headers the routes read as text: when present, they must be text.
pub const TEXT_HEADERS: &[&str] = &["Last-Event-ID"];

/// What [`headers`] lets through in a text header, as a JSON Schema
/// pattern: no control character (Unicode's Cc).
pub const TEXT_HEADER_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";

/// Refuses a text header (`Last-Event-ID`) holding bytes that are not
/// printable text.
pub async fn headers(req: Request, next: Next) -> Response {
    for name in TEXT_HEADERS {
        if let Some(value) = req.headers().get(*name) {
            let text = std::str::from_utf8(value.as_bytes()).ok();
            if text.is_none_or(|t| t.chars().any(char::is_control)) {
                return ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!("header {name} must be printable UTF-8 text"),
                )
                .with_field(*name, "not printable UTF-8 text")
                .into_response();
            }
        }
    }
    next.run(req).await
}

/// Refuses a path parameter that is not UTF-8, or holds U+0000, once
/// percent-decoded, naming it from the matched route's template.
pub async fn path_params(matched: Option<MatchedPath>, req: Request, next: Next) -> Response {
    if let Some(matched) = matched
        && let Some((name, problem)) = bad_param(matched.as_str(), req.uri().path())
    {
        return ApiError::new(
            ErrorCode::InvalidParameter,
            format!("path parameter {name} {problem}"),
        )
        .with_field(name, problem)
        .into_response();
    }
    next.run(req).await
}

/// The first parameter of `template` (`/v1/sessions/{sessionId}`) whose
/// segment of `path` is not acceptable text, and what is wrong with it.
fn bad_param<'t>(template: &'t str, path: &str) -> Option<(&'t str, &'static str)> {
    let mut segments = path.split('/');
    for part in template.split('/') {
        let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) else {
            segments.next();
            continue;
        };
        let (name, raw) = match inner.strip_prefix('*') {
            Some(name) => (name, segments.by_ref().collect::<Vec<_>>().join("/")),
            None => (inner, segments.next().unwrap_or("").to_owned()),
        };
        match String::from_utf8(percent_decode(raw.as_bytes())) {
            Err(_) => return Some((name, "is not UTF-8 once percent-decoded")),
            Ok(text) if text.contains('\0') => return Some((name, "holds U+0000")),
            Ok(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parameters_are_named_by_the_template() {
        let t = "/v1/sessions/{sessionId}/queued-starts/{queueId}";
        assert_eq!(bad_param(t, "/v1/sessions/s1/queued-starts/q1"), None);
        assert_eq!(
            bad_param(t, "/v1/sessions/%C0%AF/queued-starts/q1"),
            Some(("sessionId", "is not UTF-8 once percent-decoded"))
        );
        assert_eq!(
            bad_param(t, "/v1/sessions/s1/queued-starts/a%00"),
            Some(("queueId", "holds U+0000"))
        );
        assert_eq!(
            bad_param("/v1/x/{*rest}", "/v1/x/a/%FF"),
            Some(("rest", "is not UTF-8 once percent-decoded"))
        );
        assert_eq!(
            bad_param("/v1/sessions/{sessionId}", "/v1/sessions/caf%C3%A9"),
            None
        );
    }

    #[test]
    fn request_ids_are_short_printable_ascii() {
        let ok = |s: &[u8]| acceptable_request_id(&HeaderValue::from_bytes(s).unwrap());
        assert!(ok(b"abc-123_x.y:z"));
        assert!(ok("a".repeat(MAX_REQUEST_ID).as_bytes()));
        assert!(!ok("a".repeat(MAX_REQUEST_ID + 1).as_bytes()));
        assert!(!ok(b""));
        assert!(!ok(b"two words"));
        assert!(!ok(b"tab\there"));
        assert!(!ok(b"caf\xc3\xa9"));
    }
}
