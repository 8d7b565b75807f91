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
use super::commands::history;
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

/// A line the server accepted: the trace's line as written (its
/// sequences included), the eventId it has in the session, and the
/// answer's entry for it.
struct Accepted {
    line_no: usize,
    line: Value,
    id: String,
    answered: Value,
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
    let mut accepted: Vec<Accepted> = Vec::new();
    for (line_no, line) in &trace.lines {
        let written: Value =
            serde_json::from_str(line).map_err(|err| anyhow::anyhow!("line {line_no}: {err}"))?;
        let mut event = written.clone();
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
            // A command answers 200 where an append answers 201, and
            // lists what it appended under `appended`.
            super::api::Answer {
                status: if a.status == 200 { 201 } else { a.status },
                body: if a.status == 200 {
                    a.body["appended"].clone()
                } else {
                    a.body
                },
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
            let refused = Refused {
                line_no: *line_no,
                line: &written,
                id: (!by_person).then_some(id.as_str()),
            };
            return judge_history(api, session, &accepted, Some(refused)).await;
        }
        anyhow::ensure!(
            answer.status == 201,
            "line {line_no} should be accepted, got {} {}",
            answer.status,
            answer.body
        );
        let first = &answer.body["events"][0];
        let answered_id = first["eventId"].as_str().unwrap_or_default();
        if by_person {
            anyhow::ensure!(
                !answered_id.is_empty(),
                "line {line_no}, a person's decision, was accepted, but the command's answer \
                 names no event it appended: {}",
                answer.body
            );
        } else {
            anyhow::ensure!(
                answered_id == id,
                "line {line_no} was accepted, but the append's answer names event {} instead \
                 of {id}: {}",
                words(&first["eventId"]),
                answer.body
            );
        }
        accepted.push(Accepted {
            line_no: *line_no,
            line: written,
            id: answered_id.to_owned(),
            answered: first.clone(),
        });
    }
    judge_history(api, session, &accepted, None).await
}

/// The line a server refused, as the trace wrote it, and the eventId it
/// was proposed with (none when a command built it).
struct Refused<'a> {
    line_no: usize,
    line: &'a Value,
    id: Option<&'a str>,
}

/// The sequences an answer and history give an event.
const SEQUENCES: [(&str, Option<&str>); 3] = [
    ("sessionSequence", None),
    ("sequence", Some("rootRunId")),
    ("workflowSequence", Some("workflowId")),
];

/// Reads the session's history and judges it against what the trace's
/// lines were answered: every accepted line is there once, in the
/// trace's order, at the sequences its answer gave and the trace implies
/// (the trace's own sequences, moved on by the events the server added
/// itself before it in the same session, run tree or workflow), and
/// nothing of a refused line is. Events the server adds on its own
/// authority (a run paused while its client executor is away, say) are
/// not the trace's business.
async fn judge_history(
    api: &Api,
    session: &str,
    accepted: &[Accepted],
    refused: Option<Refused<'_>>,
) -> anyhow::Result<()> {
    let h = history(api, session).await?;
    let at = |id: &str| h.iter().position(|e| e["eventId"] == id);
    let ours: Vec<&str> = accepted.iter().map(|a| a.id.as_str()).collect();
    let added = |e: &Value| !ours.contains(&e["eventId"].as_str().unwrap_or_default());
    if let Some(r) = &refused {
        let written = h.iter().find(|e| {
            r.id.is_some_and(|id| e["eventId"] == id) || (added(e) && same_content(e, r.line))
        });
        if let Some(e) = written {
            anyhow::bail!(
                "line {} was refused, yet history holds it: {} at sessionSequence {}",
                r.line_no,
                words(&e["type"]),
                words(&e["sessionSequence"])
            );
        }
    }
    let mut last: Option<(usize, usize)> = None;
    for a in accepted {
        let Some(p) = at(&a.id) else {
            anyhow::bail!(
                "line {} was accepted as event {}, but history does not hold it",
                a.line_no,
                a.id
            );
        };
        let stored = &h[p];
        anyhow::ensure!(
            stored["type"] == a.line["type"],
            "line {} was accepted as event {}, but history holds that event as a {}, not a {}",
            a.line_no,
            a.id,
            words(&stored["type"]),
            words(&a.line["type"])
        );
        if let Some((before, line)) = last {
            anyhow::ensure!(
                p > before,
                "history holds line {}'s event before line {line}'s",
                a.line_no
            );
        }
        last = Some((p, a.line_no));
        for (field, scope) in SEQUENCES {
            // The trace's sequence, after the events the server added
            // before this one in the same scope.
            let implied = a.line[field].as_u64().map(|n| {
                n + h[..p]
                    .iter()
                    .filter(|e| added(e) && scope.is_none_or(|s| e[s] == stored[s]))
                    .count() as u64
            });
            if let Some(implied) = implied {
                anyhow::ensure!(
                    a.answered[field].as_u64() == Some(implied),
                    "line {}'s answer gives it {field} {}; the trace implies {implied}{}",
                    a.line_no,
                    words(&a.answered[field]),
                    added_note(&h[..p], added)
                );
            }
            anyhow::ensure!(
                a.answered[field] == stored[field],
                "line {}'s answer gives it {field} {}, but history holds it at {}",
                a.line_no,
                words(&a.answered[field]),
                words(&stored[field])
            );
        }
    }
    Ok(())
}

/// Whether a stored event is a trace's line under another eventId: the
/// same type and every member of the line the journal does not assign.
fn same_content(stored: &Value, line: &Value) -> bool {
    let Some(members) = line.as_object() else {
        return false;
    };
    stored["type"] == line["type"]
        && members
            .iter()
            .filter(|(k, _)| {
                ![
                    "eventId",
                    "sessionId",
                    "sessionSequence",
                    "sequence",
                    "workflowSequence",
                    "timestamp",
                    "actor",
                ]
                .contains(&k.as_str())
            })
            .all(|(k, v)| stored[k] == *v)
}

/// ` (the server added N events of its own before it)`, when it did.
fn added_note(before: &[Value], added: impl Fn(&Value) -> bool) -> String {
    match before.iter().filter(|e| added(e)).count() {
        0 => String::new(),
        n => format!(" (the server added {n} events of its own before it)"),
    }
}

/// A JSON value as a person reads it: a string without quotes, a number,
/// or `none` when absent.
pub fn words(v: &Value) -> String {
    match v {
        Value::Null => "none".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
