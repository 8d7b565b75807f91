//! Bodies of control messages (§10.4, §11): transport traffic with no
//! eventId, authority sequence or revision.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::authority::Outcome;
use crate::primitives::{
    ClientExecutorId, ExecutionToken, JsonObject, LeaseId, NonEmptyString, RunId, SessionId,
    Timestamp, ToolCallId, UInt, WorkflowId, some,
};

/// `client.attach`: an executor asks to attach to a logical endpoint.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientAttach {
    /// The endpoint to attach as.
    pub client_executor_id: ClientExecutorId,
    /// Profiles the client negotiates (e.g. `narad.client-executor/v1`).
    #[serde(default, deserialize_with = "some")]
    pub profiles: Option<Vec<NonEmptyString>>,
}

/// `client.attached` (§11.1): a new lease, superseding any earlier one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientAttached {
    /// The endpoint.
    pub client_executor_id: ClientExecutorId,
    /// The fencing token of this attachment.
    pub lease_id: LeaseId,
    /// How often each side sends a heartbeat.
    pub heartbeat_interval_ms: UInt,
    /// When the lease lapses without a heartbeat.
    pub lease_expires_at: Timestamp,
}

/// `server.heartbeat` (§11.2): backend-to-client liveness.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerHeartbeat {
    /// The endpoint, on an executor channel.
    #[serde(default, deserialize_with = "some")]
    pub client_executor_id: Option<ClientExecutorId>,
    /// The current lease, on an executor channel.
    #[serde(default, deserialize_with = "some")]
    pub lease_id: Option<LeaseId>,
    /// The lease's current expiry.
    #[serde(default, deserialize_with = "some")]
    pub lease_expires_at: Option<Timestamp>,
    /// When it was sent.
    #[serde(default, deserialize_with = "some")]
    pub timestamp: Option<Timestamp>,
}

/// `client.heartbeat` (§11.2): renews the named lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientHeartbeat {
    /// The endpoint.
    pub client_executor_id: ClientExecutorId,
    /// The lease to renew.
    pub lease_id: LeaseId,
}

/// `client.tool.execute` (§11.3): the one targeted order to run a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientToolExecute {
    /// The endpoint it is addressed to.
    pub client_executor_id: ClientExecutorId,
    /// The lease it was issued under.
    pub lease_id: LeaseId,
    /// The single-use capability to finish this call.
    pub execution_token: ExecutionToken,
    /// When the token lapses.
    pub execution_token_expires_at: Timestamp,
    /// The tool call.
    pub tool_call_id: ToolCallId,
    /// Exactly the started call's toolName.
    pub tool_name: NonEmptyString,
    /// Exactly the started call's args.
    pub args: JsonObject,
}

/// `client.tool.finish` (§11.3): the outcome of one execution token.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientToolFinish {
    /// The token being finished.
    pub execution_token: ExecutionToken,
    /// How the call ended.
    pub outcome: Outcome,
    /// Any JSON value, including null.
    pub response: Value,
    /// A machine code for an error or cancellation.
    #[serde(default, deserialize_with = "some")]
    pub code: Option<NonEmptyString>,
    /// User-safe text.
    #[serde(default, deserialize_with = "some")]
    pub message: Option<String>,
    /// The endpoint, for the log.
    #[serde(default, deserialize_with = "some")]
    pub client_executor_id: Option<ClientExecutorId>,
    /// The lease the finish is sent under.
    #[serde(default, deserialize_with = "some")]
    pub lease_id: Option<LeaseId>,
    /// The tool call, for the log.
    #[serde(default, deserialize_with = "some")]
    pub tool_call_id: Option<ToolCallId>,
}

/// History limits a server advertises (§10.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryLimits {
    /// The largest `limit` a history page accepts.
    pub max_page_size: UInt,
    /// The page size used when none is asked for.
    pub default_page_size: UInt,
}

/// Heartbeat limits a server advertises (§10.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatLimits {
    /// How often heartbeats are sent.
    pub interval_ms: UInt,
    /// How long a lease lives without a heartbeat.
    pub lease_ttl_ms: UInt,
}

/// The session's active top-level execution (§3.1).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ActiveExecution {
    /// An independent top-level run.
    #[serde(rename_all = "camelCase")]
    Run {
        /// The run (its own rootRunId).
        run_id: RunId,
    },
    /// A workflow, with its active top-level run if one is running.
    #[serde(rename_all = "camelCase")]
    Workflow {
        /// The workflow.
        workflow_id: WorkflowId,
        /// Its active top-level run.
        #[serde(default, deserialize_with = "some")]
        run_id: Option<RunId>,
    },
}

/// `capabilities` (§10.4): sent before any authority delivery.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// The active profile ids, core first.
    pub active_profiles: Vec<NonEmptyString>,
    /// History limits.
    pub history: HistoryLimits,
    /// Heartbeat limits.
    pub heartbeat: HeartbeatLimits,
    /// The session the document describes, when it describes one.
    #[serde(default, deserialize_with = "some")]
    pub session_id: Option<SessionId>,
    /// The session's current sequence (0: no authority yet); named apart from
    /// `sessionSequence`, which control messages never carry.
    #[serde(default, deserialize_with = "some")]
    pub current_session_sequence: Option<UInt>,
    /// The active top-level execution, if any.
    #[serde(default, deserialize_with = "some")]
    pub active_execution: Option<ActiveExecution>,
}
