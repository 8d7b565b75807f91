//! The closed catalog of `NRD-xxxx` error codes and the one error envelope
//! `{code, title, message, fields?, rule?}` every API answer uses.
//!
//! Codes are stable: a code's meaning never changes and a retired code is
//! never reused. `docs/errors.md` lists the same table; a test keeps the
//! two in agreement.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::primitives::some;

use crate::classify::WireError;

macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $code:literal, $status:literal, $title:literal;)*) => {
        /// Every error code narad answers with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            /// All codes, in catalog order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code, e.g. `NRD-0003`.
            pub fn code(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// The HTTP status the code is answered with.
            pub fn status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status,)* }
            }

            /// A short, stable summary of the error class.
            pub fn title(self) -> &'static str {
                match self { $(ErrorCode::$variant => $title,)* }
            }

            /// The code with this `NRD-xxxx` text.
            pub fn from_code(code: &str) -> Option<ErrorCode> {
                match code { $($code => Some(ErrorCode::$variant),)* _ => None }
            }
        }
    };
}

error_codes! {
    /// The server failed; the detail is in its log under the request id.
    Internal = "NRD-0001", 500, "Internal error";
    /// The request body is not JSON.
    MalformedJson = "NRD-0002", 400, "Malformed JSON";
    /// A JSON document lacks the structure its type requires.
    InvalidObject = "NRD-0003", 400, "Invalid object";
    /// A wire object names a protocol version other than narad/v1.
    UnsupportedProtocolVersion = "NRD-0004", 400, "Unsupported protocol version";
    /// An unknown type in the namespace of a negotiated profile.
    UnknownWireType = "NRD-0005", 400, "Unknown wire type";
    /// The request body exceeds the configured limit.
    PayloadTooLarge = "NRD-0006", 413, "Payload too large";
    /// The addressed resource does not exist, or is another tenant's.
    NotFound = "NRD-0007", 404, "Not found";
    /// A query parameter, path parameter or header is missing or malformed.
    InvalidParameter = "NRD-0008", 400, "Invalid parameter";
    /// The route exists, but does not take this method.
    MethodNotAllowed = "NRD-0009", 405, "Method not allowed";
    /// A `Range` no byte of the resource falls in, or that cannot be read.
    RangeNotSatisfiable = "NRD-0010", 416, "Range not satisfiable";
    /// A resumable upload's `Upload-Offset` is not the offset stored.
    UploadOffsetMismatch = "NRD-0011", 409, "Upload offset mismatch";
    /// No valid credential was presented.
    Unauthenticated = "NRD-0101", 401, "Authentication required";
    /// The caller's role lacks the permission.
    Forbidden = "NRD-0102", 403, "Forbidden";
    /// An event breaks a narad/v1 rule; the rule id says which.
    RuleViolation = "NRD-0201", 409, "Protocol rule violated";
    /// An eventId was reused with a different body.
    EventIdConflict = "NRD-0202", 409, "Event id conflict";
    /// The session's sequence is not the one the caller expected.
    SequenceMismatch = "NRD-0203", 409, "Session sequence mismatch";
    /// The session's top-level execution slot is taken.
    SessionSlotTaken = "NRD-0204", 409, "Session busy";
    /// The interrupt has already been resolved.
    InterruptAlreadyResolved = "NRD-0205", 409, "Interrupt already resolved";
    /// A session with the requested id already exists.
    SessionExists = "NRD-0206", 409, "Session exists";
    /// An extension with the requested publisher/name is registered already.
    ExtensionExists = "NRD-0207", 409, "Extension exists";
    /// The session was erased: nothing of it is kept, and its id and its
    /// events' ids cannot be used again.
    SessionErased = "NRD-0208", 410, "Session erased";
    /// An event names a blob (`narad://blobs/{id}`) this tenant does not
    /// hold for the session, or whose upload has not finished.
    ReferenceNotHeld = "NRD-0209", 409, "Blob reference not held";
    /// The organisation is being erased, or was: its credentials are
    /// refused and nothing is written for it.
    OrganisationErased = "NRD-0210", 410, "Organisation erased";
    /// An `Idempotency-Key` was used before with a different request.
    IdempotencyKeyReused = "NRD-0211", 422, "Idempotency key reused";
    /// The first request with this `Idempotency-Key` has not answered yet.
    IdempotentRequestInFlight = "NRD-0212", 409, "Request with this key in flight";
    /// History cursors that identify different positions.
    CursorConflict = "NRD-0301", 400, "Cursor conflict";
    /// A stream cursor past anything the store holds.
    CursorAhead = "NRD-0302", 409, "Cursor ahead of the store";
    /// A stream cursor naming no event the store holds for the caller.
    CursorUnknown = "NRD-0303", 409, "Cursor unknown";
    /// A client executor's lease is superseded or lapsed, or is not the
    /// one the execution token was issued under.
    LeaseNotCurrent = "NRD-0401", 409, "Lease not current";
    /// An execution token that was not issued to this executor.
    ExecutionTokenInvalid = "NRD-0402", 403, "Execution token invalid";
    /// An execution token past its expiry.
    ExecutionTokenExpired = "NRD-0403", 410, "Execution token expired";
    /// A token finished before with other data, or its call closed otherwise.
    FinishConflict = "NRD-0404", 409, "Finish conflicts";
    /// A runtime lease that is not the current, unexpired lease of its run.
    RuntimeLeaseNotCurrent = "NRD-0501", 409, "Runtime lease not current";
    /// An append without the lease to a run journal a runtime holds.
    RuntimeLeaseRequired = "NRD-0502", 409, "Runtime lease required";
    /// The tenant's rate of appended events is spent; retry after the
    /// `Retry-After` seconds.
    EventRateLimited = "NRD-0601", 429, "Event rate limit reached";
    /// The tenant's rate of commands is spent; retry after the
    /// `Retry-After` seconds.
    CommandRateLimited = "NRD-0602", 429, "Command rate limit reached";
    /// The tenant has as many streams open as it may.
    OpenStreamLimitReached = "NRD-0603", 429, "Open stream limit reached";
    /// The tenant has as many client executors attached as it may.
    ExecutorLimitReached = "NRD-0604", 429, "Attached executor limit reached";
    /// The tenant holds as many sessions as it may.
    SessionLimitReached = "NRD-0605", 429, "Session limit reached";
    /// The tenant's blobs hold as many bytes as they may.
    StoredBytesLimitReached = "NRD-0606", 429, "Stored bytes limit reached";
    /// The database cannot be reached.
    DatabaseUnavailable = "NRD-0901", 503, "Database unavailable";
    /// The object store holding blob bytes cannot be reached or failed.
    BlobStoreUnavailable = "NRD-0902", 503, "Blob store unavailable";
}

/// The error envelope of every API answer that is not a success.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// `NRD-` and four digits, from the catalog.
    #[serde(deserialize_with = "error_code_text")]
    pub code: String,
    /// The catalog title of the code.
    pub title: String,
    /// What went wrong and what to do next; never internal detail.
    pub message: String,
    /// Per-field problems: JSON pointer → what is wrong there.
    #[serde(default, deserialize_with = "some")]
    pub fields: Option<BTreeMap<String, String>>,
    /// The protocol rule id, when a rule of narad/v1 was broken.
    #[serde(default, deserialize_with = "some")]
    pub rule: Option<String>,
    /// Structured context: the active execution a start conflicts with,
    /// the decision an interrupt was already resolved with, …
    #[serde(default, deserialize_with = "some")]
    pub details: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ErrorBody {
    /// An envelope for `code` with a specific message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code: code.code().to_owned(),
            title: code.title().to_owned(),
            message: message.into(),
            fields: None,
            rule: None,
            details: None,
        }
    }

    /// Adds one per-field problem.
    pub fn with_field(mut self, pointer: impl Into<String>, problem: impl Into<String>) -> Self {
        self.fields
            .get_or_insert_with(BTreeMap::new)
            .insert(pointer.into(), problem.into());
        self
    }

    /// Names the broken protocol rule.
    pub fn with_rule(mut self, rule: impl Into<String>) -> Self {
        self.rule = Some(rule.into());
        self
    }

    /// Adds structured context.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        if let serde_json::Value::Object(map) = details {
            self.details = Some(map);
        }
        self
    }

    /// The catalog entry of this envelope's code.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_code(&self.code)
    }
}

impl From<&WireError> for ErrorBody {
    fn from(e: &WireError) -> Self {
        let body = ErrorBody::new(e.code(), e.to_string());
        match e.pointer() {
            Some(p) => {
                let problem = match e {
                    WireError::Invalid { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                body.with_field(p, problem)
            }
            None => body,
        }
    }
}

/// Reads an error code, refusing text not of the form `NRD-` and four
/// digits. Codes this reader does not know are kept: a newer server may
/// answer with them.
fn error_code_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    let well_formed = s
        .strip_prefix("NRD-")
        .is_some_and(|digits| digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_digit()));
    if well_formed {
        Ok(s)
    } else {
        Err(serde::de::Error::custom(format_args!(
            "{s:?} is not an error code of the form NRD-0000"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_well_formed() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.code()), "{} is listed twice", c.code());
            let digits = c.code().strip_prefix("NRD-").expect("NRD- prefix");
            assert!(digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_digit()));
            assert!((400..600).contains(&c.status()));
            assert_eq!(ErrorCode::from_code(c.code()), Some(*c));
        }
    }

    #[test]
    fn errors_doc_matches_the_catalog() {
        let doc = include_str!("../../../docs/errors.md");
        let rows: Vec<(String, u16, String)> = doc
            .lines()
            .filter(|l| l.starts_with("| NRD-"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].to_owned(),
                    cells[2].parse().expect("status is a number"),
                    cells[3].to_owned(),
                )
            })
            .collect();
        let catalog: Vec<(String, u16, String)> = ErrorCode::ALL
            .iter()
            .map(|c| (c.code().to_owned(), c.status(), c.title().to_owned()))
            .collect();
        assert_eq!(rows, catalog, "docs/errors.md and ErrorCode disagree");
    }

    #[test]
    fn wire_errors_become_envelopes_with_the_pointer() {
        let e = crate::Reader::default()
            .classify(&serde_json::json!({"protocolVersion": "narad/v1", "type": "run.started"}))
            .unwrap_err();
        let body = ErrorBody::from(&e);
        assert_eq!(body.code, "NRD-0003");
        assert_eq!(body.title, "Invalid object");
        assert!(body.fields.unwrap().contains_key("/eventId"));
    }
}
