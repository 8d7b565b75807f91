//! The rules of narad/v1, each with a stable id, the spec section it comes
//! from and one sentence. A [`Violation`] always names one of them; the
//! error envelope carries the id as `rule`; `docs/rules.md` lists them all
//! and the golden traces exercise every one.

use std::fmt;

use serde::Serialize;

use crate::primitives::EventId;

/// A rule of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Rule {
    /// Stable id, e.g. `run.terminal.open-work`.
    pub id: &'static str,
    /// The specification section(s) it comes from, e.g. `§6.2`.
    pub section: &'static str,
    /// What the rule demands, in one sentence.
    pub summary: &'static str,
}

macro_rules! rules {
    ($($(#[$doc:meta])* $name:ident = $id:literal, $section:literal, $summary:literal;)*) => {
        $(
            $(#[$doc])*
            #[doc = concat!("`", $id, "` (", $section, "): ", $summary)]
            pub const $name: Rule = Rule { id: $id, section: $section, summary: $summary };
        )*

        /// Every rule, in documentation order.
        pub const ALL: &[Rule] = &[$($name,)*];
    };
}

rules! {
    // Wire structure (checked by the classifier before any rule below).
    WIRE_INVALID = "wire.invalid", "§5, §13",
        "An object has the structure its type requires (schema/).";
    WIRE_VERSION = "wire.version", "§13",
        "Unknown protocol versions are rejected.";
    WIRE_UNKNOWN_TYPE = "wire.unknown-type", "§13",
        "An unknown type in the namespace of an active profile fails closed.";
    PROFILE_NOT_ACTIVE = "profile.not-active", "§2.1, §13",
        "A journal holds only core events and events of its active profiles.";

    // Identity and ordering.
    EVENT_ID_UNIQUE = "event.id.unique", "§4.1",
        "An eventId is never reused within its session.";
    EVENT_SESSION = "event.session", "§3.1",
        "Every event of a session journal names that session.";
    SEQUENCE_SESSION = "sequence.session.contiguous", "§4.2",
        "sessionSequence is contiguous from 1 within the session.";
    SEQUENCE_WORKFLOW = "sequence.workflow.contiguous", "§4.2",
        "workflowSequence is contiguous from 1 within the workflow.";
    SEQUENCE_RUN = "sequence.run.contiguous", "§4.2",
        "The run-tree sequence is contiguous from 1 within the root run journal.";
    WORKFLOW_RUN_POSITION = "workflow.run.position", "§4.2, §9.1",
        "Events of a workflow-owned run carry that workflow's position; other runs' events carry none.";

    // Session slot.
    SESSION_SLOT = "session.slot.single", "§3.1",
        "A session has at most one active top-level execution: one top-level run, or one workflow.";

    // Runs.
    RUN_UNKNOWN = "run.unknown", "§3.3",
        "A run-tree event names a started run of its root journal.";
    RUN_STARTED_ONCE = "run.started.once", "§7.1",
        "run.started occurs exactly once per runId.";
    RUN_STARTED_ROOT = "run.started.root", "§3.3",
        "A top-level run is its own rootRunId; a nested run keeps its parent's rootRunId.";
    RUN_NESTED_PARENT = "run.nested.parent", "§3.3",
        "A nested run's parentRunId names a started run.";
    RUN_PAUSE_SINGLE = "run.pause.single", "§6.1, §7.2",
        "At most one pause cycle is open per run: only a running run pauses.";
    RUN_PAUSED_INTERRUPT = "run.paused.interrupt", "§7.2, §7.6",
        "A pause that names an interrupt names an open interrupt of the run with the same waitId.";
    RUN_RESUME_NOT_PAUSED = "run.resume.not-paused", "§6.1",
        "Only a paused run resumes.";
    RUN_RESUME_WAIT = "run.resume.wait-mismatch", "§7.3",
        "run.resumed carries the waitId of the open pause.";
    RUN_RESUME_INTERRUPT_OPEN = "run.resume.interrupt-open", "§6.4, §7.7",
        "A pause that waits on an interrupt resumes only after the interrupt is resolved.";
    RUN_PAUSED_NO_NEW_WORK = "run.paused.no-new-work", "§6.4",
        "A paused run starts no tool calls and no child runs.";
    RUN_TERMINAL_PAUSED = "run.terminal.paused", "§6.1",
        "A paused run resumes before it emits a terminal.";
    RUN_TERMINAL_OPEN_WORK = "run.terminal.open-work", "§6.2",
        "No terminal while the run owns an open child run, tool call or interrupt.";
    RUN_TERMINAL_ONCE = "run.terminal.once", "§7.5",
        "A run has exactly one terminal.";
    RUN_TERMINAL_FINAL = "run.terminal.final", "§6.1",
        "After its terminal a run has no lifecycle, tool, interrupt or message events.";
    RUN_STOP_NO_NEW_WORK = "run.stop.no-new-work", "§6.3",
        "After run.stop.requested the target starts no child runs or tool calls.";
    RUN_STOP_TARGET = "run.stop.target", "§7.4",
        "targetRunId names an open run of the same root journal.";

    // Interrupts.
    INTERRUPT_ID_UNIQUE = "interrupt.id.unique", "§3.4",
        "An interruptId is requested once.";
    INTERRUPT_SINGLE_OPEN = "interrupt.single-open", "§3.4",
        "At most one open blocking interrupt per run (or workflow).";
    INTERRUPT_REQUESTED_RUNNING = "interrupt.requested.running", "§3.4, §7.6",
        "A blocking interrupt is requested of a running, unpaused run or workflow.";
    INTERRUPT_PAUSE_CONSECUTIVE = "interrupt.pause.consecutive", "§7.6, §9.8",
        "A blocking interrupt is followed consecutively in its journal by the pause with the same waitId and interruptId.";
    INTERRUPT_UNKNOWN = "interrupt.unknown", "§7.7",
        "interrupt.resolved names a requested interrupt.";
    INTERRUPT_RESOLVED_ONCE = "interrupt.resolved.once", "§7.7",
        "An interrupt is resolved at most once.";
    INTERRUPT_RESOLVED_WAIT = "interrupt.resolved.wait-mismatch", "§7.7",
        "interrupt.resolved carries the request's waitId.";
    INTERRUPT_RESOLVED_OWNER = "interrupt.resolved.owner", "§7.7",
        "An interrupt is resolved in the run or workflow journal that requested it.";
    INTERRUPT_DECISION = "interrupt.decision.allowed", "§7.7",
        "The decision is one of the request's actions, or expired.";
    INTERRUPT_MEMBERS_DECISION = "interrupt.members.decision", "§7.7",
        "Each member decision is one of the request's actions, or expired.";
    INTERRUPT_MEMBERS_MATCH = "interrupt.members.match", "§7.7",
        "members has one entry per member the request listed.";
    INTERRUPT_MEMBERS_FOLD = "interrupt.members.fold", "§7.7",
        "The decision is the pack fold of the members: stop wins; else all approve; else all expired; otherwise deny.";

    // Tool calls.
    TOOL_CALL_ID_UNIQUE = "tool.call.id.unique", "§3.5, §11.3",
        "A toolCallId is started once and never reassigned.";
    TOOL_CLIENT_UNBOUND = "tool.client.unbound", "§3.3, §7.8",
        "A client tool call needs the run's own clientExecutorId; a nested run does not inherit it.";
    TOOL_CALL_UNKNOWN = "tool.call.unknown", "§7.9",
        "tool.call.finished names a started tool call.";
    TOOL_CALL_FINISHED_ONCE = "tool.call.finished.once", "§7.9",
        "Exactly one finish follows each start.";
    TOOL_CALL_OWNER = "tool.call.owner", "§3.5",
        "A tool call belongs to exactly one run: it finishes in the run that started it.";

    // Workflows.
    WORKFLOW_STARTED_ONCE = "workflow.started.once", "§6.5",
        "workflow.started occurs once per workflowId.";
    WORKFLOW_UNKNOWN = "workflow.unknown", "§3.2",
        "A workflow event or workflow-owned run names a started workflow.";
    WORKFLOW_RUN_SINGLE_TOP_LEVEL = "workflow.run.single-top-level", "§3.2",
        "At most one top-level run of a workflow is active at once.";
    WORKFLOW_PAUSE_SINGLE = "workflow.pause.single", "§7.6",
        "At most one pause cycle is open per workflow.";
    WORKFLOW_PAUSED_INTERRUPT = "workflow.paused.interrupt", "§7.6",
        "workflow.paused names an open interrupt of the workflow with the same waitId.";
    WORKFLOW_RESUME_NOT_PAUSED = "workflow.resume.not-paused", "§7.7",
        "Only a paused workflow resumes.";
    WORKFLOW_RESUME_WAIT = "workflow.resume.wait-mismatch", "§7.7",
        "workflow.resumed carries the waitId of the open pause, after its interrupt is resolved.";
    WORKFLOW_TERMINAL_PAUSED = "workflow.terminal.paused", "§6.5",
        "A paused workflow resumes before it emits a terminal.";
    WORKFLOW_TERMINAL_OPEN_WORK = "workflow.terminal.open-work", "§6.5",
        "No workflow terminal while a run or an interrupt of the workflow is open.";
    WORKFLOW_TERMINAL_ONCE = "workflow.terminal.once", "§6.5",
        "A workflow has exactly one terminal.";
    WORKFLOW_TERMINAL_FINAL = "workflow.terminal.final", "§6.5",
        "After its terminal a workflow starts no runs, steps or interrupts.";

    // Conversation.
    MESSAGE_ID_UNIQUE = "message.id.unique", "§9.2",
        "A messageId is recorded or started once.";
    MESSAGE_TEXT_NOT_STARTED = "message.text.not-started", "§9.2",
        "message.text.delta and .completed follow message.text.started.";
    MESSAGE_TEXT_COMPLETED = "message.text.completed.final", "§9.2",
        "Nothing follows message.text.completed for that message.";
    MESSAGE_SCOPE_MATCH = "message.scope.match", "§9.2",
        "A streamed message's events carry the ordering fields of the scope it started in.";
    MESSAGE_UNKNOWN = "message.unknown", "§9.4",
        "message.redacted names a recorded or started message.";
    REASONING_ID_UNIQUE = "reasoning.id.unique", "§9.2",
        "A reasoningId is started once.";
    REASONING_NOT_STARTED = "reasoning.not-started", "§9.2",
        "reasoning.delta and .completed follow reasoning.started.";
    REASONING_COMPLETED = "reasoning.completed.final", "§9.2",
        "Nothing follows reasoning.completed for that reasoning stream.";

    // Attachments and artifacts.
    ATTACHMENT_ID_UNIQUE = "attachment.id.unique", "§9.5",
        "An attachmentId is added once.";
    ATTACHMENT_UNKNOWN = "attachment.unknown", "§9.5",
        "attachment.ready, .failed and .removed name an added, not removed attachment.";
    ARTIFACT_ID_UNIQUE = "artifact.id.unique", "§9.5",
        "An artifactId is added once.";
    ARTIFACT_UNKNOWN = "artifact.unknown", "§9.5",
        "artifact.ready and .failed name an added artifact.";

    // State and UI documents.
    STATE_REVISION_BASE = "state.revision.base", "§9.6",
        "A delta's baseRevision is the document's current revision.";
    STATE_REVISION_CONTIGUOUS = "state.revision.contiguous", "§9.6",
        "A delta's revision equals baseRevision + 1.";
    STATE_REVISION_REGRESS = "state.revision.regress", "§9.6",
        "A snapshot's revision is not below the document's current revision.";
    STATE_PATCH_APPLIES = "state.patch.applies", "§9.6",
        "A delta's RFC 6902 patch applies to the current document.";
    STATE_COMPACTED_BOUNDS = "state.compacted.bounds", "§9.6",
        "state.compacted covers only earlier authority and existing revisions.";
    VIEW_ID_UNIQUE = "view.id.unique", "§9.6",
        "A viewId is opened once.";
    VIEW_UNKNOWN = "view.unknown", "§9.6",
        "view.updated and view.closed name an open view.";
    VIEW_PATCH_APPLIES = "view.patch.applies", "§9.6",
        "A view update with operation=patch applies to the view's state.";

    // Progress.
    PROGRESS_AFTER_TERMINAL = "progress.after-terminal", "§9.8",
        "Progress is not recorded after its run's terminal.";

    // Who may issue what (the journal knows who appends: engine::Issuer).
    ISSUER_ACTOR = "issuer.actor.server-stamped", "§7.7, §12",
        "Actor provenance is stamped by the server on the events of commands; a backend's proposal carries none.";
    ISSUER_BACKEND_DECISION = "issuer.backend.decision", "§7.7, §12",
        "A backend resolves an interrupt only with expired; any other decision comes from a person's resolve-interrupt.";
    ISSUER_PERSON_EXPIRED = "issuer.person.expired", "§7.7",
        "expired is reserved for backend expiry: a person's resolution never decides expired.";
    ISSUER_CLIENT_RESULT = "issuer.backend.client-result", "§11.3, §12",
        "A client call's result comes only from a finish under its execution token, and its error closes (client_execution_expired once its token expired; client_unavailable or delivery_failed when delivery was not accepted) only from the server that issues the token and delivers the call: a backend closes one only as cancelled under a stop, with a null response.";

    // Delivery (the client reducer).
    DELIVERY_GAP = "delivery.gap", "§10.1, §10.3",
        "Delivered authority has no gap in sessionSequence; a client re-reads history instead of applying past one.";
    DELIVERY_CONFLICT = "delivery.conflict", "§4.1, §10.1",
        "A re-delivered event keeps its eventId and sequence; two events never share one.";
    WATCH_REVISION_REGRESS = "watch.revision.regress", "§4.2, §8",
        "A watch scope's revision never regresses.";
}

/// The rule with this id.
pub fn by_id(id: &str) -> Option<&'static Rule> {
    ALL.iter().find(|r| r.id == id)
}

/// A broken rule: which one, by which event, and a sentence saying what
/// happened and what the issuer should do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    /// The rule.
    pub rule: &'static str,
    /// The offending event, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<EventId>,
    /// The JSON pointer of the offending field within the event, when one
    /// field is at fault (e.g. `/decision`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What happened.
    pub message: String,
}

impl Violation {
    /// A violation of `rule`.
    pub fn new(rule: Rule, message: impl Into<String>) -> Self {
        Self {
            rule: rule.id,
            event_id: None,
            field: None,
            message: message.into(),
        }
    }

    /// The same violation, pointing at a field of the event.
    pub fn field(mut self, pointer: impl Into<String>) -> Self {
        self.field = Some(pointer.into());
        self
    }

    /// The same violation, naming the offending event.
    pub fn at(mut self, event_id: &EventId) -> Self {
        self.event_id = Some(event_id.clone());
        self
    }

    /// The rule broken.
    pub fn rule(&self) -> &'static Rule {
        by_id(self.rule).expect("violations name registered rules")
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] ", self.rule)?;
        if let Some(e) = &self.event_id {
            write!(f, "event {e}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for Violation {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_doc_matches_the_registry() {
        let doc = include_str!("../../../docs/rules.md");
        let rows: Vec<(String, String, String)> = doc
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                (
                    cells[0]
                        .trim_start_matches("| ")
                        .trim_matches('`')
                        .to_owned(),
                    cells[1].to_owned(),
                    cells[2].trim_end_matches(" |").to_owned(),
                )
            })
            .collect();
        let registry: Vec<(String, String, String)> = ALL
            .iter()
            .map(|r| (r.id.to_owned(), r.section.to_owned(), r.summary.to_owned()))
            .collect();
        assert_eq!(rows, registry, "docs/rules.md and rules::ALL disagree");
    }

    #[test]
    fn rule_ids_are_unique_and_dotted() {
        let mut seen = std::collections::HashSet::new();
        for r in ALL {
            assert!(seen.insert(r.id), "{} is listed twice", r.id);
            assert!(
                r.id.contains('.') && r.id == r.id.to_lowercase(),
                "{}",
                r.id
            );
            assert!(r.section.starts_with('§'), "{}", r.id);
        }
    }
}
