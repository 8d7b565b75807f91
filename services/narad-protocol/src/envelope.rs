//! The fields every wire object carries by class (§5.1, DESIGN.md §3):
//! authority events, watch events, hydrate records and control messages.
//!
//! Fields are flat on the object. The typed envelopes below hold the class
//! fields; the per-type body holds the rest.

use serde::{Deserialize, Serialize};

use crate::primitives::{
    EventId, ProtocolVersion, RunId, Sequence, SessionId, Timestamp, UInt, WorkflowId, some,
};

/// The four kinds of wire data (§2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Immutable facts appended by the backend.
    Authority,
    /// Scoped revision notifications.
    Watch,
    /// Derived projections anchored to authority cursors.
    Hydrate,
    /// Transport traffic: attachment, heartbeat, targeted execution.
    Control,
}

impl Kind {
    /// Top-level fields an object of this kind must not carry: hydrate
    /// records and control messages never have an eventId or a sequence,
    /// and watch events never consume an authority sequence.
    pub fn forbidden_fields(self) -> &'static [&'static str] {
        match self {
            Kind::Authority => &[],
            Kind::Watch => &["sessionSequence", "workflowSequence", "sequence"],
            Kind::Hydrate | Kind::Control => {
                &["eventId", "sessionSequence", "workflowSequence", "sequence"]
            }
        }
    }
}

/// Whether an authority event must, may or must not carry an ordering
/// position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// The fields must all be present.
    Required,
    /// The fields may be present (all together) or absent.
    Optional,
    /// None of the fields may appear.
    Forbidden,
}

/// Which ordering positions an authority event carries besides its
/// session position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// `rootRunId`, `runId`, `sequence`.
    pub run: Presence,
    /// `workflowId`, `workflowSequence`.
    pub workflow: Presence,
}

impl Placement {
    /// Session authority only: no run or workflow position.
    pub const SESSION: Placement = Placement {
        run: Presence::Forbidden,
        workflow: Presence::Forbidden,
    };
    /// Run-tree authority; a workflow position when the run is
    /// workflow-owned.
    pub const RUN_TREE: Placement = Placement {
        run: Presence::Required,
        workflow: Presence::Optional,
    };
    /// Workflow authority: a workflow position and no run position.
    pub const WORKFLOW: Placement = Placement {
        run: Presence::Forbidden,
        workflow: Presence::Required,
    };
    /// Either position may appear; the body's own scope field may narrow it.
    pub const SCOPED: Placement = Placement {
        run: Presence::Optional,
        workflow: Presence::Optional,
    };
}

/// The run-tree ordering position (§4.2): the run journal, the run, and the
/// contiguous sequence within the root run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunPosition {
    /// The top-level run whose journal this event belongs to.
    pub root_run_id: RunId,
    /// The run the event is about.
    pub run_id: RunId,
    /// Contiguous from 1 within `rootRunId`.
    pub sequence: Sequence,
}

/// The workflow ordering position (§4.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowPosition {
    /// The owning workflow.
    pub workflow_id: WorkflowId,
    /// Contiguous from 1 within the workflow.
    pub workflow_sequence: Sequence,
}

/// The fields of every authority event besides its type-specific body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorityEnvelope {
    /// Always `narad/v1`.
    pub protocol_version: ProtocolVersion,
    /// Unique within `(sessionId, eventId)`.
    pub event_id: EventId,
    /// Informational; never used to order authority.
    pub timestamp: Timestamp,
    /// The owning session.
    pub session_id: SessionId,
    /// Contiguous from 1 within the session.
    pub session_sequence: Sequence,
    /// Present on run-tree authority.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunPosition>,
    /// Present on workflow authority, including a workflow-owned run's events.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<WorkflowPosition>,
}

/// The flat form in which envelope fields arrive; turned into an
/// [`AuthorityEnvelope`] once the positions are checked as wholes.
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawAuthorityEnvelope {
    pub event_id: EventId,
    pub timestamp: Timestamp,
    pub session_id: SessionId,
    pub session_sequence: Sequence,
    #[serde(default, deserialize_with = "some")]
    pub root_run_id: Option<RunId>,
    #[serde(default, deserialize_with = "some")]
    pub run_id: Option<RunId>,
    #[serde(default, deserialize_with = "some")]
    pub sequence: Option<Sequence>,
    #[serde(default, deserialize_with = "some")]
    pub workflow_id: Option<WorkflowId>,
    #[serde(default, deserialize_with = "some")]
    pub workflow_sequence: Option<Sequence>,
}

/// A placement problem: the JSON pointer of the field, and what is wrong.
pub(crate) type FieldProblem = (String, String);

impl RawAuthorityEnvelope {
    /// Assembles the envelope, enforcing all-or-nothing positions and the
    /// placement `rule` of the event type (`why` names the rule's source for
    /// the message, e.g. "run.started is run-tree authority").
    pub(crate) fn place(
        self,
        rule: Placement,
        why: &str,
    ) -> Result<AuthorityEnvelope, FieldProblem> {
        let run = whole(
            [
                ("rootRunId", self.root_run_id.is_some()),
                ("runId", self.run_id.is_some()),
                ("sequence", self.sequence.is_some()),
            ],
            rule.run,
            why,
        )?
        .then(|| RunPosition {
            root_run_id: self.root_run_id.expect("checked"),
            run_id: self.run_id.expect("checked"),
            sequence: self.sequence.expect("checked"),
        });
        let workflow = whole(
            [
                ("workflowId", self.workflow_id.is_some()),
                ("workflowSequence", self.workflow_sequence.is_some()),
            ],
            rule.workflow,
            why,
        )?
        .then(|| WorkflowPosition {
            workflow_id: self.workflow_id.expect("checked"),
            workflow_sequence: self.workflow_sequence.expect("checked"),
        });
        Ok(AuthorityEnvelope {
            protocol_version: ProtocolVersion,
            event_id: self.event_id,
            timestamp: self.timestamp,
            session_id: self.session_id,
            session_sequence: self.session_sequence,
            run,
            workflow,
        })
    }
}

/// Checks that a group of fields is present as a whole or absent as a
/// whole, as `presence` demands. Returns whether the group is present.
fn whole<const N: usize>(
    fields: [(&str, bool); N],
    presence: Presence,
    why: &str,
) -> Result<bool, FieldProblem> {
    let names: Vec<&str> = fields.iter().map(|(n, _)| *n).collect();
    let any = fields.iter().any(|(_, p)| *p);
    match presence {
        Presence::Forbidden => match fields.iter().find(|(_, p)| *p) {
            Some((name, _)) => Err((format!("/{name}"), format!("must be absent: {why}"))),
            None => Ok(false),
        },
        Presence::Required | Presence::Optional => {
            if !any && presence == Presence::Optional {
                return Ok(false);
            }
            match fields.iter().find(|(_, p)| !*p) {
                Some((name, _)) if presence == Presence::Required => {
                    Err((format!("/{name}"), format!("is required: {why}")))
                }
                Some((name, _)) => Err((
                    format!("/{name}"),
                    format!(
                        "is required with {}: they travel together",
                        names.join(", ")
                    ),
                )),
                None => Ok(true),
            }
        }
    }
}

/// The fields of every watch event besides its body (§8).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchEnvelope {
    /// Always `narad/v1`.
    pub protocol_version: ProtocolVersion,
    /// Unique within the watch scope's deduplication key.
    pub event_id: EventId,
    /// Informational.
    pub timestamp: Timestamp,
    /// Monotonic within the scope; may skip values, never regresses.
    pub revision: UInt,
    /// The authority advance this notification covers, when given.
    #[serde(default, deserialize_with = "some")]
    pub cursor: Option<Cursor>,
}

/// A typed authority cursor carried by watch events (§8).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Cursor {
    /// A position in a session's authority.
    #[serde(rename_all = "camelCase")]
    Session {
        /// The session, when not implied by the event.
        #[serde(default, deserialize_with = "some")]
        session_id: Option<SessionId>,
        /// The greatest session sequence covered.
        session_sequence: Sequence,
    },
    /// A position in a workflow's authority.
    #[serde(rename_all = "camelCase")]
    Workflow {
        /// The workflow.
        workflow_id: WorkflowId,
        /// The greatest workflow sequence covered.
        workflow_sequence: Sequence,
    },
    /// A position in a run journal.
    #[serde(rename_all = "camelCase")]
    Run {
        /// The run journal.
        root_run_id: RunId,
        /// The greatest run-tree sequence covered.
        sequence: Sequence,
    },
}

/// The fields of every hydrate record besides its body (DESIGN.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HydrateEnvelope {
    /// Always `narad/v1`.
    pub protocol_version: ProtocolVersion,
    /// When the projection was taken.
    pub timestamp: Timestamp,
}

/// The fields of every control message besides its body (§11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ControlEnvelope {
    /// Always `narad/v1`.
    pub protocol_version: ProtocolVersion,
}
