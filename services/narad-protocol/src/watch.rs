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

/// The eventId of a watch event narad emits, derived from its scope and
/// revision alone, so that every replica names the same notification alike
/// (§4.1), and carrying the authority position it covers, so that a stream
/// can resume after it (`Last-Event-ID`).
///
/// Encoded as `w1.` and the unpadded base64url of a JSON array; opaque to
/// clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchId {
    /// The watch type, e.g. `session.revision`.
    pub type_name: String,
    /// The session (absent for workspace scope).
    pub session_id: Option<String>,
    /// The run or workflow of a run or workflow scope.
    pub scope_id: Option<String>,
    /// The revision.
    pub revision: u64,
    /// The sessionSequence of the authority it covers, for session-bound
    /// types.
    pub covers: Option<u64>,
    /// For watch events the outbox carries (`session.created`,
    /// `session.archived`): the transaction that recorded them.
    pub txid: Option<i64>,
}

/// The prefix of every [`WatchId`].
pub const WATCH_ID_PREFIX: &str = "w1.";

impl WatchId {
    /// The eventId.
    pub fn encode(&self) -> String {
        use base64::Engine;
        let json = serde_json::to_vec(&(
            &self.type_name,
            &self.session_id,
            &self.scope_id,
            self.revision,
            self.covers,
            self.txid,
        ))
        .expect("serialises");
        format!(
            "{WATCH_ID_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
        )
    }

    /// Reads an eventId narad gave a watch event; `None` for any other id.
    pub fn decode(id: &str) -> Option<WatchId> {
        use base64::Engine;
        let rest = id.strip_prefix(WATCH_ID_PREFIX)?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(rest)
            .ok()?;
        type Parts = (
            String,
            Option<String>,
            Option<String>,
            u64,
            Option<u64>,
            Option<i64>,
        );
        let (type_name, session_id, scope_id, revision, covers, txid): Parts =
            serde_json::from_slice(&bytes).ok()?;
        // Positions narad gives out are at most 2^53 − 1 (and a
        // transaction id is never negative): anything else is no id of
        // ours, and must not wrap in the store's 64-bit columns.
        let safe = |n: u64| n <= crate::primitives::MAX_SAFE_INTEGER;
        if !safe(revision) || !covers.is_none_or(safe) || txid.is_some_and(|t| t < 0) {
            return None;
        }
        Some(WatchId {
            type_name,
            session_id,
            scope_id,
            revision,
            covers,
            txid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_ids_round_trip_and_are_deterministic() {
        let id = WatchId {
            type_name: "run.revision".into(),
            session_id: Some("s:1/x".into()),
            scope_id: Some("r1".into()),
            revision: 7,
            covers: Some(42),
            txid: None,
        };
        let encoded = id.encode();
        assert!(encoded.starts_with(WATCH_ID_PREFIX));
        assert_eq!(
            encoded,
            id.clone().encode(),
            "same scope and revision, same id"
        );
        assert_eq!(WatchId::decode(&encoded), Some(id.clone()));
        assert_eq!(WatchId::decode("run-7"), None);
        assert_eq!(WatchId::decode("w1.!!"), None);
        for past in [
            WatchId {
                revision: 1 << 63,
                ..id.clone()
            },
            WatchId {
                covers: Some(crate::primitives::MAX_SAFE_INTEGER + 1),
                ..id.clone()
            },
            WatchId {
                txid: Some(-1),
                ..id.clone()
            },
        ] {
            assert_eq!(WatchId::decode(&past.encode()), None, "{past:?}");
        }
    }
}
