//! Property tests of `narad_protocol::repair` over generated sessions:
//! whatever a session left open, the events that close a run journal are
//! accepted by the rule engine, in order, and leave every run of the
//! journal ended; cancelling a lost runtime's backend calls is accepted
//! and leaves no backend call open.

use narad_protocol::engine::SessionState;
use narad_protocol::primitives::RunId;
use narad_protocol::repair::{self, Closing};
use narad_protocol::testing::session;
use narad_protocol::{AuthorityEvent, Classified, Reader, WireObject};
use proptest::prelude::*;
use serde_json::{Value, json};

fn parse(line: &Value) -> AuthorityEvent {
    match Reader::all_profiles().classify(line) {
        Ok(Classified::Accepted(o)) => match *o {
            WireObject::Authority(a) => a,
            other => panic!("not authority: {other:?}"),
        },
        other => panic!("not accepted: {other:?}\n{line}"),
    }
}

/// Fills the sequences a journal would assign (and the workflow position
/// of a workflow-owned run's event), then applies the event.
fn append(state: &mut SessionState, mut proposal: Value) -> Result<(), String> {
    let root = RunId::new(proposal["rootRunId"].as_str().unwrap()).unwrap();
    let run = RunId::new(proposal["runId"].as_str().unwrap()).unwrap();
    proposal["sessionId"] = json!("ses-p");
    proposal["timestamp"] = json!("2026-12-01T00:00:00Z");
    proposal["sessionSequence"] = json!(state.next_session_sequence());
    proposal["sequence"] = json!(state.next_run_sequence(&root));
    if let Some(w) = state.runs.get(&run).and_then(|r| r.workflow_id.clone()) {
        proposal["workflowId"] = json!(w);
        proposal["workflowSequence"] = json!(state.next_workflow_sequence(&w));
    }
    let event = parse(&proposal);
    state
        .apply(&event)
        .map(|_| ())
        .map_err(|v| format!("{} refused by {}: {}", proposal, v.rule, v.message))
}

fn replay(lines: &[Value]) -> SessionState {
    let mut state = SessionState::new();
    for l in lines {
        state
            .apply(&parse(l))
            .expect("a generated session is valid");
    }
    state
}

fn open_roots(state: &SessionState) -> Vec<RunId> {
    state
        .runs
        .iter()
        .filter(|(_, r)| r.parent_run_id.is_none() && !r.status.is_terminal())
        .map(|(id, _)| id.clone())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn closing_a_journal_is_accepted_and_ends_every_run_of_it(
        choices in prop::collection::vec(any::<u8>(), 1..120),
        cancelled in any::<bool>(),
    ) {
        let mut state = replay(&session(&choices));
        let how = if cancelled {
            Closing::Cancelled { code: "stopped_without_runtime".into(), message: "stopped".into() }
        } else {
            Closing::Error { code: "runtime_lost".into(), message: "lost".into() }
        };
        for root in open_roots(&state) {
            for event in repair::close_journal(&state, &root, &how) {
                if let Err(e) = append(&mut state, event) {
                    panic!("{e}");
                }
            }
            let open: Vec<_> = state.runs.iter()
                .filter(|(_, r)| r.root_run_id == root && !r.status.is_terminal())
                .map(|(id, _)| id.to_string())
                .collect();
            prop_assert!(open.is_empty(), "runs left open in {}: {:?}", root, open);
            prop_assert!(repair::close_journal(&state, &root, &how).is_empty());
        }
    }

    #[test]
    fn cancelling_backend_calls_is_accepted_and_leaves_none_open(
        choices in prop::collection::vec(any::<u8>(), 1..120),
    ) {
        let mut state = replay(&session(&choices));
        let how = Closing::Error { code: "runtime_lost".into(), message: "lost".into() };
        for root in open_roots(&state) {
            for event in repair::cancel_backend_calls(&state, &root, &how) {
                if let Err(e) = append(&mut state, event) {
                    panic!("{e}");
                }
            }
            let open_backend = state.runs.values()
                .filter(|r| r.root_run_id == root)
                .flat_map(|r| r.open_tool_calls.iter())
                .filter(|c| state.tool_calls[*c].executor == narad_protocol::authority::Executor::Backend)
                .count();
            prop_assert_eq!(open_backend, 0);
        }
    }
}

/// The properties above are not vacuous: over many generated sessions the
/// closing events include every step of the repair (calls cancelled,
/// interrupts expired, pauses resumed, nested runs ended). The generator
/// never leaves a pause owed; the next test does.
#[test]
fn generated_sessions_exercise_every_step_of_a_repair() {
    use std::collections::BTreeSet;
    let how = Closing::Error {
        code: "runtime_lost".into(),
        message: "lost".into(),
    };
    let mut seen = BTreeSet::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..600 {
        let choices: Vec<u8> = (0..100)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut state = replay(&session(&choices));
        for root in open_roots(&state) {
            for event in repair::close_journal(&state, &root, &how) {
                let nested = event["runId"] != event["rootRunId"];
                seen.insert(format!(
                    "{}{}",
                    event["type"].as_str().unwrap(),
                    if nested { " (nested)" } else { "" }
                ));
                append(&mut state, event).unwrap();
            }
        }
    }
    for step in [
        "tool.call.finished",
        "interrupt.resolved",
        "run.resumed",
        "run.error",
        "run.error (nested)",
    ] {
        assert!(seen.contains(step), "no {step} among {seen:?}");
    }
}

fn proposal(kind: &str, fields: Value) -> Value {
    let mut e = json!({"protocolVersion": "narad/v1", "type": kind,
        "eventId": uuid::Uuid::now_v7().to_string(), "rootRunId": "r1", "runId": "r1"});
    for (k, v) in fields.as_object().unwrap() {
        e[k] = v.clone();
    }
    e
}

/// A runtime lost right after a blocking interrupt, before its pause: the
/// repair writes the owed pause first (§7.6), then closes.
#[test]
fn an_owed_pause_comes_first() {
    let mut state = SessionState::new();
    for p in [
        proposal("run.started", json!({})),
        proposal(
            "tool.call.started",
            json!({"toolCallId": "t1", "toolName": "x", "executor": "backend", "args": {}}),
        ),
        proposal(
            "interrupt.requested",
            json!({"interruptId": "i1", "waitId": "w1", "kind": "approval", "actions": ["approve"]}),
        ),
    ] {
        append(&mut state, p).unwrap();
    }
    let root = RunId::new("r1").unwrap();
    let how = Closing::Error {
        code: "runtime_lost".into(),
        message: "lost".into(),
    };
    let retry = repair::cancel_backend_calls(&state, &root, &how);
    let kinds = |v: &[Value]| {
        v.iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(&retry), ["run.paused", "tool.call.finished"]);
    let close = repair::close_journal(&state, &root, &how);
    assert_eq!(
        kinds(&close),
        [
            "run.paused",
            "tool.call.finished",
            "interrupt.resolved",
            "run.resumed",
            "run.error"
        ]
    );
    for e in close {
        append(&mut state, e).unwrap();
    }
    assert!(state.runs[&root].status.is_terminal());
}
