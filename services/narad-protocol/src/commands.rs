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
    /// The run's session: needed only when the run id is used in several
    /// sessions.
    #[serde(default, deserialize_with = "some")]
    pub session_id: Option<SessionId>,
    /// Why.
    #[serde(default, deserialize_with = "some")]
    pub reason: Option<String>,
}

/// `resolve-interrupt`: decide an open interrupt. The interrupt id alone
/// locates its owning journal (§2.2), unless it is used in several
/// sessions: then `sessionId` names the one meant.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResolveInterrupt {
    /// The open interrupt.
    pub interrupt_id: InterruptId,
    /// The interrupt's session: needed only when the interrupt id is used
    /// in several sessions.
    #[serde(default, deserialize_with = "some")]
    pub session_id: Option<SessionId>,
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
    /// The workflow's session: needed only when the workflow id is used in
    /// several sessions.
    #[serde(default, deserialize_with = "some")]
    pub session_id: Option<SessionId>,
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

/// What a command acts on, as authorization sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// A session the body names.
    Session(&'a SessionId),
    /// An object found by its id (a run, an interrupt, a workflow), in the
    /// session the body names if it names one, else wherever the id is.
    Located {
        /// The entity kind, as the journal stores it (`run`, `interrupt`,
        /// `workflow`).
        kind: &'static str,
        /// Its id.
        id: &'a str,
        /// The body's field holding the id, e.g. `runId`.
        field: &'static str,
        /// The session the body names, if any.
        session: Option<&'a SessionId>,
    },
    /// A session the server creates and names itself (create-session
    /// without a sessionId).
    NewSession,
}

impl Command {
    /// What the command acts on.
    pub fn target(&self) -> Target<'_> {
        match self {
            Command::StartRun(c) => Target::Session(&c.session_id),
            Command::RecordUserMessage(c) => Target::Session(&c.session_id),
            Command::StartWorkflow(c) => Target::Session(&c.session_id),
            Command::RedactMessage(c) => Target::Session(&c.session_id),
            Command::UpdateSession(c) => Target::Session(&c.session_id),
            Command::ArchiveSession(c) => Target::Session(&c.session_id),
            Command::CreateSession(c) => match &c.session_id {
                Some(s) => Target::Session(s),
                None => Target::NewSession,
            },
            Command::StopRun(c) => Target::Located {
                kind: "run",
                id: c.run_id.as_str(),
                field: "runId",
                session: c.session_id.as_ref(),
            },
            Command::ResolveInterrupt(c) => Target::Located {
                kind: "interrupt",
                id: c.interrupt_id.as_str(),
                field: "interruptId",
                session: c.session_id.as_ref(),
            },
            Command::CancelWorkflow(c) => Target::Located {
                kind: "workflow",
                id: c.workflow_id.as_str(),
                field: "workflowId",
                session: c.session_id.as_ref(),
            },
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
