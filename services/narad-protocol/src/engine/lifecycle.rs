//! Runs, interrupts, tool calls and workflows (§3, §6, §7, §9.1, §9.8).
//!
//! Every handler checks first and mutates last, so that a refused event
//! leaves the state unchanged.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Applied, InterruptState, Owner, PendingPause, RunState, SessionState, Slot, Status,
    ToolCallState, WorkflowState, violation,
};
use crate::authority::Resumed;
use crate::authority::{
    Executor, InterruptRequested, InterruptResolved, RunPaused, RunStarted, RunStopRequested,
    ToolCallFinished, ToolCallStarted, WorkflowPaused,
};
use crate::primitives::{InterruptId, RunId, WorkflowId};
use crate::rules::{self, Violation};
use crate::wire::AuthorityEvent;

/// The decision every interrupt may be resolved with by backend expiry.
pub const EXPIRED: &str = "expired";

impl SessionState {
    pub(super) fn run_started(
        &mut self,
        event: &AuthorityEvent,
        b: &RunStarted,
    ) -> Result<Applied, Violation> {
        let pos = event
            .envelope
            .run
            .as_ref()
            .expect("run.started is run-tree");
        let run_id = &pos.run_id;
        if self.runs.contains_key(run_id) {
            return Err(violation(
                rules::RUN_STARTED_ONCE,
                format!("run {run_id} has already started"),
            ));
        }
        let workflow = self.workflow_position(event).map(|w| &w.workflow_id);
        match &b.parent_run_id {
            None => {
                if run_id != &pos.root_run_id {
                    return Err(violation(
                        rules::RUN_STARTED_ROOT,
                        format!(
                            "top-level run {run_id} names rootRunId {}; a top-level run is its own root (or name its parentRunId)",
                            pos.root_run_id
                        ),
                    ));
                }
                self.check_top_level_slot(run_id, workflow)?;
            }
            Some(parent_id) => {
                if run_id == &pos.root_run_id {
                    return Err(violation(
                        rules::RUN_STARTED_ROOT,
                        format!("nested run {run_id} cannot be its own rootRunId"),
                    ));
                }
                let Some(parent) = self.runs.get(parent_id) else {
                    return Err(violation(
                        rules::RUN_NESTED_PARENT,
                        format!("parent run {parent_id} has not started"),
                    ));
                };
                if parent.root_run_id != pos.root_run_id {
                    return Err(violation(
                        rules::RUN_STARTED_ROOT,
                        format!(
                            "nested run {run_id} names rootRunId {} but its parent {parent_id} belongs to {}",
                            pos.root_run_id, parent.root_run_id
                        ),
                    ));
                }
                no_new_work(parent_id, parent, "child runs")?;
                self.check_workflow_position(event, parent.workflow_id.as_ref(), run_id)?;
            }
        }
        // Accepted: record the run and what it occupies.
        self.runs.insert(
            run_id.clone(),
            RunState {
                root_run_id: pos.root_run_id.clone(),
                parent_run_id: b.parent_run_id.clone(),
                workflow_id: workflow.cloned(),
                client_executor_id: b.client_executor_id.clone(),
                status: Status::Running,
                stop_requested: false,
                open_children: BTreeSet::new(),
                open_tool_calls: BTreeSet::new(),
                open_interrupts: BTreeMap::new(),
            },
        );
        if let Some(parent_id) = &b.parent_run_id {
            self.run_mut(parent_id).open_children.insert(run_id.clone());
        }
        match workflow {
            Some(w) => {
                let wf = self.workflows.get_mut(w).expect("checked");
                wf.open_runs.insert(run_id.clone());
                if b.parent_run_id.is_none() {
                    wf.active_top_level_run = Some(run_id.clone());
                }
            }
            None if b.parent_run_id.is_none() => {
                self.slot = Some(Slot::Run {
                    run_id: run_id.clone(),
                });
            }
            None => {}
        }
        Ok(Applied::default())
    }

    /// §3.1 and §3.2: a top-level run needs the free session slot, or the
    /// slot of its own open workflow with no other top-level run active.
    fn check_top_level_slot(
        &self,
        run_id: &RunId,
        workflow: Option<&WorkflowId>,
    ) -> Result<(), Violation> {
        match (workflow, &self.slot) {
            (None, None) => Ok(()),
            (None, Some(active)) => Err(violation(
                rules::SESSION_SLOT,
                format!(
                    "top-level run {run_id} cannot start while {} holds the session's slot",
                    describe_slot(active)
                ),
            )),
            (Some(w), _) => {
                let wf = &self.workflows[w];
                if wf.status.is_terminal() {
                    return Err(violation(
                        rules::WORKFLOW_TERMINAL_FINAL,
                        format!("workflow {w} has ended; it starts no runs"),
                    ));
                }
                if let Some(active) = &wf.active_top_level_run {
                    return Err(violation(
                        rules::WORKFLOW_RUN_SINGLE_TOP_LEVEL,
                        format!(
                            "top-level run {run_id} cannot start while run {active} is workflow {w}'s active top-level run"
                        ),
                    ));
                }
                Ok(())
            }
        }
    }

    pub(super) fn run_paused(
        &mut self,
        event: &AuthorityEvent,
        b: &RunPaused,
    ) -> Result<(), Violation> {
        let (run_id, run) = self.placed_run(event)?.expect("run-tree");
        let run_id = run_id.clone();
        if run.status.is_terminal() {
            return Err(ended(&run_id, "run.paused"));
        }
        if let Status::Paused { wait_id, .. } = &run.status {
            return Err(violation(
                rules::RUN_PAUSE_SINGLE,
                format!("run {run_id} is already paused (waitId {wait_id}); resume it first"),
            ));
        }
        if let Some(i) = &b.interrupt_id {
            let ok = self.interrupts.get(i).is_some_and(|s| {
                s.owner
                    == (Owner::Run {
                        run_id: run_id.clone(),
                    })
                    && s.decision.is_none()
                    && s.wait_id == b.wait_id
            });
            if !ok {
                return Err(violation(
                    rules::RUN_PAUSED_INTERRUPT,
                    format!(
                        "run {run_id} pauses on interrupt {i}, which is not an open interrupt of this run with waitId {}",
                        b.wait_id
                    ),
                ));
            }
        }
        self.run_mut(&run_id).status = Status::Paused {
            wait_id: b.wait_id.clone(),
            interrupt_id: b.interrupt_id.clone(),
        };
        Ok(())
    }

    pub(super) fn run_resumed(
        &mut self,
        event: &AuthorityEvent,
        b: &Resumed,
    ) -> Result<(), Violation> {
        let (run_id, run) = self.placed_run(event)?.expect("run-tree");
        let run_id = run_id.clone();
        if run.status.is_terminal() {
            return Err(ended(&run_id, "run.resumed"));
        }
        let Status::Paused {
            wait_id,
            interrupt_id,
        } = &run.status
        else {
            return Err(violation(
                rules::RUN_RESUME_NOT_PAUSED,
                format!("run {run_id} is not paused"),
            ));
        };
        if wait_id != &b.wait_id {
            return Err(violation(
                rules::RUN_RESUME_WAIT,
                format!(
                    "run {run_id} is paused on waitId {wait_id}, not {}",
                    b.wait_id
                ),
            ));
        }
        if let Some(i) = interrupt_id
            && run.open_interrupts.contains_key(i)
        {
            return Err(violation(
                rules::RUN_RESUME_INTERRUPT_OPEN,
                format!("run {run_id} waits on interrupt {i}, which is not resolved yet"),
            ));
        }
        self.run_mut(&run_id).status = Status::Running;
        Ok(())
    }

    pub(super) fn run_stop_requested(
        &mut self,
        event: &AuthorityEvent,
        b: &RunStopRequested,
    ) -> Result<(), Violation> {
        let (_, owner) = self.placed_run(event)?.expect("run-tree");
        let root = owner.root_run_id.clone();
        let target = &b.target_run_id;
        match self.runs.get(target) {
            Some(t) if t.root_run_id == root && !t.status.is_terminal() => {}
            Some(t) if t.status.is_terminal() => {
                return Err(violation(
                    rules::RUN_STOP_TARGET,
                    format!("run {target} has already ended; there is nothing to stop"),
                ));
            }
            _ => {
                return Err(violation(
                    rules::RUN_STOP_TARGET,
                    format!("targetRunId {target} is not a run of run journal {root}"),
                ));
            }
        }
        self.run_mut(target).stop_requested = true;
        Ok(())
    }

    pub(super) fn run_terminal(
        &mut self,
        event: &AuthorityEvent,
        status: Status,
    ) -> Result<Applied, Violation> {
        let name = event.body.wire_type().name();
        let (run_id, run) = self.placed_run(event)?.expect("run-tree");
        let run_id = run_id.clone();
        if run.status.is_terminal() {
            return Err(violation(
                rules::RUN_TERMINAL_ONCE,
                format!("run {run_id} has already ended; {name} would be a second terminal"),
            ));
        }
        if let Status::Paused { wait_id, .. } = &run.status {
            return Err(violation(
                rules::RUN_TERMINAL_PAUSED,
                format!(
                    "run {run_id} is paused (waitId {wait_id}); emit run.resumed before {name}"
                ),
            ));
        }
        let mut open = Vec::new();
        open.extend(run.open_children.iter().map(|c| format!("child run {c}")));
        open.extend(run.open_tool_calls.iter().map(|t| format!("tool call {t}")));
        open.extend(run.open_interrupts.keys().map(|i| format!("interrupt {i}")));
        if !open.is_empty() {
            return Err(violation(
                rules::RUN_TERMINAL_OPEN_WORK,
                format!(
                    "{name} of run {run_id} while it owns open work ({}): close, cancel or fail it first",
                    open.join(", ")
                ),
            ));
        }
        let parent = run.parent_run_id.clone();
        let workflow = run.workflow_id.clone();
        self.run_mut(&run_id).status = status;
        if let Some(p) = parent {
            self.run_mut(&p).open_children.remove(&run_id);
        }
        if let Some(w) = workflow {
            let wf = self.workflows.get_mut(&w).expect("a run's workflow exists");
            wf.open_runs.remove(&run_id);
            if wf.active_top_level_run.as_ref() == Some(&run_id) {
                wf.active_top_level_run = None;
            }
        }
        let frees = self.slot == Some(Slot::Run { run_id });
        if frees {
            self.slot = None;
        }
        Ok(Applied { slot_freed: frees })
    }

    pub(super) fn interrupt_requested(
        &mut self,
        event: &AuthorityEvent,
        b: &InterruptRequested,
    ) -> Result<(), Violation> {
        let id = &b.interrupt_id;
        if self.interrupts.contains_key(id) {
            return Err(violation(
                rules::INTERRUPT_ID_UNIQUE,
                format!("interrupt {id} was already requested"),
            ));
        }
        let blocking = b.is_blocking();
        let owner = match self.placed_run(event)? {
            Some((run_id, run)) => {
                if run.status.is_terminal() {
                    return Err(ended(run_id, "interrupt.requested"));
                }
                if blocking {
                    self.no_open_blocking(&run.open_interrupts, &format!("run {run_id}"))?;
                    if run.status.is_paused() {
                        return Err(violation(
                            rules::INTERRUPT_REQUESTED_RUNNING,
                            format!(
                                "run {run_id} is paused; a blocking interrupt needs a running run to pause"
                            ),
                        ));
                    }
                }
                Owner::Run {
                    run_id: run_id.clone(),
                }
            }
            None => {
                let (w, wf) = self.workflow_open(event)?.expect("workflow scope");
                if blocking {
                    self.no_open_blocking(&wf.open_interrupts, &format!("workflow {w}"))?;
                    if wf.status.is_paused() {
                        return Err(violation(
                            rules::INTERRUPT_REQUESTED_RUNNING,
                            format!(
                                "workflow {w} is paused; a blocking interrupt needs a running workflow to pause"
                            ),
                        ));
                    }
                }
                Owner::Workflow {
                    workflow_id: w.clone(),
                }
            }
        };
        let members = b
            .input
            .as_ref()
            .and_then(|i| i.get("members"))
            .and_then(|m| m.as_array())
            .map(|m| {
                m.iter()
                    .filter_map(|x| x.get("requestId")?.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let pending = blocking.then(|| PendingPause {
            run_id: match &owner {
                Owner::Run { run_id } => Some(run_id.clone()),
                Owner::Workflow { .. } => None,
            },
            interrupt_id: id.clone(),
            wait_id: b.wait_id.clone(),
        });
        match &owner {
            Owner::Run { run_id } => {
                let root = self.runs[run_id].root_run_id.clone();
                self.run_mut(run_id)
                    .open_interrupts
                    .insert(id.clone(), blocking);
                if pending.is_some() {
                    self.run_journals
                        .get_mut(&root)
                        .expect("exists")
                        .pending_pause = pending;
                }
            }
            Owner::Workflow { workflow_id } => {
                let wf = self.workflows.get_mut(workflow_id).expect("exists");
                wf.open_interrupts.insert(id.clone(), blocking);
                if pending.is_some() {
                    wf.pending_pause = pending;
                }
            }
        }
        self.interrupts.insert(
            id.clone(),
            InterruptState {
                owner,
                wait_id: b.wait_id.clone(),
                actions: b.actions.iter().map(|a| a.as_str().to_owned()).collect(),
                blocking,
                members,
                decision: None,
            },
        );
        Ok(())
    }

    fn no_open_blocking(
        &self,
        open: &BTreeMap<InterruptId, bool>,
        who: &str,
    ) -> Result<(), Violation> {
        match open.iter().find(|(_, blocking)| **blocking).map(|(i, _)| i) {
            Some(i) => Err(violation(
                rules::INTERRUPT_SINGLE_OPEN,
                format!("{who} already has open blocking interrupt {i}"),
            )),
            None => Ok(()),
        }
    }

    pub(super) fn interrupt_resolved(
        &mut self,
        event: &AuthorityEvent,
        b: &InterruptResolved,
    ) -> Result<(), Violation> {
        let id = &b.interrupt_id;
        let Some(req) = self.interrupts.get(id) else {
            return Err(violation(
                rules::INTERRUPT_UNKNOWN,
                format!("interrupt {id} was never requested"),
            ));
        };
        if let Some(d) = &req.decision {
            return Err(violation(
                rules::INTERRUPT_RESOLVED_ONCE,
                format!("interrupt {id} was already resolved with decision {d:?}"),
            ));
        }
        if req.wait_id != b.wait_id {
            return Err(violation(
                rules::INTERRUPT_RESOLVED_WAIT,
                format!(
                    "interrupt {id} belongs to waitId {}, not {}",
                    req.wait_id, b.wait_id
                ),
            ));
        }
        let placed = self.placed_run(event)?.map(|(r, _)| r.clone());
        let in_owner = match &req.owner {
            Owner::Run { run_id } => placed.as_ref() == Some(run_id),
            Owner::Workflow { workflow_id } => {
                placed.is_none()
                    && self.workflow_position(event).map(|w| &w.workflow_id) == Some(workflow_id)
            }
        };
        if !in_owner {
            return Err(violation(
                rules::INTERRUPT_RESOLVED_OWNER,
                format!(
                    "interrupt {id} belongs to {}; resolve it in that journal",
                    describe_owner(&req.owner)
                ),
            ));
        }
        let allowed = |d: &str| d == EXPIRED || req.actions.iter().any(|a| a == d);
        if !allowed(b.decision.as_str()) {
            return Err(violation(
                rules::INTERRUPT_DECISION,
                format!(
                    "decision {:?} is not among interrupt {id}'s actions {:?} (or expired)",
                    b.decision.as_str(),
                    req.actions
                ),
            ));
        }
        if let Some(members) = &b.members {
            if let Some(m) = members.iter().find(|m| !allowed(m.decision.as_str())) {
                return Err(violation(
                    rules::INTERRUPT_MEMBERS_DECISION,
                    format!(
                        "member {} decided {:?}, which is not among the actions {:?} (or expired)",
                        m.request_id,
                        m.decision.as_str(),
                        req.actions
                    ),
                ));
            }
            let given: Vec<&str> = members.iter().map(|m| m.request_id.as_str()).collect();
            let unique: BTreeSet<&str> = given.iter().copied().collect();
            let listed: BTreeSet<&str> = req.members.iter().map(String::as_str).collect();
            if unique.len() != given.len() || unique != listed {
                return Err(violation(
                    rules::INTERRUPT_MEMBERS_MATCH,
                    format!(
                        "members {given:?} do not match, one each, the members the request listed {:?}",
                        req.members
                    ),
                ));
            }
            let fold = fold_members(members.iter().map(|m| m.decision.as_str()));
            if fold != b.decision.as_str() {
                return Err(violation(
                    rules::INTERRUPT_MEMBERS_FOLD,
                    format!(
                        "the members fold to {fold:?} (stop wins; else all approve; else all expired; otherwise deny), not {:?}",
                        b.decision.as_str()
                    ),
                ));
            }
        }
        let owner = req.owner.clone();
        self.interrupts.get_mut(id).expect("exists").decision =
            Some(b.decision.as_str().to_owned());
        match owner {
            Owner::Run { run_id } => {
                self.run_mut(&run_id).open_interrupts.remove(id);
            }
            Owner::Workflow { workflow_id } => {
                self.workflows
                    .get_mut(&workflow_id)
                    .expect("exists")
                    .open_interrupts
                    .remove(id);
            }
        }
        Ok(())
    }

    pub(super) fn tool_call_started(
        &mut self,
        event: &AuthorityEvent,
        b: &ToolCallStarted,
    ) -> Result<(), Violation> {
        let (run_id, run) = self.placed_run(event)?.expect("run-tree");
        let id = &b.tool_call_id;
        if self.tool_calls.contains_key(id) {
            return Err(violation(
                rules::TOOL_CALL_ID_UNIQUE,
                format!("tool call {id} was already started; a retry uses a new toolCallId"),
            ));
        }
        no_new_work(run_id, run, "tool calls")?;
        if b.executor == Executor::Client && run.client_executor_id.is_none() {
            return Err(violation(
                rules::TOOL_CLIENT_UNBOUND,
                format!(
                    "run {run_id} has no clientExecutorId of its own, so it cannot start client tool call {id}"
                ),
            ));
        }
        let run_id = run_id.clone();
        self.run_mut(&run_id).open_tool_calls.insert(id.clone());
        self.tool_calls.insert(
            id.clone(),
            ToolCallState {
                run_id,
                tool_name: b.tool_name.clone(),
                executor: b.executor,
                outcome: None,
            },
        );
        Ok(())
    }

    pub(super) fn tool_call_finished(
        &mut self,
        event: &AuthorityEvent,
        b: &ToolCallFinished,
    ) -> Result<(), Violation> {
        let (run_id, _) = self.placed_run(event)?.expect("run-tree");
        let id = &b.tool_call_id;
        let Some(call) = self.tool_calls.get(id) else {
            return Err(violation(
                rules::TOOL_CALL_UNKNOWN,
                format!("tool call {id} was never started"),
            ));
        };
        if let Some(o) = call.outcome {
            return Err(violation(
                rules::TOOL_CALL_FINISHED_ONCE,
                format!("tool call {id} already finished ({o:?})"),
            ));
        }
        if &call.run_id != run_id {
            return Err(violation(
                rules::TOOL_CALL_OWNER,
                format!(
                    "tool call {id} belongs to run {}, not {run_id}",
                    call.run_id
                ),
            ));
        }
        let owner = call.run_id.clone();
        self.tool_calls.get_mut(id).expect("exists").outcome = Some(b.outcome);
        self.run_mut(&owner).open_tool_calls.remove(id);
        Ok(())
    }

    pub(super) fn workflow_started(&mut self, event: &AuthorityEvent) -> Result<(), Violation> {
        let w = &event
            .envelope
            .workflow
            .as_ref()
            .expect("workflow authority")
            .workflow_id;
        if let Some(active) = &self.slot {
            return Err(violation(
                rules::SESSION_SLOT,
                format!(
                    "workflow {w} cannot start while {} holds the session's slot",
                    describe_slot(active)
                ),
            ));
        }
        self.workflows.insert(
            w.clone(),
            WorkflowState {
                sequence: 0,
                status: Status::Running,
                active_top_level_run: None,
                open_runs: BTreeSet::new(),
                open_interrupts: BTreeMap::new(),
                pending_pause: None,
            },
        );
        self.slot = Some(Slot::Workflow {
            workflow_id: w.clone(),
        });
        Ok(())
    }

    pub(super) fn workflow_paused(
        &mut self,
        event: &AuthorityEvent,
        b: &WorkflowPaused,
    ) -> Result<(), Violation> {
        let (w, wf) = self.workflow_open(event)?.expect("workflow authority");
        if let Status::Paused { wait_id, .. } = &wf.status {
            return Err(violation(
                rules::WORKFLOW_PAUSE_SINGLE,
                format!("workflow {w} is already paused (waitId {wait_id})"),
            ));
        }
        let ok = self.interrupts.get(&b.interrupt_id).is_some_and(|s| {
            s.owner
                == (Owner::Workflow {
                    workflow_id: w.clone(),
                })
                && s.decision.is_none()
                && s.wait_id == b.wait_id
        });
        if !ok {
            return Err(violation(
                rules::WORKFLOW_PAUSED_INTERRUPT,
                format!(
                    "workflow {w} pauses on interrupt {}, which is not an open interrupt of this workflow with waitId {}",
                    b.interrupt_id, b.wait_id
                ),
            ));
        }
        self.workflows.get_mut(&w).expect("exists").status = Status::Paused {
            wait_id: b.wait_id.clone(),
            interrupt_id: Some(b.interrupt_id.clone()),
        };
        Ok(())
    }

    pub(super) fn workflow_resumed(
        &mut self,
        event: &AuthorityEvent,
        b: &Resumed,
    ) -> Result<(), Violation> {
        let (w, wf) = self.workflow_open(event)?.expect("workflow authority");
        let Status::Paused {
            wait_id,
            interrupt_id,
        } = &wf.status
        else {
            return Err(violation(
                rules::WORKFLOW_RESUME_NOT_PAUSED,
                format!("workflow {w} is not paused"),
            ));
        };
        let interrupt_open = interrupt_id
            .as_ref()
            .is_some_and(|i| wf.open_interrupts.contains_key(i));
        if wait_id != &b.wait_id || interrupt_open {
            return Err(violation(
                rules::WORKFLOW_RESUME_WAIT,
                format!(
                    "workflow {w} is paused on waitId {wait_id}{}; resumed with {}",
                    if interrupt_open {
                        " and its interrupt is unresolved"
                    } else {
                        ""
                    },
                    b.wait_id
                ),
            ));
        }
        self.workflows.get_mut(&w).expect("exists").status = Status::Running;
        Ok(())
    }

    pub(super) fn workflow_terminal(
        &mut self,
        event: &AuthorityEvent,
        status: Status,
    ) -> Result<Applied, Violation> {
        let name = event.body.wire_type().name();
        let w = event
            .envelope
            .workflow
            .as_ref()
            .expect("workflow authority")
            .workflow_id
            .clone();
        let wf = &self.workflows[&w];
        if wf.status.is_terminal() {
            return Err(violation(
                rules::WORKFLOW_TERMINAL_ONCE,
                format!("workflow {w} has already ended; {name} would be a second terminal"),
            ));
        }
        if let Status::Paused { wait_id, .. } = &wf.status {
            return Err(violation(
                rules::WORKFLOW_TERMINAL_PAUSED,
                format!("workflow {w} is paused (waitId {wait_id}); resume it before {name}"),
            ));
        }
        let mut open = Vec::new();
        open.extend(wf.open_runs.iter().map(|r| format!("run {r}")));
        open.extend(wf.open_interrupts.keys().map(|i| format!("interrupt {i}")));
        if !open.is_empty() {
            return Err(violation(
                rules::WORKFLOW_TERMINAL_OPEN_WORK,
                format!("{name} of workflow {w} while {} is open", open.join(", ")),
            ));
        }
        self.workflows.get_mut(&w).expect("exists").status = status;
        let frees = self.slot == Some(Slot::Workflow { workflow_id: w });
        if frees {
            self.slot = None;
        }
        Ok(Applied { slot_freed: frees })
    }

    pub(super) fn progress(&self, event: &AuthorityEvent) -> Result<(), Violation> {
        let (run_id, run) = self.placed_run(event)?.expect("run-tree");
        if run.status.is_terminal() {
            return Err(violation(
                rules::PROGRESS_AFTER_TERMINAL,
                format!("run {run_id} has ended; progress is not recorded after a terminal"),
            ));
        }
        Ok(())
    }

    /// Run extensions: about a started run, allowed even after its terminal
    /// (they never change lifecycle, §9.9).
    pub(super) fn run_annotation(&self, event: &AuthorityEvent) -> Result<(), Violation> {
        self.placed_run(event).map(|_| ())
    }

    pub(super) fn run_mut(&mut self, run_id: &RunId) -> &mut RunState {
        self.runs.get_mut(run_id).expect("the run exists")
    }
}

/// §6.3, §6.4 and §6.1: a run that is stopping, paused or ended starts no
/// new work.
fn no_new_work(run_id: &RunId, run: &RunState, what: &str) -> Result<(), Violation> {
    if run.status.is_terminal() {
        return Err(ended(run_id, what));
    }
    if run.status.is_paused() {
        return Err(violation(
            rules::RUN_PAUSED_NO_NEW_WORK,
            format!("run {run_id} is paused; it starts no {what} until it resumes"),
        ));
    }
    if run.stop_requested {
        return Err(violation(
            rules::RUN_STOP_NO_NEW_WORK,
            format!("run {run_id} was asked to stop; it starts no new {what}"),
        ));
    }
    Ok(())
}

/// A violation of `run.terminal.final`.
pub(super) fn ended(run_id: &RunId, what: &str) -> Violation {
    violation(
        rules::RUN_TERMINAL_FINAL,
        format!("run {run_id} has ended; it takes no {what}"),
    )
}

/// The pack fold of member decisions (§7.7): stop wins; else all approve;
/// else all expired; otherwise deny.
pub fn fold_members<'a>(decisions: impl Iterator<Item = &'a str> + Clone) -> &'static str {
    if decisions.clone().any(|d| d == "stop") {
        "stop"
    } else if decisions.clone().all(|d| d == "approve") {
        "approve"
    } else if decisions.clone().all(|d| d == EXPIRED) {
        EXPIRED
    } else {
        "deny"
    }
}

fn describe_slot(slot: &Slot) -> String {
    match slot {
        Slot::Run { run_id } => format!("run {run_id}"),
        Slot::Workflow { workflow_id } => format!("workflow {workflow_id}"),
    }
}

fn describe_owner(owner: &Owner) -> String {
    match owner {
        Owner::Run { run_id } => format!("run {run_id}"),
        Owner::Workflow { workflow_id } => format!("workflow {workflow_id}"),
    }
}
