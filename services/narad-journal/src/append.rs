//! The append transaction: a batch of proposed authority events for one
//! session becomes durable, with its sequences, or nothing does.
//!
//! A proposal is an authority event without its sequences: the journal
//! assigns `sessionSequence`, the run-tree `sequence` and the
//! `workflowSequence` (§4.2), fills `sessionId`, a missing `timestamp`, and
//! the `workflowId` of a workflow-owned run's events.

use narad_protocol::authority::Actor;
use narad_protocol::engine::Issuer;
use narad_protocol::primitives::{SessionId, Timestamp};
use narad_protocol::{AuthorityEvent, Classified, Reader, WireError, WireObject};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::group::Request;
use crate::{Journal, JournalError, TenantId};

/// The largest batch one append takes.
pub const MAX_BATCH: usize = 1000;

/// Options of an append.
#[derive(Debug, Clone, Default)]
pub struct AppendOptions {
    /// Append only if the session is at exactly this sequence (optimistic
    /// concurrency); otherwise [`JournalError::SequenceMismatch`].
    pub expected_session_sequence: Option<u64>,
    /// Who appends, for the runtime-lease fence.
    pub fence: Fence,
    /// Who appends, for the rules of who may write what (the `issuer.*`
    /// rules, checked in the append transaction); a command's actor is
    /// stamped on the events that record it.
    pub issuer: Issuer,
    /// Hand the top-level runs this batch starts to the work queue.
    pub work: Option<crate::runtime::WorkOrder>,
}

/// Who appends, as the runtime-lease fence sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Fence {
    /// The server itself (commands, executors, sweepers): never fenced.
    #[default]
    Server,
    /// The server repairing a run journal whose item it marked `closing`
    /// (`narad_journal::runtime`): refused once the item is no longer
    /// closing (another closer finished it, a runtime holds it again).
    Closing,
    /// A backend over the API. A run journal held by a runtime takes its
    /// appends only under the current lease; a lease given must be the
    /// current, unexpired lease of every run journal the batch touches.
    Backend {
        /// The runtime lease presented, if any.
        lease: Option<String>,
    },
}

/// One appended event's identity and sequences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppendedEvent {
    /// The event.
    #[schema(schema_with = crate::openapi::id)]
    pub event_id: String,
    /// Its sessionSequence.
    #[schema(schema_with = crate::openapi::sequence)]
    pub session_sequence: u64,
    /// Its run-tree sequence, for run-tree events.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::sequence)]
    pub sequence: Option<u64>,
    /// Its workflowSequence, for workflow events.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::sequence)]
    pub workflow_sequence: Option<u64>,
}

/// The result of an append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Appended {
    /// The batch's events, in order.
    pub events: Vec<AppendedEvent>,
    /// The whole batch had been appended before with the same bodies:
    /// nothing was written, and these are the stored sequences.
    pub duplicate: bool,
    /// The session's top-level slot became free.
    #[serde(skip)]
    pub slot_freed: bool,
    /// A queued start that became run.started in this transaction (its
    /// event is the last of `events`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::id)]
    pub dequeued: Option<String>,
}

/// A proposal made ready for the engine: parsed, with placeholder
/// sequences, and the digest of its canonical form (RFC 8785) that makes
/// retries recognisable.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub(crate) event: AuthorityEvent,
    pub(crate) body: Value,
    pub(crate) sha256: Vec<u8>,
}

const SEQUENCE_FIELDS: [&str; 3] = ["sessionSequence", "sequence", "workflowSequence"];

/// Checks a proposal and parses it as an authority event, with
/// placeholder sequences the journal replaces once it holds the lock.
pub(crate) fn prepare(
    index: usize,
    proposal: &Value,
    session_id: &SessionId,
) -> Result<Prepared, JournalError> {
    let invalid = |pointer: &str, message: String| JournalError::Invalid {
        index,
        error: WireError::Invalid {
            pointer: pointer.to_owned(),
            message,
        },
    };
    let Some(object) = proposal.as_object() else {
        return Err(invalid(
            "",
            "a proposed event must be a JSON object".to_owned(),
        ));
    };
    if let Some(field) = SEQUENCE_FIELDS.iter().find(|f| object.contains_key(**f)) {
        return Err(invalid(
            &format!("/{field}"),
            "sequences are assigned by the journal: omit this field".to_owned(),
        ));
    }
    if !object.contains_key("eventId") {
        return Err(invalid(
            "/eventId",
            "missing field: a proposed event names its eventId, which makes retries idempotent"
                .to_owned(),
        ));
    }
    match object.get("sessionId") {
        Some(Value::String(s)) if s != session_id.as_str() => {
            return Err(invalid(
                "/sessionId",
                format!("names session {s:?}, but the batch is appended to {session_id}"),
            ));
        }
        _ => {}
    }
    let sha256 = Sha256::digest(
        serde_jcs::to_vec(proposal)
            .map_err(|e| invalid("", format!("cannot canonicalise: {e}")))?,
    )
    .to_vec();
    let mut body = proposal.clone();
    body["sessionId"] = json!(session_id);
    if !object.contains_key("timestamp") {
        body["timestamp"] = json!(Timestamp::now());
    }
    body["sessionSequence"] = json!(1);
    if object.contains_key("rootRunId") || object.contains_key("runId") {
        body["sequence"] = json!(1);
    }
    if object.contains_key("workflowId") {
        body["workflowSequence"] = json!(1);
    }
    let event = match Reader::all_profiles().classify(&body) {
        Ok(Classified::Accepted(object)) => match *object {
            WireObject::Authority(e) => e,
            other => {
                return Err(invalid(
                    "/type",
                    format!("{} is not an authority event", other.wire_type().name()),
                ));
            }
        },
        Ok(Classified::Ignored { type_name, .. }) => {
            return Err(JournalError::Invalid {
                index,
                error: WireError::Invalid {
                    pointer: "/type".to_owned(),
                    message: format!("{type_name:?} is not a narad/v1 type"),
                },
            });
        }
        Err(error) => return Err(JournalError::Invalid { index, error }),
    };
    Ok(Prepared {
        event,
        body,
        sha256,
    })
}

/// The event types that record who caused them (§7.7): the server stamps
/// their actor.
const RECORDS_ACTOR: [&str; 3] = [
    "interrupt.resolved",
    "run.stop.requested",
    "message.user.recorded",
];

/// A command's proposals with its actor stamped on those that record one.
fn stamp(proposals: &[Value], actor: &Actor) -> Vec<Value> {
    let actor = serde_json::to_value(actor).expect("serialises");
    proposals
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if p["type"]
                .as_str()
                .is_some_and(|t| RECORDS_ACTOR.contains(&t))
            {
                p["actor"] = actor.clone();
            }
            p
        })
        .collect()
}

impl Journal {
    /// Appends a batch of proposed authority events to a session: all of
    /// them, with contiguous sequences, or none.
    ///
    /// A batch whose eventIds were all appended before with the same
    /// bodies is an idempotent success returning the stored sequences; an
    /// eventId reused with another body is [`JournalError::EventIdConflict`].
    /// A batch breaking a rule is [`JournalError::Rejected`] with the index
    /// of the offending event and the rule.
    ///
    /// Concurrent appends share transactions: see `combine.rs`. Each
    /// batch is still checked, accepted or refused on its own.
    #[tracing::instrument(skip_all, fields(tenant = %tenant, session = %session_id, events = proposals.len()))]
    pub async fn append(
        &self,
        tenant: &TenantId,
        session_id: &SessionId,
        proposals: &[Value],
        options: AppendOptions,
    ) -> Result<Appended, JournalError> {
        if proposals.is_empty() || proposals.len() > MAX_BATCH {
            return Err(JournalError::InvalidBody {
                pointer: "/events",
                message: format!(
                    "a batch holds 1 to {MAX_BATCH} events, this one {}",
                    proposals.len()
                ),
            });
        }
        let stamped;
        let proposals = match &options.issuer {
            Issuer::Command(actor) => {
                stamped = stamp(proposals, actor);
                &stamped[..]
            }
            _ => proposals,
        };
        let prepared = proposals
            .iter()
            .enumerate()
            .map(|(i, p)| prepare(i, p, session_id))
            .collect::<Result<Vec<_>, _>>()?;
        let held = self.check_references(tenant, session_id, proposals).await?;
        let appended = self
            .combiner
            .submit(Request {
                tenant: tenant.clone(),
                session: session_id.clone(),
                prepared,
                options,
            })
            .await;
        if appended.is_ok()
            && !held.is_empty()
            && let Err(e) = self
                .settle_references(tenant, session_id, proposals, held)
                .await
        {
            // The batch stands; a retry of it settles again.
            tracing::warn!(error = %e, "cannot append the outcome of an added blob reference yet");
        }
        match appended {
            // Said as every other route says it: an erased session is 410.
            Err(JournalError::SessionNotFound(id)) if self.session_erased(tenant, &id).await => {
                Err(JournalError::SessionErased(id))
            }
            other => other,
        }
    }

    /// Whether `session` of `tenant` was erased (false when that cannot be
    /// read now).
    async fn session_erased(&self, tenant: &TenantId, session: &str) -> bool {
        let Ok(client) = self.pool.get().await else {
            return false;
        };
        crate::in_tenant(client, tenant, async |c| {
            crate::erasure::was_erased(c, tenant, session).await
        })
        .await
        .unwrap_or(false)
    }
}

#[cfg(test)]
mod fuzz {
    //! The append body parser ([`prepare`]) on proposals that are events of
    //! generated sessions with their sequences taken out, then mutated:
    //! never a panic, and every refusal a typed client error.

    use proptest::prelude::*;

    use super::*;

    fn proposal(choices: &[u8], which: prop::sample::Index) -> Value {
        let events = narad_protocol::testing::session(choices);
        let mut event = events[which.index(events.len())].clone();
        for field in SEQUENCE_FIELDS {
            event.as_object_mut().unwrap().remove(field);
        }
        event
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            ".{0,12}".prop_map(Value::from),
            Just(json!({})),
            Just(json!([])),
        ]
    }

    fn check(p: &Value) -> Result<(), TestCaseError> {
        let session = SessionId::new("ses-p").unwrap();
        if let Err(e) = prepare(0, p, &session) {
            let status = e.code().status();
            prop_assert!((400..500).contains(&status), "{}: {}", status, e);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn mutated_proposals_are_parsed_or_refused(
            choices in prop::collection::vec(any::<u8>(), 1..24),
            which in any::<prop::sample::Index>(),
            key in any::<prop::sample::Index>(),
            value in leaf(),
            remove in any::<bool>(),
            extra in prop::sample::select(&["sessionSequence", "sequence", "eventId", "type", "sessionId", "timestamp"][..]),
        ) {
            let mut p = proposal(&choices, which);
            let keys: Vec<String> = p.as_object().unwrap().keys().cloned().collect();
            let k = keys[key.index(keys.len())].clone();
            if remove {
                p.as_object_mut().unwrap().remove(&k);
            } else {
                p[&k] = value.clone();
            }
            check(&p)?;
            p[extra] = value;
            check(&p)?;
        }

        #[test]
        fn any_json_value_is_parsed_or_refused(value in leaf(), text in ".{0,64}") {
            check(&value)?;
            if let Ok(v) = serde_json::from_str::<Value>(&text) {
                check(&v)?;
            }
        }
    }
}
