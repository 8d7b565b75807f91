//! Schema ↔ Rust agreement (§13: prose, schema and code are one contract).
//!
//! Every file under `schema/` is compiled with the `jsonschema` crate
//! (formats asserted) and paired with the Rust parser of the same type.
//! The tests prove that both accept each example, that the Rust types
//! round-trip it to equal JSON, and that the two agree — accept or reject —
//! on every single-point mutation of every example and on 10,000 random
//! mutations.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use common::{Family, Schema, schema_root, schemas};
use narad_protocol::commands::Command;
use narad_protocol::{Reader, WireError, WireType};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Asserts that the schema and the Rust parser give `v` the same verdict.
fn assert_agree(s: &Schema, v: &Value, what: &str) {
    let schema_ok = s.schema_accepts(v);
    let rust = s.rust_parse(v);
    if schema_ok != rust.is_ok() {
        let schema_errors: Vec<String> = s
            .validator
            .iter_errors(v)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        panic!(
            "{}: schema and Rust disagree on {what}\n  input: {v}\n  schema: {}\n  rust: {:?}",
            s.path,
            if schema_ok {
                "valid".to_owned()
            } else {
                schema_errors.join("; ")
            },
            rust
        );
    }
}

// ------------------------------------------------------------ coverage

#[test]
fn every_wire_type_and_command_has_exactly_one_schema() {
    let names = |fam: Family| -> BTreeSet<String> {
        schemas()
            .iter()
            .filter(|s| s.family == fam)
            .map(|s| s.name.clone())
            .collect()
    };
    let registry: BTreeSet<String> = WireType::ALL.iter().map(|t| t.name().to_owned()).collect();
    assert_eq!(
        names(Family::Wire),
        registry,
        "wire schemas vs the Rust registry"
    );
    let commands: BTreeSet<String> = Command::NAMES.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(
        names(Family::Command),
        commands,
        "command schemas vs Rust commands"
    );
    for s in schemas() {
        let file = s.path.rsplit('/').next().unwrap();
        assert_eq!(file, format!("{}.json", s.name), "file name matches title");
        assert!(!s.examples().is_empty(), "{} has no example", s.path);
    }
}

#[test]
fn every_type_named_in_the_spec_has_a_schema_and_a_rust_type() {
    let spec = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/spec/narad-v1.txt"),
    )
    .expect("docs/spec/narad-v1.txt");
    // Dotted lowercase words of the spec that are not wire types: the
    // naming convention itself, a field path, a profile id, a tool name.
    let not_types = [
        "dotted.lowercase",
        "input.members",
        "narad.graph",
        "open.file",
    ];
    let schema_names: BTreeSet<&str> = schemas().iter().map(|s| s.name.as_str()).collect();
    let mut named = BTreeSet::new();
    for word in spec.split(|c: char| !(c.is_ascii_lowercase() || c == '.' || c == '-')) {
        let word = word.trim_matches('.');
        if word.contains('.') && !not_types.contains(&word) {
            named.insert(word.to_owned());
        }
    }
    assert!(
        named.len() >= 60,
        "the spec scan found only {}",
        named.len()
    );
    let missing_rust: Vec<_> = named
        .iter()
        .filter(|n| WireType::from_name(n).is_none())
        .collect();
    let missing_schema: Vec<_> = named
        .iter()
        .filter(|n| !schema_names.contains(n.as_str()))
        .collect();
    assert!(
        missing_rust.is_empty(),
        "named in the spec, no Rust type: {missing_rust:?}"
    );
    assert!(
        missing_schema.is_empty(),
        "named in the spec, no schema: {missing_schema:?}"
    );
}

// ------------------------------------------------------------ examples

#[test]
fn every_example_validates_and_round_trips_to_equal_json() {
    for s in schemas() {
        for ex in s.examples() {
            let errors: Vec<String> = s
                .validator
                .iter_errors(&ex)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "{}: example fails its schema: {errors:?}",
                s.path
            );
            let back = s
                .rust_parse(&ex)
                .unwrap_or_else(|e| panic!("{}: Rust rejects the example: {e}", s.path));
            assert_eq!(back, ex, "{}: example does not round-trip", s.path);
        }
    }
}

// ------------------------------------------------------------ negatives

/// The names in a schema's own `required` list and in those of the
/// envelope it references, besides `type`.
fn required_fields(s: &Schema) -> Vec<String> {
    let mut out: Vec<String> = s.raw["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .filter(|n| *n != "type")
        .map(str::to_owned)
        .collect();
    if s.family == Family::Wire {
        out.push("protocolVersion".to_owned());
    }
    out
}

#[test]
fn removing_a_required_field_is_rejected_by_schema_and_rust() {
    for s in schemas() {
        let ex = &s.examples()[0];
        let required = required_fields(s);
        if s.family == Family::Document || s.family == Family::Command {
            assert!(
                !required.is_empty() || s.name == "create-session",
                "{} requires nothing",
                s.path
            );
        }
        for field in required {
            let mut v = ex.clone();
            v.as_object_mut().unwrap().remove(&field);
            assert!(
                !s.schema_accepts(&v),
                "{}: schema accepts it without {field}",
                s.path
            );
            let err = s
                .rust_parse(&v)
                .expect_err(&format!("{}: Rust accepts it without {field}", s.path));
            assert!(
                err.contains(&field) || err.contains("protocol"),
                "{}: {err}",
                s.path
            );
        }
    }
}

#[test]
fn a_wrong_enum_value_is_rejected_by_schema_and_rust() {
    let mut checked = 0;
    for s in schemas() {
        let ex = &s.examples()[0];
        for (key, value) in ex.as_object().unwrap() {
            // A string field whose schema accepts this example's value but
            // not an arbitrary other string is enum-like.
            let Value::String(_) = value else { continue };
            let mut v = ex.clone();
            v[key] = json!("no-such-value-xyz");
            if s.schema_accepts(&v) {
                continue;
            }
            checked += 1;
            assert!(
                s.rust_parse(&v).is_err(),
                "{}: Rust accepts {key} = no-such-value-xyz",
                s.path
            );
        }
    }
    assert!(checked >= 40, "only {checked} enum-like fields were found");
}

#[test]
fn create_session_without_fields_is_valid_and_with_unknown_fields_is_not() {
    let s = schemas()
        .iter()
        .find(|s| s.name == "create-session")
        .unwrap();
    assert_agree(s, &json!({}), "an empty body");
    assert!(s.schema_accepts(&json!({})));
    let bad = json!({"titel": "typo"});
    assert_agree(s, &bad, "a misspelt field");
    assert!(!s.schema_accepts(&bad));
}

/// Values that exercise every constraint kind: types, emptiness, signs,
/// integral floats, the 2^53 bound, formats, references.
fn hostile_values() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(2.0),
        json!(9_007_199_254_740_992u64),
        json!(""),
        json!("x"),
        json!("data:text/plain;base64,aGk="),
        json!("2026-08-05 04:00:00Z"),
        json!("no-such-value-xyz"),
        json!("x".repeat(257)),
        json!([]),
        json!(["x"]),
        json!({}),
        json!({"op": "add", "path": "/a"}),
        // Characters regular-expression dialects class differently (`\s`
        // takes U+0085 in Rust and Python, not in ECMAScript).
        json!("a.b\u{85}c"),
        json!("a\u{1}.b"),
        json!("a.b\u{3000}"),
        json!("a.\u{feff}b"),
    ]
}

/// Every JSON pointer inside `v`, the root excluded.
fn paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{prefix}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                paths(child, &p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let p = format!("{prefix}/{i}");
                out.push(p.clone());
                paths(child, &p, out);
            }
        }
        _ => {}
    }
}

fn parent_and_key(pointer: &str) -> (&str, String) {
    let (parent, last) = pointer.rsplit_once('/').unwrap();
    (parent, last.replace("~1", "/").replace("~0", "~"))
}

fn remove_at(v: &mut Value, pointer: &str) {
    let (parent, key) = parent_and_key(pointer);
    match v.pointer_mut(parent).unwrap() {
        Value::Object(m) => {
            m.remove(&key);
        }
        Value::Array(a) => {
            a.remove(key.parse::<usize>().unwrap());
        }
        _ => unreachable!(),
    }
}

#[test]
fn schema_and_rust_agree_on_every_single_point_mutation_of_every_example() {
    let mut cases = 0;
    for s in schemas() {
        for ex in s.examples() {
            let mut ptrs = Vec::new();
            paths(&ex, "", &mut ptrs);
            for p in &ptrs {
                let mut v = ex.clone();
                remove_at(&mut v, p);
                assert_agree(s, &v, &format!("removing {p}"));
                cases += 1;
                for h in hostile_values() {
                    let mut v = ex.clone();
                    *v.pointer_mut(p).unwrap() = h.clone();
                    assert_agree(s, &v, &format!("{p} = {h}"));
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 10_000, "only {cases} mutations were checked");
}

#[test]
fn rejections_name_a_json_pointer_that_exists_or_is_the_missing_field() {
    for s in schemas().iter().filter(|s| s.family == Family::Wire) {
        let ex = &s.examples()[0];
        for field in required_fields(s) {
            let mut v = ex.clone();
            v.as_object_mut().unwrap().remove(&field);
            match Reader::all_profiles().classify(&v) {
                Err(e @ WireError::Invalid { .. }) => {
                    assert_eq!(
                        e.pointer(),
                        Some(format!("/{field}").as_str()),
                        "{}",
                        s.path
                    )
                }
                other => panic!("{}: removing {field} gave {other:?}", s.path),
            }
        }
    }
}

// ------------------------------------------------------------ fuzzing

/// One random edit of a JSON document.
#[derive(Debug, Clone)]
enum Mutation {
    Remove(usize),
    Replace(usize, Value),
    Insert(usize, String, Value),
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-3i64..5).prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-z.:/~ -]{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "run",
            "workflow",
            "session",
            "success",
            "client",
            "automatic",
            "add",
            "replace",
            "narad/v1",
            "2026-08-05T04:00:00Z",
            "data:,x",
            "/a/b",
            "~2",
            "acme.x",
        ])
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m: BTreeMap<String, Value>| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Remove),
        (any::<usize>(), arb_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        (
            any::<usize>(),
            prop::sample::select(vec![
                "type",
                "protocolVersion",
                "eventId",
                "runId",
                "rootRunId",
                "sequence",
                "workflowId",
                "workflowSequence",
                "scope",
                "messageScope",
                "operation",
                "x",
            ]),
            arb_json()
        )
            .prop_map(|(i, k, v)| Mutation::Insert(i, k.to_owned(), v)),
    ]
}

fn apply(ex: &Value, m: &Mutation) -> Value {
    let mut v = ex.clone();
    let mut ptrs = vec![String::new()];
    paths(ex, "", &mut ptrs);
    match m {
        Mutation::Remove(i) => {
            let p = &ptrs[i % ptrs.len()];
            if p.is_empty() {
                v = Value::Null;
            } else {
                remove_at(&mut v, p);
            }
        }
        Mutation::Replace(i, new) => *v.pointer_mut(&ptrs[i % ptrs.len()]).unwrap() = new.clone(),
        Mutation::Insert(i, key, new) => {
            let objects: Vec<&String> = ptrs
                .iter()
                .filter(|p| ex.pointer(p).is_some_and(Value::is_object))
                .collect();
            let p = objects[i % objects.len()];
            v.pointer_mut(p).unwrap()[key.as_str()] = new.clone();
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// 10,000 random mutations of the examples: the parser never panics,
    /// and it accepts exactly what the schema accepts.
    #[test]
    fn random_mutations_never_panic_and_schema_and_rust_agree(
        which in any::<usize>(),
        mutations in prop::collection::vec(arb_mutation(), 1..4),
    ) {
        let s = &schemas()[which % schemas().len()];
        let ex = &s.examples()[0];
        let mut v = ex.clone();
        for m in &mutations {
            v = apply(&v, m);
            if !v.is_object() { break; }
        }
        assert_agree(s, &v, &format!("mutations {mutations:?}"));
        // The raw text path must not panic either.
        let _ = Reader::all_profiles().classify_str(&v.to_string());
    }
}

// ------------------------------------------------------------ README

#[test]
fn schema_readme_lists_every_file_with_its_profile_and_placement() {
    use narad_protocol::envelope::Placement;
    let readme = std::fs::read_to_string(schema_root().join("README.md")).unwrap();
    let rows: HashMap<String, Vec<String>> = readme
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l.split('|').map(|c| c.trim().to_owned()).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2..].to_vec())
        })
        .collect();
    for shared in ["defs.json", "envelopes.json"] {
        assert!(
            rows.contains_key(shared),
            "schema/README.md does not list {shared}"
        );
    }
    for s in schemas() {
        let row = rows
            .get(&s.path)
            .unwrap_or_else(|| panic!("schema/README.md does not list {}", s.path));
        if s.family != Family::Wire {
            continue;
        }
        let t = WireType::from_name(&s.name).unwrap();
        let profile = t
            .profile()
            .id()
            .trim_start_matches("narad.")
            .trim_end_matches("/v1");
        assert_eq!(row[0], profile, "{}: profile column", s.path);
        assert_eq!(
            s.raw["x-narad-profile"],
            t.profile().id(),
            "{}: x-narad-profile names the profile that owns the type",
            s.path
        );
        let placement = match t.placement() {
            None => "",
            Some(p) if p == Placement::RUN_TREE => "run-tree",
            Some(p) if p == Placement::WORKFLOW => "workflow",
            Some(p) if p == Placement::SESSION => "session",
            Some(_) => "scoped",
        };
        assert_eq!(row[2], placement, "{}: placement column", s.path);
    }
    assert_eq!(
        rows.len(),
        schemas().len() + 2,
        "schema/README.md lists files that do not exist"
    );
}

// ------------------------------------------------------------ patterns

/// Every `pattern` string in `v`, with the pointer where it stands.
fn patterns(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let here = format!("{at}/{k}");
                match (k.as_str(), child) {
                    ("pattern", Value::String(p)) => out.push((here, p.clone())),
                    _ => patterns(child, &here, out),
                }
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                patterns(child, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// JSON Schema patterns are ECMAScript regular expressions, but the
/// schemas are read by Rust (`jsonschema`), JavaScript (Ajv in the
/// TypeScript SDK) and Python (schemathesis, the Python SDK). Shorthand
/// classes (`\s`, `\w`, `\d`, `\b` and their negations) mean different sets
/// in those dialects — `\s` takes U+0085 in Rust and Python but not in
/// ECMAScript, so a client checking with Ajv sent names the server refused.
/// Every pattern spells its characters out instead.
#[test]
fn schema_patterns_use_no_dialect_dependent_classes() {
    let mut files = Vec::new();
    common::collect_json(&schema_root(), &mut files);
    let mut found = Vec::new();
    for f in &files {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        patterns(&v, "", &mut found);
        for (at, p) in found.drain(..) {
            let mut chars = p.chars();
            while let Some(c) = chars.next() {
                if c != '\\' {
                    continue;
                }
                let escaped = chars.next();
                assert!(
                    !matches!(escaped, Some('s' | 'S' | 'w' | 'W' | 'd' | 'D' | 'b' | 'B')),
                    "{}#{at}: pattern {p:?} uses \\{} — spell the characters out",
                    f.display(),
                    escaped.unwrap()
                );
            }
        }
    }
    assert!(
        files.len() > 50,
        "only {} schema files were read",
        files.len()
    );
}
