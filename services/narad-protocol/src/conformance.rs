//! The golden-trace runner: reads traces in the format of
//! `conformance/README.md` and checks them against the classifier, the rule
//! engine and the reducer.
//!
//! A trace is `NAME.jsonl` (one wire object per line) beside
//! `NAME.expect.json` (a [`Manifest`]). In `journal` mode the lines are an
//! append sequence; in `delivery` mode they are what a client received.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::authority::{Actor, ActorKind};
use crate::classify::{Classified, Reader, WireError};
use crate::engine::Issuer;
use crate::primitives::NonEmptyString;
use crate::profile::{Profile, ProfileSet};
use crate::reducer::{Reducer, wire_violation};
use crate::rules::{self, Violation};
use crate::wire::WireObject;

/// How a trace's lines are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// An append sequence: each line is the next authority event of one
    /// session journal, validated in order.
    Journal,
    /// What a client received, duplicates and re-deliveries included:
    /// reduced in order.
    Delivery,
}

/// The expected result of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    /// Every line is accepted.
    Accept,
    /// Line `rejectAt` is the first to be rejected.
    Reject,
}

/// Who appends a journal trace's lines, for the `issuer.*` rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceIssuer {
    /// A backend proposing events over the API.
    Backend,
    /// A person's commands (the events they build carry an actor).
    Person,
}

impl TraceIssuer {
    /// The engine's issuer of the trace's lines.
    pub fn issuer(self) -> Issuer {
        match self {
            TraceIssuer::Backend => Issuer::Backend,
            TraceIssuer::Person => Issuer::Command(Actor {
                kind: ActorKind::User,
                sub: NonEmptyString::new("conformance").expect("not empty"),
                extension: None,
            }),
        }
    }
}

/// `NAME.expect.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// The specification sections exercised, e.g. `§6.2`.
    pub spec: String,
    /// One sentence saying what the trace shows.
    pub description: String,
    /// The negotiated (journal: active) profile ids; core is implied.
    pub profiles: Vec<String>,
    /// `journal` or `delivery`.
    pub mode: Mode,
    /// `accept` or `reject`.
    pub outcome: Expected,
    /// For `reject`: the 1-based line of the first object to be rejected.
    #[serde(default)]
    pub reject_at: Option<usize>,
    /// The rule id the rejection names.
    #[serde(default)]
    pub rule: Option<String>,
    /// For `journal`: who appends the lines, when the trace is about the
    /// `issuer.*` rules; absent, the lines are checked against the
    /// lifecycle rules alone.
    #[serde(default)]
    pub issuer: Option<TraceIssuer>,
    /// The reduced state expected after the last accepted line: every
    /// member given must match; members not given are not compared.
    #[serde(default)]
    pub state: Option<Value>,
}

/// A trace: its name, its lines and its manifest.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The file name without `.jsonl`.
    pub name: String,
    /// The lines, blank ones removed, with their 1-based line numbers.
    pub lines: Vec<(usize, String)>,
    /// The expectation.
    pub manifest: Manifest,
}

/// Loads every trace of a directory, sorted by name.
pub fn load_dir(dir: &Path) -> Result<Vec<Trace>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    files.iter().map(|f| load(f)).collect()
}

/// Loads one trace from its `.jsonl` path.
pub fn load(jsonl: &Path) -> Result<Trace, String> {
    let name = jsonl
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| format!("{} has no name", jsonl.display()))?
        .to_owned();
    let text = std::fs::read_to_string(jsonl)
        .map_err(|e| format!("cannot read {}: {e}", jsonl.display()))?;
    let expect_path = jsonl.with_file_name(format!("{name}.expect.json"));
    let expect = std::fs::read_to_string(&expect_path)
        .map_err(|e| format!("cannot read {}: {e}", expect_path.display()))?;
    parse(&name, &text, &expect).map_err(|e| format!("{}: {e}", expect_path.display()))
}

/// A trace from its name, the text of its `.jsonl` and of its
/// `.expect.json`.
pub fn parse(name: &str, jsonl: &str, expect: &str) -> Result<Trace, String> {
    let manifest: Manifest = serde_json::from_str(expect).map_err(|e| e.to_string())?;
    let lines = jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.to_owned()))
        .collect();
    Ok(Trace {
        name: name.to_owned(),
        lines,
        manifest,
    })
}

/// What a trace run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The first rejection: its line and the violation.
    pub rejection: Option<(usize, Violation)>,
    /// The reduced state after the last accepted line.
    pub state: Value,
}

/// Runs a trace's lines and reports what happened, whatever was expected.
pub fn run(trace: &Trace) -> Result<Outcome, String> {
    let (profiles, unknown) =
        ProfileSet::from_ids(trace.manifest.profiles.iter().map(String::as_str));
    if !unknown.is_empty() {
        return Err(format!("unknown profile id(s) {}", unknown.join(", ")));
    }
    let mut reducer = Reducer::new(profiles);
    let mut rejection = None;
    let issuer = trace.manifest.issuer.map(TraceIssuer::issuer);
    for (line, text) in &trace.lines {
        let step = match trace.manifest.mode {
            Mode::Journal => journal_step(&mut reducer, profiles, issuer.as_ref(), text),
            Mode::Delivery => delivery_step(&mut reducer, text),
        };
        if let Err(v) = step {
            rejection = Some((*line, v));
            break;
        }
    }
    Ok(Outcome {
        rejection,
        state: reducer.to_json(),
    })
}

/// Runs a trace and compares with its manifest: `Ok` when it conforms,
/// else what differs.
pub fn check(trace: &Trace) -> Result<(), String> {
    let m = &trace.manifest;
    let outcome = run(trace)?;
    match (m.outcome, &outcome.rejection) {
        (Expected::Accept, None) => {}
        (Expected::Accept, Some((line, v))) => {
            return Err(format!("line {line} was rejected: {v}"));
        }
        (Expected::Reject, None) => {
            return Err(format!(
                "every line was accepted; line {} should have been rejected",
                m.reject_at.unwrap_or(0)
            ));
        }
        (Expected::Reject, Some((line, v))) => {
            let at = m
                .reject_at
                .ok_or("a reject trace needs rejectAt in its manifest")?;
            if *line != at {
                return Err(format!("line {line} was rejected ({v}), not line {at}"));
            }
            if let Some(rule) = &m.rule
                && rule != v.rule
            {
                return Err(format!("line {line} broke {}, not {rule}: {v}", v.rule));
            }
        }
    }
    if let Some(expected) = &m.state {
        contains(&outcome.state, expected, "").map_err(|e| format!("state: {e}"))?;
    }
    Ok(())
}

fn journal_step(
    reducer: &mut Reducer,
    active: ProfileSet,
    issuer: Option<&Issuer>,
    text: &str,
) -> Result<(), Violation> {
    let object = match Reader::all_profiles().classify_str(text) {
        Ok(Classified::Accepted(o)) => *o,
        Ok(Classified::Ignored { type_name, .. }) => {
            return Err(Violation::new(
                rules::WIRE_UNKNOWN_TYPE,
                format!("{type_name:?} is no narad/v1 type; a journal holds only known types"),
            ));
        }
        Err(e) => return Err(wire_violation(&e)),
    };
    let t = object.wire_type();
    if !active.contains(t.profile()) {
        return Err(Violation::new(
            rules::PROFILE_NOT_ACTIVE,
            format!(
                "{} belongs to {}, which is not active",
                t.name(),
                t.profile()
            ),
        ));
    }
    match object {
        WireObject::Authority(e) => {
            // The lifecycle rules first, then the issuer's, as the journal
            // checks them; a refused line leaves the state as it was.
            if let Some(issuer) = issuer {
                let mut after = reducer.state().clone();
                after.apply(&e)?;
                after.check_issuer(&e, issuer)?;
            }
            reducer.append(&e).map(|_| ())
        }
        _ => Err(Violation::new(
            rules::WIRE_INVALID,
            format!("a journal holds authority events only, not {}", t.name()),
        )),
    }
}

fn delivery_step(reducer: &mut Reducer, text: &str) -> Result<(), Violation> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| wire_violation(&WireError::Malformed(e.to_string())))?;
    reducer.deliver_json(&value).map(|_| ())
}

/// Checks that `actual` contains `expected`: objects by the members
/// `expected` names, everything else by equality. Returns the JSON pointer
/// of the first difference.
pub fn contains(actual: &Value, expected: &Value, at: &str) -> Result<(), String> {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (k, ev) in e {
                let here = format!("{at}/{k}");
                match a.get(k) {
                    Some(av) => contains(av, ev, &here)?,
                    None if ev.is_null() => {}
                    None => return Err(format!("{here} is missing; expected {ev}")),
                }
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => a
            .iter()
            .zip(e)
            .enumerate()
            .try_for_each(|(i, (av, ev))| contains(av, ev, &format!("{at}/{i}"))),
        _ if actual == expected => Ok(()),
        _ => Err(format!("{at} is {actual}; expected {expected}")),
    }
}

/// The profile ids of a set, core excluded, for manifests.
pub fn profile_ids(set: ProfileSet) -> Vec<String> {
    set.iter()
        .filter(|p| *p != Profile::Core)
        .map(|p| p.id().to_owned())
        .collect()
}
