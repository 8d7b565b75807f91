//! Property tests of the rule engine and the reducer over generated
//! sessions: nested runs, tool calls, interrupts, pauses, stops, workflows
//! and messages, produced by a model of the protocol written here,
//! independently of the engine.

use narad_protocol::conformance::{self, Expected, Manifest, Mode, Trace};
use narad_protocol::profile::ProfileSet;
use narad_protocol::reducer::Reducer;
use narad_protocol::rules;
use proptest::prelude::*;
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
            "protocolVersion": "narad/v1", "type": ty, "eventId": format!("e-{}", self.seq),
            "timestamp": "2026-08-05T04:00:00Z", "sessionId": "ses-p", "sessionSequence": self.seq,
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

fn session(choices: &[u8]) -> Vec<Value> {
    let mut m = Model::default();
    for &c in choices {
        m.step(c);
    }
    m.events
}

fn trace(lines: &[Value], mode: Mode) -> Trace {
    Trace {
        name: "generated".to_owned(),
        lines: lines
            .iter()
            .enumerate()
            .map(|(i, l)| (i + 1, l.to_string()))
            .collect(),
        manifest: Manifest {
            spec: "§6–§11".to_owned(),
            description: "generated".to_owned(),
            profiles: conformance::profile_ids(ProfileSet::all()),
            mode,
            outcome: Expected::Accept,
            reject_at: None,
            rule: None,
            state: None,
        },
    }
}

fn reduce(lines: &[Value]) -> Value {
    let mut r = Reducer::new(ProfileSet::all());
    for l in lines {
        r.deliver_json(l)
            .unwrap_or_else(|v| panic!("delivery refused {l}: {v}"));
    }
    r.to_json()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every session the model generates is accepted, line by line, through
    /// the classifier and the rule engine.
    #[test]
    fn generated_valid_sessions_are_accepted(choices in prop::collection::vec(any::<u8>(), 1..80)) {
        let lines = session(&choices);
        let outcome = conformance::run(&trace(&lines, Mode::Journal)).unwrap();
        if let Some((line, v)) = outcome.rejection {
            panic!("line {line} of a valid session was refused: {v}\n{}", lines[line - 1]);
        }
    }

    /// Re-delivering any prefix ranges and duplicating lines yields the
    /// state of the clean delivery; so does delivering everything twice.
    #[test]
    fn duplicated_and_replayed_delivery_reduces_to_the_same_state(
        choices in prop::collection::vec(any::<u8>(), 1..60),
        replays in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..6),
    ) {
        let lines = session(&choices);
        let clean = reduce(&lines);
        let mut delivered: Vec<Value> = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            delivered.push(line.clone());
            for (at, from) in &replays {
                if at.index(lines.len()) == i {
                    let start = from.index(i + 1);
                    delivered.extend_from_slice(&lines[start..=i]);
                }
            }
        }
        prop_assert_eq!(&reduce(&delivered), &clean);
        let twice: Vec<Value> = lines.iter().flat_map(|l| [l.clone(), l.clone()]).collect();
        prop_assert_eq!(&reduce(&twice), &clean);
    }

    /// One random change to one line of a valid session is either still
    /// valid or refused with a registered rule id, leaving the state as
    /// the lines before it left it. Never a panic.
    #[test]
    fn a_single_mutation_is_valid_or_refused_with_a_rule_id(
        choices in prop::collection::vec(any::<u8>(), 2..50),
        which in any::<prop::sample::Index>(),
        how in 0u8..8,
        field in any::<prop::sample::Index>(),
    ) {
        let mut lines = session(&choices);
        let at = which.index(lines.len());
        match how {
            0 => { lines.remove(at); }
            1 => { let l = lines[at].clone(); lines.insert(at, l); }
            2 if at + 1 < lines.len() => lines.swap(at, at + 1),
            _ => {
                let obj = lines[at].as_object_mut().unwrap();
                let keys: Vec<String> = obj.keys().cloned().collect();
                let key = &keys[field.index(keys.len())];
                match how {
                    3 => { obj.remove(key); }
                    4 => { obj.insert(key.clone(), json!("x")); }
                    5 => { obj.insert(key.clone(), json!(1)); }
                    6 => {
                        if let Some(n) = obj[key].as_u64() { obj.insert(key.clone(), json!(n + 1)); }
                    }
                    _ => { obj.insert(key.clone(), Value::Null); }
                }
            }
        }
        let t = trace(&lines, Mode::Journal);
        let outcome = conformance::run(&t).unwrap();
        if let Some((line, v)) = outcome.rejection {
            prop_assert!(rules::by_id(v.rule).is_some(), "unregistered rule {}", v.rule);
            let mut before = t.clone();
            before.lines.retain(|(n, _)| *n < line);
            prop_assert_eq!(conformance::run(&before).unwrap().state, outcome.state);
        }
    }
}

/// An emulated journal store: the session core and entities as rows.
#[derive(Default)]
struct Rows {
    core: narad_protocol::engine::SessionCore,
    entities: std::collections::BTreeMap<narad_protocol::engine::EntityKey, Value>,
    /// Event ids, as the journal's unique index keeps them.
    event_ids: std::collections::BTreeSet<String>,
}

impl Rows {
    /// Loads what the contract says one event needs: the core, the keys the
    /// event references, and the open runs of every run journal named.
    fn load_for(
        &self,
        event: &narad_protocol::AuthorityEvent,
    ) -> narad_protocol::engine::SessionState {
        use narad_protocol::engine::{EntityKey, SessionState, referenced_keys};
        let mut state = SessionState::from_core(self.core.clone());
        let keys = referenced_keys(event);
        let roots: Vec<String> = keys
            .iter()
            .filter_map(|k| match k {
                EntityKey::RunJournal(r) => Some(r.as_str().to_owned()),
                _ => None,
            })
            .collect();
        for (k, v) in &self.entities {
            let open_run_of_root = matches!(k, EntityKey::Run(_))
                && roots.iter().any(|r| v["rootRunId"] == json!(r))
                && matches!(v["state"].as_str(), Some("running" | "paused"));
            if keys.contains(k) || open_run_of_root {
                state.load_entity(k.clone(), v.clone()).unwrap();
            }
        }
        state
    }

    fn store(&mut self, state: &narad_protocol::engine::SessionState) {
        self.core = state.core();
        for (k, v) in state.entities() {
            self.entities.insert(k, v);
        }
    }
}

fn parse(line: &Value) -> Option<narad_protocol::AuthorityEvent> {
    match narad_protocol::Reader::all_profiles().classify(line) {
        Ok(narad_protocol::Classified::Accepted(o)) => match *o {
            narad_protocol::WireObject::Authority(e) => Some(e),
            _ => None,
        },
        _ => None,
    }
}

/// Applies `lines` to the whole state and, event by event, to states
/// loaded from rows as the journal will; both must agree throughout.
fn assert_partial_loading_agrees(lines: &[Value]) {
    let mut full = narad_protocol::engine::SessionState::new();
    let mut rows = Rows::default();
    for line in lines {
        let Some(event) = parse(line) else { return };
        let mut partial = rows.load_for(&event);
        let verdict_full = full.apply(&event);
        if rows.event_ids.contains(event.envelope.event_id.as_str()) {
            // The journal's deduplication refuses it before the engine runs.
            assert_eq!(verdict_full.unwrap_err().rule, rules::EVENT_ID_UNIQUE.id);
            return;
        }
        rows.event_ids
            .insert(event.envelope.event_id.as_str().to_owned());
        let verdict_partial = partial.apply(&event);
        assert_eq!(verdict_full, verdict_partial, "verdicts differ on {line}");
        if verdict_full.is_err() {
            return;
        }
        rows.store(&partial);
        let stored: std::collections::BTreeMap<_, _> = rows.entities.clone();
        let whole: std::collections::BTreeMap<_, _> = full.entities().into_iter().collect();
        assert_eq!(
            stored, whole,
            "stored entities differ from the whole state after {line}"
        );
        assert_eq!(rows.core, full.core());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// The journal loads, per append, only the core, the referenced
    /// entities and the open runs of the referenced journals: on valid and
    /// on mutated sessions that gives the verdicts and the state of the
    /// whole in-memory engine.
    #[test]
    fn loading_only_what_an_event_references_gives_the_same_verdicts(
        choices in prop::collection::vec(any::<u8>(), 1..60),
        mutate in any::<bool>(),
        which in any::<prop::sample::Index>(),
        field in any::<prop::sample::Index>(),
    ) {
        let mut lines = session(&choices);
        if mutate {
            let at = which.index(lines.len());
            let obj = lines[at].as_object_mut().unwrap();
            let keys: Vec<String> = obj.keys().cloned().collect();
            let key = keys[field.index(keys.len())].clone();
            obj.insert(key, json!("run-1"));
        }
        assert_partial_loading_agrees(&lines);
    }
}

#[test]
fn loading_only_what_an_event_references_agrees_on_every_journal_trace() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance/traces");
    for t in conformance::load_dir(&dir).unwrap() {
        if t.manifest.mode != Mode::Journal {
            continue;
        }
        let lines: Vec<Value> = t
            .lines
            .iter()
            .map(|(_, l)| serde_json::from_str(l).unwrap())
            .collect();
        assert_partial_loading_agrees(&lines);
    }
}
