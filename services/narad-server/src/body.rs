//! Reading request bodies and query strings, with the API's errors: a body
//! over the limit is 413 (`NRD-0006`), a body that is not JSON is 400
//! (`NRD-0002`) naming where it broke, a string or object key holding
//! U+0000 or an integer beyond 64 bits is 400 (`NRD-0003`) with its JSON
//! pointer (see [`unstorable`]), a query parameter that
//! is unknown or malformed is 400 (`NRD-0008`) naming it.
//!
//! Every body and query string a handler reads passes here, so these
//! refusals hold for every route. U+0000 is refused because Postgres
//! `text` and `jsonb` cannot hold it: let through, it fails the query.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use narad_protocol::ErrorCode;
use narad_protocol::primitives::MAX_SAFE_INTEGER;
use narad_protocol::wire::escape_pointer_token;
use serde_json::Value;

use crate::error::ApiError;

/// A JSON request body (any content type: `curl -d` sends a form type).
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<JsonBody, ApiError> {
        let bytes = read(req, state).await?;
        if bytes.is_empty() {
            return Err(ApiError::new(
                ErrorCode::MalformedJson,
                "the request body is empty; send a JSON object",
            )
            .with_field("", "empty body"));
        }
        parse(&bytes).map(JsonBody)
    }
}

/// A JSON request body that may be left out: an empty (or blank) body is
/// `None`; anything else is read as [`JsonBody`] is.
#[derive(Debug)]
pub struct OptionalJsonBody(pub Option<Value>);

impl<S: Send + Sync> FromRequest<S> for OptionalJsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<OptionalJsonBody, ApiError> {
        let bytes = read(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        parse(&bytes).map(|v| OptionalJsonBody(Some(v)))
    }
}

async fn read<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::new(
                ErrorCode::MalformedJson,
                format!("the request body could not be read: {e}"),
            )
        }
    })
}

/// The answer to a body over the limit (also given before the body is
/// read, when its `Content-Length` announces as much).
pub fn too_large() -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        "the request body exceeds this server's limit (NARAD_MAX_BODY_BYTES); \
         send smaller batches",
    )
}

/// Parses a body: JSON, and no U+0000 anywhere in it. Integral numbers
/// written with a fraction or an exponent (`30000.0`, `3e4`) are read as
/// the integers they are ([`integral_numbers_as_integers`]).
fn parse(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!(
                "the request body is not JSON: {e} (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
        .with_field("", format!("line {}, column {}", e.line(), e.column()))
    })?;
    if let Some((pointer, problem)) = unstorable(bytes, &value) {
        return Err(
            ApiError::new(ErrorCode::InvalidObject, format!("{pointer}: {problem}"))
                .with_field(pointer, problem),
        );
    }
    integral_numbers_as_integers(&mut value);
    Ok(value)
}

/// What of a JSON text (`bytes`, read as `value`) narad could not keep
/// exactly, and its JSON pointer: a string or key holding U+0000 (Postgres
/// cannot hold it), or an integer beyond 64 bits (serde_json would read it
/// as the nearest float). Every JSON a client sends is checked here.
pub fn unstorable(bytes: &[u8], value: &Value) -> Option<(String, String)> {
    if let Some(pointer) = nul_pointer(value) {
        return Some((
            pointer,
            "text holds U+0000, which narad cannot store; remove it".into(),
        ));
    }
    // Such an integer reads as a float of magnitude 2^63 or more: the text
    // is read again only when the value holds one.
    if holds_float_of_64_bit_magnitude(value)
        && let Some((pointer, literal)) = crate::wide_integers::wide_integer(bytes)
    {
        return Some((
            pointer,
            format!(
                "the integer {literal} does not fit in 64 bits, and narad keeps numbers \
                 exactly or not at all; send it as a string"
            ),
        ));
    }
    None
}

fn holds_float_of_64_bit_magnitude(value: &Value) -> bool {
    match value {
        Value::Number(n) => n
            .as_f64()
            .is_some_and(|f| n.is_f64() && f.abs() >= 9_223_372_036_854_775_808.0),
        Value::Array(items) => items.iter().any(holds_float_of_64_bit_magnitude),
        Value::Object(map) => map.values().any(holds_float_of_64_bit_magnitude),
        _ => false,
    }
}

/// Rewrites every number of `value` that is an integer written as a float
/// (`2.0`, `1e3`, `-0.0`) and within ±(2^53 − 1) as that integer. JSON has
/// one number type and JSON Schema counts `2.0` as an integer, so a field
/// that takes an integer takes it in either spelling; larger floats are
/// left as they are (no integer field takes them).
pub fn integral_numbers_as_integers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().expect("an f64 number");
            if f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER as f64 {
                // Exact: |f| ≤ 2^53 − 1 is an integer an f64 holds exactly.
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers_as_integers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers_as_integers),
        _ => {}
    }
}

/// Reads a JSON body as `T`: a member of the wrong type, a missing one or
/// an unknown one is 400 (`NRD-0003`) with its JSON pointer. A member is
/// left out rather than `null`, as everywhere in the protocol (serde alone
/// would read `null` as absent where the document says a value).
pub fn typed<T: serde::de::DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    if let Some((name, _)) = body
        .as_object()
        .and_then(|o| o.iter().find(|(_, v)| v.is_null()))
    {
        let pointer = format!("/{}", escape_pointer_token(name));
        return Err(ApiError::new(
            ErrorCode::InvalidObject,
            format!("the body at {pointer:?} is null: leave the member out instead"),
        )
        .with_field(pointer, "null is not a value of this member; leave it out"));
    }
    serde_path_to_error::deserialize(body).map_err(|e| {
        let pointer: String = e
            .path()
            .iter()
            .map(|segment| match segment {
                serde_path_to_error::Segment::Seq { index } => format!("/{index}"),
                serde_path_to_error::Segment::Map { key } => {
                    format!("/{}", escape_pointer_token(key))
                }
                _ => String::new(),
            })
            .collect();
        let problem = e.inner().to_string();
        // serde names an unknown or missing member in its message, at the
        // object's own path: point at the member.
        let member = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|p| problem.strip_prefix(p)?.split('`').next());
        let pointer = match member {
            Some(name) => format!("{pointer}/{}", escape_pointer_token(name)),
            None => pointer,
        };
        ApiError::new(
            ErrorCode::InvalidObject,
            format!("the body at {pointer:?}: {problem}"),
        )
        .with_field(pointer, problem)
    })
}

/// The JSON pointer (RFC 6901) of the first string or object key of
/// `value` that holds U+0000: of the key itself when a key does.
pub fn nul_pointer(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => s.contains('\0').then(String::new),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| nul_pointer(v).map(|rest| format!("/{i}{rest}"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(format!("/{}", escape_pointer_token(k)))
            } else {
                nul_pointer(v).map(|rest| format!("/{}{rest}", escape_pointer_token(k)))
            }
        }),
        _ => None,
    }
}

/// A query string as name → value, read strictly by [`Query::text`], [`Query::number`] and
/// [`Query::finish`]. Names and values must be UTF-8 without U+0000 once
/// percent-decoded.
#[derive(Debug, Default)]
pub struct Query(BTreeMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Query {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Query, ApiError> {
        Query::parse(parts.uri.query().unwrap_or(""))
    }
}

impl Query {
    /// Reads a raw query string (`a=1&b=x%20y`, `+` for a space).
    pub fn parse(raw: &str) -> Result<Query, ApiError> {
        let mut map = BTreeMap::new();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(name).map_err(|problem| {
                let shown = String::from_utf8_lossy(&form_bytes(name)).into_owned();
                invalid(&shown, &format!("has a name that {problem}"))
            })?;
            let value = decode(value).map_err(|problem| invalid(&name, problem))?;
            if map.insert(name.clone(), value).is_some() {
                return Err(invalid(&name, "is given twice"));
            }
        }
        Ok(Query(map))
    }

    /// The text of parameter `name`, if given.
    pub fn text(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }

    /// Parameter `name` as a non-negative integer, if given: at most
    /// 2^53 − 1, like every integer of the protocol (a larger cursor
    /// would wrap in the store's 64-bit columns).
    pub fn number(&mut self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.0.remove(name) {
            None => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n <= MAX_SAFE_INTEGER => Ok(Some(n)),
                Ok(_) => Err(invalid(
                    name,
                    &format!("must be at most {MAX_SAFE_INTEGER} (2^53 - 1), got {v}"),
                )),
                Err(_) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => Err(invalid(
                    name,
                    &format!("must be at most {MAX_SAFE_INTEGER} (2^53 - 1), got {v}"),
                )),
                Err(_) => Err(invalid(
                    name,
                    &format!("must be a non-negative integer, got {v:?}"),
                )),
            },
        }
    }

    /// Parameter `name` as `true` or `false`, if given.
    pub fn boolean(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.0.remove(name).as_deref() {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(v) => Err(invalid(name, &format!("must be true or false, got {v:?}"))),
        }
    }

    /// Fails on any parameter not taken: a misspelt cursor must not be
    /// silently ignored.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            Some(name) => Err(invalid(name, "is not a parameter of this route")),
            None => Ok(()),
        }
    }
}

/// The bytes of a form-encoded component: `+` is a space, `%XX` a byte.
fn form_bytes(raw: &str) -> Vec<u8> {
    let plus = raw.replace('+', " ");
    percent_decode(plus.as_bytes())
}

/// A percent-encoded component as text: UTF-8, without U+0000.
fn decode(raw: &str) -> Result<String, &'static str> {
    let text = String::from_utf8(form_bytes(raw)).map_err(|_| "is not UTF-8 once decoded")?;
    if text.contains('\0') {
        return Err("holds U+0000");
    }
    Ok(text)
}

/// Percent-decodes `raw`; a `%` not followed by two hex digits stays as is.
pub fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    out
}

/// A parameter (path, query or header) read as its type: the type's own
/// refusal becomes 400 `NRD-0008` naming the parameter.
pub fn parameter<T, E: std::fmt::Display>(name: &str, parsed: Result<T, E>) -> Result<T, ApiError> {
    parsed.map_err(|e| {
        ApiError::new(ErrorCode::InvalidParameter, format!("{name}: {e}"))
            .with_field(name, e.to_string())
    })
}

/// 400 `NRD-0008` for query parameter `name`: "query parameter {name}
/// {problem}", pointing at it.
pub fn invalid(name: &str, problem: &str) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidParameter,
        format!("query parameter {name} {problem}"),
    )
    .with_field(name, problem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integral_floats_are_read_as_integers() {
        let mut v = json!({"a": 30000.0, "b": [1e3, -0.0, 2.5, 1e300], "c": "3.0", "d": 7});
        integral_numbers_as_integers(&mut v);
        assert_eq!(
            v,
            json!({"a": 30000, "b": [1000, 0, 2.5, 1e300], "c": "3.0", "d": 7})
        );
        assert!(v["a"].is_u64() && v["b"][1].is_i64());
        let mut edge = json!([9007199254740991.0, 9007199254740992.0]);
        integral_numbers_as_integers(&mut edge);
        assert!(edge[0].is_u64() && edge[1].is_f64());
    }

    #[test]
    fn nul_is_found_in_values_and_keys_with_escaped_pointers() {
        assert_eq!(
            nul_pointer(&json!({"a": [1, "ok", {"b": "x\u{0}"}]})).as_deref(),
            Some("/a/2/b")
        );
        assert_eq!(
            nul_pointer(&json!({"m": {"x/~\u{0}": 1}})).as_deref(),
            Some("/m/x~1~0\u{0}")
        );
        assert_eq!(nul_pointer(&json!("\u{0}")).as_deref(), Some(""));
        assert_eq!(nul_pointer(&json!({"a": ["fine", 1, null]})), None);
    }

    #[test]
    fn query_values_are_decoded_strictly() {
        let mut q = Query::parse("a=x%20y&b=c+d&n=9007199254740991").unwrap();
        assert_eq!(q.text("a").as_deref(), Some("x y"));
        assert_eq!(q.text("b").as_deref(), Some("c d"));
        assert_eq!(q.number("n").unwrap(), Some(9_007_199_254_740_991));
        q.finish().unwrap();
        for (raw, name) in [
            ("after=%00", "after"),
            ("after=%C0%AF", "after"),
            ("a=1&a=2", "a"),
        ] {
            let e = Query::parse(raw).unwrap_err();
            let body = axum::response::IntoResponse::into_response(e);
            assert_eq!(body.status(), StatusCode::BAD_REQUEST, "{raw} names {name}");
        }
        for n in [
            "9007199254740992",
            "9223372036854775808",
            "99999999999999999999999",
            "-1",
            "x",
        ] {
            let mut q = Query::parse(&format!("n={n}")).unwrap();
            assert!(q.number("n").is_err(), "{n}");
        }
    }

    #[test]
    fn percent_decoding_keeps_stray_percents() {
        assert_eq!(percent_decode(b"a%2Fb%zz%4"), b"a/b%zz%4");
        assert_eq!(percent_decode(b"%C0%AF"), [0xC0, 0xAF]);
    }
}
