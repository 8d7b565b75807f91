//! CORS: what lets a page of another origin call the API from a browser.
//!
//! Off unless `NARAD_CORS_ORIGINS` names origins, each exact
//! (`https://console.example.com`; never `*`): a page of any other origin
//! gets answers without CORS headers, which its browser does not hand it.
//! No credentials mode is needed (calls carry `Authorization`, streams a
//! ticket), so `Access-Control-Allow-Credentials` is never sent.
//!
//! A preflight (`OPTIONS` with `Access-Control-Request-Method`) from an
//! allowed origin is answered 204 with the methods its path takes and the
//! request headers the asked operation reads, both taken from the OpenAPI
//! document, so that they cannot drift from the routes. Every other answer
//! to an allowed origin names it in `Access-Control-Allow-Origin` (errors
//! too, so a page can read the envelope) and exposes `x-request-id` and
//! `Retry-After`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// How long a browser may keep a preflight's answer, in seconds.
pub const MAX_AGE_SECONDS: u32 = 600;

/// The answer headers a page may read besides the safelisted ones.
pub const EXPOSED: &str = "x-request-id, retry-after";

/// Request headers every operation reads (the request id is kept when a
/// client sends one).
const ALWAYS_ALLOWED: &[&str] = &["x-request-id"];

/// Checks `NARAD_CORS_ORIGINS`' entries: each an exact origin, a scheme
/// (`http` or `https`) and a host with an optional port, nothing after.
pub fn parse_origins(entries: &[String]) -> Result<Vec<HeaderValue>, String> {
    let mut origins = Vec::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let problem = |why: &str| -> Result<Vec<HeaderValue>, String> {
            Err(format!(
                "NARAD_CORS_ORIGINS: {entry:?} {why}; give exact origins such as \
                 https://console.example.com, separated by commas"
            ))
        };
        if entry == "*" || entry.contains('*') {
            return problem("is a wildcard, which narad does not allow");
        }
        let Some((scheme, rest)) = entry.split_once("://") else {
            return problem("has no scheme");
        };
        if scheme != "http" && scheme != "https" {
            return problem("is not http or https");
        }
        if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
            return problem("is not an origin (a host and an optional port, no path)");
        }
        let Ok(value) = HeaderValue::from_str(&entry.to_ascii_lowercase()) else {
            return problem("is not a header value");
        };
        origins.push(value);
    }
    Ok(origins)
}

/// The CORS policy: the allowed origins and, for each path of the API, the
/// methods it takes and the headers each reads.
#[derive(Debug, Default)]
pub struct Cors {
    origins: Vec<HeaderValue>,
    routes: Vec<Route>,
}

#[derive(Debug)]
struct Route {
    /// The path's segments; `None` where the template has a parameter.
    segments: Vec<Option<String>>,
    /// Each method the path takes, with the request headers it reads.
    methods: BTreeMap<String, Vec<String>>,
}

impl Cors {
    /// The policy for `origins` over the routes of `document` (the OpenAPI
    /// document of [`crate::routes::openapi::complete`]).
    pub fn new(origins: Vec<HeaderValue>, document: &Value) -> Cors {
        let mut routes = Vec::new();
        for (path, item) in document["paths"].as_object().into_iter().flatten() {
            let segments = path
                .split('/')
                .map(|s| (!s.starts_with('{')).then(|| s.to_owned()))
                .collect();
            let mut methods = BTreeMap::new();
            for (method, op) in item.as_object().into_iter().flatten() {
                if !matches!(method.as_str(), "get" | "post" | "put" | "patch" | "delete") {
                    continue;
                }
                methods.insert(method.to_ascii_uppercase(), request_headers(op));
            }
            routes.push(Route { segments, methods });
        }
        Cors { origins, routes }
    }

    /// Whether any origin is allowed.
    pub fn is_enabled(&self) -> bool {
        !self.origins.is_empty()
    }

    fn allowed(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        let lower = origin.to_str().ok()?.to_ascii_lowercase();
        self.origins.iter().find(|o| *o == lower.as_str()).cloned()
    }

    fn route(&self, path: &str) -> Option<&Route> {
        let asked: Vec<&str> = path.split('/').collect();
        self.routes.iter().find(|r| {
            r.segments.len() == asked.len()
                && r.segments.iter().zip(&asked).all(|(s, a)| match s {
                    Some(literal) => literal == a,
                    None => !a.is_empty(),
                })
        })
    }

    /// The answer to a preflight from `origin`, or `None` when the path or
    /// the method asked for is not one of the API's.
    fn preflight(&self, origin: HeaderValue, req: &Request) -> Option<Response> {
        let asked = req
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)?
            .to_str()
            .ok()?;
        let route = self.route(req.uri().path())?;
        let headers = route.methods.get(asked)?;
        let methods: Vec<&str> = route.methods.keys().map(String::as_str).collect();
        let mut answer = StatusCode::NO_CONTENT.into_response();
        let h = answer.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_str(&methods.join(", ")).ok()?,
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_str(&headers.join(", ")).ok()?,
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from(MAX_AGE_SECONDS),
        );
        h.insert(header::VARY, vary());
        Some(answer)
    }
}

/// The request headers an operation reads: its header parameters, the
/// credential when it takes one, the body's type when it has a body, and
/// the request id.
fn request_headers(op: &Value) -> Vec<String> {
    let mut names: Vec<String> = ALWAYS_ALLOWED.iter().map(|h| (*h).to_owned()).collect();
    let secured = op["security"].as_array().is_some_and(|s| {
        s.iter()
            .any(|r| r.as_object().is_some_and(|r| r.contains_key("bearer")))
    });
    if secured {
        names.push("authorization".to_owned());
    }
    if op.get("requestBody").is_some() {
        names.push("content-type".to_owned());
    }
    for parameter in op["parameters"].as_array().into_iter().flatten() {
        if parameter["in"] == "header"
            && let Some(name) = parameter["name"].as_str()
        {
            names.push(name.to_ascii_lowercase());
        }
    }
    names.sort();
    names.dedup();
    names
}

fn vary() -> HeaderValue {
    HeaderValue::from_static(
        "origin, access-control-request-method, access-control-request-headers",
    )
}

/// The layer: answers preflights, and marks answers to allowed origins.
pub async fn layer(State(cors): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    if !cors.is_enabled() {
        return next.run(req).await;
    }
    let origin = cors.allowed(req.headers());
    if req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        && let Some(origin) = origin.clone()
        && let Some(answer) = cors.preflight(origin, &req)
    {
        return answer;
    }
    let mut answer = next.run(req).await;
    let h = answer.headers_mut();
    h.append(header::VARY, HeaderValue::from_static("origin"));
    if let Some(origin) = origin {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED),
        );
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_exact_and_never_wildcards() {
        let ok = parse_origins(&[
            "https://console.example.com".into(),
            " http://localhost:5173 ".into(),
            "".into(),
        ])
        .unwrap();
        assert_eq!(ok, ["https://console.example.com", "http://localhost:5173"]);
        for bad in [
            "*",
            "https://*.example.com",
            "console.example.com",
            "ftp://x",
            "https://x/path",
            "https://",
        ] {
            let e = parse_origins(&[bad.into()]).unwrap_err();
            assert!(e.contains("NARAD_CORS_ORIGINS"), "{bad}: {e}");
        }
    }

    #[test]
    fn routes_come_from_the_document() {
        let doc = crate::routes::openapi::document();
        let cors = Cors::new(parse_origins(&["https://a.example".into()]).unwrap(), &doc);
        let events = cors.route("/v1/sessions/s-1/events").unwrap();
        assert_eq!(events.methods.keys().collect::<Vec<_>>(), ["GET", "POST"]);
        assert!(events.methods["POST"].contains(&"narad-runtime-lease".to_owned()));
        assert!(events.methods["POST"].contains(&"content-type".to_owned()));
        assert!(events.methods["GET"].contains(&"authorization".to_owned()));
        assert!(!events.methods["GET"].contains(&"content-type".to_owned()));
        let stream = cors.route("/v1/sessions/s-1/stream").unwrap();
        assert!(stream.methods["GET"].contains(&"last-event-id".to_owned()));
        assert!(cors.route("/v1/sessions//events").is_none());
        assert!(cors.route("/v1/nothing").is_none());
    }
}
