//! Closing a run journal whose runtime is gone, with ordinary authority
//! events (§6.2, §6.3).
//!
//! Pure functions of the engine's state: given what is open in one run
//! journal, they propose the events that close it in an order the rules
//! accept. The journal assigns their sequences and the rule engine checks
//! them like any batch.
//!
//! Order: a blocking workflow-scope interrupt of the owning workflow still
//! owed its `workflow.paused` gets it, and so does a run's (§7.6); then,
//! for every run of the journal, deepest first, the run's open tool
//! calls finish `cancelled`; its open interrupts resolve `expired` (§7.7);
//! its pause cycle resumes (§6.4: a paused run resumes before a terminal);
//! and it ends. A parent ends after its children (§6.2).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::authority::Executor;
use crate::engine::{SessionState, Status};
use crate::primitives::{EventId, RunId};

/// How the runs of a journal end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// `run.error` with this code and message (the runtime was lost).
    Error {
        /// The machine code, e.g. `runtime_lost`.
        code: String,
        /// User-safe text.
        message: String,
    },
    /// `run.cancelled` with this code and message (a stop nobody served).
    Cancelled {
        /// The machine code.
        code: String,
        /// User-safe text.
        message: String,
    },
}

impl Closing {
    fn code(&self) -> &str {
        match self {
            Closing::Error { code, .. } | Closing::Cancelled { code, .. } => code,
        }
    }

    fn message(&self) -> &str {
        match self {
            Closing::Error { message, .. } | Closing::Cancelled { message, .. } => message,
        }
    }
}

/// The pause reason of a blocking interrupt's owed pause, when the server
/// writes it while repairing the journal.
pub const REPAIR_PAUSE_REASON: &str = "narad.runtime_lost";

fn proposal(kind: &str, root: &RunId, run: &RunId) -> Value {
    json!({
        "protocolVersion": "narad/v1", "type": kind, "eventId": EventId::new_v7(),
        "rootRunId": root, "runId": run,
    })
}

/// The owed pause of a blocking interrupt (§7.6), if the journal owes one:
/// nothing else may come next in that journal.
fn owed_pause(state: &SessionState, root: &RunId) -> Option<(RunId, Value)> {
    let pending = state.run_journals.get(root)?.pending_pause.as_ref()?;
    let run = pending.run_id.clone()?;
    let mut e = proposal("run.paused", root, &run);
    e["waitId"] = json!(pending.wait_id);
    e["interruptId"] = json!(pending.interrupt_id);
    e["reason"] = json!(REPAIR_PAUSE_REASON);
    e["resumeMode"] = json!("command");
    Some((run, e))
}

/// The owed pause of the workflow that owns journal `root`, if a
/// blocking workflow-scope interrupt awaits its `workflow.paused`: every
/// event of a workflow-owned run takes a workflowSequence, so nothing of
/// the run may come before that pause (§7.6).
fn owed_workflow_pause(state: &SessionState, root: &RunId) -> Option<Value> {
    let workflow = state.runs.get(root)?.workflow_id.as_ref()?;
    let pending = state.workflows.get(workflow)?.pending_pause.as_ref()?;
    Some(json!({
        "protocolVersion": "narad/v1", "type": "workflow.paused", "eventId": EventId::new_v7(),
        "workflowId": workflow, "waitId": pending.wait_id, "interruptId": pending.interrupt_id,
        "reason": REPAIR_PAUSE_REASON, "resumeMode": "command",
    }))
}

/// The open runs of a journal, deepest first (children before parents),
/// then by id.
fn open_runs_deepest_first(state: &SessionState, root: &RunId) -> Vec<RunId> {
    let depth = |id: &RunId| {
        let mut d = 0usize;
        let mut at = state.runs.get(id);
        while let Some(parent) = at.and_then(|r| r.parent_run_id.as_ref()) {
            d += 1;
            at = state.runs.get(parent);
        }
        d
    };
    let mut runs: Vec<(usize, RunId)> = state
        .runs
        .iter()
        .filter(|(_, r)| &r.root_run_id == root && !r.status.is_terminal())
        .map(|(id, _)| (depth(id), id.clone()))
        .collect();
    runs.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    runs.into_iter().map(|(_, id)| id).collect()
}

fn finish_call(root: &RunId, run: &RunId, call: &str, how: &Closing) -> Value {
    let mut e = proposal("tool.call.finished", root, run);
    e["toolCallId"] = json!(call);
    e["outcome"] = json!("cancelled");
    e["response"] = Value::Null;
    e["code"] = json!(how.code());
    e["message"] = json!(how.message());
    e
}

/// The events that close every open run of journal `root`, with all their
/// open work, ending each as `how` says. Empty when nothing is open.
pub fn close_journal(state: &SessionState, root: &RunId, how: &Closing) -> Vec<Value> {
    let mut events: Vec<Value> = owed_workflow_pause(state, root).into_iter().collect();
    // Pause status as the events below leave it.
    let mut paused: BTreeMap<RunId, String> = state
        .runs
        .iter()
        .filter(|(_, r)| &r.root_run_id == root)
        .filter_map(|(id, r)| match &r.status {
            Status::Paused { wait_id, .. } => Some((id.clone(), wait_id.to_string())),
            _ => None,
        })
        .collect();
    if let Some((run, pause)) = owed_pause(state, root) {
        paused.insert(run, pause["waitId"].as_str().unwrap_or_default().to_owned());
        events.push(pause);
    }
    for run_id in open_runs_deepest_first(state, root) {
        let run = &state.runs[&run_id];
        for call in &run.open_tool_calls {
            events.push(finish_call(root, &run_id, call.as_str(), how));
        }
        for interrupt_id in run.open_interrupts.keys() {
            let Some(interrupt) = state.interrupts.get(interrupt_id) else {
                continue;
            };
            let mut e = proposal("interrupt.resolved", root, &run_id);
            e["interruptId"] = json!(interrupt_id);
            e["waitId"] = json!(interrupt.wait_id);
            e["decision"] = json!(crate::engine::EXPIRED);
            e["reason"] = json!(how.code());
            events.push(e);
        }
        if let Some(wait_id) = paused.remove(&run_id) {
            let mut e = proposal("run.resumed", root, &run_id);
            e["waitId"] = json!(wait_id);
            events.push(e);
        }
        let mut end = match how {
            Closing::Error { .. } => proposal("run.error", root, &run_id),
            Closing::Cancelled { .. } => proposal("run.cancelled", root, &run_id),
        };
        end["code"] = json!(how.code());
        end["message"] = json!(how.message());
        events.push(end);
    }
    events
}

/// The events that cancel the open backend tool calls of journal `root`
/// (a lost runtime's calls, whose results nobody will report), so that a
/// retrying runtime starts from a journal with no dangling call. Client
/// tool calls stay open: their executor still finishes them. A blocking
/// interrupt owed its pause gets it first. Empty when no backend call is open.
pub fn cancel_backend_calls(state: &SessionState, root: &RunId, how: &Closing) -> Vec<Value> {
    let mut events = Vec::new();
    let mut calls = Vec::new();
    for run_id in open_runs_deepest_first(state, root) {
        for call in &state.runs[&run_id].open_tool_calls {
            if state
                .tool_calls
                .get(call)
                .is_none_or(|c| c.executor == Executor::Backend)
            {
                calls.push(finish_call(root, &run_id, call.as_str(), how));
            }
        }
    }
    if calls.is_empty() {
        return events;
    }
    events.extend(owed_workflow_pause(state, root));
    if let Some((_, pause)) = owed_pause(state, root) {
        events.push(pause);
    }
    events.extend(calls);
    events
}
