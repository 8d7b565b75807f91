//! The rule engine: every lifecycle and ordering rule of narad/v1 (§3–§11)
//! as one pure state machine over a session's authority.
//!
//! [`SessionState::apply`] takes the next authority event of a session and
//! either accepts it, updating the state, or refuses it with a
//! [`Violation`] naming the broken rule, leaving the state exactly as it
//! was. The journal calls it inside its append transaction; the client
//! reducer and the conformance runner call the same code.
//!
//! Timestamps are never consulted: authority is ordered by its sequences
//! alone (§4.2).

mod content;
mod entities;
mod issuer;
mod lifecycle;

pub use entities::{EntityKey, SessionCore, referenced_keys};
pub use issuer::{CLIENT_EXECUTION_EXPIRED, CLIENT_UNAVAILABLE, DELIVERY_FAILED, Issuer};
pub use lifecycle::{EXPIRED, fold_members};

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::authority::{Executor, Outcome};
use crate::envelope::{RunPosition, WorkflowPosition};
use crate::primitives::{
    ArtifactId, AttachmentId, ClientExecutorId, EventId, InterruptId, MessageId, NonEmptyString,
    ReasoningId, RunId, Sequence, SessionId, ToolCallId, ViewId, WaitId, WorkflowId,
};
use crate::profile::{Profile, ProfileSet};
use crate::rules::{self, Violation};
use crate::wire::{AuthorityBody, AuthorityEvent, WireType};

/// Where a run or workflow stands (§6.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Status {
    /// Doing work.
    Running,
    /// In a pause cycle.
    #[serde(rename_all = "camelCase")]
    Paused {
        /// The open pause cycle.
        wait_id: WaitId,
        /// The interrupt it waits on, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interrupt_id: Option<InterruptId>,
    },
    /// Completed.
    Finished,
    /// Failed.
    Error,
    /// Cancelled.
    Cancelled,
}

impl Status {
    /// Whether the status is a terminal.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Status::Finished | Status::Error | Status::Cancelled)
    }

    /// Whether a pause cycle is open.
    pub fn is_paused(&self) -> bool {
        matches!(self, Status::Paused { .. })
    }
}

/// What the engine knows of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunState {
    /// The run journal it belongs to.
    pub root_run_id: RunId,
    /// Its parent, for a nested run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// The owning workflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<WorkflowId>,
    /// Its own client executor binding; never inherited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_executor_id: Option<ClientExecutorId>,
    /// Where it stands.
    #[serde(flatten)]
    pub status: Status,
    /// Set by run.stop.requested (§6.3).
    pub stop_requested: bool,
    /// Open child runs.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub open_children: BTreeSet<RunId>,
    /// Open tool calls.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub open_tool_calls: BTreeSet<ToolCallId>,
    /// Open interrupts, each with whether it blocks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub open_interrupts: BTreeMap<InterruptId, bool>,
}

impl RunState {
    /// Whether this is a top-level run (of the session or of a workflow).
    pub fn is_top_level(&self) -> bool {
        self.parent_run_id.is_none()
    }
}

/// A blocking interrupt whose pause must come next in its journal (§7.6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPause {
    /// The run (for a run journal) that must pause; absent for a workflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// The interrupt.
    pub interrupt_id: InterruptId,
    /// Its pause cycle.
    pub wait_id: WaitId,
}

/// One root run journal's ordering state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunJournal {
    /// The last run-tree sequence.
    pub sequence: u64,
    /// A blocking interrupt awaiting its consecutive pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pause: Option<PendingPause>,
}

/// What the engine knows of one workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowState {
    /// The last workflow sequence.
    pub sequence: u64,
    /// Where it stands.
    #[serde(flatten)]
    pub status: Status,
    /// Its active top-level run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_top_level_run: Option<RunId>,
    /// Its open runs, at any depth.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub open_runs: BTreeSet<RunId>,
    /// Its open workflow-scope interrupts, each with whether it blocks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub open_interrupts: BTreeMap<InterruptId, bool>,
    /// A blocking interrupt awaiting its consecutive pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pause: Option<PendingPause>,
}

/// Who owns an interrupt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "lowercase")]
pub enum Owner {
    /// A run.
    #[serde(rename_all = "camelCase")]
    Run {
        /// The run.
        run_id: RunId,
    },
    /// A workflow.
    #[serde(rename_all = "camelCase")]
    Workflow {
        /// The workflow.
        workflow_id: WorkflowId,
    },
}

/// What the engine knows of one interrupt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptState {
    /// Its owner.
    #[serde(flatten)]
    pub owner: Owner,
    /// Its pause cycle.
    pub wait_id: WaitId,
    /// The allowed decisions.
    pub actions: Vec<String>,
    /// Whether it blocks.
    pub blocking: bool,
    /// The requestIds of the members listed in `input.members`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// The decision, once resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
}

/// What the engine knows of one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallState {
    /// The owning run.
    pub run_id: RunId,
    /// The tool.
    pub tool_name: NonEmptyString,
    /// Who executes it.
    pub executor: Executor,
    /// How it ended, once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// The ordering fields a streamed item started with (§9.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placed {
    /// The run, for run-scoped items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// The workflow, for workflow-scoped items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<WorkflowId>,
}

impl Placed {
    fn of(event: &AuthorityEvent) -> Self {
        Self {
            run_id: event.envelope.run.as_ref().map(|r| r.run_id.clone()),
            workflow_id: event
                .envelope
                .workflow
                .as_ref()
                .map(|w| w.workflow_id.clone()),
        }
    }
}

/// A message's or reasoning stream's lifecycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamState {
    /// Where it started.
    #[serde(flatten)]
    pub placed: Placed,
    /// Whether it is whole (user messages are whole when recorded).
    pub completed: bool,
}

/// Which family a state document belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DocumentFamily {
    /// `state.*` documents.
    State,
    /// `ui.state.*` documents.
    Ui,
}

/// A state or UI document (§9.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    /// Its revision; 0 before any snapshot or delta.
    pub revision: u64,
    /// Its content; `{}` before any snapshot.
    pub state: Value,
}

impl Default for Document {
    fn default() -> Self {
        Self {
            revision: 0,
            state: Value::Object(Default::default()),
        }
    }
}

/// A UI view (§9.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ViewState {
    /// Whether it is open.
    pub open: bool,
    /// Its current state.
    pub state: Value,
}

/// The session's active top-level execution (§3.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Slot {
    /// An independent top-level run.
    #[serde(rename_all = "camelCase")]
    Run {
        /// The run.
        run_id: RunId,
    },
    /// A workflow.
    #[serde(rename_all = "camelCase")]
    Workflow {
        /// The workflow.
        workflow_id: WorkflowId,
    },
}

/// What accepting an event changed, for callers that act on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The session's top-level slot became free with this event.
    pub slot_freed: bool,
}

/// Everything the rules need to know about one session's authority so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionState {
    /// The profiles whose rules this state enforces (all, for a journal).
    #[serde(skip, default = "ProfileSet::all")]
    pub profiles: ProfileSet,
    /// The session, once the first event named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The last sessionSequence.
    pub session_sequence: u64,
    /// Every eventId seen (§4.1).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub event_ids: BTreeSet<EventId>,
    /// The active top-level execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
    /// Runs by id.
    #[serde(default)]
    pub runs: BTreeMap<RunId, RunState>,
    /// Run journals by rootRunId.
    #[serde(default)]
    pub run_journals: BTreeMap<RunId, RunJournal>,
    /// Workflows by id.
    #[serde(default)]
    pub workflows: BTreeMap<WorkflowId, WorkflowState>,
    /// Interrupts by id.
    #[serde(default)]
    pub interrupts: BTreeMap<InterruptId, InterruptState>,
    /// Tool calls by id.
    #[serde(default)]
    pub tool_calls: BTreeMap<ToolCallId, ToolCallState>,
    /// Messages by id.
    #[serde(default)]
    pub messages: BTreeMap<MessageId, StreamState>,
    /// Reasoning streams by id.
    #[serde(default)]
    pub reasoning: BTreeMap<ReasoningId, StreamState>,
    /// Attachments by id: `true` while not removed.
    #[serde(default)]
    pub attachments: BTreeMap<AttachmentId, bool>,
    /// Artifacts by id.
    #[serde(default)]
    pub artifacts: BTreeSet<ArtifactId>,
    /// State and UI documents by family and scope.
    #[serde(default)]
    pub documents: BTreeMap<DocumentFamily, BTreeMap<String, Document>>,
    /// Views by id.
    #[serde(default)]
    pub views: BTreeMap<ViewId, ViewState>,
}

/// Shorthand for a rule violation.
pub(crate) fn violation(rule: rules::Rule, message: impl Into<String>) -> Violation {
    Violation::new(rule, message)
}

impl Default for SessionState {
    fn default() -> Self {
        Self::with_profiles(ProfileSet::all())
    }
}

impl SessionState {
    /// An empty session enforcing every profile, as a journal does.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty session enforcing core and `profiles` only, as a client
    /// that negotiated them does.
    pub fn with_profiles(profiles: ProfileSet) -> Self {
        Self {
            profiles,
            session_id: None,
            session_sequence: 0,
            event_ids: BTreeSet::new(),
            slot: None,
            runs: BTreeMap::new(),
            run_journals: BTreeMap::new(),
            workflows: BTreeMap::new(),
            interrupts: BTreeMap::new(),
            tool_calls: BTreeMap::new(),
            messages: BTreeMap::new(),
            reasoning: BTreeMap::new(),
            attachments: BTreeMap::new(),
            artifacts: BTreeSet::new(),
            documents: BTreeMap::new(),
            views: BTreeMap::new(),
        }
    }

    /// Whether the event is outside the profiles this state enforces: of
    /// an inactive profile, or placed in a workflow (with no run) when the
    /// workflow profile is inactive. Such events are [`skip`](Self::skip)ped.
    pub fn is_outside_profiles(&self, event: &AuthorityEvent) -> bool {
        !self.profiles.contains(event.body.wire_type().profile())
            || (!self.profiles.contains(Profile::Workflow)
                && event.envelope.run.is_none()
                && event.envelope.workflow.is_some())
    }

    /// Accounts for an event outside the enforced profiles without applying
    /// its rules: its identity and its place in the session and run
    /// sequences are still checked and recorded, so that what a client
    /// ignores never looks like a gap.
    pub fn skip(&mut self, event: &AuthorityEvent) -> Result<(), Violation> {
        let id = &event.envelope.event_id;
        self.check_identity(event).map_err(|v| v.at(id))?;
        self.check_session_sequence(event).map_err(|v| v.at(id))?;
        let run = event.envelope.run.as_ref();
        if let Some(r) = run.filter(|r| self.run_journals.contains_key(&r.root_run_id)) {
            self.check_run_sequence(&r.root_run_id, r.sequence)
                .map_err(|v| v.at(id))?;
        }
        self.record_identity(event);
        if let Some(r) = run
            && let Some(j) = self.run_journals.get_mut(&r.root_run_id)
        {
            j.sequence = r.sequence.get();
        }
        Ok(())
    }

    /// `sessionSequence` is the next of the session (§4.2).
    fn check_session_sequence(&self, event: &AuthorityEvent) -> Result<(), Violation> {
        let seq = event.envelope.session_sequence;
        if seq.get() == self.next_session_sequence() {
            return Ok(());
        }
        Err(violation(
            rules::SEQUENCE_SESSION,
            format!(
                "sessionSequence {seq} where {} comes next",
                self.next_session_sequence()
            ),
        ))
    }

    /// The run-tree `sequence` is the next of its root journal (§4.2).
    fn check_run_sequence(&self, root_run_id: &RunId, sequence: Sequence) -> Result<(), Violation> {
        let next = self.next_run_sequence(root_run_id);
        if sequence.get() == next {
            return Ok(());
        }
        Err(violation(
            rules::SEQUENCE_RUN,
            format!("sequence {sequence} in run journal {root_run_id} where {next} comes next"),
        ))
    }

    /// Records an accepted (or skipped) event's identity and session position.
    fn record_identity(&mut self, event: &AuthorityEvent) {
        let env = &event.envelope;
        self.session_id
            .get_or_insert_with(|| env.session_id.clone());
        self.event_ids.insert(env.event_id.clone());
        self.session_sequence = env.session_sequence.get();
    }

    /// The event's workflow position, when this state tracks workflows.
    pub(crate) fn workflow_position<'e>(
        &self,
        event: &'e AuthorityEvent,
    ) -> Option<&'e WorkflowPosition> {
        if self.profiles.contains(Profile::Workflow) {
            event.envelope.workflow.as_ref()
        } else {
            None
        }
    }

    /// The next sessionSequence to assign.
    pub fn next_session_sequence(&self) -> u64 {
        self.session_sequence + 1
    }

    /// The next run-tree sequence of a root journal (1 for a new one).
    pub fn next_run_sequence(&self, root_run_id: &RunId) -> u64 {
        self.run_journals
            .get(root_run_id)
            .map_or(1, |j| j.sequence + 1)
    }

    /// The next workflowSequence of a workflow (1 for a new one).
    pub fn next_workflow_sequence(&self, workflow_id: &WorkflowId) -> u64 {
        self.workflows
            .get(workflow_id)
            .map_or(1, |w| w.sequence + 1)
    }

    /// Accepts the next authority event of the session, or refuses it with
    /// the rule it breaks. A refused event leaves the state unchanged.
    pub fn apply(&mut self, event: &AuthorityEvent) -> Result<Applied, Violation> {
        let id = &event.envelope.event_id;
        self.check_identity(event).map_err(|v| v.at(id))?;
        self.check_order(event).map_err(|v| v.at(id))?;
        let applied = self.apply_body(event).map_err(|v| v.at(id))?;
        self.advance(event);
        Ok(applied)
    }

    fn check_identity(&self, event: &AuthorityEvent) -> Result<(), Violation> {
        let env = &event.envelope;
        if let Some(session) = &self.session_id
            && session != &env.session_id
        {
            return Err(violation(
                rules::EVENT_SESSION,
                format!(
                    "the event names session {} but this journal is session {session}",
                    env.session_id
                ),
            ));
        }
        if self.event_ids.contains(&env.event_id) {
            return Err(violation(
                rules::EVENT_ID_UNIQUE,
                format!(
                    "eventId {} was already used in this session; a new fact needs a new id",
                    env.event_id
                ),
            ));
        }
        Ok(())
    }

    /// Sequences, and the consecutive-pause rule, which is about order.
    fn check_order(&self, event: &AuthorityEvent) -> Result<(), Violation> {
        let env = &event.envelope;
        let t = event.body.wire_type();
        self.check_session_sequence(event)?;
        if let Some(WorkflowPosition {
            workflow_id,
            workflow_sequence,
        }) = self.workflow_position(event)
        {
            match self.workflows.get(workflow_id) {
                Some(_) if t == WireType::WorkflowStarted => {
                    return Err(violation(
                        rules::WORKFLOW_STARTED_ONCE,
                        format!("workflow {workflow_id} has already started"),
                    ));
                }
                None if t != WireType::WorkflowStarted => {
                    return Err(violation(
                        rules::WORKFLOW_UNKNOWN,
                        format!("workflow {workflow_id} has not started"),
                    ));
                }
                _ => {}
            }
            let next = self.next_workflow_sequence(workflow_id);
            if workflow_sequence.get() != next {
                return Err(violation(
                    rules::SEQUENCE_WORKFLOW,
                    format!(
                        "workflowSequence {workflow_sequence} of workflow {workflow_id} where {next} comes next"
                    ),
                ));
            }
            if let Some(p) = &self
                .workflows
                .get(workflow_id)
                .and_then(|w| w.pending_pause.clone())
                && !is_pause_for(event, p)
            {
                return Err(violation(
                    rules::INTERRUPT_PAUSE_CONSECUTIVE,
                    format!(
                        "workflow {workflow_id} owes workflow.paused for interrupt {} (waitId {}) before any other workflow event; got {}",
                        p.interrupt_id,
                        p.wait_id,
                        t.name()
                    ),
                ));
            }
        }
        if let Some(RunPosition {
            root_run_id,
            run_id,
            sequence,
        }) = &env.run
        {
            let journal = self.run_journals.get(root_run_id);
            let starts_root = t == WireType::RunStarted && run_id == root_run_id;
            match journal {
                Some(_) if starts_root => {
                    return Err(violation(
                        rules::RUN_STARTED_ONCE,
                        format!("run {run_id} has already started"),
                    ));
                }
                None if !starts_root => {
                    let rule = if t == WireType::RunStarted {
                        rules::RUN_STARTED_ROOT
                    } else {
                        rules::RUN_UNKNOWN
                    };
                    return Err(violation(
                        rule,
                        format!("no run journal {root_run_id} has started in this session"),
                    ));
                }
                _ => {}
            }
            self.check_run_sequence(root_run_id, *sequence)?;
            if let Some(p) = journal.and_then(|j| j.pending_pause.as_ref())
                && !is_pause_for(event, p)
            {
                let interloper = if t == WireType::ProgressRecorded {
                    " (progress may not interleave either, §9.8)"
                } else {
                    ""
                };
                return Err(violation(
                    rules::INTERRUPT_PAUSE_CONSECUTIVE,
                    format!(
                        "run journal {root_run_id} owes run.paused of run {} for interrupt {} (waitId {}) next; got {}{interloper}",
                        p.run_id.as_ref().map_or("?", RunId::as_str),
                        p.interrupt_id,
                        p.wait_id,
                        t.name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Records the event's identity and ordering once it is accepted.
    fn advance(&mut self, event: &AuthorityEvent) {
        let env = &event.envelope;
        self.record_identity(event);
        if let Some(w) = self.workflow_position(event)
            && let Some(state) = self.workflows.get_mut(&w.workflow_id)
        {
            state.sequence = w.workflow_sequence.get();
            if state
                .pending_pause
                .as_ref()
                .is_some_and(|p| is_pause_for(event, p))
            {
                state.pending_pause = None;
            }
        }
        if let Some(r) = &env.run {
            let journal = self.run_journals.entry(r.root_run_id.clone()).or_default();
            journal.sequence = r.sequence.get();
            if journal
                .pending_pause
                .as_ref()
                .is_some_and(|p| is_pause_for(event, p))
            {
                journal.pending_pause = None;
            }
        }
    }

    fn apply_body(&mut self, event: &AuthorityEvent) -> Result<Applied, Violation> {
        use AuthorityBody as B;
        match &event.body {
            B::RunStarted(b) => self.run_started(event, b),
            B::RunPaused(b) => self.run_paused(event, b).map(|()| Applied::default()),
            B::RunResumed(b) => self.run_resumed(event, b).map(|()| Applied::default()),
            B::RunStopRequested(b) => self
                .run_stop_requested(event, b)
                .map(|()| Applied::default()),
            B::RunFinished(_) => self.run_terminal(event, Status::Finished),
            B::RunError(_) => self.run_terminal(event, Status::Error),
            B::RunCancelled(_) => self.run_terminal(event, Status::Cancelled),
            B::InterruptRequested(b) => self
                .interrupt_requested(event, b)
                .map(|()| Applied::default()),
            B::InterruptResolved(b) => self
                .interrupt_resolved(event, b)
                .map(|()| Applied::default()),
            B::ToolCallStarted(b) => self
                .tool_call_started(event, b)
                .map(|()| Applied::default()),
            B::ToolCallFinished(b) => self
                .tool_call_finished(event, b)
                .map(|()| Applied::default()),
            B::WorkflowStarted(_) => self.workflow_started(event).map(|()| Applied::default()),
            B::WorkflowPaused(b) => self.workflow_paused(event, b).map(|()| Applied::default()),
            B::WorkflowResumed(b) => self.workflow_resumed(event, b).map(|()| Applied::default()),
            B::WorkflowFinished(_) => self.workflow_terminal(event, Status::Finished),
            B::WorkflowError(_) => self.workflow_terminal(event, Status::Error),
            B::WorkflowCancelled(_) => self.workflow_terminal(event, Status::Cancelled),
            B::WorkflowEdgeTaken(_) => Ok(Applied::default()),
            B::WorkflowStepStarted(_) => self.workflow_open(event).map(|_| Applied::default()),
            B::ProgressRecorded(_) => self.progress(event).map(|()| Applied::default()),
            B::RunCustom(_) | B::RunRaw(_) => {
                self.run_annotation(event).map(|()| Applied::default())
            }
            _ => self.content(event).map(|()| Applied::default()),
        }
    }

    /// Checks the run named by a run-tree event (other than run.started):
    /// started, in this root journal, and carrying the workflow position of
    /// its workflow. Returns the run.
    fn placed_run(&self, event: &AuthorityEvent) -> Result<Option<(&RunId, &RunState)>, Violation> {
        let Some(pos) = &event.envelope.run else {
            return Ok(None);
        };
        let run = match self.runs.get_key_value(&pos.run_id) {
            Some((id, run)) if run.root_run_id == pos.root_run_id => (id, run),
            Some((_, run)) => {
                return Err(violation(
                    rules::RUN_UNKNOWN,
                    format!(
                        "run {} belongs to run journal {}, not {}",
                        pos.run_id, run.root_run_id, pos.root_run_id
                    ),
                ));
            }
            None => {
                return Err(violation(
                    rules::RUN_UNKNOWN,
                    format!("run {} has not started", pos.run_id),
                ));
            }
        };
        self.check_workflow_position(event, run.1.workflow_id.as_ref(), &pos.run_id)?;
        Ok(Some(run))
    }

    /// Checks the workflow named by an event's workflow position, when it
    /// has no run position to speak for it: started (checked in order) and
    /// not terminal. Returns the workflow's id and state.
    fn workflow_open(
        &self,
        event: &AuthorityEvent,
    ) -> Result<Option<(WorkflowId, &WorkflowState)>, Violation> {
        let Some(pos) = self.workflow_position(event) else {
            return Ok(None);
        };
        let wf = self
            .workflows
            .get(&pos.workflow_id)
            .expect("order check ensures the workflow exists");
        if wf.status.is_terminal() {
            return Err(violation(
                rules::WORKFLOW_TERMINAL_FINAL,
                format!(
                    "workflow {} has ended; it takes no {}",
                    pos.workflow_id,
                    event.body.wire_type().name()
                ),
            ));
        }
        Ok(Some((pos.workflow_id.clone(), wf)))
    }
}

/// Whether `event` is the pause a pending blocking interrupt waits for.
fn is_pause_for(event: &AuthorityEvent, p: &PendingPause) -> bool {
    match &event.body {
        AuthorityBody::RunPaused(b) => {
            p.run_id.as_ref() == event.envelope.run.as_ref().map(|r| &r.run_id)
                && b.wait_id == p.wait_id
                && b.interrupt_id.as_ref() == Some(&p.interrupt_id)
        }
        AuthorityBody::WorkflowPaused(b) => {
            p.run_id.is_none() && b.wait_id == p.wait_id && b.interrupt_id == p.interrupt_id
        }
        _ => false,
    }
}

impl SessionState {
    /// Checks that a run-tree event of a run carries exactly its workflow's
    /// position (§4.2).
    fn check_workflow_position(
        &self,
        event: &AuthorityEvent,
        workflow_id: Option<&WorkflowId>,
        run_id: &RunId,
    ) -> Result<(), Violation> {
        let carried = self.workflow_position(event).map(|w| &w.workflow_id);
        if carried == workflow_id {
            return Ok(());
        }
        let message = match (workflow_id, carried) {
            (Some(w), None) => format!(
                "run {run_id} belongs to workflow {w}: its events carry workflowId and workflowSequence"
            ),
            (Some(w), Some(c)) => format!("run {run_id} belongs to workflow {w}, not {c}"),
            (None, Some(c)) => {
                format!("run {run_id} belongs to no workflow, yet the event names {c}")
            }
            (None, None) => unreachable!(),
        };
        Err(violation(rules::WORKFLOW_RUN_POSITION, message))
    }
}
