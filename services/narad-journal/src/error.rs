//! What the journal's operations fail with, and how each failure reads to
//! a client (`NRD-xxxx` code and message).

use narad_protocol::rules::Violation;
use narad_protocol::{ErrorBody, ErrorCode, WireError};

/// A journal failure.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The session does not exist for this tenant.
    #[error("session {0} does not exist")]
    SessionNotFound(String),
    /// The thing named does not exist for this tenant.
    #[error("{0} does not exist")]
    NotFound(String),
    /// The session's top-level slot is taken (start-run, onConflict=reject).
    #[error("the session's top-level slot is taken by {active}")]
    SlotTaken {
        /// The active execution.
        active: serde_json::Value,
    },
    /// The interrupt was resolved before.
    #[error("interrupt {interrupt_id} was already resolved with decision {decision:?}")]
    InterruptAlreadyResolved {
        /// The interrupt.
        interrupt_id: String,
        /// The decision recorded.
        decision: String,
    },
    /// The caller's credential is limited to other sessions.
    #[error("{0}")]
    Forbidden(String),
    /// An id-located command whose id is used in several sessions, without
    /// the sessionId that says which is meant.
    #[error("{message}")]
    Ambiguous {
        /// The JSON pointer of the field that would settle it.
        pointer: &'static str,
        /// What to do.
        message: String,
    },
    /// A session with this id already exists.
    #[error("session {0} already exists")]
    SessionExists(String),
    /// An extension with this publisher/name is registered already.
    #[error("extension {0} is registered already")]
    ExtensionExists(String),
    /// A proposed event is not a valid narad/v1 authority event.
    #[error("event {index} of the batch is invalid: {error}")]
    Invalid {
        /// The event's position in the batch, from 0.
        index: usize,
        /// What is wrong, with a pointer into the event.
        error: WireError,
    },
    /// A proposed event breaks a protocol rule; nothing was written.
    #[error("event {index} of the batch breaks {}: {}", violation.rule, violation.message)]
    Rejected {
        /// The event's position in the batch, from 0.
        index: usize,
        /// The rule broken.
        violation: Violation,
    },
    /// An eventId of the batch was already used with another body (or in
    /// another session, or the batch is only partly a retry).
    #[error("eventId {event_id} was already used with a different event")]
    EventIdConflict {
        /// The conflicting id.
        event_id: String,
    },
    /// `expectedSessionSequence` is not the session's current sequence.
    #[error("the session is at sequence {actual}, not the expected {expected}")]
    SequenceMismatch {
        /// What the caller expected.
        expected: u64,
        /// The session's current sequence.
        actual: u64,
    },
    /// A history query is malformed (a limit out of range, a cursor
    /// without its id).
    #[error("{parameter}: {message}")]
    InvalidParameter {
        /// The parameter.
        parameter: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// History cursors that identify different positions (§10.2).
    #[error("the cursors identify different positions: {0}")]
    CursorConflict(String),
    /// A client executor's lease is superseded or lapsed, or is not the
    /// lease an execution token was issued under (§11.1).
    #[error("{0}")]
    LeaseNotCurrent(String),
    /// An execution token this tenant never issued to this executor.
    #[error("{0}")]
    TokenInvalid(String),
    /// An execution token past its expiry (§11.3 rule 9).
    #[error("{0}")]
    TokenExpired(String),
    /// A token already finished with other data, or its call closed
    /// otherwise (§11.3 rule 8).
    #[error("{0}")]
    FinishConflict(String),
    /// A runtime lease that is not the current, unexpired lease of its run.
    #[error("{0}")]
    RuntimeLeaseNotCurrent(String),
    /// An append without the lease to a run journal a runtime holds.
    #[error("{0}")]
    RuntimeLeaseRequired(String),
    /// The database failed or cannot be reached.
    #[error("database error: {0}")]
    Database(#[from] tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("no database connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// Stored data could not be read back.
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
}

impl JournalError {
    /// The catalogued code of this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            JournalError::SessionNotFound(_) | JournalError::NotFound(_) => ErrorCode::NotFound,
            JournalError::SlotTaken { .. } => ErrorCode::SessionSlotTaken,
            JournalError::InterruptAlreadyResolved { .. } => ErrorCode::InterruptAlreadyResolved,
            JournalError::SessionExists(_) => ErrorCode::SessionExists,
            JournalError::Forbidden(_) => ErrorCode::Forbidden,
            JournalError::Ambiguous { .. } => ErrorCode::InvalidParameter,
            JournalError::ExtensionExists(_) => ErrorCode::ExtensionExists,
            JournalError::Invalid { error, .. } => error.code(),
            JournalError::Rejected { .. } => ErrorCode::RuleViolation,
            JournalError::EventIdConflict { .. } => ErrorCode::EventIdConflict,
            JournalError::SequenceMismatch { .. } => ErrorCode::SequenceMismatch,
            JournalError::InvalidParameter { .. } => ErrorCode::InvalidParameter,
            JournalError::CursorConflict(_) => ErrorCode::CursorConflict,
            JournalError::LeaseNotCurrent(_) => ErrorCode::LeaseNotCurrent,
            JournalError::TokenInvalid(_) => ErrorCode::ExecutionTokenInvalid,
            JournalError::TokenExpired(_) => ErrorCode::ExecutionTokenExpired,
            JournalError::FinishConflict(_) => ErrorCode::FinishConflict,
            JournalError::RuntimeLeaseNotCurrent(_) => ErrorCode::RuntimeLeaseNotCurrent,
            JournalError::RuntimeLeaseRequired(_) => ErrorCode::RuntimeLeaseRequired,
            JournalError::Database(_) | JournalError::Pool(_) => ErrorCode::DatabaseUnavailable,
            JournalError::Corrupt(_) => ErrorCode::Internal,
        }
    }

    /// The error envelope a client receives: specific, with the pointer
    /// and rule id where there are some, and no internal detail.
    pub fn to_body(&self) -> ErrorBody {
        match self {
            JournalError::Invalid { index, error } => {
                let inner = ErrorBody::from(error);
                let mut body = ErrorBody::new(
                    error.code(),
                    format!("event {index} of the batch: {}", inner.message),
                );
                for (pointer, problem) in inner.fields.into_iter().flatten() {
                    body = body.with_field(format!("/events/{index}{pointer}"), problem);
                }
                body
            }
            JournalError::Rejected { index, violation } => ErrorBody::new(
                self.code(),
                format!(
                    "event {index} of the batch was refused, and nothing of the batch was written: {}",
                    violation.message
                ),
            )
            .with_rule(violation.rule)
            .with_field(
                format!("/events/{index}{}", violation.field.as_deref().unwrap_or("")),
                violation.message.clone(),
            ),
            JournalError::Ambiguous { pointer, message } => {
                ErrorBody::new(self.code(), message.clone()).with_field(*pointer, message.clone())
            }
            JournalError::SlotTaken { active } => ErrorBody::new(
                self.code(),
                format!(
                    "the session's top-level slot is taken by {active}; retry once it has ended, \
                     or start with onConflict enqueue or interrupt"
                ),
            )
            .with_rule(narad_protocol::rules::SESSION_SLOT.id)
            .with_details(serde_json::json!({"activeExecution": active})),
            JournalError::InterruptAlreadyResolved { interrupt_id, decision } => {
                ErrorBody::new(self.code(), self.to_string()).with_details(
                    serde_json::json!({"interruptId": interrupt_id, "decision": decision}),
                )
            }
            JournalError::Database(_) | JournalError::Pool(_) => ErrorBody::new(
                self.code(),
                "the database cannot be reached; retry with backoff",
            ),
            JournalError::Corrupt(_) => {
                ErrorBody::new(self.code(), "the server failed; the detail is in its log")
            }
            other => ErrorBody::new(self.code(), other.to_string()),
        }
    }
}
