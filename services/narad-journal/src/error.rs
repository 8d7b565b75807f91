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
    /// The session was erased (`DELETE /v1/sessions/{id}`, retention or
    /// the tenant's erasure): nothing of it is left.
    #[error("session {0} was erased; nothing of it is kept, and its id cannot be used again")]
    SessionErased(String),
    /// The tenant's erasure was asked for: nothing more is written for it.
    #[error(
        "organisation {0} is being erased, or was: nothing more is written for it, and its \
         credentials are refused"
    )]
    TenantClosed(String),
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
    /// This organisation registered an extension with this publisher/name already.
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
    /// A request body breaks a rule between its members (a message scope
    /// without its id, a nested run with runtime settings, …).
    #[error("{pointer}: {message}")]
    InvalidBody {
        /// The JSON pointer of the member at fault.
        pointer: &'static str,
        /// What is wrong, and what to send instead.
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
    /// An event names a blob (`narad://blobs/{id}`) this tenant does not
    /// hold for the session, or whose upload has not finished.
    #[error("event {index} of the batch: {message}")]
    ReferenceNotHeld {
        /// The event's position in the batch, from 0.
        index: usize,
        /// What is wrong with the reference.
        message: String,
    },
    /// A tenant's quota is reached (sessions, attached executors); `code`
    /// names the limit.
    #[error("{message}")]
    LimitReached {
        /// The code naming the limit.
        code: ErrorCode,
        /// What was refused and what to do next.
        message: String,
    },
    /// The database failed or cannot be reached ([`JournalError::code`]
    /// tells which). Displayed with its cause: SQLSTATE, message, detail,
    /// constraint, table and column, or the connection's error chain.
    #[error("database error: {}", describe_database_error(.0))]
    Database(#[from] tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("no database connection: {}", describe_pool_error(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// Stored data could not be read back.
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
    /// The object store holding blob bytes failed or cannot be reached.
    #[error("the blob store failed: {0}")]
    BlobStore(String),
}

impl JournalError {
    /// The catalogued code of this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            JournalError::SessionNotFound(_) | JournalError::NotFound(_) => ErrorCode::NotFound,
            JournalError::SessionErased(_) => ErrorCode::SessionErased,
            JournalError::TenantClosed(_) => ErrorCode::OrganisationErased,
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
            JournalError::InvalidBody { .. } => ErrorCode::InvalidObject,
            JournalError::CursorConflict(_) => ErrorCode::CursorConflict,
            JournalError::LeaseNotCurrent(_) => ErrorCode::LeaseNotCurrent,
            JournalError::TokenInvalid(_) => ErrorCode::ExecutionTokenInvalid,
            JournalError::TokenExpired(_) => ErrorCode::ExecutionTokenExpired,
            JournalError::FinishConflict(_) => ErrorCode::FinishConflict,
            JournalError::RuntimeLeaseNotCurrent(_) => ErrorCode::RuntimeLeaseNotCurrent,
            JournalError::RuntimeLeaseRequired(_) => ErrorCode::RuntimeLeaseRequired,
            JournalError::LimitReached { code, .. } => *code,
            JournalError::ReferenceNotHeld { .. } => ErrorCode::ReferenceNotHeld,
            JournalError::Database(_) | JournalError::Pool(_) if self.is_unreachable() => {
                ErrorCode::DatabaseUnavailable
            }
            JournalError::Database(_) | JournalError::Pool(_) | JournalError::Corrupt(_) => {
                ErrorCode::Internal
            }
            JournalError::BlobStore(_) => ErrorCode::BlobStoreUnavailable,
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
            JournalError::ReferenceNotHeld { index, message } => {
                ErrorBody::new(self.code(), format!("event {index} of the batch: {message}"))
                    .with_field(format!("/events/{index}/uri"), message.clone())
            }
            JournalError::InvalidParameter { parameter, message } => {
                ErrorBody::new(self.code(), self.to_string()).with_field(*parameter, message.clone())
            }
            JournalError::Ambiguous { pointer, message }
            | JournalError::InvalidBody { pointer, message } => {
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
            JournalError::Pool(deadpool_postgres::PoolError::Timeout(_)) => ErrorBody::new(
                self.code(),
                "no database connection was free in time: every pooled connection is busy \
                 (NARAD_DATABASE_POOL, NARAD_DATABASE_WAIT_MS); retry with backoff",
            ),
            JournalError::Database(_) | JournalError::Pool(_) if self.is_unreachable() => {
                ErrorBody::new(
                    self.code(),
                    "the database cannot be reached; retry with backoff",
                )
            }
            JournalError::Database(_) | JournalError::Pool(_) | JournalError::Corrupt(_) => {
                ErrorBody::new(
                    self.code(),
                    "the server failed; the detail is in its log under the x-request-id",
                )
            }
            JournalError::BlobStore(_) => ErrorBody::new(
                self.code(),
                "the blob store failed or cannot be reached; retry with backoff (the detail is \
                 in the server's log under the x-request-id)",
            ),
            other => ErrorBody::new(self.code(), other.to_string()),
        }
    }
}

impl JournalError {
    /// Whether this is a database failure that retrying later may cure:
    /// the database cannot be reached, the connection was lost, the pool
    /// had no connection in time, or the server is shutting down or
    /// starting. Every other database error (a constraint, a type, a
    /// statement the server refused) is a failure of narad itself.
    pub fn is_unreachable(&self) -> bool {
        match self {
            JournalError::Database(e) => database_unreachable(e),
            JournalError::Pool(e) => match e {
                deadpool_postgres::PoolError::Backend(e) => database_unreachable(e),
                deadpool_postgres::PoolError::NoRuntimeSpecified => false,
                _ => true,
            },
            _ => false,
        }
    }
}

/// SQLSTATEs of a database that cannot serve now: class 08 (connection
/// exception), `53300` too many connections, `57P01`–`57P03` (shut down by
/// an administrator, a crash, or not accepting connections yet), `57P05`
/// idle session timeout.
fn unreachable_state(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "53300" | "57P01" | "57P02" | "57P03" | "57P05")
}

fn database_unreachable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(state) => unreachable_state(state.code()),
        // Not an error the server answered: a connection that failed on
        // the network (an I/O error) is an outage; anything else (a value
        // that does not convert, a row count) is a bug.
        None => source_chain(e).any(|s| s.is::<std::io::Error>()),
    }
}

fn source_chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| e.source())
}

/// A database error as the log needs it: the server's SQLSTATE, message,
/// detail, constraint, table and column when it answered with an error,
/// otherwise what failed and why.
fn describe_database_error(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        // tokio-postgres writes its cause after its own text.
        return e.to_string();
    };
    let mut text = format!(
        "SQLSTATE {} ({}): {}",
        db.code().code(),
        db.severity(),
        db.message()
    );
    for (what, value) in [
        ("detail", db.detail()),
        ("hint", db.hint()),
        ("constraint", db.constraint()),
        ("schema", db.schema()),
        ("table", db.table()),
        ("column", db.column()),
        ("where", db.where_()),
    ] {
        if let Some(value) = value {
            text.push_str(&format!("; {what}: {value}"));
        }
    }
    text
}

fn describe_pool_error(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => describe_database_error(e),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connection_states_are_outages() {
        for code in ["08006", "08001", "57P01", "57P03", "53300"] {
            assert!(unreachable_state(code), "{code}");
        }
        // U+0000 in text, a unique violation, a type error, a deadlock.
        for code in ["22021", "22P05", "23505", "42804", "40P01"] {
            assert!(!unreachable_state(code), "{code}");
        }
    }
}
