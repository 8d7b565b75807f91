//! The engine's state as separable entities, so that a journal can store
//! it as rows and load, for each append, only what that append can touch.
//!
//! The contract: to apply a batch, a [`SessionState`] needs its session
//! core ([`SessionCore`]), the entities [`referenced_keys`] names for each
//! event, and every open run of each run journal those keys name (a
//! terminating run updates its parent, which is open while a child is).
//! With those loaded, `apply` gives the same verdict and the same changes
//! as on the whole state; the journal's tests prove it on generated
//! sessions.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{DocumentFamily, SessionState, Slot};
use crate::primitives::{
    ArtifactId, AttachmentId, InterruptId, MessageId, ReasoningId, RunId, SessionId, ToolCallId,
    ViewId, WorkflowId,
};
use crate::wire::{AuthorityBody as B, AuthorityEvent};

/// The name of one stored entity of the engine's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityKey {
    /// A run.
    Run(RunId),
    /// A root run journal's ordering state.
    RunJournal(RunId),
    /// A workflow.
    Workflow(WorkflowId),
    /// An interrupt.
    Interrupt(InterruptId),
    /// A tool call.
    ToolCall(ToolCallId),
    /// A message's lifecycle.
    Message(MessageId),
    /// A reasoning stream's lifecycle.
    Reasoning(ReasoningId),
    /// An attachment.
    Attachment(AttachmentId),
    /// An artifact.
    Artifact(ArtifactId),
    /// A state or UI document.
    Document(DocumentFamily, String),
    /// A view.
    View(ViewId),
}

impl EntityKey {
    /// The stored kind, e.g. `run`.
    pub fn kind(&self) -> &'static str {
        match self {
            EntityKey::Run(_) => "run",
            EntityKey::RunJournal(_) => "run_journal",
            EntityKey::Workflow(_) => "workflow",
            EntityKey::Interrupt(_) => "interrupt",
            EntityKey::ToolCall(_) => "tool_call",
            EntityKey::Message(_) => "message",
            EntityKey::Reasoning(_) => "reasoning",
            EntityKey::Attachment(_) => "attachment",
            EntityKey::Artifact(_) => "artifact",
            EntityKey::Document(DocumentFamily::State, _) => "document.state",
            EntityKey::Document(DocumentFamily::Ui, _) => "document.ui",
            EntityKey::View(_) => "view",
        }
    }

    /// The stored id within its kind.
    pub fn id(&self) -> &str {
        match self {
            EntityKey::Run(id) | EntityKey::RunJournal(id) => id.as_str(),
            EntityKey::Workflow(id) => id.as_str(),
            EntityKey::Interrupt(id) => id.as_str(),
            EntityKey::ToolCall(id) => id.as_str(),
            EntityKey::Message(id) => id.as_str(),
            EntityKey::Reasoning(id) => id.as_str(),
            EntityKey::Attachment(id) => id.as_str(),
            EntityKey::Artifact(id) => id.as_str(),
            EntityKey::Document(_, scope) => scope,
            EntityKey::View(id) => id.as_str(),
        }
    }

    /// The key of a stored `(kind, id)`.
    pub fn from_parts(kind: &str, id: &str) -> Option<EntityKey> {
        let id_of = |s: &str| s.to_owned();
        Some(match kind {
            "run" => EntityKey::Run(RunId::new(id).ok()?),
            "run_journal" => EntityKey::RunJournal(RunId::new(id).ok()?),
            "workflow" => EntityKey::Workflow(WorkflowId::new(id).ok()?),
            "interrupt" => EntityKey::Interrupt(InterruptId::new(id).ok()?),
            "tool_call" => EntityKey::ToolCall(ToolCallId::new(id).ok()?),
            "message" => EntityKey::Message(MessageId::new(id).ok()?),
            "reasoning" => EntityKey::Reasoning(ReasoningId::new(id).ok()?),
            "attachment" => EntityKey::Attachment(AttachmentId::new(id).ok()?),
            "artifact" => EntityKey::Artifact(ArtifactId::new(id).ok()?),
            "document.state" => EntityKey::Document(DocumentFamily::State, id_of(id)),
            "document.ui" => EntityKey::Document(DocumentFamily::Ui, id_of(id)),
            "view" => EntityKey::View(ViewId::new(id).ok()?),
            _ => return None,
        })
    }
}

/// The session-level part of the state: kept on the session's own row.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionCore {
    /// The session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The last sessionSequence.
    #[serde(default)]
    pub session_sequence: u64,
    /// The active top-level execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
}

/// The entities an event names directly.
pub fn referenced_keys(event: &AuthorityEvent) -> Vec<EntityKey> {
    let mut keys = Vec::new();
    if let Some(r) = &event.envelope.run {
        keys.push(EntityKey::Run(r.run_id.clone()));
        keys.push(EntityKey::RunJournal(r.root_run_id.clone()));
    }
    if let Some(w) = &event.envelope.workflow {
        keys.push(EntityKey::Workflow(w.workflow_id.clone()));
    }
    let doc = |family, scope: &crate::primitives::NonEmptyString| {
        EntityKey::Document(family, scope.as_str().to_owned())
    };
    match &event.body {
        B::RunStarted(b) => keys.extend(b.parent_run_id.clone().map(EntityKey::Run)),
        B::RunStopRequested(b) => keys.push(EntityKey::Run(b.target_run_id.clone())),
        B::RunPaused(b) => keys.extend(b.interrupt_id.clone().map(EntityKey::Interrupt)),
        B::WorkflowPaused(b) => keys.push(EntityKey::Interrupt(b.interrupt_id.clone())),
        B::InterruptRequested(b) => keys.push(EntityKey::Interrupt(b.interrupt_id.clone())),
        B::InterruptResolved(b) => keys.push(EntityKey::Interrupt(b.interrupt_id.clone())),
        B::ToolCallStarted(b) => keys.push(EntityKey::ToolCall(b.tool_call_id.clone())),
        B::ToolCallFinished(b) => keys.push(EntityKey::ToolCall(b.tool_call_id.clone())),
        B::MessageUserRecorded(b) => keys.push(EntityKey::Message(b.message_id.clone())),
        B::MessageTextStarted(b) => keys.push(EntityKey::Message(b.message_id.clone())),
        B::MessageTextDelta(b) => keys.push(EntityKey::Message(b.message_id.clone())),
        B::MessageTextCompleted(b) => keys.push(EntityKey::Message(b.message_id.clone())),
        B::MessageRedacted(b) => keys.push(EntityKey::Message(b.message_id.clone())),
        B::ReasoningStarted(b) => keys.push(EntityKey::Reasoning(b.reasoning_id.clone())),
        B::ReasoningDelta(b) => keys.push(EntityKey::Reasoning(b.reasoning_id.clone())),
        B::ReasoningCompleted(b) => keys.push(EntityKey::Reasoning(b.reasoning_id.clone())),
        B::AttachmentAdded(b) => keys.push(EntityKey::Attachment(b.attachment_id.clone())),
        B::AttachmentReady(b) => keys.push(EntityKey::Attachment(b.attachment_id.clone())),
        B::AttachmentFailed(b) => keys.push(EntityKey::Attachment(b.attachment_id.clone())),
        B::AttachmentRemoved(b) => keys.push(EntityKey::Attachment(b.attachment_id.clone())),
        B::ArtifactAdded(b) => keys.push(EntityKey::Artifact(b.artifact_id.clone())),
        B::ArtifactReady(b) => keys.push(EntityKey::Artifact(b.artifact_id.clone())),
        B::ArtifactFailed(b) => keys.push(EntityKey::Artifact(b.artifact_id.clone())),
        B::StateSnapshot(b) => keys.push(doc(DocumentFamily::State, &b.scope)),
        B::StateDelta(b) => keys.push(doc(DocumentFamily::State, &b.scope)),
        B::StateCompacted(b) => keys.push(doc(DocumentFamily::State, &b.scope)),
        B::UiStateSnapshot(b) => keys.push(doc(DocumentFamily::Ui, &b.scope)),
        B::UiStateDelta(b) => keys.push(doc(DocumentFamily::Ui, &b.scope)),
        B::ViewOpened(b) => keys.push(EntityKey::View(b.view_id.clone())),
        B::ViewUpdated(b) => keys.push(EntityKey::View(b.view_id.clone())),
        B::ViewClosed(b) => keys.push(EntityKey::View(b.view_id.clone())),
        _ => {}
    }
    keys
}

impl SessionState {
    /// The session core.
    pub fn core(&self) -> SessionCore {
        SessionCore {
            session_id: self.session_id.clone(),
            session_sequence: self.session_sequence,
            slot: self.slot.clone(),
        }
    }

    /// A state made of a session core alone; entities are loaded next.
    pub fn from_core(core: SessionCore) -> Self {
        let mut s = Self::new();
        s.session_id = core.session_id;
        s.session_sequence = core.session_sequence;
        s.slot = core.slot;
        s
    }

    /// Every entity of this state, as stored values.
    pub fn entities(&self) -> Vec<(EntityKey, Value)> {
        fn all<'a, K: Clone + 'a, V: Serialize + 'a>(
            map: impl IntoIterator<Item = (&'a K, &'a V)>,
            key: impl Fn(K) -> EntityKey,
        ) -> Vec<(EntityKey, Value)> {
            map.into_iter()
                .map(|(k, v)| (key(k.clone()), serde_json::to_value(v).expect("serialises")))
                .collect()
        }
        let mut out = Vec::new();
        out.extend(all(&self.runs, EntityKey::Run));
        out.extend(all(&self.run_journals, EntityKey::RunJournal));
        out.extend(all(&self.workflows, EntityKey::Workflow));
        out.extend(all(&self.interrupts, EntityKey::Interrupt));
        out.extend(all(&self.tool_calls, EntityKey::ToolCall));
        out.extend(all(&self.messages, EntityKey::Message));
        out.extend(all(&self.reasoning, EntityKey::Reasoning));
        out.extend(all(&self.attachments, EntityKey::Attachment));
        out.extend(
            self.artifacts
                .iter()
                .map(|a| (EntityKey::Artifact(a.clone()), Value::Bool(true))),
        );
        for (family, docs) in &self.documents {
            out.extend(all(docs, |scope: String| {
                EntityKey::Document(*family, scope)
            }));
        }
        out.extend(all(&self.views, EntityKey::View));
        out
    }

    /// Loads one stored entity.
    pub fn load_entity(&mut self, key: EntityKey, value: Value) -> Result<(), serde_json::Error> {
        use serde_json::from_value as v;
        match key {
            EntityKey::Run(id) => drop(self.runs.insert(id, v(value)?)),
            EntityKey::RunJournal(id) => drop(self.run_journals.insert(id, v(value)?)),
            EntityKey::Workflow(id) => drop(self.workflows.insert(id, v(value)?)),
            EntityKey::Interrupt(id) => drop(self.interrupts.insert(id, v(value)?)),
            EntityKey::ToolCall(id) => drop(self.tool_calls.insert(id, v(value)?)),
            EntityKey::Message(id) => drop(self.messages.insert(id, v(value)?)),
            EntityKey::Reasoning(id) => drop(self.reasoning.insert(id, v(value)?)),
            EntityKey::Attachment(id) => drop(self.attachments.insert(id, v(value)?)),
            EntityKey::Artifact(id) => drop(self.artifacts.insert(id)),
            EntityKey::Document(family, scope) => drop(
                self.documents
                    .entry(family)
                    .or_default()
                    .insert(scope, v(value)?),
            ),
            EntityKey::View(id) => drop(self.views.insert(id, v(value)?)),
        }
        Ok(())
    }
}
