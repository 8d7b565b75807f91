//! The one error answer of the API: the `{code, title, message, fields?,
//! rule?, details?}` envelope with the status its code is answered with.
//!
//! Messages are for the public: a database failure or a bug answers with a
//! generic sentence, and its detail goes to the log, inside the request's
//! span (which carries the `x-request-id` the response also carries).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use narad_journal::JournalError;
use narad_protocol::{ErrorBody, ErrorCode};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    body: Box<ErrorBody>,
    /// Seconds a client waits before retrying (`Retry-After`), if any.
    retry_after: Option<u64>,
}

impl ApiError {
    /// An answer with `code` and a message saying what to do next.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            body: Box::new(ErrorBody::new(code, message)),
            retry_after: None,
        }
    }

    /// An answer with a ready envelope.
    pub fn from_body(body: ErrorBody) -> ApiError {
        ApiError {
            body: Box::new(body),
            retry_after: None,
        }
    }

    /// Adds a per-field problem (JSON pointer → what is wrong there).
    pub fn with_field(mut self, pointer: impl Into<String>, problem: impl Into<String>) -> Self {
        *self.body = self.body.with_field(pointer, problem);
        self
    }

    /// Adds structured context (`details`).
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        *self.body = self.body.with_details(details);
        self
    }

    /// Answers with `Retry-After: seconds`.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The `Retry-After` seconds, if any.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// A failure of the server itself: logged in full, answered in general.
    pub fn internal(detail: impl std::fmt::Display) -> ApiError {
        tracing::error!(%detail, "internal error");
        ApiError::new(
            ErrorCode::Internal,
            "the server failed; retry, and report the x-request-id if it persists",
        )
    }

    /// The `NRD-` code.
    pub fn code(&self) -> &str {
        &self.body.code
    }

    /// The HTTP status it is answered with.
    pub fn status(&self) -> StatusCode {
        ErrorCode::from_code(&self.body.code)
            .and_then(|c| StatusCode::from_u16(c.status()).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, Json(*self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<JournalError> for ApiError {
    fn from(e: JournalError) -> ApiError {
        match &e {
            JournalError::Database(_) | JournalError::Pool(_) if e.is_unreachable() => {
                tracing::error!(error = %e, "the database cannot be reached");
            }
            JournalError::Database(_) | JournalError::Pool(_) => {
                tracing::error!(error = %e, "database error");
            }
            JournalError::Corrupt(_) => {
                tracing::error!(error = %e, "stored data is not what narad wrote");
            }
            JournalError::BlobStore(_) => {
                tracing::error!(error = %e, "the blob store failed");
            }
            _ => {}
        }
        let limit = matches!(e, JournalError::LimitReached { .. });
        let error = ApiError::from_body(e.to_body());
        // A quota the journal enforces (sessions, executors) answers as
        // every limit does: counted, with its name and Retry-After.
        if limit {
            crate::quotas::journal_refusal(error)
        } else {
            error
        }
    }
}

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;
