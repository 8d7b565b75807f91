//! The golden traces of `conformance/traces`: each conforms to its
//! manifest, together they exercise every rule, and every object in them
//! validates against `schema/` (§13: prose, schema and traces agree).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use narad_protocol::conformance::{self, Expected, Mode, Trace};
use narad_protocol::rules;
use serde_json::Value;

fn traces() -> Vec<Trace> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance/traces");
    conformance::load_dir(&dir).expect("conformance/traces loads")
}

#[test]
fn every_trace_conforms_to_its_manifest() {
    let traces = traces();
    assert!(traces.len() >= 80, "only {} traces", traces.len());
    let failures: Vec<String> = traces
        .iter()
        .filter_map(|t| {
            conformance::check(t)
                .err()
                .map(|e| format!("{}: {e}", t.name))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} traces fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_rule_is_exercised_by_a_rejecting_trace() {
    let exercised: BTreeSet<String> = traces()
        .iter()
        .filter_map(|t| t.manifest.rule.clone())
        .collect();
    let missing: Vec<&str> = rules::ALL
        .iter()
        .map(|r| r.id)
        .filter(|id| !exercised.contains(*id))
        .collect();
    assert!(missing.is_empty(), "rules no trace exercises: {missing:?}");
    let unknown: Vec<&String> = exercised
        .iter()
        .filter(|id| rules::by_id(id).is_none())
        .collect();
    assert!(
        unknown.is_empty(),
        "traces name rules that do not exist: {unknown:?}"
    );
}

#[test]
fn both_modes_and_both_outcomes_are_covered_with_duplicated_deliveries() {
    let traces = traces();
    let count = |mode: Mode, outcome: Expected| {
        traces
            .iter()
            .filter(|t| t.manifest.mode == mode && t.manifest.outcome == outcome)
            .count()
    };
    assert!(count(Mode::Journal, Expected::Accept) >= 20);
    assert!(count(Mode::Journal, Expected::Reject) >= 60);
    assert!(count(Mode::Delivery, Expected::Accept) >= 8);
    assert!(count(Mode::Delivery, Expected::Reject) >= 4);
    let with_duplicates = traces
        .iter()
        .filter(|t| t.manifest.mode == Mode::Delivery)
        .filter(|t| {
            let ids: Vec<&str> = t.lines.iter().map(|(_, l)| l.as_str()).collect();
            ids.iter().collect::<BTreeSet<_>>().len() < ids.len()
        })
        .count();
    assert!(
        with_duplicates >= 3,
        "only {with_duplicates} delivery traces repeat a line"
    );
}

#[test]
fn every_object_in_every_trace_validates_against_its_schema() {
    let by_type: BTreeMap<&str, &common::Schema> = common::schemas()
        .iter()
        .filter(|s| s.family == common::Family::Wire)
        .map(|s| (s.name.as_str(), s))
        .collect();
    let mut checked = 0;
    for t in traces() {
        let structural_reject = t
            .manifest
            .rule
            .as_deref()
            .is_some_and(|r| r.starts_with("wire."));
        for (line, text) in &t.lines {
            if structural_reject && Some(*line) == t.manifest.reject_at {
                continue; // the line is structurally wrong on purpose
            }
            let v: Value = serde_json::from_str(text).unwrap();
            let Some(schema) = v["type"].as_str().and_then(|ty| by_type.get(ty)) else {
                continue; // an unknown type, ignored on purpose
            };
            let errors: Vec<String> = schema
                .validator
                .iter_errors(&v)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "{}:{line} fails {}: {errors:?}",
                t.name,
                schema.path
            );
            checked += 1;
        }
    }
    assert!(checked > 500, "only {checked} objects were checked");
}

#[test]
fn a_rejected_line_changes_no_state() {
    // The state reported after a rejection must equal the state after the
    // lines before it alone.
    for t in traces()
        .into_iter()
        .filter(|t| t.manifest.outcome == Expected::Reject)
    {
        let full = conformance::run(&t).unwrap();
        let Some((line, _)) = full.rejection else {
            continue;
        };
        let mut before = t.clone();
        before.lines.retain(|(n, _)| *n < line);
        let prefix = conformance::run(&before).unwrap();
        assert_eq!(
            full.state, prefix.state,
            "{}: the rejected line {line} changed the state",
            t.name
        );
    }
}
