//! Journal-mode golden traces through the API (§13): each trace is a new
//! session; its lines are appended one by one, as a backend proposes them
//! (and a person's decision as the resolve-interrupt command). Accepted
//! lines must be accepted, with answers that agree with history and the
//! trace; the first rejected line must be refused (409 with the trace's
//! rule, when it names one; 400 when the line is no valid object) and
//! nothing of it written.
//!
//! Not every trace is about what a server's API can be asked: delivery
//! traces are what a client receives (`narad conformance client`); some
//! rules check what the journal itself assigns (sequences, eventIds, the
//! session of an event), which a proposal does not carry; and only an
//! executor under its execution token may give a client tool call its
//! result. Those are counted, not run. What a rejected line breaks is
//! the manifest's `rule`, or, when it names none, what narad's reference
//! rules find there. A trace written for fewer profiles than the server's
//! sessions have runs when the reference finds the same outcome with the
//! server's profiles (core events, mostly), and is skipped otherwise.

use std::time::Instant;

use narad_protocol::conformance::{self, Expected, Mode, Trace, TraceIssuer};
use narad_protocol::{Classified, Reader};
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

/// Members of an event the journal assigns: a proposal leaves them out.
const ASSIGNED_MEMBERS: [&str; 4] = [
    "sessionSequence",
    "sequence",
    "workflowSequence",
    "sessionId",
];

/// What a server must answer to a trace's rejected line.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    /// 409, naming this rule (any, when the manifest names none).
    Rule(Option<String>),
    /// 400: the line is no valid object; the error code (`NRD-0003` an
    /// invalid object, `NRD-0004` another protocol version, `NRD-0005` an
    /// unknown type in a negotiated profile's namespace).
    Invalid(&'static str),
}

/// What the server suite makes of a trace.
#[derive(Debug, Clone, PartialEq)]
enum Plan {
    /// Not about a server's API: why.
    NotForTheApi(&'static str),
    /// Appended line by line; a rejected line refused so.
    Replay(Option<Refusal>),
}

/// What the server suite makes of a trace, whatever profiles it claims.
fn plan(trace: &Trace) -> Plan {
    let m = &trace.manifest;
    if m.mode != Mode::Journal {
        return Plan::NotForTheApi("a delivery trace");
    }
    if m.issuer.is_none() && gives_a_client_result(&trace.lines) {
        return Plan::NotForTheApi("a client result, which only an executor gives");
    }
    let (Expected::Reject, Some(at)) = (m.outcome, m.reject_at) else {
        return Plan::Replay(None);
    };
    let Some(line) = trace
        .lines
        .iter()
        .find(|(n, _)| *n == at)
        .and_then(|(_, l)| serde_json::from_str::<Value>(l).ok())
    else {
        // Not JSON, or no such line: what narad's reader makes of it.
        return Plan::Replay(Some(Refusal::Invalid("NRD-0003")));
    };
    // The line as the kit proposes it, with placeholders where the journal
    // assigns: is it a valid object?
    let mut proposed = proposal(&line, "kit");
    for member in ASSIGNED_MEMBERS {
        if line.get(member).is_some() || member == "sessionSequence" {
            proposed[member] = json!(1);
        }
    }
    proposed["sessionId"] = json!("kit");
    match Reader::all_profiles().classify_str(&proposed.to_string()) {
        Err(narad_protocol::WireError::Invalid { pointer, .. })
            if ASSIGNED_MEMBERS.iter().any(|m| pointer == format!("/{m}")) =>
        {
            return Plan::NotForTheApi("about what the journal assigns");
        }
        Err(e) => return Plan::Replay(Some(Refusal::Invalid(e.code().code()))),
        // A journal holds known types only (wire.unknown-type).
        Ok(Classified::Ignored { .. }) => return Plan::Replay(Some(Refusal::Invalid("NRD-0003"))),
        Ok(Classified::Accepted(_)) => {}
    }
    // A valid object: the rule it breaks is the manifest's, or what the
    // reference rules find on that line.
    let found = m.rule.clone().or_else(|| {
        conformance::run(trace)
            .ok()?
            .rejection
            .filter(|(n, _)| *n == at)
            .map(|(_, v)| v.rule.to_owned())
    });
    let broken = found.as_deref().unwrap_or_default();
    if ASSIGNED_BY_THE_JOURNAL.contains(&broken) || broken.starts_with("wire.") {
        // A wire rule broken only in members the journal assigns.
        return Plan::NotForTheApi("about what the journal assigns");
    }
    Plan::Replay(Some(Refusal::Rule(m.rule.clone())))
}

/// Why a trace written for `wanted` profiles (sorted) cannot run on a
/// server whose sessions have every `claimed` one (sorted), if it cannot:
/// it needs a profile the server does not claim, or narad's reference
/// rules reach another outcome with the server's profiles than with the
/// trace's (a line of a profile the trace left inactive, say).
fn profiles_differ(trace: &Trace, wanted: &[String], claimed: &[String]) -> Option<String> {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|p| !claimed.contains(p))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Some(format!("the server does not claim {}", missing.join(", ")));
    }
    if wanted == claimed {
        return None;
    }
    let outcome = |t: &Trace| {
        conformance::run(t)
            .map(|o| o.rejection.map(|(line, v)| (line, v.rule)))
            .ok()
    };
    let mut as_served = trace.clone();
    as_served.manifest.profiles = claimed.to_vec();
    let (theirs, ours) = (outcome(trace), outcome(&as_served));
    match (theirs, ours) {
        (Some(a), Some(b)) if a == b => None,
        (_, Some(Some((line, rule)))) => Some(format!(
            "written for fewer profiles than the server's sessions have, and with theirs line \
             {line} would be refused ({rule}): its outcome depends on profiles"
        )),
        (_, Some(None)) => Some(
            "written for fewer profiles than the server's sessions have, and with theirs every \
             line would be accepted: its outcome depends on profiles"
                .to_owned(),
        ),
        (_, None) => Some(format!(
            "written for fewer profiles than the server's sessions have ({}), which narad's \
             reference rules do not know",
            claimed.join(", ")
        )),
    }
}

/// A trace's line as the kit proposes it in `session`: without what the
/// journal assigns, its eventId in the session's namespace (event ids
/// are unique per organisation).
fn proposal(line: &Value, session: &str) -> Value {
    let mut event = line.clone();
    if let Some(o) = event.as_object_mut() {
        for f in ASSIGNED_MEMBERS {
            o.remove(f);
        }
        // An id that is no string is sent as it is, to be refused.
        if let Some(id) = o.get("eventId").and_then(Value::as_str) {
            let id = format!("{session}-{id}");
            o.insert("eventId".into(), json!(id));
        }
    }
    event
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
        let refusal = match plan(trace) {
            Plan::NotForTheApi(_) => {
                not_for_api += 1;
                continue;
            }
            Plan::Replay(refusal) => refusal,
        };
        let name = format!("journal/{}", trace.name);
        if !only(&name) {
            continue;
        }
        let m = &trace.manifest;
        let started = Instant::now();
        let mut wanted = m.profiles.clone();
        wanted.sort();
        let verdict = match profiles_differ(trace, &wanted, &claimed) {
            Some(why) => Verdict::Skip(why),
            None => {
                match replay(api, trace, refusal.as_ref(), &format!("kit-{run_id}-{n}")).await {
                    Ok(()) => Verdict::Pass,
                    Err(why) => Verdict::Fail(format!("{why:#}")),
                }
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

/// Appends a trace's lines into a new session `session`; the line at
/// `rejectAt` must meet `refusal`.
async fn replay(
    api: &Api,
    trace: &Trace,
    refusal: Option<&Refusal>,
    session: &str,
) -> anyhow::Result<()> {
    let m = &trace.manifest;
    api.post("/v1/sessions", BACKEND, &json!({ "sessionId": session }))
        .await?
        .expect(201, "creating the trace's session")?;
    let reject_at = match m.outcome {
        Expected::Accept => None,
        Expected::Reject => m.reject_at,
    };
    let mut accepted: Vec<Accepted> = Vec::new();
    for (line_no, line) in &trace.lines {
        // A line that is no JSON is sent as it is (as a string).
        let written: Value =
            serde_json::from_str(line).unwrap_or_else(|_| Value::String(line.clone()));
        let event = proposal(&written, session);
        let id = event["eventId"].as_str().unwrap_or_default().to_owned();
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
                replayed: a.replayed,
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
            refused_so(*line_no, refusal, &answer)?;
            let refused = Refused {
                line_no: *line_no,
                line: &written,
                id: (!by_person && !id.is_empty()).then_some(id.as_str()),
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

/// Fails unless `answer` refuses line `line_no` as `refusal` says.
fn refused_so(
    line_no: usize,
    refusal: Option<&Refusal>,
    answer: &super::api::Answer,
) -> anyhow::Result<()> {
    let got = || {
        let mut got = format!("{} {}", answer.status, answer.code());
        if let Some(rule) = answer.body["rule"].as_str() {
            got.push_str(&format!(" naming {rule}"));
        }
        match answer.body["message"].as_str() {
            Some(message) => format!("{got}: {message}"),
            None => format!("{got} {}", answer.body),
        }
    };
    match refusal {
        Some(Refusal::Invalid(code)) => anyhow::ensure!(
            answer.status == 400 && answer.code() == *code,
            "line {line_no} is no valid object and should be refused with 400 {code}, got {}",
            got()
        ),
        Some(Refusal::Rule(Some(rule))) => anyhow::ensure!(
            answer.status == 409 && answer.body["rule"] == rule.as_str(),
            "line {line_no} should be refused (409) naming {rule}, got {}",
            got()
        ),
        Some(Refusal::Rule(None)) | None => anyhow::ensure!(
            answer.status == 409,
            "line {line_no} should be refused (409, a rule broken), got {}",
            got()
        ),
    }
    Ok(())
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
