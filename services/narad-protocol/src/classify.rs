//! The one entry point that reads raw wire JSON the way §13 demands.
//!
//! | input | outcome |
//! |---|---|
//! | not JSON | [`WireError::Malformed`] |
//! | `protocolVersion` other than `narad/v1` | [`WireError::UnsupportedVersion`] |
//! | a known type of a profile the reader did not negotiate | [`Classified::Ignored`] |
//! | an unknown type in a negotiated profile's namespace | [`WireError::UnknownType`] (fail closed) |
//! | an unknown type in no negotiated namespace | [`Classified::Ignored`] |
//! | a known, negotiated type that is structurally invalid | [`WireError::Invalid`] with the JSON pointer of the first problem |
//! | otherwise | [`Classified::Accepted`]; unknown optional fields are ignored |

use serde_json::Value;

use crate::errors::ErrorCode;
use crate::primitives::PROTOCOL_VERSION;
use crate::profile::{Profile, ProfileSet};
use crate::wire::{WireObject, WireType};

/// A reader of wire objects with a set of negotiated profiles.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reader {
    profiles: ProfileSet,
}

/// What the classifier made of a wire object it did not reject.
#[derive(Debug, Clone, PartialEq)]
pub enum Classified {
    /// A valid object of a negotiated type.
    Accepted(Box<WireObject>),
    /// An object this reader must ignore.
    Ignored {
        /// The object's `type`.
        type_name: String,
        /// Why it is ignored.
        reason: IgnoreReason,
    },
}

/// Why an object is ignored rather than read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoreReason {
    /// A known type of a profile the reader did not negotiate (§2.1).
    NotNegotiated(Profile),
    /// An unknown type outside every negotiated profile's namespace.
    Unclaimed,
}

/// Why a wire object was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The text is not JSON.
    #[error("not valid JSON: {0}")]
    Malformed(String),
    /// A protocol version other than narad/v1 (§13).
    #[error("unsupported protocol version {found}: this reader speaks {PROTOCOL_VERSION:?} only")]
    UnsupportedVersion {
        /// The version found, as JSON text.
        found: String,
    },
    /// An unknown type claimed by a negotiated profile's namespace (§13).
    #[error(
        "unknown type {type_name:?} in the namespace of negotiated profile {profile}: \
         an active profile's unknown types fail closed"
    )]
    UnknownType {
        /// The type found.
        type_name: String,
        /// The profile whose namespace it claims.
        profile: Profile,
    },
    /// The object does not have the structure its type requires.
    #[error("{}: {message}", if pointer.is_empty() { "(the object)" } else { pointer })]
    Invalid {
        /// The JSON pointer (RFC 6901) of the first problem; `""` is the
        /// object itself.
        pointer: String,
        /// What is wrong there.
        message: String,
    },
}

impl WireError {
    /// The catalogued error code for this rejection.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::Malformed(_) => ErrorCode::MalformedJson,
            WireError::UnsupportedVersion { .. } => ErrorCode::UnsupportedProtocolVersion,
            WireError::UnknownType { .. } => ErrorCode::UnknownWireType,
            WireError::Invalid { .. } => ErrorCode::InvalidObject,
        }
    }

    /// The JSON pointer of the problem, where there is one.
    pub fn pointer(&self) -> Option<&str> {
        match self {
            WireError::Invalid { pointer, .. } => Some(pointer),
            WireError::UnsupportedVersion { .. } => Some("/protocolVersion"),
            WireError::UnknownType { .. } => Some("/type"),
            WireError::Malformed(_) => None,
        }
    }

    fn invalid(pointer: &str, message: impl Into<String>) -> Self {
        WireError::Invalid {
            pointer: pointer.to_owned(),
            message: message.into(),
        }
    }
}

impl Reader {
    /// A reader that negotiated `profiles` (core is always included).
    pub fn new(profiles: ProfileSet) -> Self {
        Self { profiles }
    }

    /// A reader of every profile this implementation knows, as the server is.
    pub fn all_profiles() -> Self {
        Self::new(ProfileSet::all())
    }

    /// The negotiated profiles.
    pub fn profiles(&self) -> ProfileSet {
        self.profiles
    }

    /// Classifies one wire object given as JSON text.
    pub fn classify_str(&self, text: &str) -> Result<Classified, WireError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| WireError::Malformed(e.to_string()))?;
        self.classify(&value)
    }

    /// Classifies one wire object.
    pub fn classify(&self, value: &Value) -> Result<Classified, WireError> {
        let object = value
            .as_object()
            .ok_or_else(|| WireError::invalid("", "a wire object must be a JSON object"))?;
        match object.get("protocolVersion") {
            None => return Err(WireError::invalid("/protocolVersion", "missing field")),
            Some(Value::String(v)) if v == PROTOCOL_VERSION => {}
            Some(Value::String(v)) => {
                return Err(WireError::UnsupportedVersion {
                    found: format!("{v:?}"),
                });
            }
            Some(other) => {
                return Err(WireError::invalid(
                    "/protocolVersion",
                    format!("must be the string {PROTOCOL_VERSION:?}, got {other}"),
                ));
            }
        }
        let type_name = match object.get("type") {
            Some(Value::String(t)) => t,
            None => return Err(WireError::invalid("/type", "missing field")),
            Some(other) => {
                return Err(WireError::invalid(
                    "/type",
                    format!("must be a string, got {other}"),
                ));
            }
        };
        let Some(wire_type) = WireType::from_name(type_name) else {
            return match self.profiles.claiming(type_name) {
                Some(profile) => Err(WireError::UnknownType {
                    type_name: type_name.clone(),
                    profile,
                }),
                None => Ok(Classified::Ignored {
                    type_name: type_name.clone(),
                    reason: IgnoreReason::Unclaimed,
                }),
            };
        };
        if !self.profiles.contains(wire_type.profile()) {
            return Ok(Classified::Ignored {
                type_name: type_name.clone(),
                reason: IgnoreReason::NotNegotiated(wire_type.profile()),
            });
        }
        WireObject::parse(wire_type, value)
            .map(|obj| Classified::Accepted(Box::new(obj)))
            .map_err(|(pointer, message)| WireError::Invalid { pointer, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run_started() -> Value {
        json!({
            "protocolVersion": "narad/v1", "type": "run.started",
            "eventId": "e-1", "timestamp": "2026-08-05T04:00:00Z",
            "sessionId": "s-1", "sessionSequence": 1,
            "rootRunId": "r-1", "runId": "r-1", "sequence": 1
        })
    }

    #[test]
    fn accepts_a_valid_core_event_and_ignores_unknown_fields() {
        let mut v = run_started();
        v["someFutureField"] = json!({"x": 1});
        let c = Reader::default().classify(&v).unwrap();
        let Classified::Accepted(obj) = c else {
            panic!("expected an accepted object")
        };
        let WireObject::Authority(e) = *obj else {
            panic!("expected an authority event")
        };
        assert_eq!(e.envelope.run.unwrap().sequence.get(), 1);
    }

    #[test]
    fn rejects_other_protocol_versions() {
        let mut v = run_started();
        v["protocolVersion"] = json!("narad/v2");
        let e = Reader::default().classify(&v).unwrap_err();
        assert!(matches!(e, WireError::UnsupportedVersion { .. }), "{e}");
        assert_eq!(e.code(), ErrorCode::UnsupportedProtocolVersion);
    }

    #[test]
    fn ignores_types_of_profiles_not_negotiated() {
        let v = json!({"protocolVersion": "narad/v1", "type": "workflow.started"});
        assert_eq!(
            Reader::default().classify(&v).unwrap(),
            Classified::Ignored {
                type_name: "workflow.started".into(),
                reason: IgnoreReason::NotNegotiated(Profile::Workflow)
            }
        );
    }

    #[test]
    fn unknown_types_fail_closed_only_in_negotiated_namespaces() {
        let v = json!({"protocolVersion": "narad/v1", "type": "workflow.teleported"});
        assert!(matches!(
            Reader::default().classify(&v).unwrap(),
            Classified::Ignored {
                reason: IgnoreReason::Unclaimed,
                ..
            }
        ));
        let reader = Reader::new(ProfileSet::core().with(Profile::Workflow));
        let e = reader.classify(&v).unwrap_err();
        assert_eq!(e.code(), ErrorCode::UnknownWireType);
        let core = json!({"protocolVersion": "narad/v1", "type": "run.teleported"});
        assert!(Reader::default().classify(&core).is_err());
    }

    #[test]
    fn reports_the_pointer_of_the_first_problem() {
        let mut v = run_started();
        v.as_object_mut().unwrap().remove("sessionSequence");
        let e = Reader::default().classify(&v).unwrap_err();
        assert_eq!(e.pointer(), Some("/sessionSequence"), "{e}");

        let mut v = run_started();
        v["sequence"] = json!(0);
        assert_eq!(
            Reader::default().classify(&v).unwrap_err().pointer(),
            Some("/sequence")
        );

        let mut v = run_started();
        v.as_object_mut().unwrap().remove("rootRunId");
        assert_eq!(
            Reader::default().classify(&v).unwrap_err().pointer(),
            Some("/rootRunId")
        );

        let v = json!({
            "protocolVersion": "narad/v1", "type": "interrupt.requested",
            "eventId": "e-2", "timestamp": "2026-08-05T04:00:00Z",
            "sessionId": "s-1", "sessionSequence": 2,
            "rootRunId": "r-1", "runId": "r-1", "sequence": 2,
            "interruptId": "i-1", "waitId": "w-1", "kind": "tool.approval",
            "actions": ["approve", ""]
        });
        assert_eq!(
            Reader::default().classify(&v).unwrap_err().pointer(),
            Some("/actions/1")
        );
    }

    #[test]
    fn workflow_scope_interrupts_carry_no_run_position() {
        let v = json!({
            "protocolVersion": "narad/v1", "type": "interrupt.requested",
            "eventId": "e-2", "timestamp": "2026-08-05T04:00:00Z",
            "sessionId": "s-1", "sessionSequence": 2,
            "workflowId": "wf-1", "workflowSequence": 3,
            "rootRunId": "r-1", "runId": "r-1", "sequence": 2,
            "interruptId": "i-1", "waitId": "w-1", "kind": "review", "actions": ["approve"],
            "scope": "workflow"
        });
        let e = Reader::all_profiles().classify(&v).unwrap_err();
        assert_eq!(e.pointer(), Some("/rootRunId"), "{e}");
    }

    #[test]
    fn malformed_text_and_non_objects_are_rejected() {
        assert!(matches!(
            Reader::default().classify_str("{\"a\":"),
            Err(WireError::Malformed(_))
        ));
        assert_eq!(
            Reader::default()
                .classify(&json!([1]))
                .unwrap_err()
                .pointer(),
            Some("")
        );
    }

    #[test]
    fn control_messages_never_carry_an_event_id() {
        let v = json!({
            "protocolVersion": "narad/v1", "type": "client.heartbeat", "eventId": "e-9",
            "clientExecutorId": "desktop-1", "leaseId": "l-1"
        });
        let e = Reader::all_profiles().classify(&v).unwrap_err();
        assert_eq!(e.pointer(), Some("/eventId"));
    }
}
