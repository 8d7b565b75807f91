//! Journal-mode golden traces through the API (§13): each trace is a new
//! session; its lines are appended one by one, as a backend proposes them
//! (and a person's decision as the resolve-interrupt command). Accepted
//! lines must be accepted; the first rejected line must be refused with
//! the trace's rule and nothing written.
//!
//! Not every trace is about what a server's API can be asked: delivery
//! traces are what a client receives (`narad conformance client`);
//! wire-level traces are refused as bad input before any rule; some rules
//! check what the journal itself assigns (sequences, eventIds, the session
//! of an event), which a proposal does not carry; and only an executor
//! under its execution token may give a client tool call its result.
//! Those are counted, not run.

use std::time::Instant;

use narad_protocol::conformance::{Expected, Mode, Trace, TraceIssuer};
use serde_json::{Value, json};

use super::api::{Api, BACKEND, PERSON};
use super::report::{Case, Report, Verdict};

/// Rules a backend's proposal cannot break, since the journal assigns or
/// keys what they check.
const ASSIGNED_BY_THE_JOURNAL: &[&str] = &[
    "sequence.session.contiguous",
    "sequence.run.contiguous",
    "sequence.workflow.contiguous",
    "event.id.unique",
    "event.session",
    "watch.revision.regress",
    "workflow.run.position",
];

/// Why a trace is not a case of the server suite, if it is not.
fn not_for_the_api(trace: &Trace) -> Option<&'static str> {
    let m = &trace.manifest;
    let rule = m.rule.as_deref().unwrap_or("");
    if m.mode != Mode::Journal {
        Some("a delivery trace")
    } else if rule.starts_with("wire.") {
        Some("wire-level")
    } else if ASSIGNED_BY_THE_JOURNAL.contains(&rule) {
        Some("about what the journal assigns")
    } else if m.issuer.is_none() && gives_a_client_result(&trace.lines) {
        Some("a client result, which only an executor gives")
    } else {
        None
    }
}

/// Whether a trace finishes a client tool call with a result.
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

/// Runs every trace a server's API can be asked about; answers how many
/// traces are not for the API.
pub async fn run(
    api: &Api,
    traces: &[Trace],
    claimed: &[String],
    run_id: &str,
    report: &mut Report,
    only: impl Fn(&str) -> bool,
) -> usize {
    let mut not_for_api = 0;
    let mut claimed: Vec<String> = claimed.to_vec();
    claimed.sort();
    for (n, trace) in traces.iter().enumerate() {
        if not_for_the_api(trace).is_some() {
            not_for_api += 1;
            continue;
        }
        let name = format!("journal/{}", trace.name);
        if !only(&name) {
            continue;
        }
        let m = &trace.manifest;
        let started = Instant::now();
        let mut wanted = m.profiles.clone();
        wanted.sort();
        let missing: Vec<&String> = wanted.iter().filter(|p| !claimed.contains(p)).collect();
        let verdict = if !missing.is_empty() {
            Verdict::Skip(format!(
                "the server does not claim {}",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        } else if wanted != claimed {
            // A session has every claimed profile active: a trace written
            // for fewer would meet events of profiles it did not expect.
            Verdict::Skip("written for fewer profiles than the server's sessions have".to_owned())
        } else {
            match replay(api, trace, &format!("kit-{run_id}-{n}")).await {
                Ok(()) => Verdict::Pass,
                Err(why) => Verdict::Fail(format!("{why:#}")),
            }
        };
        report.record(Case {
            name,
            spec: m.spec.clone(),
            rule: m.rule.clone(),
            verdict,
            time: started.elapsed(),
        });
    }
    not_for_api
}

/// Appends a trace's lines into a new session `session`.
async fn replay(api: &Api, trace: &Trace, session: &str) -> anyhow::Result<()> {
    let m = &trace.manifest;
    api.post("/v1/sessions", BACKEND, &json!({ "sessionId": session }))
        .await?
        .expect(201, "creating the trace's session")?;
    let reject_at = match m.outcome {
        Expected::Accept => None,
        Expected::Reject => m.reject_at,
    };
    let rule = m.rule.as_deref().unwrap_or("");
    for (i, (line_no, line)) in trace.lines.iter().enumerate() {
        let mut event: Value =
            serde_json::from_str(line).map_err(|err| anyhow::anyhow!("line {line_no}: {err}"))?;
        let o = event
            .as_object_mut()
            .ok_or_else(|| anyhow::anyhow!("line {line_no} is not an object"))?;
        for f in [
            "sessionSequence",
            "sequence",
            "workflowSequence",
            "sessionId",
        ] {
            o.remove(f);
        }
        // Event ids are unique per organisation: one namespace per trace.
        let id = format!("{session}-{}", o["eventId"].as_str().unwrap_or("e"));
        o.insert("eventId".into(), json!(id));
        let by_person = event["type"] == "interrupt.resolved"
            && (m.issuer == Some(TraceIssuer::Person)
                || (event["decision"] != "expired" && Some(*line_no) != reject_at));
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
            let a = api
                .post("/v1/commands/resolve-interrupt", PERSON, &cmd)
                .await?;
            // A command answers 200 where an append answers 201.
            super::api::Answer {
                status: if a.status == 200 { 201 } else { a.status },
                ..a
            }
        } else {
            api.post(
                &format!("/v1/sessions/{session}/events"),
                BACKEND,
                &json!({ "events": [event] }),
            )
            .await?
        };
        if Some(*line_no) == reject_at {
            anyhow::ensure!(
                answer.status == 409 && answer.body["rule"] == rule,
                "line {line_no} should be refused (409) naming {rule}, got {} {}",
                answer.status,
                answer.body
            );
            // Nothing of the refused append was written.
            let stored = api.get(&format!("/v1/sessions/{session}"), BACKEND).await?;
            let at = stored.expect(200, "reading the session")?["sessionSequence"].as_u64();
            anyhow::ensure!(
                at == Some(i as u64),
                "after the refusal of line {line_no} the session is at {at:?}, not {i}: \
                 something of it was written"
            );
            return Ok(());
        }
        anyhow::ensure!(
            answer.status == 201,
            "line {line_no} should be accepted, got {} {}",
            answer.status,
            answer.body
        );
    }
    Ok(())
}
