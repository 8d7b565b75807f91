//! A model of the protocol that generates valid sessions: nested runs,
//! tool calls, interrupts, pauses, stops, workflows and messages, written
//! independently of the rule engine. Tests use it to check the engine, the
//! reducer and the journal against a second reading of the rules;
//! benchmarks use it for realistic workloads.

use serde_json::{Value, json};

#[derive(Clone, Debug, PartialEq)]
enum RunStatus {
    Running,
    Paused {
        wait: String,
        interrupt: Option<(String, bool)>,
    },
    Done,
}

#[derive(Clone, Debug)]
struct Run {
    id: String,
    root: String,
    workflow: Option<String>,
    bound: bool,
    status: RunStatus,
    stop: bool,
    open_tools: Vec<String>,
    open_children: usize,
    parent: Option<usize>,
}

#[derive(Clone, Debug)]
struct Workflow {
    id: String,
    done: bool,
    top_active: bool,
    open_runs: usize,
}

/// One possible next step of the model.
type Action = Box<dyn Fn(&mut Model)>;

/// A model of one session that only ever proposes valid next events.
#[derive(Default)]
struct Model {
    session_id: String,
    events: Vec<Value>,
    seq: u64,
    root_seq: std::collections::BTreeMap<String, u64>,
    wf_seq: std::collections::BTreeMap<String, u64>,
    runs: Vec<Run>,
    workflows: Vec<Workflow>,
    slot_taken: bool,
    next_id: u64,
}

impl Model {
    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{}", self.next_id)
    }

    fn push(&mut self, ty: &str, run: Option<usize>, workflow: Option<&str>, body: Value) {
        self.seq += 1;
        let mut e = json!({
            "protocolVersion": "narad/v1", "type": ty, "eventId": format!("{}-e{}", self.session_id, self.seq),
            "timestamp": "2026-08-05T04:00:00Z", "sessionId": self.session_id, "sessionSequence": self.seq,
        });
        let workflow = workflow
            .map(str::to_owned)
            .or_else(|| run.and_then(|r| self.runs[r].workflow.clone()));
        if let Some(r) = run {
            let root = self.runs[r].root.clone();
            let s = self.root_seq.entry(root.clone()).or_default();
            *s += 1;
            e["rootRunId"] = json!(root);
            e["runId"] = json!(self.runs[r].id);
            e["sequence"] = json!(*s);
        }
        if let Some(w) = workflow {
            let s = self.wf_seq.entry(w.clone()).or_default();
            *s += 1;
            e["workflowId"] = json!(w);
            e["workflowSequence"] = json!(*s);
        }
        for (k, v) in body.as_object().unwrap() {
            e[k] = v.clone();
        }
        self.events.push(e);
    }

    fn start_run(&mut self, parent: Option<usize>, workflow: Option<String>, bound: bool) {
        let id = self.id("run");
        let root = parent.map_or(id.clone(), |p| self.runs[p].root.clone());
        let workflow = parent.map_or(workflow, |p| self.runs[p].workflow.clone());
        self.runs.push(Run {
            id,
            root,
            workflow: workflow.clone(),
            bound,
            status: RunStatus::Running,
            stop: false,
            open_tools: vec![],
            open_children: 0,
            parent,
        });
        let r = self.runs.len() - 1;
        let mut body = json!({});
        if let Some(p) = parent {
            body["parentRunId"] = json!(self.runs[p].id);
            self.runs[p].open_children += 1;
        }
        if bound {
            body["clientExecutorId"] = json!("desktop-1");
        }
        if let Some(w) = &workflow {
            let wf = self.workflows.iter_mut().find(|x| &x.id == w).unwrap();
            wf.open_runs += 1;
            if parent.is_none() {
                wf.top_active = true;
            }
        } else if parent.is_none() {
            self.slot_taken = true;
        }
        self.push("run.started", Some(r), None, body);
    }

    /// Applies the action chosen by `choice` among those valid now.
    fn step(&mut self, choice: u8) {
        let running: Vec<usize> = (0..self.runs.len())
            .filter(|&r| self.runs[r].status == RunStatus::Running)
            .collect();
        let open: Vec<usize> = (0..self.runs.len())
            .filter(|&r| self.runs[r].status != RunStatus::Done)
            .collect();
        let mut actions: Vec<Action> = Vec::new();
        if !self.slot_taken {
            actions.push(Box::new(|m| m.start_run(None, None, m.next_id % 2 == 0)));
            actions.push(Box::new(|m| {
                let id = m.id("wf");
                m.workflows.push(Workflow {
                    id: id.clone(),
                    done: false,
                    top_active: false,
                    open_runs: 0,
                });
                m.slot_taken = true;
                m.push("workflow.started", None, Some(&id), json!({}));
            }));
        }
        for (w, wf) in self.workflows.iter().enumerate() {
            if wf.done {
                continue;
            }
            if !wf.top_active {
                actions.push(Box::new(move |m| {
                    let id = m.workflows[w].id.clone();
                    m.start_run(None, Some(id), true)
                }));
            }
            if wf.open_runs == 0 {
                actions.push(Box::new(move |m| {
                    let id = m.workflows[w].id.clone();
                    m.workflows[w].done = true;
                    m.slot_taken = false;
                    m.push("workflow.finished", None, Some(&id), json!({}));
                }));
            }
            actions.push(Box::new(move |m| {
                let id = m.workflows[w].id.clone();
                m.push(
                    "workflow.edge.taken",
                    None,
                    Some(&id),
                    json!({"from": "a", "to": "b", "caseIndex": 0}),
                );
            }));
        }
        for &r in &running {
            let run = self.runs[r].clone();
            if !run.stop {
                actions.push(Box::new(move |m| {
                    m.start_run(Some(r), None, m.next_id % 3 == 0)
                }));
                actions.push(Box::new(move |m| {
                    let tc = m.id("tc");
                    m.runs[r].open_tools.push(tc.clone());
                    let executor = if m.runs[r].bound && m.next_id % 2 == 0 { "client" } else { "backend" };
                    m.push("tool.call.started", Some(r), None, json!({"toolCallId": tc, "toolName": "x", "executor": executor, "args": {}}));
                }));
            }
            actions.push(Box::new(move |m| {
                let (i, w) = (m.id("int"), m.id("wait"));
                m.push("interrupt.requested", Some(r), None, json!({"interruptId": i, "waitId": w, "kind": "tool.approval", "actions": ["approve", "deny", "stop"]}));
                m.push("run.paused", Some(r), None, json!({"waitId": w, "interruptId": i, "reason": "interrupt", "resumeMode": "command"}));
                m.runs[r].status = RunStatus::Paused { wait: w, interrupt: Some((i, false)) };
            }));
            actions.push(Box::new(move |m| {
                let w = m.id("wait");
                m.push(
                    "run.paused",
                    Some(r),
                    None,
                    json!({"waitId": w, "reason": "capacity", "resumeMode": "automatic"}),
                );
                m.runs[r].status = RunStatus::Paused {
                    wait: w,
                    interrupt: None,
                };
            }));
            actions.push(Box::new(move |m| {
                let id = m.id("msg");
                m.push(
                    "message.text.started",
                    Some(r),
                    None,
                    json!({"messageId": id, "role": "assistant", "messageScope": "run"}),
                );
                m.push(
                    "message.text.delta",
                    Some(r),
                    None,
                    json!({"messageId": id, "delta": "hi"}),
                );
                m.push(
                    "message.text.completed",
                    Some(r),
                    None,
                    json!({"messageId": id}),
                );
            }));
            if run.open_tools.is_empty() && run.open_children == 0 {
                for terminal in ["run.finished", "run.cancelled"] {
                    actions.push(Box::new(move |m| m.end_run(r, terminal)));
                }
            }
        }
        for &r in &open {
            let run = self.runs[r].clone();
            if let Some(tc) = run.open_tools.first().cloned() {
                actions.push(Box::new(move |m| {
                    m.runs[r].open_tools.retain(|t| t != &tc);
                    m.push(
                        "tool.call.finished",
                        Some(r),
                        None,
                        json!({"toolCallId": tc, "outcome": "success", "response": null}),
                    );
                }));
            }
            if !run.stop {
                actions.push(Box::new(move |m| {
                    m.runs[r].stop = true;
                    let target = m.runs[r].id.clone();
                    m.push(
                        "run.stop.requested",
                        Some(r),
                        None,
                        json!({"targetRunId": target}),
                    );
                }));
            }
            actions.push(Box::new(move |m| {
                m.push("progress.recorded", Some(r), None, json!({"progressId": "p", "category": "x", "label": "y", "status": "active", "privacy": "public"}));
            }));
            if let RunStatus::Paused { wait, interrupt } = &run.status {
                match interrupt {
                    Some((i, false)) => {
                        let (i, wait) = (i.clone(), wait.clone());
                        actions.push(Box::new(move |m| {
                            m.push(
                                "interrupt.resolved",
                                Some(r),
                                None,
                                json!({"interruptId": i, "waitId": wait, "decision": "approve"}),
                            );
                            if let RunStatus::Paused {
                                interrupt: Some((_, resolved)),
                                ..
                            } = &mut m.runs[r].status
                            {
                                *resolved = true;
                            }
                        }));
                    }
                    _ => {
                        let wait = wait.clone();
                        actions.push(Box::new(move |m| {
                            m.push("run.resumed", Some(r), None, json!({"waitId": wait}));
                            m.runs[r].status = RunStatus::Running;
                        }));
                    }
                }
            }
        }
        actions.push(Box::new(|m| {
            let id = m.id("umsg");
            m.push(
                "message.user.recorded",
                None,
                None,
                json!({"messageId": id, "messageScope": "session", "content": "go"}),
            );
        }));
        let pick = choice as usize % actions.len();
        actions[pick](self);
    }

    fn end_run(&mut self, r: usize, terminal: &str) {
        self.runs[r].status = RunStatus::Done;
        if let Some(p) = self.runs[r].parent {
            self.runs[p].open_children -= 1;
        }
        match self.runs[r].workflow.clone() {
            Some(w) => {
                let wf = self.workflows.iter_mut().find(|x| x.id == w).unwrap();
                wf.open_runs -= 1;
                if self.runs[r].parent.is_none() {
                    wf.top_active = false;
                }
            }
            None if self.runs[r].parent.is_none() => self.slot_taken = false,
            None => {}
        }
        self.push(terminal, Some(r), None, json!({}));
    }
}

/// A valid session of authority events, generated from `choices` (each
/// byte picks the next step among those valid at that point).
pub fn session(choices: &[u8]) -> Vec<Value> {
    session_with_id("ses-p", choices)
}

/// [`session`] for a given session id.
pub fn session_with_id(session_id: &str, choices: &[u8]) -> Vec<Value> {
    let mut m = Model {
        session_id: session_id.to_owned(),
        ..Model::default()
    };
    for &c in choices {
        m.step(c);
    }
    m.events
}
