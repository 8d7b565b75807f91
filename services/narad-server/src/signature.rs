//! Signed calls of registered extensions (seed 004, DESIGN.md §2).
//!
//! Four headers travel together: `Narad-Signature` (`hmac-sha256,` and the
//! MAC in lower-case hex), `Narad-Timestamp` (seconds since the epoch),
//! `Narad-Request-Id` (unique per call) and `Narad-Extension`
//! (`org/publisher/name`: the organisation that registered the extension
//! and its name there, which say whose secret verifies, outside the signed
//! bytes; names are each organisation's own). The MAC is HMAC-SHA256 over five parts, each ending in `\n`:
//! the method upper-cased, the path with its query, the timestamp, the
//! request id, and the lower-case hex SHA-256 of the body.
//!
//! Signed calls reach the streaming endpoints only (until the streams land,
//! history reads); anywhere else they are 403. Every cause of failure —
//! missing header, stale timestamp, unknown extension, wrong MAC, replayed
//! request id — answers the same 401 sentence, so that a refusal never
//! tells whether a registration exists; a verified call of a disabled
//! registration is 403.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName};
use hmac::{Hmac, KeyInit, Mac};
use narad_protocol::ErrorCode;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::auth::{Principal, Role};
use crate::error::ApiError;

/// `Narad-Signature`.
pub const SIGNATURE: HeaderName = HeaderName::from_static("narad-signature");
/// `Narad-Timestamp`.
pub const TIMESTAMP: HeaderName = HeaderName::from_static("narad-timestamp");
/// `Narad-Request-Id`.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("narad-request-id");
/// `Narad-Extension`.
pub const EXTENSION: HeaderName = HeaderName::from_static("narad-extension");
/// How far a signed call's timestamp may be from the server's clock.
pub const WINDOW_SECONDS: u32 = 60;
/// The algorithm prefix of `Narad-Signature`.
pub const ALGORITHM: &str = "hmac-sha256";

/// The one sentence every refused signature gets.
pub const REFUSED: &str = "the request's extension signature could not be verified";

/// Refuses a signed call anywhere but a streaming endpoint (403), before
/// routing: also on routes without a token, unknown routes and wrong methods.
pub async fn streaming_only(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if is_signed(req.headers()) && !is_streaming(req.method(), req.uri().path()) {
        return axum::response::IntoResponse::into_response(ApiError::new(
            ErrorCode::Forbidden,
            "signed extension calls reach only the streaming endpoints; \
             this route needs a bearer token",
        ));
    }
    next.run(req).await
}

/// The routes signed calls may reach: history reads, session streams and
/// the tenant stream (`GET /v1/sessions/{sessionId}/events`, `…/stream`,
/// `GET /v1/events`).
fn is_streaming(method: &axum::http::Method, path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    method == axum::http::Method::GET
        && (matches!(segments[..], ["", "v1", "sessions", id, "events" | "stream"] if !id.is_empty())
            || matches!(segments[..], ["", "v1", "events"]))
}

/// Whether a request carries an extension signature: any of the four
/// headers, which travel together (a call with some of them is verified,
/// and refused for the missing ones, never taken as a bearer call).
pub fn is_signed(headers: &HeaderMap) -> bool {
    [SIGNATURE, TIMESTAMP, REQUEST_ID, EXTENSION]
        .iter()
        .any(|h| headers.contains_key(h))
}

/// The bytes a signature covers.
pub fn signed_bytes(
    method: &str,
    path_and_query: &str,
    timestamp: &str,
    request_id: &str,
    body: &[u8],
) -> Vec<u8> {
    format!(
        "{}\n{path_and_query}\n{timestamp}\n{request_id}\n{}\n",
        method.to_uppercase(),
        hex::encode(Sha256::digest(body))
    )
    .into_bytes()
}

/// The `Narad-Signature` value for `bytes` under `secret`.
pub fn sign(secret: &[u8], bytes: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(bytes);
    format!("{ALGORITHM},{}", hex::encode(mac.finalize().into_bytes()))
}

/// The caller of a streaming endpoint: a bearer principal, or a verified,
/// enabled extension (a reader of its own tenant).
#[derive(Debug, Clone)]
pub struct StreamCaller(pub Principal);

impl FromRequestParts<AppState> for StreamCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<StreamCaller, ApiError> {
        if !is_signed(&parts.headers) {
            // A browser's EventSource sends no Authorization: its page
            // puts a stream ticket in the URL instead.
            if !parts
                .headers
                .contains_key(axum::http::header::AUTHORIZATION)
                && let Some(ticket) = crate::routes::tickets::ticket_of(parts)
            {
                return crate::routes::tickets::verify(parts, state, &ticket)
                    .await
                    .map(StreamCaller);
            }
            return Principal::from_request_parts(parts, state)
                .await
                .map(StreamCaller);
        }
        verify(parts, state).await.map(StreamCaller)
    }
}

fn refused(cause: &str) -> ApiError {
    tracing::info!(cause, "an extension signature was refused");
    ApiError::new(ErrorCode::Unauthenticated, REFUSED)
}

async fn verify(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let header = |name: &HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let (Some(signature), Some(timestamp), Some(request_id), Some(extension)) = (
        header(&SIGNATURE),
        header(&TIMESTAMP),
        header(&REQUEST_ID),
        header(&EXTENSION),
    ) else {
        return Err(refused("a header is missing"));
    };
    let Some(mac) = signature
        .strip_prefix(ALGORITHM)
        .and_then(|s| s.strip_prefix(','))
        .and_then(|h| hex::decode(h).ok())
    else {
        return Err(refused("the signature is not hmac-sha256,<hex>"));
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(ApiError::internal)?
        .as_secs();
    let Ok(signed_at) = timestamp.parse::<u64>() else {
        return Err(refused("the timestamp is not seconds since the epoch"));
    };
    if now.abs_diff(signed_at) > u64::from(WINDOW_SECONDS) {
        return Err(refused("the timestamp is outside the window"));
    }
    if request_id.len() > 256 {
        return Err(refused("the request id is too long"));
    }
    // Streaming calls carry no body: the MAC covers the empty one, and a
    // body it did not cover is refused.
    let has_body = parts
        .headers
        .contains_key(axum::http::header::TRANSFER_ENCODING)
        || parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if has_body {
        return Err(refused("a streaming call carries a body"));
    }
    // Publisher and name hold no `/`; the organisation is what precedes them.
    let mut named = extension.rsplitn(3, '/');
    let (Some(name), Some(publisher), Some(org)) = (named.next(), named.next(), named.next())
    else {
        return Err(refused("the extension is not org/publisher/name"));
    };
    let Ok(tenant) = narad_journal::TenantId::new(org) else {
        return Err(refused("the organisation is not a tenant id"));
    };
    let Some(key) = state.journal.signing_key(&tenant, publisher, name).await? else {
        return Err(refused("no such extension"));
    };
    let extension = format!("{publisher}/{name}");
    let extension = extension.as_str();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |p| p.as_str());
    let bytes = signed_bytes(
        parts.method.as_str(),
        path_and_query,
        timestamp,
        request_id,
        b"",
    );
    let mut expected =
        Hmac::<Sha256>::new_from_slice(&key.secret).expect("HMAC takes any key length");
    expected.update(&bytes);
    // verify_slice compares in constant time.
    if expected.verify_slice(&mac).is_err() {
        return Err(refused("the MAC does not verify"));
    }
    if !key.enabled {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "the extension {extension} is disabled; an admin of its organisation can enable it again"
            ),
        ));
    }
    if !state
        .journal
        .accept_request_id(&key.tenant, extension, request_id, WINDOW_SECONDS)
        .await?
    {
        return Err(refused("the request id was used before"));
    }
    Principal {
        tenant: key.tenant,
        subject: format!("extension:{extension}"),
        roles: [Role::Reader].into_iter().collect(),
        executors: None,
        sessions: None,
        valid_until: None,
        extension: Some((publisher.to_owned(), name.to_owned())),
    }
    .admitted(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of the README's extension section: the signed
    /// string and the signature, with the secret hex-decoded to its bytes.
    #[test]
    fn the_readme_example_signs_as_documented() {
        let secret_hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let bytes = signed_bytes("get", "/v1/events?sessionId=s1", "1767225600", "req-1", b"");
        let string = "GET\n/v1/events?sessionId=s1\n1767225600\nreq-1\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n";
        assert_eq!(String::from_utf8(bytes.clone()).unwrap(), string);
        let signature = sign(&hex::decode(secret_hex).unwrap(), &bytes);
        assert_eq!(
            signature,
            "hmac-sha256,5c4e18a5aa635801926d3f7d3eeb21cd2c4dee811a05ced7a2586e9e6606078d"
        );
        // The hex text itself is not the key.
        assert_ne!(sign(secret_hex.as_bytes(), &bytes), signature);

        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
                .unwrap();
        let escaped = string.replace('\n', "\\n");
        assert!(readme.contains(&escaped), "README shows {escaped}");
        assert!(
            readme.contains(&format!("Narad-Signature: {signature}")),
            "README shows the signature"
        );
    }
}
