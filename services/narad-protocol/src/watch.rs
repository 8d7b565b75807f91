//! Bodies of watch events (§8): "this scope changed; catch up". Each body
//! holds the ids of its scope; the revision and cursor are in the
//! [`WatchEnvelope`](crate::envelope::WatchEnvelope).

use serde::{Deserialize, Serialize};

use crate::primitives::{JsonObject, NodeId, RunId, SessionId, WorkflowId, WorkspaceId, some};

/// `session.revision`: a session's authority advanced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRevision {
    /// The session.
    pub session_id: SessionId,
}

/// `run.revision`: a run's authority advanced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRevision {
    /// The session.
    pub session_id: SessionId,
    /// The run journal.
    pub root_run_id: RunId,
    /// The run.
    pub run_id: RunId,
}

/// `workflow.revision`: a workflow's authority advanced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowRevision {
    /// The session.
    pub session_id: SessionId,
    /// The workflow.
    pub workflow_id: WorkflowId,
}

/// `node.revision`: a node's derived state changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRevision {
    /// The session.
    pub session_id: SessionId,
    /// The node.
    pub node_id: NodeId,
}

/// `workspace.revision`: the tenant's catalogue of sessions changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceRevision {
    /// The workspace (the tenant).
    pub workspace_id: WorkspaceId,
}

/// `session.created` and `session.updated`: a session's catalogue entry.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionChanged {
    /// The workspace (the tenant).
    pub workspace_id: WorkspaceId,
    /// The affected session.
    pub session_id: SessionId,
    /// Its title.
    #[serde(default, deserialize_with = "some")]
    pub title: Option<String>,
    /// Its metadata.
    #[serde(default, deserialize_with = "some")]
    pub metadata: Option<JsonObject>,
}

/// `session.archived`: a session left the active catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionArchived {
    /// The workspace (the tenant).
    pub workspace_id: WorkspaceId,
    /// The affected session.
    pub session_id: SessionId,
}
