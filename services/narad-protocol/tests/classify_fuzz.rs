//! Fuzzing the wire classifier: arbitrary bytes, and valid events of
//! generated sessions mutated (a field removed, a value replaced by other
//! JSON, the text cut or a byte changed). The classifier never panics, and
//! every refusal is a typed error with a 4xx code and, where it points, a
//! JSON pointer.

use narad_protocol::testing::session;
use narad_protocol::{Reader, WireError};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Any JSON value, a few levels deep, with the numbers and text that
/// break parsers: huge, negative, fractional, U+0000, long.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(9_007_199_254_740_992u64)),
        Just(json!(1.5)),
        ".{0,16}".prop_map(Value::from),
        Just(json!("\u{0}")),
        Just(json!("narad/v1")),
        Just(json!("x".repeat(300))),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every JSON pointer of `v`'s members, the root included.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(o) => {
            for (k, child) in o {
                let key = k.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{at}/{key}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Remove,
    Replace(Value),
}

/// A valid event of a generated session, one of its members mutated.
fn mutated_event() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(any::<u8>(), 1..24),
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        prop_oneof![
            1 => Just(Mutation::Remove),
            3 => any_json().prop_map(Mutation::Replace),
        ],
    )
        .prop_map(|(choices, which, member, mutation)| {
            let events = session(&choices);
            let mut event = events[which.index(events.len())].clone();
            let mut all = Vec::new();
            pointers(&event, String::new(), &mut all);
            let at = all[member.index(all.len())].clone();
            match mutation {
                Mutation::Replace(v) => {
                    if let Some(slot) = event.pointer_mut(&at) {
                        *slot = v;
                    }
                }
                Mutation::Remove => {
                    if let Some((parent, key)) = at.rsplit_once('/') {
                        let key = key.replace("~1", "/").replace("~0", "~");
                        match event.pointer_mut(parent) {
                            Some(Value::Object(o)) => {
                                o.remove(&key);
                            }
                            Some(Value::Array(a)) => {
                                if let Ok(i) = key.parse::<usize>() {
                                    a.remove(i);
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            event
        })
}

/// A refusal is typed: a 400 code, and a pointer that is one.
fn typed(e: &WireError) -> Result<(), TestCaseError> {
    prop_assert_eq!(e.code().status(), 400, "{}", e);
    if let Some(p) = e.pointer() {
        prop_assert!(p.is_empty() || p.starts_with('/'), "pointer {:?}", p);
    }
    let body = narad_protocol::ErrorBody::from(e);
    prop_assert!(body.code.starts_with("NRD-"));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let text = String::from_utf8_lossy(&bytes);
        for reader in [Reader::default(), Reader::all_profiles()] {
            if let Err(e) = reader.classify_str(&text) {
                typed(&e)?;
            }
        }
    }

    #[test]
    fn arbitrary_json_never_panics(v in any_json()) {
        for reader in [Reader::default(), Reader::all_profiles()] {
            if let Err(e) = reader.classify(&v) {
                typed(&e)?;
            }
        }
    }

    #[test]
    fn mutated_valid_events_never_panic(event in mutated_event()) {
        for reader in [Reader::default(), Reader::all_profiles()] {
            if let Err(e) = reader.classify(&event) {
                typed(&e)?;
            }
        }
    }

    #[test]
    fn mutated_event_text_never_panics(
        event in mutated_event(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut text = serde_json::to_vec(&event).unwrap();
        let i = at.index(text.len());
        text[i] = byte;
        text.truncate(cut.index(text.len()) + 1);
        if let Err(e) = Reader::all_profiles().classify_str(&String::from_utf8_lossy(&text)) {
            typed(&e)?;
        }
    }
}
