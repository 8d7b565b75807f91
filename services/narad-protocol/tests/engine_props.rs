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

use narad_protocol::testing::session;

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
            issuer: None,
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
