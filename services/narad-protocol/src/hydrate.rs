//! Bodies of hydrate records (§9.3, §9.7): derived projections anchored to
//! authority cursors. They carry no eventId and consume no sequence.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::authority::{MessageScope, Patch};
use crate::primitives::{
    Absent, AttachmentId, MessageId, NonEmptyString, ReasoningId, RunId, Sequence, SessionId,
    SnapshotId, UInt, WorkflowId, some,
};

/// Who wrote a transcript message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageRole {
    /// A person.
    User,
    /// The agent.
    Assistant,
    /// The system.
    System,
}

/// Reasoning kept with a transcript message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptReasoning {
    /// The reasoning stream.
    pub reasoning_id: ReasoningId,
    /// Its text so far.
    pub text: String,
    /// Whether `reasoning.completed` was seen.
    pub completed: bool,
}

/// A display redaction applied to a transcript message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptRedaction {
    /// Why.
    pub reason: NonEmptyString,
    /// What to show instead; `null` hides the message.
    #[serde(deserialize_with = "crate::primitives::present")]
    pub display_replacement: Option<String>,
}

/// One message of a transcript snapshot.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptMessage {
    /// The message.
    pub message_id: MessageId,
    /// Who wrote it.
    pub role: MessageRole,
    /// Where it belongs.
    pub message_scope: MessageScope,
    /// The content: a user message's content, or streamed text so far.
    pub content: Value,
    /// Whether the message is whole.
    pub completed: bool,
    /// The run journal, for run-scoped messages.
    #[serde(default, deserialize_with = "some")]
    pub root_run_id: Option<RunId>,
    /// The run, for run-scoped messages.
    #[serde(default, deserialize_with = "some")]
    pub run_id: Option<RunId>,
    /// The workflow, for workflow-scoped messages.
    #[serde(default, deserialize_with = "some")]
    pub workflow_id: Option<WorkflowId>,
    /// Admitted inputs it refers to.
    #[serde(default, deserialize_with = "some")]
    pub attachment_ids: Option<Vec<AttachmentId>>,
    /// Reasoning joined to this message.
    #[serde(default, deserialize_with = "some")]
    pub reasoning: Option<Vec<TranscriptReasoning>>,
    /// A display redaction, when one was recorded.
    #[serde(default, deserialize_with = "some")]
    pub redaction: Option<TranscriptRedaction>,
}

/// `messages.snapshot` (§9.3): the transcript through a session sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessagesSnapshot {
    /// The snapshot.
    pub snapshot_id: SnapshotId,
    /// The session.
    pub session_id: SessionId,
    /// Authority through which the snapshot is complete (0: none).
    pub covers_through_session_sequence: UInt,
    /// The messages, in transcript order.
    pub messages: Vec<TranscriptMessage>,
}

/// The source cursor of a run-scope graph record (§9.7).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceRunCursor {
    /// A committed run-tree sequence of the root journal.
    pub sequence: Sequence,
    /// The root journal, when repeated here.
    #[serde(default, deserialize_with = "some")]
    pub root_run_id: Option<RunId>,
}

/// The source cursor of a workflow-scope graph record (§9.7).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceWorkflowCursor {
    /// A committed workflow sequence.
    pub sequence: Sequence,
    /// The workflow, when repeated here.
    #[serde(default, deserialize_with = "some")]
    pub workflow_id: Option<WorkflowId>,
}

/// What a graph record is about (§9.7), with its anchoring cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "lowercase")]
pub enum GraphScope {
    /// One run tree.
    #[serde(rename_all = "camelCase")]
    Run {
        /// An already-started root run of the session.
        root_run_id: RunId,
        /// The authority the record is derived through.
        source_run_cursor: SourceRunCursor,
        /// A run-scope record must not name a workflow (§9.7).
        #[serde(default, skip_serializing)]
        workflow_id: Absent,
    },
    /// A workflow (reserved for orchestration support).
    #[serde(rename_all = "camelCase")]
    Workflow {
        /// The workflow.
        workflow_id: WorkflowId,
        /// The authority the record is derived through.
        source_workflow_cursor: SourceWorkflowCursor,
    },
}

/// A graph node; `id` and `kind` are required, the rest is defined by the
/// graph schema version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphNode {
    /// Deterministic node id.
    pub id: NonEmptyString,
    /// What the node stands for, e.g. `run`, `tool.call`.
    pub kind: NonEmptyString,
    /// Further attributes.
    #[serde(flatten)]
    pub attributes: serde_json::Map<String, Value>,
}

/// A graph edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphEdge {
    /// Deterministic edge id.
    pub id: NonEmptyString,
    /// Source node id.
    pub from: NonEmptyString,
    /// Target node id.
    pub to: NonEmptyString,
    /// What the edge stands for, e.g. `parent`, `edge.taken`.
    pub kind: NonEmptyString,
    /// Further attributes.
    #[serde(flatten)]
    pub attributes: serde_json::Map<String, Value>,
}

/// `graph.snapshot` (§9.7): canonical graph state at a revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphSnapshot {
    /// The session.
    pub session_id: SessionId,
    /// The scope key and its source cursor.
    #[serde(flatten)]
    pub scope: GraphScope,
    /// The payload schema version, e.g. `narad.graph/1`.
    pub graph_schema_version: NonEmptyString,
    /// The graph revision.
    pub revision: UInt,
    /// The root node.
    pub root_node_id: NonEmptyString,
    /// Nodes, in canonical order.
    pub nodes: Vec<GraphNode>,
    /// Edges, in canonical order.
    pub edges: Vec<GraphEdge>,
}

/// `graph.delta` (§9.7): an RFC 6902 step between contiguous revisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphDelta {
    /// The session.
    pub session_id: SessionId,
    /// The scope key and its source cursor.
    #[serde(flatten)]
    pub scope: GraphScope,
    /// The payload schema version.
    pub graph_schema_version: NonEmptyString,
    /// The revision the patch applies to.
    pub base_revision: UInt,
    /// `baseRevision + 1`.
    pub revision: UInt,
    /// The patch.
    pub patch: Patch,
}
