//! Bodies of authority events: the type-specific fields of every core and
//! profile authority type (§7, §9, DESIGN.md §3). Envelope fields live in
//! [`crate::envelope`].

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::envelope::Placement;
use crate::primitives::{
    ArtifactId, AttachmentId, ClientExecutorId, InterruptId, JsonObject, MessageId, NamespacedName,
    NodeId, NonEmptyString, NonEmptyVec, ProgressId, ReasoningId, RunId, Timestamp, ToolCallId,
    UInt, ViewId, WaitId, present, some,
};

// ---------------------------------------------------------------- values

/// How a run pause ends (§6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResumeMode {
    /// The backend resumes once its recovery condition is met.
    Automatic,
    /// An accepted external request is required.
    Command,
}

/// Who executes a tool call (§3.5). Immutable once started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Executor {
    /// The backend.
    Backend,
    /// The run's bound client executor.
    Client,
}

/// How a tool call ended (§7.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It succeeded.
    Success,
    /// It failed.
    Error,
    /// It was cancelled.
    Cancelled,
}

/// Whether an interrupt belongs to a run journal or a workflow (§7.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum InterruptScope {
    /// Run-tree authority (the default).
    #[default]
    Run,
    /// Workflow authority.
    Workflow,
}

impl InterruptScope {
    fn placement(scope: Option<InterruptScope>) -> Placement {
        match scope.unwrap_or_default() {
            InterruptScope::Run => Placement::RUN_TREE,
            InterruptScope::Workflow => Placement::WORKFLOW,
        }
    }
}

/// Where a message belongs (§9.2); the envelope's ordering fields must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageScope {
    /// The session as a whole.
    Session,
    /// A workflow.
    Workflow,
    /// A run.
    Run,
}

impl MessageScope {
    /// The ordering positions an event in this scope carries.
    pub fn placement(self) -> Placement {
        match self {
            MessageScope::Session => Placement::SESSION,
            MessageScope::Workflow => Placement::WORKFLOW,
            MessageScope::Run => Placement::RUN_TREE,
        }
    }
}

/// The author of a streamed message (§9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamRole {
    /// The agent.
    Assistant,
    /// The system.
    System,
}

/// Token counters and other additive, non-negative figures (§7.5). Keys
/// are open; common ones are `inputTokens`, `outputTokens`,
/// `reasoningTokens`, `cachedInputTokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(transparent)]
pub struct Usage(BTreeMap<String, serde_json::Number>);

impl Usage {
    /// The counters.
    pub fn counters(&self) -> &BTreeMap<String, serde_json::Number> {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Usage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, serde_json::Number>::deserialize(d)?;
        if let Some((k, v)) = map
            .iter()
            .find(|(_, v)| v.as_f64().is_some_and(|f| f < 0.0))
        {
            return Err(de::Error::custom(format_args!(
                "usage counter {k:?} is {v}; counters are non-negative"
            )));
        }
        Ok(Usage(map))
    }
}

/// An RFC 6902 JSON Patch (state, UI and graph deltas).
pub type Patch = json_patch::Patch;

// ---------------------------------------------- core: runs (and terminals)

/// `run.started` (§7.1): the run enters `running`. Exactly once per runId.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStarted {
    /// The parent of a nested run; absent on a top-level run.
    #[serde(default, deserialize_with = "some")]
    pub parent_run_id: Option<RunId>,
    /// The effective client executor binding; absent means none (§3.3).
    #[serde(default, deserialize_with = "some")]
    pub client_executor_id: Option<ClientExecutorId>,
    /// The input the run was started with.
    #[serde(default, deserialize_with = "some")]
    pub input: Option<Value>,
}

/// `run.paused` (§7.2): a durable suspension; one pause cycle per run.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunPaused {
    /// The pause cycle.
    pub wait_id: WaitId,
    /// Why, as an open (preferably namespaced) string.
    pub reason: NonEmptyString,
    /// How the pause ends.
    pub resume_mode: ResumeMode,
    /// The interrupt this pause waits on.
    #[serde(default, deserialize_with = "some")]
    pub interrupt_id: Option<InterruptId>,
    /// When an automatic resume will be tried.
    #[serde(default, deserialize_with = "some")]
    pub retry_at: Option<Timestamp>,
    /// A user-safe explanation.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
}

/// `run.resumed` and `workflow.resumed` (§7.3): closes the open pause cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resumed {
    /// Matches the open pause's waitId.
    pub wait_id: WaitId,
}

/// `run.stop.requested` (§7.4): sets stopRequested on the target run.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStopRequested {
    /// The run being stopped; equal to runId for a direct stop.
    pub target_run_id: RunId,
    /// Why, as an open string.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
    /// Protected provenance of who asked, stamped by the server.
    #[serde(default, deserialize_with = "some")]
    pub actor: Option<Actor>,
}

/// `run.finished` and `workflow.finished` (§7.5, §6.5): completed. A
/// terminal obeys the open-work invariant (§6.2).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finished {
    /// Artifacts the run produced.
    #[serde(default, deserialize_with = "some")]
    pub artifact_ids: Option<Vec<ArtifactId>>,
    /// What the run consumed.
    #[serde(default, deserialize_with = "some")]
    pub usage: Option<Usage>,
}

/// `run.error` and `workflow.error` (§7.5, §6.5): failed.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failed {
    /// An opaque machine string.
    pub code: NonEmptyString,
    /// Sanitised, user-safe text.
    pub message: NonEmptyString,
    /// Partial usage.
    #[serde(default, deserialize_with = "some")]
    pub usage: Option<Usage>,
}

/// `run.cancelled` and `workflow.cancelled` (§7.5, §6.5): cancelled.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    /// An opaque machine string.
    #[serde(default, deserialize_with = "some")]
    pub code: Option<NonEmptyString>,
    /// User-safe text.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
    /// Partial usage.
    #[serde(default, deserialize_with = "some")]
    pub usage: Option<Usage>,
}

// ------------------------------------------------------ core: interrupts

/// `interrupt.requested` (§7.6): an external decision or input request.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptRequested {
    /// The interrupt.
    pub interrupt_id: InterruptId,
    /// The pause cycle that will wait on it.
    pub wait_id: WaitId,
    /// An open namespaced string, e.g. `tool.approval`.
    pub kind: NonEmptyString,
    /// The decisions a resolution may choose from.
    pub actions: NonEmptyVec<NonEmptyString>,
    /// `run` (default) or `workflow`.
    #[serde(default, deserialize_with = "some")]
    pub scope: Option<InterruptScope>,
    /// Whether it blocks (default true; only a blocking one pauses).
    #[serde(default, deserialize_with = "some")]
    pub blocking: Option<bool>,
    /// When the backend may resolve it as `expired`.
    #[serde(default, deserialize_with = "some")]
    pub expires_at: Option<Timestamp>,
    /// A short title.
    #[serde(default, deserialize_with = "some")]
    pub title: Option<String>,
    /// A user-safe message.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
    /// Kind-specific structured input (e.g. `members` of a HITL pack).
    #[serde(default, deserialize_with = "some")]
    pub input: Option<Value>,
}

impl InterruptRequested {
    /// Whether the interrupt blocks (the default).
    pub fn is_blocking(&self) -> bool {
        self.blocking.unwrap_or(true)
    }
}

/// What kind of caller an [`Actor`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActorKind {
    /// The subject (`sub`) of a bearer token.
    User,
    /// A registered extension's signed call.
    Extension,
}

/// Protected actor provenance (§7.7, §12): who caused an event a command
/// built. The server stamps it from the caller's credential; a backend's
/// proposal never carries it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Actor {
    /// What kind of caller.
    pub kind: ActorKind,
    /// The credential's subject.
    pub sub: NonEmptyString,
    /// The extension (`publisher/name`), for a signed extension call.
    #[serde(default, deserialize_with = "some")]
    pub extension: Option<NonEmptyString>,
}

/// One member decision of a resolved HITL pack (§7.7).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberDecision {
    /// The member request.
    pub request_id: NonEmptyString,
    /// The tool call the member was about.
    #[serde(default, deserialize_with = "some")]
    pub tool_call_id: Option<ToolCallId>,
    /// The tool's name.
    #[serde(default, deserialize_with = "some")]
    pub tool_name: Option<String>,
    /// The tool's type.
    #[serde(default, deserialize_with = "some")]
    pub tool_type: Option<String>,
    /// One of the request's actions, or `expired`.
    pub decision: NonEmptyString,
}

/// `interrupt.resolved` (§7.7): closes the interrupt; does not itself resume.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptResolved {
    /// The interrupt.
    pub interrupt_id: InterruptId,
    /// Its pause cycle.
    pub wait_id: WaitId,
    /// One of the request's actions, or `expired`.
    pub decision: NonEmptyString,
    /// `run` (default) or `workflow`, as on the request.
    #[serde(default, deserialize_with = "some")]
    pub scope: Option<InterruptScope>,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
    /// Protected provenance of who decided, stamped by the server.
    #[serde(default, deserialize_with = "some")]
    pub actor: Option<Actor>,
    /// Per-member decisions of a multi-member pack.
    #[serde(default, deserialize_with = "some")]
    pub members: Option<Vec<MemberDecision>>,
}

// ------------------------------------------------------- core: tool calls

/// `tool.call.started` (§7.8): observational; never executed by clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallStarted {
    /// The tool call.
    pub tool_call_id: ToolCallId,
    /// The tool.
    pub tool_name: NonEmptyString,
    /// Who executes it; immutable.
    pub executor: Executor,
    /// The complete structured arguments (may be `{}`).
    pub args: JsonObject,
}

/// `tool.call.finished` (§7.9): exactly one per start.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallFinished {
    /// The tool call.
    pub tool_call_id: ToolCallId,
    /// How it ended.
    pub outcome: Outcome,
    /// Any JSON value, including null.
    pub response: Value,
    /// A machine code summarising an error or cancellation.
    #[serde(default, deserialize_with = "some")]
    pub code: Option<NonEmptyString>,
    /// User-safe text.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
}

// -------------------------------------------------------------- workflow

/// `workflow.started` (§6.5).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStarted {
    /// The executor runs default to; each run still records its own.
    #[serde(default, deserialize_with = "some")]
    pub default_client_executor_id: Option<ClientExecutorId>,
    /// The input the workflow was started with.
    #[serde(default, deserialize_with = "some")]
    pub input: Option<Value>,
}

/// `workflow.paused` (§7.6): a workflow pause cycle.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowPaused {
    /// The pause cycle.
    pub wait_id: WaitId,
    /// The interrupt it waits on.
    pub interrupt_id: InterruptId,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<NonEmptyString>,
    /// How the pause ends.
    #[serde(default, deserialize_with = "some")]
    pub resume_mode: Option<ResumeMode>,
    /// A user-safe explanation.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
}

/// `workflow.edge.taken` (§6.6): an exclusive choice selected a path.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowEdgeTaken {
    /// The source node.
    pub from: NodeId,
    /// The selected target node.
    pub to: NodeId,
    /// The matching condition's index; one past the last for the default.
    #[serde(default, deserialize_with = "some")]
    pub case_index: Option<UInt>,
    /// The field the condition read; empty for the default path.
    #[serde(default, deserialize_with = "some")]
    pub pointer: Option<String>,
    /// The comparison that matched, or `default`.
    #[serde(default, deserialize_with = "some")]
    pub op: Option<String>,
}

/// `workflow.step.started`: linear succession onto a node.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStepStarted {
    /// The node the workflow moved onto.
    pub node_id: NodeId,
    /// A display title.
    #[serde(default, deserialize_with = "some")]
    pub title: Option<String>,
}

// ---------------------------------------------------------- conversation

/// `message.user.recorded` (§9.2).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageUserRecorded {
    /// The message.
    pub message_id: MessageId,
    /// Where it belongs; the envelope must match.
    pub message_scope: MessageScope,
    /// The content: text or structured parts.
    pub content: Value,
    /// Admitted inputs it refers to.
    #[serde(default, deserialize_with = "some")]
    pub attachment_ids: Option<Vec<AttachmentId>>,
    /// Protected provenance of who said it, stamped by the server.
    #[serde(default, deserialize_with = "some")]
    pub actor: Option<Actor>,
}

/// `message.text.started` (§9.2): a streamed message opens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageTextStarted {
    /// The message.
    pub message_id: MessageId,
    /// Its author.
    pub role: StreamRole,
    /// Where it belongs; the envelope must match.
    pub message_scope: MessageScope,
}

/// `message.text.delta` (§9.2): appended text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageTextDelta {
    /// The message.
    pub message_id: MessageId,
    /// The text to append.
    pub delta: String,
}

/// `message.text.completed` (§9.2): the message is whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageTextCompleted {
    /// The message.
    pub message_id: MessageId,
}

/// `reasoning.started` (§9.2).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReasoningStarted {
    /// The reasoning stream, e.g. `reasoning:{assistantMessageId}`.
    pub reasoning_id: ReasoningId,
    /// The assistant message it belongs to.
    #[serde(default, deserialize_with = "some")]
    pub message_id: Option<MessageId>,
}

/// `reasoning.delta` (§9.2).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReasoningDelta {
    /// The reasoning stream.
    pub reasoning_id: ReasoningId,
    /// The text to append.
    pub delta: String,
    /// The assistant message it belongs to.
    #[serde(default, deserialize_with = "some")]
    pub message_id: Option<MessageId>,
}

/// `reasoning.completed` (§9.2).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReasoningCompleted {
    /// The reasoning stream.
    pub reasoning_id: ReasoningId,
    /// The assistant message it belongs to.
    #[serde(default, deserialize_with = "some")]
    pub message_id: Option<MessageId>,
}

/// `message.redacted` (§9.4): changes conversation display only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageRedacted {
    /// The message.
    pub message_id: MessageId,
    /// Why.
    pub reason: NonEmptyString,
    /// What to show instead; `null` hides the message.
    #[serde(deserialize_with = "present")]
    pub display_replacement: Option<String>,
}

// ----------------------------------------------- attachments, artifacts

/// `attachment.added` (§9.5): metadata and a reference; never raw bytes.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentAdded {
    /// The attachment.
    pub attachment_id: AttachmentId,
    /// A display name.
    pub name: NonEmptyString,
    /// The media type, e.g. `image/png`.
    pub media_type: NonEmptyString,
    /// The size in bytes.
    #[serde(default, deserialize_with = "some")]
    pub size_bytes: Option<UInt>,
    /// An authorised reference to the bytes.
    #[serde(default, deserialize_with = "some")]
    pub uri: Option<Reference>,
    /// The hex SHA-256 of the bytes.
    #[serde(default, deserialize_with = "some")]
    pub sha256: Option<String>,
}

/// `attachment.ready` (§9.5).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentReady {
    /// The attachment.
    pub attachment_id: AttachmentId,
    /// An authorised reference to the bytes.
    #[serde(default, deserialize_with = "some")]
    pub uri: Option<Reference>,
}

/// `attachment.failed` (§9.5).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentFailed {
    /// The attachment.
    pub attachment_id: AttachmentId,
    /// A machine code.
    pub code: NonEmptyString,
    /// User-safe text.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
}

/// `attachment.removed` (§9.5).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentRemoved {
    /// The attachment.
    pub attachment_id: AttachmentId,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
}

/// `artifact.added` (§9.5): a produced output's metadata and reference.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactAdded {
    /// The artifact.
    pub artifact_id: ArtifactId,
    /// A display name.
    pub name: NonEmptyString,
    /// The media type.
    pub media_type: NonEmptyString,
    /// The size in bytes.
    #[serde(default, deserialize_with = "some")]
    pub size_bytes: Option<UInt>,
    /// An authorised reference to the bytes.
    #[serde(default, deserialize_with = "some")]
    pub uri: Option<Reference>,
    /// The hex SHA-256 of the bytes.
    #[serde(default, deserialize_with = "some")]
    pub sha256: Option<String>,
}

/// `artifact.ready` (§9.5).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactReady {
    /// The artifact.
    pub artifact_id: ArtifactId,
    /// An authorised reference to the bytes.
    #[serde(default, deserialize_with = "some")]
    pub uri: Option<Reference>,
}

/// `artifact.failed` (§9.5).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactFailed {
    /// The artifact.
    pub artifact_id: ArtifactId,
    /// A machine code.
    pub code: NonEmptyString,
    /// User-safe text.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
}

/// A reference to bytes held elsewhere. A `data:` URI would embed the raw
/// bytes in the event, which §9.5 forbids, so it is refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Reference(String);

impl Reference {
    /// Checks and wraps a reference.
    pub fn new(s: impl Into<String>) -> Result<Self, String> {
        let s = s.into();
        if s.is_empty() {
            return Err("a reference must not be empty".to_owned());
        }
        if s.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("data:")) {
            return Err(
                "a data: URI embeds raw bytes, which narad events must not carry (§9.5); \
                 store the bytes and send a reference to them"
                    .to_owned(),
            );
        }
        Ok(Self(s))
    }

    /// The reference.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Reference {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(d)?).map_err(de::Error::custom)
    }
}

// ------------------------------------------------------------ state, ui

/// `state.snapshot` and `ui.state.snapshot` (§9.6): a whole document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DocumentSnapshot {
    /// The document's key, e.g. `session` or `run:r-1`.
    pub scope: NonEmptyString,
    /// The document's revision.
    pub revision: UInt,
    /// The document.
    pub state: Value,
}

/// `state.delta` and `ui.state.delta` (§9.6): one RFC 6902 step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DocumentDelta {
    /// The document's key.
    pub scope: NonEmptyString,
    /// The revision the patch applies to.
    pub base_revision: UInt,
    /// `baseRevision + 1`.
    pub revision: UInt,
    /// The patch.
    pub patch: Patch,
}

/// `state.compacted` (§9.6): history before a point folded into a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateCompacted {
    /// The document's key.
    pub scope: NonEmptyString,
    /// The session authority the snapshot covers.
    pub covers_through_session_sequence: UInt,
    /// The snapshot's revision.
    pub snapshot_revision: UInt,
}

/// `view.opened` (§9.6).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ViewOpened {
    /// The view.
    pub view_id: ViewId,
    /// What kind of view, e.g. `acme.diff`.
    #[serde(default, deserialize_with = "some")]
    pub view: Option<NonEmptyString>,
    /// Its initial state.
    #[serde(default, deserialize_with = "some")]
    pub state: Option<Value>,
}

/// How a view update applies (§9.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "lowercase")]
pub enum ViewUpdate {
    /// Replace the view's state.
    Replace {
        /// The new state.
        state: Value,
    },
    /// Patch the view's state.
    Patch {
        /// The RFC 6902 patch.
        patch: Patch,
    },
}

/// `view.updated` (§9.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ViewUpdated {
    /// The view.
    pub view_id: ViewId,
    /// `operation` with its `state` or `patch`.
    #[serde(flatten)]
    pub update: ViewUpdate,
}

/// `view.closed` (§9.6).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ViewClosed {
    /// The view.
    pub view_id: ViewId,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
}

// -------------------------------------------------------------- progress

/// Where a progress item stands (§9.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressStatus {
    /// Under way.
    Active,
    /// Done.
    Completed,
    /// Failed.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// Who may see a progress item (§9.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Privacy {
    /// Anyone who may read the session.
    Public,
    /// Operators.
    Internal,
    /// Restricted.
    Sensitive,
}

/// `progress.recorded` (§9.8): an activity fact with no lifecycle authority.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressRecorded {
    /// Stable identity of the activity item.
    pub progress_id: ProgressId,
    /// An open namespaced string.
    pub category: NonEmptyString,
    /// A user-visible summary.
    pub label: NonEmptyString,
    /// More detail.
    #[serde(default, deserialize_with = "some")]
    pub detail: Option<String>,
    /// Where it stands.
    pub status: ProgressStatus,
    /// Who may see it.
    pub privacy: Privacy,
}

// ------------------------------------------------------------ extensions

/// `session.custom`, `workflow.custom`, `run.custom` (§9.9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Custom {
    /// A namespaced name; unknown names are ignored by core reducers.
    pub name: NamespacedName,
    /// Any JSON value.
    pub value: Value,
}

/// `session.raw`, `workflow.raw`, `run.raw` (§9.9): untrusted data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Raw {
    /// The payload's media type.
    pub content_type: NonEmptyString,
    /// The opaque encoded payload.
    pub payload: String,
}

/// `node.custom` (§9.9): a custom value about a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCustom {
    /// The node.
    pub node_id: NodeId,
    /// A namespaced name.
    pub name: NamespacedName,
    /// Any JSON value.
    pub value: Value,
}

/// `node.raw` (§9.9): an opaque payload about a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRaw {
    /// The node.
    pub node_id: NodeId,
    /// The payload's media type.
    pub content_type: NonEmptyString,
    /// The opaque encoded payload.
    pub payload: String,
}

/// The placement of a scoped authority body, decided by its own scope field.
pub(crate) fn scoped_placement(body: &crate::wire::AuthorityBody) -> Placement {
    use crate::wire::AuthorityBody as B;
    match body {
        B::InterruptRequested(b) => InterruptScope::placement(b.scope),
        B::InterruptResolved(b) => InterruptScope::placement(b.scope),
        B::MessageUserRecorded(b) => b.message_scope.placement(),
        B::MessageTextStarted(b) => b.message_scope.placement(),
        _ => Placement::SCOPED,
    }
}
