//! Command bodies (§2.2, DESIGN.md §3): the inbound requests whose accepted
//! effects appear as authority events. Commands are not journal facts.
//!
//! Command bodies are strict: an unknown field is an error (a misspelt
//! `onConflict` must not silently mean the default).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::authority::{MemberDecision, MessageScope};
use crate::classify::WireError;
use crate::primitives::{
    AttachmentId, Attempts, ClientExecutorId, InterruptId, JsonObject, MessageId, NonEmptyString,
    QueueName, RunId, SessionId, WorkflowId, present, some,
};
use crate::wire::deserialize;

/// What `start-run` does when the session's top-level slot is taken (§3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnConflict {
    /// Refuse, naming the active execution.
    #[default]
    Reject,
    /// Queue the start; it becomes `run.started` when the slot frees.
    Enqueue,
    /// Stop the active run and start this one once it has ended.
    Interrupt,
}

/// What the server does with a queued run when its runtime's lease lapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLost {
    /// Hand the run to another runtime, up to `maxAttempts` claims; then fail.
    Retry,
    /// Close the run: open work closed, then `run.error` (`runtime_lost`).
    Fail,
}

impl OnLost {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnLost::Retry => "retry",
            OnLost::Fail => "fail",
        }
    }
}

/// `start-run`'s `runtime`: hand the run to the work queue of agent
/// runtimes. Absent fields take the server's defaults.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeOrder {
    /// The queue runtimes claim it from (default `default`).
    #[serde(default, deserialize_with = "some")]
    pub queue: Option<QueueName>,
    /// What happens when the holding runtime is lost.
    #[serde(default, deserialize_with = "some")]
    pub on_lost: Option<OnLost>,
    /// The most claims, counting the first (retry policy).
    #[serde(default, deserialize_with = "some")]
    pub max_attempts: Option<Attempts>,
}

/// `start-run`: start a top-level or nested run.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartRun {
    /// The session.
    pub session_id: SessionId,
    /// The new run's id; the server issues one when absent.
    #[serde(default, deserialize_with = "some")]
    pub run_id: Option<RunId>,
    /// The parent, for a nested run.
    #[serde(default, deserialize_with = "some")]
    pub parent_run_id: Option<RunId>,
    /// The owning workflow.
    #[serde(default, deserialize_with = "some")]
    pub workflow_id: Option<WorkflowId>,
    /// The client executor to bind.
    #[serde(default, deserialize_with = "some")]
    pub client_executor_id: Option<ClientExecutorId>,
    /// The run's input.
    #[serde(default, deserialize_with = "some")]
    pub input: Option<Value>,
    /// What to do when the slot is taken (default `reject`).
    #[serde(default, deserialize_with = "some")]
    pub on_conflict: Option<OnConflict>,
    /// Hand a top-level run to agent runtimes through the work queue.
    #[serde(default, deserialize_with = "some")]
    pub runtime: Option<RuntimeOrder>,
}

/// `stop-run`: request that a run stop.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StopRun {
    /// The run to stop.
    pub run_id: RunId,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
}

/// `resolve-interrupt`: decide an open interrupt. The interrupt id alone
/// locates its owning journal (§2.2).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResolveInterrupt {
    /// The open interrupt.
    pub interrupt_id: InterruptId,
    /// One of the request's actions.
    pub decision: NonEmptyString,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
    /// Per-member decisions of a multi-member pack.
    #[serde(default, deserialize_with = "some")]
    pub members: Option<Vec<MemberDecision>>,
}

/// `record-user-message`: record what a person said.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordUserMessage {
    /// The session.
    pub session_id: SessionId,
    /// Where the message belongs.
    pub message_scope: MessageScope,
    /// Text or structured parts.
    pub content: Value,
    /// The message id; the server issues one when absent.
    #[serde(default, deserialize_with = "some")]
    pub message_id: Option<MessageId>,
    /// Admitted inputs it refers to.
    #[serde(default, deserialize_with = "some")]
    pub attachment_ids: Option<Vec<AttachmentId>>,
    /// The run, for `messageScope = run`.
    #[serde(default, deserialize_with = "some")]
    pub run_id: Option<RunId>,
    /// The workflow, for `messageScope = workflow`.
    #[serde(default, deserialize_with = "some")]
    pub workflow_id: Option<WorkflowId>,
}

/// `start-workflow`: start a workflow in a session's top-level slot.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartWorkflow {
    /// The session.
    pub session_id: SessionId,
    /// The workflow id; the server issues one when absent.
    #[serde(default, deserialize_with = "some")]
    pub workflow_id: Option<WorkflowId>,
    /// The executor its runs default to.
    #[serde(default, deserialize_with = "some")]
    pub default_client_executor_id: Option<ClientExecutorId>,
    /// The workflow's input.
    #[serde(default, deserialize_with = "some")]
    pub input: Option<Value>,
}

/// `cancel-workflow`: cancel a workflow's runs, then the workflow.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelWorkflow {
    /// The workflow.
    pub workflow_id: WorkflowId,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
}

/// `redact-message`: change how a message displays (§9.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedactMessage {
    /// The session (message ids are unique per session only).
    pub session_id: SessionId,
    /// The message.
    pub message_id: MessageId,
    /// Why.
    pub reason: NonEmptyString,
    /// What to show instead; `null` hides the message.
    #[serde(deserialize_with = "present")]
    pub display_replacement: Option<String>,
}

/// `create-session`: open a new session.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSession {
    /// The session id; the server issues one when absent.
    #[serde(default, deserialize_with = "some")]
    pub session_id: Option<SessionId>,
    /// A title.
    #[serde(default, deserialize_with = "some")]
    pub title: Option<String>,
    /// Metadata.
    #[serde(default, deserialize_with = "some")]
    pub metadata: Option<JsonObject>,
}

/// `archive-session`: take a session out of the active catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArchiveSession {
    /// The session.
    pub session_id: SessionId,
}

/// `update-session`: change a session's catalogue entry (title,
/// metadata); emits `session.updated` when anything changed. Each field
/// given replaces the stored one whole; at least one is given.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "UpdateSessionBody")]
pub struct UpdateSession {
    /// The session.
    pub session_id: SessionId,
    /// The new title.
    pub title: Option<String>,
    /// The new metadata, replacing the stored object.
    pub metadata: Option<JsonObject>,
}

/// `update-session` as sent, before the check that it changes something.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UpdateSessionBody {
    session_id: SessionId,
    #[serde(default, deserialize_with = "some")]
    title: Option<String>,
    #[serde(default, deserialize_with = "some")]
    metadata: Option<JsonObject>,
}

impl TryFrom<UpdateSessionBody> for UpdateSession {
    type Error = &'static str;

    fn try_from(b: UpdateSessionBody) -> Result<UpdateSession, Self::Error> {
        if b.title.is_none() && b.metadata.is_none() {
            return Err("update-session changes title, metadata or both: give at least one");
        }
        Ok(UpdateSession {
            session_id: b.session_id,
            title: b.title,
            metadata: b.metadata,
        })
    }
}

macro_rules! commands {
    ($($variant:ident($ty:ty) = $name:literal;)*) => {
        /// Any command, by name.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        #[allow(missing_docs)]
        pub enum Command {
            $($variant($ty),)*
        }

        impl Command {
            /// Every command name, as in `POST /v1/commands/{name}`.
            pub const NAMES: &'static [&'static str] = &[$($name,)*];

            /// The command's name.
            pub fn name(&self) -> &'static str {
                match self { $(Command::$variant(_) => $name,)* }
            }

            /// Parses the body of the command `name`. `None` when no
            /// command has that name.
            pub fn parse(name: &str, body: &Value) -> Option<Result<Command, WireError>> {
                let parsed = match name {
                    $($name => deserialize::<$ty>(body).map(Command::$variant),)*
                    _ => return None,
                };
                Some(parsed.map_err(|(pointer, message)| WireError::Invalid { pointer, message }))
            }
        }
    };
}

commands! {
    StartRun(StartRun) = "start-run";
    StopRun(StopRun) = "stop-run";
    ResolveInterrupt(ResolveInterrupt) = "resolve-interrupt";
    RecordUserMessage(RecordUserMessage) = "record-user-message";
    StartWorkflow(StartWorkflow) = "start-workflow";
    CancelWorkflow(CancelWorkflow) = "cancel-workflow";
    RedactMessage(RedactMessage) = "redact-message";
    CreateSession(CreateSession) = "create-session";
    UpdateSession(UpdateSession) = "update-session";
    ArchiveSession(ArchiveSession) = "archive-session";
}

impl Command {
    /// The session the command names in its body; `None` for commands that
    /// find their session from another id (a run, an interrupt, a
    /// workflow) and for a create-session that lets the server choose.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Command::StartRun(c) => Some(c.session_id.as_str()),
            Command::RecordUserMessage(c) => Some(c.session_id.as_str()),
            Command::StartWorkflow(c) => Some(c.session_id.as_str()),
            Command::RedactMessage(c) => Some(c.session_id.as_str()),
            Command::CreateSession(c) => c.session_id.as_ref().map(|s| s.as_str()),
            Command::UpdateSession(c) => Some(c.session_id.as_str()),
            Command::ArchiveSession(c) => Some(c.session_id.as_str()),
            Command::StopRun(_) | Command::ResolveInterrupt(_) | Command::CancelWorkflow(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_in_commands_are_errors() {
        let e = Command::parse(
            "start-run",
            &json!({"sessionId": "s", "onconflict": "enqueue"}),
        )
        .unwrap()
        .unwrap_err();
        assert!(e.to_string().contains("onconflict"), "{e}");
    }

    #[test]
    fn update_session_changes_something_and_knows_its_fields() {
        let e = Command::parse("update-session", &json!({"sessionId": "s"}))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("give at least one"), "{e}");
        let e = Command::parse("update-session", &json!({"sessionId": "s", "titel": "x"}))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("titel"), "{e}");
        let Some(Ok(Command::UpdateSession(u))) = Command::parse(
            "update-session",
            &json!({"sessionId": "s", "metadata": {"team": "platform"}}),
        ) else {
            panic!("a metadata-only update parses")
        };
        assert_eq!(u.title, None);
        assert_eq!(u.metadata.unwrap()["team"], "platform");
    }

    #[test]
    fn unknown_commands_are_none() {
        assert!(Command::parse("launch-rocket", &json!({})).is_none());
    }
}
