//! Attachment and artifact bytes (§9.5): `POST /v1/sessions/{sessionId}/blobs`
//! streams an upload into the blob store (never whole in memory),
//! digesting it as it comes; `GET /v1/blobs/{blobId}` serves it back with
//! the session's authorization, `Range`, `ETag` = its SHA-256, and headers
//! that keep a browser from running what it downloads. Events name a blob
//! by its reference, `narad://blobs/{blobId}`.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use narad_journal::BlobRecord;
use narad_protocol::ErrorCode;
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::resumable::{UPLOAD_LENGTH, number_header};
use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::Query;
use crate::error::{ApiError, ApiResult};
use crate::quotas::Limit;
use narad_journal::TenantId;

/// The scheme and authority of a blob's reference in events.
pub use narad_journal::references::BLOB_REFERENCE as REFERENCE_PREFIX;

/// Media types a browser may show in the page: raster images. Anything
/// else (SVG and HTML included) is served as a download.
const INLINE: &[&str] = &[
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/avif",
];

/// A stored blob, as the API answers it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Blob {
    /// The blob's id.
    pub blob_id: String,
    /// What events name it by: `narad://blobs/{blobId}`.
    pub uri: String,
    /// Where it is downloaded: `/v1/blobs/{blobId}`.
    pub url: String,
    /// The session it belongs to (and is erased with).
    pub session_id: String,
    /// The file name it was uploaded with.
    pub name: String,
    /// The media type it was declared with (never sniffed).
    pub media_type: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// SHA-256 of its bytes, hex (also its `ETag`).
    pub sha256: String,
    /// With `?attachmentId=`: the attachment added to the session (its
    /// `attachment.added` appended; the server's `attachment.ready`
    /// follows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attachment_id: Option<String>,
}

impl Blob {
    /// The API's view of a stored blob.
    pub fn of(r: BlobRecord) -> Blob {
        Blob {
            uri: format!("{REFERENCE_PREFIX}{}", r.blob_id),
            url: format!("/v1/blobs/{}", r.blob_id),
            blob_id: r.blob_id,
            session_id: r.session_id,
            name: r.name,
            media_type: r.media_type,
            size_bytes: r.size_bytes,
            sha256: r.sha256.unwrap_or_default(),
            attachment_id: None,
        }
    }
}

/// The file name of an upload: 1 to 255 characters, no control
/// characters, no path separators.
fn file_name(name: Option<String>) -> ApiResult<String> {
    let Some(name) = name else {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            "name the file: ?name=report.pdf (URL-encoded)",
        )
        .with_field("name", "required"));
    };
    let ok = !name.is_empty()
        && name.chars().count() <= 255
        && !name
            .chars()
            .any(|c| c.is_control() || c == '/' || c == '\\');
    if !ok {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            "name: 1 to 255 characters, without control characters or path separators",
        )
        .with_field("name", "not a file name"));
    }
    Ok(name)
}

/// The declared media type: `type/subtype` with optional parameters, in
/// printable ASCII; `application/octet-stream` when none is declared.
fn media_type(headers: &HeaderMap) -> ApiResult<String> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok("application/octet-stream".to_owned());
    };
    let text = value.to_str().ok().map(str::trim).unwrap_or_default();
    let essence = text.split(';').next().unwrap_or_default().trim();
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    let well_formed = text.len() <= 255
        && essence
            .split_once('/')
            .is_some_and(|(t, s)| token(t) && token(s));
    if !well_formed {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            "Content-Type: the blob's media type, e.g. application/pdf",
        )
        .with_field("Content-Type", "not a media type"));
    }
    Ok(text.to_ascii_lowercase())
}

/// Uploads a blob of a session: the body is the bytes, streamed (never held
/// whole); `Content-Type` declares its media type and `?name=` its file
/// name. Beyond the organisation's largest blob (`blobMaxBytes`,
/// `NARAD_BLOB_MAX_BYTES`): 413 and nothing kept; beyond its stored bytes
/// (`storedBytes`): 429. Answers the blob with its reference and digest.
#[utoipa::path(post, path = "/v1/sessions/{sessionId}/blobs", operation_id = "uploadBlob", tag = "blobs",
    params(
        ("sessionId" = String, Path, description = "The session the blob belongs to"),
        ("Upload-Length" = Option<u64>, Header, description = "Makes the upload resumable: the bytes to come in all (this request may send a part)"),
        ("attachmentId" = Option<String>, Query, min_length = 1, max_length = 256, description = "Add the blob to the session as this attachment, on behalf of the caller (role `writer`): `attachment.added` with the caller as actor, then the server's `attachment.ready`"),
        ("name" = String, Query, min_length = 1, max_length = 255, pattern = r"^[^/\\\u0000-\u001F\u007F-\u009F]+$", description = "The file name: no path separators, no control characters"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The bytes; Content-Type declares their media type"),
    responses(
        (status = 201, description = "The blob, stored", body = Blob),
        (status = 202, description = "A resumable upload, stored so far (Location: where the rest goes)", body = super::resumable::Upload),
        (status = 403, description = "NRD-0102: no `writer` or `backend` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session"),
        (status = 409, description = "NRD-0201: with attachmentId, the attachment.added it appends breaks a rule (the id is taken); nothing of the upload is kept"),
        (status = 413, description = "NRD-0006: larger than the organisation's largest blob"),
        (status = 429, description = "NRD-0606: the organisation's blobs hold as many bytes as they may"),
        (status = 503, description = "NRD-0902: the object store cannot take the bytes; nothing was kept; retry with backoff"),
    ),
    security(("bearer" = [])))]
pub async fn upload(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path(session_id): Path<String>,
    query: Query,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let outcome = store_upload(&state, &principal, &session_id, query, &headers, body).await;
    let appended = outcome
        .as_ref()
        .ok()
        .and_then(|(_, appended)| appended.clone());
    let outcome = outcome.map(|(answer, _)| answer);
    crate::audit::record(
        &state,
        &principal,
        &request,
        "upload-blob",
        Some(&session_id),
        &outcome,
        appended.map(|a| json!({ "appended": a })).as_ref(),
    )
    .await;
    outcome
}

/// What [`upload`] does: the answer, and what it appended (with
/// `attachmentId`).
async fn store_upload(
    state: &AppState,
    principal: &Principal,
    session_id: &str,
    mut query: Query,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<(Response, Option<narad_journal::Appended>)> {
    principal
        .require(Permission::Command)
        .or_else(|_| principal.require(Permission::Append))?;
    principal.require_session(session_id)?;
    let name = file_name(query.text("name"))?;
    let attachment_id = query.text("attachmentId");
    query.finish()?;
    let attach_as = match &attachment_id {
        None => None,
        Some(id) => {
            principal.require(Permission::Command)?;
            crate::body::parameter(
                "attachmentId",
                narad_protocol::primitives::AttachmentId::new(id.clone()),
            )?;
            let session = crate::body::parameter(
                "sessionId",
                narad_protocol::primitives::SessionId::new(session_id.to_owned()),
            )?;
            Some(principal.caller().authorize(&session)?)
        }
    };
    let media_type = media_type(headers)?;
    let tenant = &principal.tenant;
    let upload_length = number_header(headers, UPLOAD_LENGTH)?;
    let sent = number_header(headers, header::CONTENT_LENGTH.as_str())?;
    let limits = UploadLimits::of(state, tenant, 0).await?;
    limits.check(upload_length.or(sent).unwrap_or(0))?;
    if let Some(length) = upload_length {
        if sent.is_some_and(|n| n > length) {
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the body ({} bytes) is longer than Upload-Length ({length})",
                    sent.unwrap_or(0)
                ),
            )
            .with_field("Upload-Length", "shorter than the body"));
        }
        if attachment_id.is_some() {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "attachmentId is for uploads sent whole; add a resumable upload's attachment \
                 by appending attachment.added with its uri once complete",
            )
            .with_field("attachmentId", "not with Upload-Length"));
        }
        let blob = state
            .journal
            .create_blob(tenant, session_id, &name, &media_type, Some(length))
            .await?;
        let location =
            HeaderValue::from_str(&format!("/v1/blobs/{}", blob.blob_id)).expect("ascii");
        let mut answer =
            super::resumable::continue_upload(state, principal, blob, body, StatusCode::CREATED)
                .await?;
        answer.headers_mut().insert(header::LOCATION, location);
        return Ok((answer, None));
    }
    let blob = state
        .journal
        .create_blob(tenant, session_id, &name, &media_type, None)
        .await?;
    let stored = receive(state, principal, &blob, body, |size| limits.check(size)).await;
    let blob_id = blob.blob_id;
    let stored = match (stored, &attach_as, &attachment_id) {
        (Ok(record), Some(auth), Some(id)) => state
            .journal
            .attach_blob(auth, &record, id)
            .await
            .map(|appended| (record, Some(appended)))
            .map_err(ApiError::from),
        (other, _, _) => other.map(|record| (record, None)),
    };
    match stored {
        Ok((record, appended)) => Ok((
            (
                StatusCode::CREATED,
                Json(Blob {
                    attachment_id,
                    ..Blob::of(record)
                }),
            )
                .into_response(),
            appended,
        )),
        Err(e) => {
            // Nothing of a refused or broken upload is kept.
            if let Err(d) = state.journal.discard_blob(tenant, &blob_id).await {
                tracing::warn!(error = %d, blob = %blob_id, "cannot discard a failed upload; the collector will");
            }
            Err(e)
        }
    }
}

/// The limits an upload stays within: the organisation's largest blob, and
/// the bytes its blobs may hold together.
pub(crate) struct UploadLimits {
    max_blob: Option<u64>,
    max_stored: Option<u64>,
    /// What the organisation's other blobs hold (read only under a limit).
    stored_elsewhere: u64,
}

impl UploadLimits {
    /// The limits of an upload of `tenant` whose blob holds `so_far` bytes.
    pub(crate) async fn of(state: &AppState, tenant: &TenantId, so_far: u64) -> ApiResult<Self> {
        let limits = state.quotas.effective(tenant).await?;
        let max_stored = limits.get(Limit::StoredBytes);
        let stored_elsewhere = match max_stored {
            Some(_) => state
                .journal
                .stored_bytes(tenant)
                .await?
                .saturating_sub(so_far),
            None => 0,
        };
        Ok(UploadLimits {
            max_blob: limits.get(Limit::BlobMaxBytes),
            max_stored,
            stored_elsewhere,
        })
    }

    /// Refuses a blob of `size` bytes: 413 past the largest blob, 429 past
    /// the stored bytes.
    pub(crate) fn check(&self, size: u64) -> ApiResult<()> {
        if let Some(max) = self.max_blob.filter(|m| size > *m) {
            crate::metrics::limit_refused(Limit::BlobMaxBytes.label());
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "a blob holds at most {max} bytes here (blobMaxBytes); nothing of this one \
                     was kept"
                ),
            )
            .with_details(json!({"limit": Limit::BlobMaxBytes.name(), "value": max})));
        }
        if let Some(max) = self
            .max_stored
            .filter(|m| self.stored_elsewhere + size > *m)
        {
            crate::metrics::limit_refused(Limit::StoredBytes.label());
            return Err(ApiError::new(
                ErrorCode::StoredBytesLimitReached,
                format!(
                    "this organisation's blobs may hold {max} bytes together (storedBytes), and \
                     this upload would pass that; nothing of it was kept: erase sessions whose \
                     attachments are no longer needed, or ask the operator for a higher limit"
                ),
            )
            .with_details(json!({"limit": Limit::StoredBytes.name(), "value": max}))
            .with_retry_after(60));
        }
        Ok(())
    }
}

/// Reads the body into the blob's chunks, each stored as it fills,
/// digesting as it goes; `check` sees the size so far before each chunk.
async fn receive(
    state: &AppState,
    principal: &Principal,
    blob: &BlobRecord,
    body: Body,
    check: impl Fn(u64) -> ApiResult<()>,
) -> ApiResult<BlobRecord> {
    let tenant = &principal.tenant;
    let mut sink = Sink::new(state, tenant, blob, 0, Vec::new(), true);
    sink.take(body, check, false).await?;
    let digest = sink.digest.take().map(|d| d.finalize().to_vec());
    Ok(state
        .journal
        .finish_blob(
            tenant,
            &blob.blob_id,
            sink.size,
            &digest.unwrap_or_default(),
        )
        .await?)
}

/// Where a body's bytes go: a blob, its size so far, and its last chunk
/// while that is not full. Every chunk but the last is the blob's chunk
/// size, so that a byte's chunk is its offset divided by that.
pub(crate) struct Sink<'a> {
    state: &'a AppState,
    tenant: &'a narad_journal::TenantId,
    blob: &'a BlobRecord,
    /// The blob's chunk size.
    chunk: usize,
    /// Bytes received in all, those in `pending` included.
    pub(crate) size: u64,
    /// The offset of `pending`'s first byte: a multiple of `chunk`.
    base: u64,
    pending: Vec<u8>,
    digest: Option<Sha256>,
}

impl<'a> Sink<'a> {
    /// A sink at `size` bytes whose last, partial chunk holds `pending`;
    /// digesting what it takes when `digest`.
    pub(crate) fn new(
        state: &'a AppState,
        tenant: &'a narad_journal::TenantId,
        blob: &'a BlobRecord,
        size: u64,
        pending: Vec<u8>,
        digest: bool,
    ) -> Sink<'a> {
        Sink {
            state,
            tenant,
            blob,
            chunk: blob.chunk_bytes as usize,
            size,
            base: size - pending.len() as u64,
            pending,
            digest: digest.then(Sha256::new),
        }
    }

    /// Stores `body`; `check` sees the size so far before anything more is
    /// stored. When the body breaks off and `keep_partial`, what arrived is
    /// stored (a resumable upload resumes after it).
    pub(crate) async fn take(
        &mut self,
        body: Body,
        check: impl Fn(u64) -> ApiResult<()>,
        keep_partial: bool,
    ) -> ApiResult<()> {
        let mut stream = body.into_data_stream();
        while let Some(frame) = stream.next().await {
            let bytes = match frame {
                Ok(bytes) => bytes,
                Err(e) => {
                    if keep_partial {
                        self.flush().await?;
                    }
                    return Err(ApiError::new(
                        ErrorCode::InvalidObject,
                        format!("the upload broke off ({e}); send the rest (or all of it) again"),
                    ));
                }
            };
            check(self.size + bytes.len() as u64)?;
            self.size += bytes.len() as u64;
            if let Some(d) = &mut self.digest {
                d.update(&bytes);
            }
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let take = (self.chunk - self.pending.len()).min(rest.len());
                self.pending.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if self.pending.len() == self.chunk {
                    self.flush().await?;
                    self.pending.clear();
                    self.base += self.chunk as u64;
                }
            }
        }
        self.flush().await
    }

    /// Stores the last chunk as it stands.
    async fn flush(&self) -> ApiResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let seq = self.blob.chunk_of(self.base);
        Ok(self
            .state
            .journal
            .put_blob_chunk(self.tenant, self.blob, seq, &self.pending)
            .await?)
    }
}

/// Downloads a blob, with the authorization of its session. `Range`
/// (one range) answers 206; `ETag` is the SHA-256 (`If-None-Match`
/// answers 304); raster images are `inline`, anything else an
/// `attachment`; never sniffed (`X-Content-Type-Options: nosniff`), never
/// run (`Content-Security-Policy: sandbox`). Another organisation's blob
/// is 404.
#[utoipa::path(get, path = "/v1/blobs/{blobId}", operation_id = "downloadBlob", tag = "blobs",
    params(
        ("blobId" = String, Path, description = "The blob (what follows narad://blobs/ in its reference)"),
        ("ticket" = Option<String>, Query, description = "A ticket (POST /v1/stream-tickets with {stream: blob, blobId}) instead of Authorization, for a plain URL in a browser"),
    ),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 206, description = "The bytes of the range asked for", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 304, description = "Not modified: the ETag matches If-None-Match"),
        (status = 403, description = "NRD-0102: no `reader` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such blob, or its upload has not finished"),
        (status = 416, description = "NRD-0010: the range names no byte of the blob"),
        (status = 503, description = "NRD-0902: the object store holding its bytes cannot be read; retry with backoff"),
    ),
    security(("bearer" = [])))]
pub async fn download(
    State(state): State<AppState>,
    crate::signature::StreamCaller(principal): crate::signature::StreamCaller,
    Path(blob_id): Path<String>,
    mut query: Query,
    headers: HeaderMap,
) -> ApiResult<Response> {
    // Its one parameter is the ticket, read by the caller's extractor; the
    // query is still read like every other (malformed text, unknown names).
    let _ = query.text(super::tickets::PARAMETER);
    query.finish()?;
    principal.require(Permission::Read)?;
    let tenant = principal.tenant.clone();
    let blob = state
        .journal
        .blob(&tenant, &blob_id)
        .await?
        .filter(|b| b.stored)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no blob has this id here"))?;
    principal.require_session(&blob.session_id)?;
    let etag = format!("\"{}\"", blob.sha256.as_deref().unwrap_or_default());
    let mut response_headers = HeaderMap::new();
    describe(&blob, &etag, &mut response_headers);
    let not_modified = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if not_modified {
        return Ok((StatusCode::NOT_MODIFIED, response_headers).into_response());
    }
    let size = blob.size_bytes;
    let range = match headers.get(header::RANGE).map(|v| v.to_str()) {
        None => None,
        Some(text) => {
            let ranges = text
                .ok()
                .and_then(|t| http_range_header::parse_range_header(t).ok())
                .and_then(|r| r.validate(size).ok());
            match ranges.as_deref() {
                Some([one]) => Some(one.clone()),
                // Several ranges: served whole, as RFC 9110 allows.
                Some(_) => None,
                None => {
                    let mut refused = ApiError::new(
                        ErrorCode::RangeNotSatisfiable,
                        format!("the blob holds {size} bytes; ask for bytes=START-END within them"),
                    )
                    .with_field("Range", "not satisfiable")
                    .into_response();
                    refused.headers_mut().insert(
                        header::CONTENT_RANGE,
                        HeaderValue::from_str(&format!("bytes */{size}")).expect("ascii"),
                    );
                    return Ok(refused);
                }
            }
        }
    };
    let (status, first, last) = match &range {
        Some(r) => (StatusCode::PARTIAL_CONTENT, *r.start(), *r.end()),
        None => (StatusCode::OK, 0, size.saturating_sub(1)),
    };
    let length = if size == 0 { 0 } else { last - first + 1 };
    if range.is_some() {
        response_headers.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&format!("bytes {first}-{last}/{size}")).expect("ascii"),
        );
    }
    response_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    let body = if length == 0 {
        Body::empty()
    } else {
        // The first part is read before answering: a store that cannot be
        // read is a 503, not a download that breaks off at once.
        let mut bytes = state.journal.read_blob(&tenant, &blob, first, last);
        let head = bytes.next().await.transpose()?;
        let rest = bytes.map(|part| part.map_err(std::io::Error::other));
        Body::from_stream(futures::stream::iter(head.map(Ok)).chain(rest))
    };
    Ok((status, response_headers, body).into_response())
}

/// The headers of a blob's answer: type, disposition, ETag, and what keeps
/// a browser from sniffing or running it.
fn describe(blob: &BlobRecord, etag: &str, h: &mut HeaderMap) {
    let essence = blob.media_type.split(';').next().unwrap_or_default().trim();
    let inline = INLINE.contains(&essence);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&blob.media_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&disposition(inline, &blob.name)).expect("ascii"),
    );
    h.insert(
        header::ETAG,
        HeaderValue::from_str(etag).expect("hex is ascii"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=0, must-revalidate"),
    );
}

/// `Content-Disposition` for `name` (RFC 6266): an ASCII fallback and the
/// UTF-8 name percent-encoded.
fn disposition(inline: bool, name: &str) -> String {
    let kind = if inline { "inline" } else { "attachment" };
    let fallback: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let encoded = percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
    format!("{kind}; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}
