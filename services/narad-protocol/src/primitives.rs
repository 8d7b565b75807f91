//! The scalar building blocks of the wire: opaque ids, sequence numbers and
//! counters, timestamps, the protocol version and a few constrained strings.
//!
//! Every type here validates on deserialisation ("parse, don't validate")
//! and serialises back to exactly the JSON it was read from, so that a
//! journal can store and replay an issuer's bytes unchanged.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// The only protocol version this crate speaks.
pub const PROTOCOL_VERSION: &str = "narad/v1";

/// The largest integer a JSON number carries exactly in every client
/// (2^53 − 1, JavaScript's `Number.MAX_SAFE_INTEGER`). Sequences, revisions
/// and counters above it are rejected rather than silently rounded.
pub const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// The longest id accepted, in Unicode scalar values (as JSON Schema's
/// `maxLength` counts).
pub const MAX_ID_CHARS: usize = 256;

/// The `protocolVersion` field: always `"narad/v1"`.
///
/// Reading any other value fails; the classifier reports it as an
/// unsupported version before looking at anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProtocolVersion;

impl Serialize for ProtocolVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(PROTOCOL_VERSION)
    }
}

impl<'de> Deserialize<'de> for ProtocolVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == PROTOCOL_VERSION {
            Ok(ProtocolVersion)
        } else {
            Err(de::Error::custom(format_args!(
                "unsupported protocol version {s:?}; this reader speaks {PROTOCOL_VERSION:?}"
            )))
        }
    }
}

/// Checks the shared id constraints: non-empty, at most [`MAX_ID_CHARS`].
fn check_id(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("an id must not be empty".to_owned());
    }
    let n = s.chars().count();
    if n > MAX_ID_CHARS {
        return Err(format!(
            "an id must be at most {MAX_ID_CHARS} characters, this one has {n}"
        ));
    }
    Ok(())
}

macro_rules! id_types {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a string after checking the id constraints
            /// (non-empty, at most 256 characters).
            pub fn new(s: impl Into<String>) -> Result<Self, String> {
                let s = s.into();
                check_id(&s)?;
                Ok(Self(s))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(de::Error::custom)
            }
        }
    )*};
}

id_types! {
    /// Identity of one authority or watch event (`eventId`), unique within
    /// its deduplication scope (§4.1).
    EventId;
    /// A session: the durable conversation and ordering boundary (§3.1).
    SessionId;
    /// One execution instance (§3.3); also the `rootRunId` of a run journal.
    RunId;
    /// An optional orchestration containing run trees (§3.2).
    WorkflowId;
    /// An external decision or input request (§3.4).
    InterruptId;
    /// One pause cycle of a run or workflow (§7.2).
    WaitId;
    /// An action belonging to exactly one run (§3.5).
    ToolCallId;
    /// A logical client execution endpoint (§3.3, §11).
    ClientExecutorId;
    /// A fencing token naming one attachment of a client executor (§11.1).
    LeaseId;
    /// A single-use capability to finish one client tool call (§11.3).
    ExecutionToken;
    /// A work queue of agent runtimes, chosen at start-run.
    QueueName;
    /// The name an agent runtime claims runs under (for operators).
    RuntimeName;
    /// A transcript message (§9.2).
    MessageId;
    /// A reasoning stream (§9.2).
    ReasoningId;
    /// An admitted input (§9.5).
    AttachmentId;
    /// A produced output (§9.5).
    ArtifactId;
    /// A progress activity item (§9.8).
    ProgressId;
    /// A workflow or graph node.
    NodeId;
    /// A UI view (§9.6).
    ViewId;
    /// A transcript snapshot (§9.3).
    SnapshotId;
    /// The workspace scope of workspace-watch events: the tenant.
    WorkspaceId;
}

impl EventId {
    /// A fresh UUIDv7 event id, as the server issues for its own events:
    /// unique, and ordered by creation time.
    pub fn new_v7() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }
}

/// Accepts a JSON integer, or a float with no fractional part (JSON
/// Schema's `integer` admits `1.0`), in `min..=MAX_SAFE_INTEGER`.
fn deserialize_safe_int<'de, D: Deserializer<'de>>(d: D, min: u64) -> Result<u64, D::Error> {
    struct V(u64);
    impl V {
        fn check<E: de::Error>(&self, n: u64) -> Result<u64, E> {
            if n < self.0 {
                Err(E::custom(format_args!(
                    "must be at least {}, got {n}",
                    self.0
                )))
            } else if n > MAX_SAFE_INTEGER {
                Err(E::custom(format_args!(
                    "must be at most {MAX_SAFE_INTEGER} (2^53 - 1), got {n}"
                )))
            } else {
                Ok(n)
            }
        }
    }
    impl Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an integer from {} to {MAX_SAFE_INTEGER}", self.0)
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
            self.check(n)
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
            match u64::try_from(n) {
                Ok(n) => self.check(n),
                Err(_) => Err(E::custom(format_args!(
                    "must be at least {}, got {n}",
                    self.0
                ))),
            }
        }
        fn visit_f64<E: de::Error>(self, f: f64) -> Result<u64, E> {
            if f.fract() != 0.0 || !f.is_finite() {
                return Err(E::custom(format_args!("must be an integer, got {f}")));
            }
            if f < 0.0 {
                return Err(E::custom(format_args!(
                    "must be at least {}, got {f}",
                    self.0
                )));
            }
            if f > MAX_SAFE_INTEGER as f64 {
                return Err(E::custom(format_args!(
                    "must be at most {MAX_SAFE_INTEGER} (2^53 - 1), got {f}"
                )));
            }
            self.check(f as u64)
        }
    }
    d.deserialize_any(V(min))
}

/// An authority sequence number (`sessionSequence`, `workflowSequence`,
/// run-tree `sequence`): an integer ≥ 1, contiguous within its domain (§4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Sequence(u64);

impl Sequence {
    /// The first sequence of every domain.
    pub const FIRST: Sequence = Sequence(1);

    /// A sequence from a number; `None` for 0 or above 2^53 − 1.
    pub fn new(n: u64) -> Option<Self> {
        (1..=MAX_SAFE_INTEGER).contains(&n).then_some(Self(n))
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The sequence after this one.
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for Sequence {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_safe_int(d, 1).map(Self)
    }
}

/// A non-negative integer of the wire (revisions, counts, intervals,
/// "covers through" cursors where 0 means "nothing yet"), at most 2^53 − 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
#[serde(transparent)]
pub struct UInt(u64);

impl UInt {
    /// A value from a number; `None` above 2^53 − 1.
    pub fn new(n: u64) -> Option<Self> {
        (n <= MAX_SAFE_INTEGER).then_some(Self(n))
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for UInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for UInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_safe_int(d, 0).map(Self)
    }
}

/// How many times a run may be claimed by agent runtimes: 1 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Attempts(u32);

impl Attempts {
    /// The most claims a run may take.
    pub const MAX: u32 = 100;

    /// A count from a number; `None` outside 1..=100.
    pub fn new(n: u32) -> Option<Self> {
        (1..=Self::MAX).contains(&n).then_some(Self(n))
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Attempts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = deserialize_safe_int(d, 1)?;
        u32::try_from(n).ok().and_then(Self::new).ok_or_else(|| {
            de::Error::custom(format_args!("must be at most {}, got {n}", Self::MAX))
        })
    }
}

/// An RFC 3339 date-time (`timestamp`, `expiresAt`, …), kept as the exact
/// text the issuer wrote. Informational only: never used to order
/// authority (§4.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Timestamp(String);

impl Timestamp {
    /// Parses and keeps an RFC 3339 date-time.
    pub fn parse(s: impl Into<String>) -> Result<Self, String> {
        let s = s.into();
        // RFC 3339 `date-time` separates date and time with `T` (or `t`);
        // chrono also takes a space, which JSON Schema's format does not.
        if !matches!(s.as_bytes().get(10), Some(b'T' | b't')) {
            return Err(format!(
                "{s:?} is not an RFC 3339 date-time (e.g. 2026-08-05T04:00:00Z)"
            ));
        }
        chrono::DateTime::parse_from_rfc3339(&s)
            .map_err(|e| format!("{s:?} is not an RFC 3339 date-time: {e}"))?;
        Ok(Self(s))
    }

    /// The current time, in UTC with millisecond precision.
    pub fn now() -> Self {
        Self(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The instant, in UTC.
    pub fn to_utc(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339(&self.0)
            .expect("validated at construction")
            .with_timezone(&chrono::Utc)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A string that must not be empty (codes, names, reasons, kinds, labels).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct NonEmptyString(String);

impl NonEmptyString {
    /// Wraps a string, refusing the empty one.
    pub fn new(s: impl Into<String>) -> Result<Self, String> {
        let s = s.into();
        if s.is_empty() {
            Err("must not be empty".to_owned())
        } else {
            Ok(Self(s))
        }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NonEmptyString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NonEmptyString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A namespaced name such as `acme.audit` or `acme.audit.v2`: two or more
/// dot-separated segments, none empty, with no white space (Unicode
/// `White_Space`) and no control characters (`Cc`) — the same set the
/// schema's `namespacedName` pattern spells out (§9.9 extension names).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct NamespacedName(String);

impl NamespacedName {
    /// Checks and wraps a namespaced name.
    pub fn new(s: impl Into<String>) -> Result<Self, String> {
        let s = s.into();
        let segments: Vec<&str> = s.split('.').collect();
        let well_formed = segments.len() >= 2
            && segments.iter().all(|seg| {
                !seg.is_empty() && !seg.chars().any(|c| c.is_whitespace() || c.is_control())
            });
        if well_formed {
            Ok(Self(s))
        } else {
            Err(format!(
                "{s:?} is not a namespaced name: write it as `namespace.name` \
                 (two or more dot-separated segments, no spaces or control characters)"
            ))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for NamespacedName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A JSON object, as carried by fields the protocol leaves open
/// (`args`, `metadata`).
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

/// A field that must be present but may be `null` (e.g. `displayReplacement`).
///
/// Use with `#[serde(deserialize_with = "present")]`: a missing field is an
/// error, while `null` reads as `None`.
pub fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// An optional field that, when present, must hold a value of its type.
///
/// Use as `#[serde(default, deserialize_with = "some")]` on `Option<T>`:
/// absent reads as `None`; `null` is refused unless `T` itself accepts it
/// (free-form JSON fields). Optional wire fields are omitted, never null.
pub fn some<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A field that must not appear (e.g. `workflowId` on a run-scope graph
/// record). Use as `#[serde(default, skip_serializing)] field: Absent`;
/// any value present is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Absent;

impl<'de> Deserialize<'de> for Absent {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(de::Error::custom("must be absent here"))
    }
}

/// A list that must hold at least one item (e.g. interrupt `actions`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct NonEmptyVec<T>(Vec<T>);

impl<T> NonEmptyVec<T> {
    /// Wraps a list, refusing the empty one.
    pub fn new(items: Vec<T>) -> Result<Self, String> {
        if items.is_empty() {
            Err("must hold at least one item".to_owned())
        } else {
            Ok(Self(items))
        }
    }

    /// The items.
    pub fn as_slice(&self) -> &[T] {
        &self.0
    }

    /// Iterates over the items.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for NonEmptyVec<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(Vec::<T>::deserialize(d)?).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sequence_accepts_integral_floats_like_json_schema_does() {
        let s: Sequence = serde_json::from_value(json!(3.0)).unwrap();
        assert_eq!(s.get(), 3);
        assert!(serde_json::from_value::<Sequence>(json!(3.5)).is_err());
        assert!(serde_json::from_value::<Sequence>(json!(0)).is_err());
        assert!(serde_json::from_value::<Sequence>(json!(-1)).is_err());
        assert!(serde_json::from_value::<Sequence>(json!(MAX_SAFE_INTEGER + 1)).is_err());
        assert!(serde_json::from_value::<UInt>(json!(0)).is_ok());
    }

    #[test]
    fn server_issued_event_ids_are_ordered_uuid_v7() {
        let a = EventId::new_v7();
        let b = EventId::new_v7();
        let ua = uuid::Uuid::parse_str(a.as_str()).unwrap();
        assert_eq!(ua.get_version_num(), 7);
        assert!(a < b, "v7 ids sort by creation: {a} then {b}");
    }

    #[test]
    fn ids_count_characters_not_bytes() {
        let max = "é".repeat(MAX_ID_CHARS);
        assert!(SessionId::new(max.clone()).is_ok());
        assert!(SessionId::new(max + "é").is_err());
        assert!(SessionId::new("").is_err());
    }

    #[test]
    fn timestamps_keep_their_text() {
        let t: Timestamp = serde_json::from_value(json!("2026-08-05T04:00:00.000Z")).unwrap();
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            json!("2026-08-05T04:00:00.000Z")
        );
        assert!(serde_json::from_value::<Timestamp>(json!("yesterday")).is_err());
    }

    #[test]
    fn namespaced_names_need_two_segments() {
        assert!(NamespacedName::new("acme.audit").is_ok());
        assert!(NamespacedName::new("audit").is_err());
        assert!(NamespacedName::new("acme..audit").is_err());
        assert!(NamespacedName::new("acme. audit").is_err());
    }

    #[test]
    fn present_fields_must_be_present_but_may_be_null() {
        #[derive(Deserialize)]
        struct T {
            #[serde(deserialize_with = "present")]
            x: Option<String>,
        }
        assert!(serde_json::from_value::<T>(json!({})).is_err());
        assert_eq!(
            serde_json::from_value::<T>(json!({"x": null})).unwrap().x,
            None
        );
    }
}
