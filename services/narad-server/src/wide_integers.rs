//! Finding integers no 64-bit integer holds in a JSON text.
//!
//! serde_json reads an integer literal beyond `i64::MIN..=u64::MAX` as the
//! nearest `f64`: `18446744073709551617` would be stored, and answered, as
//! `1.8446744073709552e19`, a value the client never sent. narad refuses
//! such a body instead (it keeps what it is given exactly, or not at all);
//! the value can travel as a string. Only the text tells an integer literal
//! from a float literal, so the check reads the text, after serde_json has
//! accepted it as JSON.

use narad_protocol::wire::escape_pointer_token;

/// One step of the path to the token being read.
enum Step {
    /// Inside an object: the member whose value comes next, once read.
    Member(Option<String>),
    /// Inside an array: the index of the item being read.
    Item(usize),
}

/// The JSON pointer and the literal of the first integer of `json` (a
/// text serde_json accepted) outside `i64::MIN..=u64::MAX`.
pub fn wide_integer(json: &[u8]) -> Option<(String, String)> {
    let mut path: Vec<Step> = Vec::new();
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                let end = string_end(json, i);
                if let Some(Step::Member(member @ None)) = path.last_mut() {
                    // A key: the text is JSON, so the string decodes.
                    *member = serde_json::from_slice(&json[i..end]).ok();
                }
                i = end;
                continue;
            }
            b'{' => path.push(Step::Member(None)),
            b'[' => path.push(Step::Item(0)),
            b'}' | b']' => {
                path.pop();
            }
            b',' => match path.last_mut() {
                Some(Step::Item(index)) => *index += 1,
                Some(Step::Member(member)) => *member = None,
                None => {}
            },
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < json.len()
                    && matches!(json[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let literal = &json[start..i];
                let integral = !literal.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
                if integral {
                    let text = std::str::from_utf8(literal).unwrap_or_default();
                    if text.parse::<i64>().is_err() && text.parse::<u64>().is_err() {
                        return Some((pointer(&path), text.to_owned()));
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index just past the string that opens at `start` (a `"`).
fn string_end(json: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < json.len() {
        match json[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    json.len()
}

fn pointer(path: &[Step]) -> String {
    path.iter()
        .map(|step| match step {
            Step::Member(Some(name)) => format!("/{}", escape_pointer_token(name)),
            Step::Member(None) => String::new(),
            Step::Item(index) => format!("/{index}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wide(text: &str) -> Option<(String, String)> {
        serde_json::from_str::<serde_json::Value>(text).expect("the tests' texts are JSON");
        wide_integer(text.as_bytes())
    }

    #[test]
    fn integers_beyond_64_bits_are_found_with_their_pointer() {
        assert_eq!(
            wide(r#"{"a": [1, {"b": 18446744073709551616}]}"#),
            Some(("/a/1/b".into(), "18446744073709551616".into()))
        );
        assert_eq!(
            wide(r#"[0, -9223372036854775809]"#),
            Some(("/1".into(), "-9223372036854775809".into()))
        );
        assert_eq!(
            wide("123456789012345678901234567890"),
            Some((String::new(), "123456789012345678901234567890".into()))
        );
    }

    #[test]
    fn what_64_bits_hold_and_floats_pass() {
        assert_eq!(
            wide(r#"{"u": 18446744073709551615, "i": -9223372036854775808, "z": -0}"#),
            None
        );
        assert_eq!(
            wide(r#"[1.8446744073709552e19, 1e30, 0.5, 12345678901234567890.0]"#),
            None
        );
    }

    #[test]
    fn strings_and_keys_are_not_numbers_and_escapes_are_read() {
        assert_eq!(
            wide(r#"{"18446744073709551616": "99999999999999999999", "s": "a\"b[{", "n": 1}"#),
            None
        );
        assert_eq!(
            wide(r#"{"a/b~\"c": {"\u0078": 99999999999999999999}}"#),
            Some(("/a~1b~0\"c/x".into(), "99999999999999999999".into()))
        );
    }

    #[test]
    fn members_after_others_and_nested_arrays_point_right() {
        assert_eq!(
            wide(
                r#"{"first": {"x": [1, 2]}, "second": [[3], [4, 5, 1e2, 100000000000000000000]]}"#
            ),
            Some(("/second/1/3".into(), "100000000000000000000".into()))
        );
    }
}
