//! What a browser needs of the server: CORS for pages of the origins
//! `NARAD_CORS_ORIGINS` names, and nothing for any other.

use narad_server::auth::Role;
use narad_tests::*;
use reqwest::Method;
use reqwest::header::HeaderMap;
use serde_json::json;

const PAGE: &str = "http://page.example:5173";

fn header<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

async fn preflight(
    s: &Server,
    origin: &str,
    path: &str,
    method: &str,
    headers: &str,
) -> reqwest::Response {
    s.http
        .request(Method::OPTIONS, format!("{}{path}", s.base))
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header("access-control-request-headers", headers)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn preflights_name_what_each_route_takes_for_allowed_origins_only() {
    let s = Server::start_with_cors(&[PAGE, "https://console.example"]).await;

    let ok = preflight(
        &s,
        PAGE,
        "/v1/sessions/s1/events",
        "POST",
        "authorization, content-type",
    )
    .await;
    assert_eq!(ok.status(), 204);
    let h = ok.headers();
    assert_eq!(header(h, "access-control-allow-origin"), Some(PAGE));
    assert_eq!(header(h, "access-control-allow-methods"), Some("GET, POST"));
    let allowed = header(h, "access-control-allow-headers").unwrap();
    for name in [
        "authorization",
        "content-type",
        "narad-runtime-lease",
        "x-request-id",
    ] {
        assert!(
            allowed.split(", ").any(|a| a == name),
            "{name} in {allowed}"
        );
    }
    assert_eq!(header(h, "access-control-max-age"), Some("600"));
    assert_eq!(header(h, "access-control-allow-credentials"), None);
    assert!(header(h, "vary").unwrap().contains("origin"));

    // A stream's preflight allows Last-Event-ID, and no body type.
    let stream = preflight(
        &s,
        PAGE,
        "/v1/sessions/s1/stream",
        "GET",
        "authorization, last-event-id",
    )
    .await;
    let allowed = header(stream.headers(), "access-control-allow-headers")
        .unwrap()
        .to_owned();
    assert!(
        allowed.contains("last-event-id") && !allowed.contains("content-type"),
        "{allowed}"
    );

    // Another origin, a method the route does not take, a path that is
    // none of the API's: no CORS answer, so the browser stops there.
    for (origin, path, method) in [
        ("http://evil.example", "/v1/sessions/s1/events", "POST"),
        (PAGE, "/v1/sessions/s1/events", "DELETE"),
        (PAGE, "/v1/nothing/here", "GET"),
    ] {
        let refused = preflight(&s, origin, path, method, "authorization").await;
        assert!(!refused.status().is_success(), "{origin} {method} {path}");
        if origin != PAGE {
            assert_eq!(
                header(refused.headers(), "access-control-allow-origin"),
                None
            );
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn answers_to_allowed_origins_are_readable_errors_included() {
    let s = Server::start_with_cors(&[PAGE]).await;
    let t = token("acme", &Role::ALL);
    let created = s
        .http
        .post(format!("{}/v1/sessions", s.base))
        .header("origin", PAGE)
        .bearer_auth(&t)
        .json(&json!({"sessionId": "s1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let h = created.headers();
    assert_eq!(header(h, "access-control-allow-origin"), Some(PAGE));
    let exposed = header(h, "access-control-expose-headers").unwrap();
    assert!(
        exposed.contains("x-request-id") && exposed.contains("retry-after"),
        "{exposed}"
    );

    // An error's envelope is readable by the page too.
    let unauthenticated = s
        .http
        .get(format!("{}/v1/sessions", s.base))
        .header("origin", PAGE)
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);
    assert_eq!(
        header(unauthenticated.headers(), "access-control-allow-origin"),
        Some(PAGE)
    );

    // Another origin gets the answer without CORS headers (its browser
    // keeps it from the page).
    let other = s
        .http
        .get(format!("{}/v1/sessions", s.base))
        .header("origin", "http://evil.example")
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(header(other.headers(), "access-control-allow-origin"), None);
    s.stop().await;
}

#[tokio::test]
async fn without_cors_origins_nothing_changes() {
    let s = Server::start().await;
    let answer = preflight(&s, PAGE, "/v1/sessions", "POST", "authorization").await;
    assert_eq!(answer.status(), 405);
    assert_eq!(
        header(answer.headers(), "access-control-allow-origin"),
        None
    );
    let got = s
        .http
        .get(format!("{}/healthz", s.base))
        .header("origin", PAGE)
        .send()
        .await
        .unwrap();
    assert_eq!(header(got.headers(), "access-control-allow-origin"), None);
    s.stop().await;
}
