//! The golden traces of `conformance/traces`, online: every journal trace
//! whose lines a backend can propose is appended, event by event, through
//! the HTTP API of a real server; accepted lines must be accepted, and
//! the first rejected line must be refused, with nothing written, naming
//! the trace's rule.
//!
//! Left out, each for a stated reason: delivery traces (they describe
//! what a client receives, not appends); traces whose profiles are not
//! every profile (a server session has them all active); traces about
//! what the journal itself assigns or keys (sequences, eventIds, the
//! session of an event): a backend proposes events without sequences, and
//! the journal answers a reused eventId as a retry or a conflict (NRD-0202)
//! rather than as a rule; and wire-level traces (malformed objects,
//! unknown types, versions), which the server answers with NRD-0003/4/5
//! before any rule.
//!
//! Who may write what (the `issuer.*` rules) binds the HTTP API too: a
//! backend approves nothing and gives no client tool call its result. So
//! a line a backend may not propose travels the way a person's decision
//! does: an accepted `interrupt.resolved` of another decision than
//! `expired` (and every resolution of a trace whose issuer is `person`) is
//! sent as the resolve-interrupt command; a trace whose client tool call
//! is finished with a result is left out, since only an executor's finish
//! under its execution token gives one (tests/tests/executors.rs).

use std::path::PathBuf;

use narad_protocol::ProfileSet;
use narad_protocol::conformance::{self, Expected, Mode, TraceIssuer};
use narad_server::auth::Role;
use narad_tests::{Server, token};
use serde_json::{Value, json};

/// Rules a backend's proposal cannot break, since the journal assigns or
/// keys what they check.
const ASSIGNED_BY_THE_JOURNAL: &[&str] = &[
    "sequence.session.contiguous",
    "sequence.run.contiguous",
    "sequence.workflow.contiguous",
    "event.id.unique",
    "event.session",
    "watch.revision.regress",
    // The journal fills the workflow position of a workflow-owned run's
    // events (narad_journal::append): a proposal without it is completed,
    // not refused.
    "workflow.run.position",
];

/// Whether a trace finishes a client tool call with a result, which only
/// an executor under its execution token may do (§11.3).
fn gives_a_client_result(lines: &[(usize, String)]) -> bool {
    let events: Vec<Value> = lines
        .iter()
        .filter_map(|(_, l)| serde_json::from_str(l).ok())
        .collect();
    events.iter().any(|f| {
        f["type"] == "tool.call.finished"
            && f["outcome"] == "success"
            && events.iter().any(|s| {
                s["type"] == "tool.call.started"
                    && s["toolCallId"] == f["toolCallId"]
                    && s["executor"] == "client"
            })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_traces_hold_through_the_http_api() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conformance/traces");
    let traces = conformance::load_dir(&dir).expect("traces");
    let all: Vec<String> = ProfileSet::all()
        .iter()
        .filter(|p| *p != narad_protocol::Profile::Core)
        .map(|p| p.id().to_owned())
        .collect();
    // Some traces bind runs to a client executor that never attaches: a
    // sweeper would pause those runs (§11.2) between a trace's lines.
    let s = Server::start_with_executors(narad_server::executors::ExecutorSettings {
        sweep_interval: std::time::Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    let t = token("acme", &Role::ALL);
    let (mut ran, mut failures) = (0, Vec::new());
    for (n, trace) in traces.iter().enumerate() {
        let m = &trace.manifest;
        let rule = m.rule.as_deref().unwrap_or("");
        let mut profiles = m.profiles.clone();
        profiles.sort();
        let mut every = all.clone();
        every.sort();
        if m.mode != Mode::Journal
            || profiles != every
            || ASSIGNED_BY_THE_JOURNAL.contains(&rule)
            || rule.starts_with("wire.")
            || (m.issuer.is_none() && gives_a_client_result(&trace.lines))
        {
            continue;
        }
        ran += 1;
        let session = format!("conf-{n}");
        s.post("/v1/sessions", &t, &json!({ "sessionId": session }))
            .await
            .expect(201);
        let reject_at = match m.outcome {
            Expected::Accept => None,
            Expected::Reject => m.reject_at,
        };
        for (line_no, (_, line)) in trace.lines.iter().enumerate() {
            let line_no = line_no + 1;
            let mut event: Value = serde_json::from_str(line).expect("JSON");
            let o = event.as_object_mut().expect("an object");
            for f in [
                "sessionSequence",
                "sequence",
                "workflowSequence",
                "sessionId",
            ] {
                o.remove(f);
            }
            // Event ids are unique per tenant: one namespace per trace.
            let id = format!("{session}-{}", o["eventId"].as_str().unwrap_or("e"));
            o.insert("eventId".into(), json!(id));
            let by_person = event["type"] == "interrupt.resolved"
                && (m.issuer == Some(TraceIssuer::Person)
                    || (event["decision"] != "expired" && Some(line_no) != reject_at));
            let answer = if by_person {
                let mut cmd = json!({
                    "interruptId": event["interruptId"], "sessionId": session,
                    "decision": event["decision"],
                });
                for f in ["reason", "members"] {
                    if let Some(v) = event.get(f) {
                        cmd[f] = v.clone();
                    }
                }
                let a = s.post("/v1/commands/resolve-interrupt", &t, &cmd).await;
                // A command answers 200; the lines of an append 201.
                narad_tests::Answer {
                    status: if a.status == 200 { 201 } else { a.status },
                    ..a
                }
            } else {
                s.post(
                    &format!("/v1/sessions/{session}/events"),
                    &t,
                    &json!({ "events": [event] }),
                )
                .await
            };
            if Some(line_no) == reject_at {
                if answer.status != 409 || answer.body["rule"] != rule {
                    failures.push(format!(
                        "{}: line {line_no} should be refused with {rule}, got {} {}",
                        trace.name, answer.status, answer.body
                    ));
                }
                // Nothing of the refused append was written.
                let stored = s.get(&format!("/v1/sessions/{session}"), &t).await;
                let at = stored.expect(200)["sessionSequence"].as_u64();
                if at != Some(line_no as u64 - 1) {
                    failures.push(format!(
                        "{}: after the refusal the session is at {at:?}, not {}",
                        trace.name,
                        line_no - 1
                    ));
                }
                break;
            }
            if answer.status != 201 {
                failures.push(format!(
                    "{}: line {line_no} should be accepted, got {} {}",
                    trace.name, answer.status, answer.body
                ));
                break;
            }
        }
    }
    assert!(ran >= 60, "only {ran} traces ran online");
    assert!(
        failures.is_empty(),
        "{} of {ran} traces differ online:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
