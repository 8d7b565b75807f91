//! Resumable uploads, for large files over unsteady connections: the
//! upload announces its length (`Upload-Length` on `POST
//! /v1/sessions/{sessionId}/blobs`), sends what it can, and resumes with
//! `PATCH /v1/blobs/{blobId}` at `Upload-Offset` (what `GET
//! /v1/blobs/{blobId}/upload` says is stored). Bytes that arrived before a
//! connection broke are kept. Once every byte is there, the blob is
//! digested and stored, as a one-request upload is.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_journal::BlobRecord;
use narad_protocol::ErrorCode;
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use super::blobs::{Blob, REFERENCE_PREFIX, Sink, UploadLimits};
use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::error::{ApiError, ApiResult};

/// The header a resumable upload announces its length with.
pub const UPLOAD_LENGTH: &str = "upload-length";

/// The header a resumed upload says where it resumes with, and an answer
/// says how much is stored with.
pub const UPLOAD_OFFSET: &str = "upload-offset";

/// A resumable upload under way.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Upload {
    /// The blob's id.
    pub blob_id: String,
    /// Its reference, once complete: `narad://blobs/{blobId}`.
    pub uri: String,
    /// Where the rest is sent (`PATCH`) and where the blob is read once
    /// complete.
    pub url: String,
    /// The session it belongs to.
    pub session_id: String,
    /// The file name.
    pub name: String,
    /// The declared media type.
    pub media_type: String,
    /// Bytes stored so far: where the next `PATCH` resumes.
    pub upload_offset: u64,
    /// The length the upload announced.
    pub upload_length: u64,
}

impl Upload {
    fn of(b: &BlobRecord) -> Upload {
        Upload {
            blob_id: b.blob_id.clone(),
            uri: format!("{REFERENCE_PREFIX}{}", b.blob_id),
            url: format!("/v1/blobs/{}", b.blob_id),
            session_id: b.session_id.clone(),
            name: b.name.clone(),
            media_type: b.media_type.clone(),
            upload_offset: b.size_bytes,
            upload_length: b.upload_length.unwrap_or(b.size_bytes),
        }
    }
}

/// A whole number header, if present; 400 naming it otherwise.
pub fn number_header(headers: &HeaderMap, name: &str) -> ApiResult<Option<u64>> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!("{name}: a whole number of bytes"),
                )
                .with_field(name, "not a whole number")
            }),
    }
}

/// Takes `body` into an uploading blob at its current size, within its
/// announced length and the tenant's limits; digests and stores the blob
/// once every byte is there. Answers 201 with the blob when complete, 202
/// with the upload's progress otherwise.
pub async fn continue_upload(
    state: &AppState,
    principal: &Principal,
    blob: BlobRecord,
    body: Body,
    complete_status: StatusCode,
) -> ApiResult<Response> {
    let tenant = &principal.tenant;
    let length = blob.upload_length.unwrap_or_default();
    let limits = UploadLimits::of(state, tenant, blob.size_bytes).await?;
    // The partial last chunk is topped up: every chunk but the last is full.
    let partial = blob.size_bytes % blob.chunk_bytes;
    let pending = if partial == 0 {
        Vec::new()
    } else {
        let seq = blob.chunk_of(blob.size_bytes);
        state
            .journal
            .blob_chunk(tenant, &blob, seq)
            .await?
            .map(|b| b.to_vec())
            .unwrap_or_default()
    };
    let mut sink = Sink::new(state, tenant, &blob, blob.size_bytes, pending, false);
    sink.take(
        body,
        |size| {
            if size > length {
                return Err(ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("the upload announced {length} bytes (Upload-Length); this passes it"),
                )
                .with_field(UPLOAD_LENGTH, "exceeded"));
            }
            limits.check(size)
        },
        true,
    )
    .await?;
    let size = sink.size;
    if size < length {
        let now = BlobRecord {
            size_bytes: size,
            ..blob
        };
        return Ok(progress(StatusCode::ACCEPTED, &now));
    }
    let digest = state.journal.blob_sha256(tenant, &blob, size).await?;
    let stored = state
        .journal
        .finish_blob(tenant, &blob.blob_id, size, &digest)
        .await?;
    // Events that named the upload while it was under way are settled now.
    if let Err(e) = state.journal.settle_blob(tenant, &stored, false).await {
        tracing::warn!(error = %e, blob = %stored.blob_id,
            "cannot settle the events naming a completed upload; appending them again settles them");
    }
    let mut response = (complete_status, Json(Blob::of(stored))).into_response();
    response
        .headers_mut()
        .insert(UPLOAD_OFFSET, HeaderValue::from(size));
    Ok(response)
}

/// An upload's progress as an answer, with `Upload-Offset`.
fn progress(status: StatusCode, blob: &BlobRecord) -> Response {
    let mut response = (status, Json(Upload::of(blob))).into_response();
    response
        .headers_mut()
        .insert(UPLOAD_OFFSET, HeaderValue::from(blob.size_bytes));
    response
}

/// The uploading blob `blob_id` of the caller's tenant and sessions.
async fn uploading(
    state: &AppState,
    principal: &Principal,
    blob_id: &str,
) -> ApiResult<BlobRecord> {
    let blob = state
        .journal
        .blob(&principal.tenant, blob_id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no upload has this id here"))?;
    principal.require_session(&blob.session_id)?;
    Ok(blob)
}

/// Sends more of a resumable upload: the body is the bytes from
/// `Upload-Offset` on, which must be what is stored so far (409 NRD-0011
/// otherwise, with the offset stored). Bytes that arrive before the
/// connection breaks are kept. Answers 200 with the blob once every byte is
/// there, 202 with the upload's progress otherwise.
#[utoipa::path(patch, path = "/v1/blobs/{blobId}", operation_id = "resumeUpload", tag = "blobs",
    params(
        ("blobId" = String, Path, description = "The upload (its blobId)"),
        ("Upload-Offset" = u64, Header, description = "Where these bytes begin: the upload's offset stored so far"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The bytes from Upload-Offset on"),
    responses(
        (status = 200, description = "Every byte is there: the blob, stored", body = Blob),
        (status = 202, description = "Stored so far; send the rest", body = Upload),
        (status = 403, description = "NRD-0102: no `writer` or `backend` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such upload"),
        (status = 409, description = "NRD-0011: Upload-Offset is not the offset stored, or the upload is complete"),
        (status = 413, description = "NRD-0006: past the announced Upload-Length or the largest blob"),
        (status = 503, description = "NRD-0902: the object store cannot take the bytes; send them again from the offset stored"),
    ),
    security(("bearer" = [])))]
pub async fn resume(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path(blob_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let mut session = None;
    let outcome = resume_upload(&state, &principal, &blob_id, &headers, body, &mut session).await;
    crate::audit::record(
        &state,
        &principal,
        &request,
        "resume-upload",
        session.as_deref(),
        &outcome,
        None,
    )
    .await;
    outcome
}

/// What [`resume`] does; `session` learns the upload's session once the
/// upload is found.
async fn resume_upload(
    state: &AppState,
    principal: &Principal,
    blob_id: &str,
    headers: &HeaderMap,
    body: Body,
    session: &mut Option<String>,
) -> ApiResult<Response> {
    principal
        .require(Permission::Command)
        .or_else(|_| principal.require(Permission::Append))?;
    let offset = number_header(headers, UPLOAD_OFFSET)?.ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidParameter,
            "Upload-Offset: where these bytes begin (GET /v1/blobs/{blobId}/upload says)",
        )
        .with_field("Upload-Offset", "required")
    })?;
    let blob = uploading(state, principal, blob_id).await?;
    *session = Some(blob.session_id.clone());
    if blob.stored || blob.upload_length.is_none() {
        return Err(ApiError::new(
            ErrorCode::UploadOffsetMismatch,
            "this upload is complete (or was sent whole): nothing more is taken",
        )
        .with_details(json!({"uploadOffset": blob.size_bytes})));
    }
    if offset != blob.size_bytes {
        return Err(ApiError::new(
            ErrorCode::UploadOffsetMismatch,
            format!(
                "{} bytes are stored; send the rest from offset {}",
                blob.size_bytes, blob.size_bytes
            ),
        )
        .with_field("Upload-Offset", "not the offset stored")
        .with_details(json!({"uploadOffset": blob.size_bytes})));
    }
    // A body announced past the length is refused before anything of it
    // is stored.
    let announced = number_header(headers, "content-length")?.unwrap_or(0);
    let length = blob.upload_length.unwrap_or_default();
    if offset + announced > length {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the upload announced {length} bytes (Upload-Length); {announced} from offset \
                 {offset} pass it"
            ),
        )
        .with_field("Upload-Offset", "with Content-Length past Upload-Length"));
    }
    continue_upload(state, principal, blob, body, StatusCode::OK).await
}

/// Where a resumable upload stands: the offset to resume at.
#[utoipa::path(get, path = "/v1/blobs/{blobId}/upload", operation_id = "getUpload", tag = "blobs",
    params(("blobId" = String, Path, description = "The upload (its blobId)")),
    responses(
        (status = 200, description = "The upload's progress (complete when uploadOffset = uploadLength)", body = Upload),
        (status = 403, description = "NRD-0102: the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such upload"),
    ),
    security(("bearer" = [])))]
pub async fn upload_progress(
    State(state): State<AppState>,
    principal: Principal,
    Path(blob_id): Path<String>,
) -> ApiResult<Response> {
    principal
        .require(Permission::Read)
        .or_else(|_| principal.require(Permission::Command))?;
    let blob = uploading(&state, &principal, &blob_id).await?;
    Ok(progress(StatusCode::OK, &blob))
}
