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
}

impl ApiError {
    /// An answer with `code` and a message saying what to do next.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            body: Box::new(ErrorBody::new(code, message)),
        }
    }

    /// An answer with a ready envelope.
    pub fn from_body(body: ErrorBody) -> ApiError {
        ApiError {
            body: Box::new(body),
        }
    }

    /// Adds a per-field problem (JSON pointer → what is wrong there).
    pub fn with_field(mut self, pointer: impl Into<String>, problem: impl Into<String>) -> Self {
        *self.body = self.body.with_field(pointer, problem);
        self
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
        (self.status(), Json(*self.body)).into_response()
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
            _ => {}
        }
        ApiError::from_body(e.to_body())
    }
}

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;
