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

// ---- Stream tickets: what a page's EventSource opens a stream with ----

async fn ticket(s: &Server, token: &str, body: serde_json::Value) -> serde_json::Value {
    s.post("/v1/stream-tickets", token, &body)
        .await
        .expect(201)
        .clone()
}

/// A GET without Authorization, as an EventSource sends it.
async fn bare(s: &Server, path_and_query: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = s.http.get(format!("{}{path_and_query}", s.base));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn a_ticket_opens_its_stream_and_its_reconnects_and_nothing_else() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let reader = token("acme", &[Role::Reader]);
    open_session(&s, &t, "s1").await;
    open_session(&s, &t, "s2").await;
    for id in ["d1", "d2"] {
        s.append(&t, "s1", &[delta(id)]).await;
    }

    let issued = ticket(&s, &reader, json!({"stream": "session", "sessionId": "s1"})).await;
    let secret = issued["ticket"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("nst_"), "{issued}");
    assert_eq!(
        issued["url"],
        format!("/v1/sessions/s1/stream?ticket={secret}")
    );
    assert!(issued["expiresAt"].as_str().unwrap().ends_with('Z'));

    // Opened with the ticket alone: the history, then what follows.
    let url = issued["url"].as_str().unwrap();
    let mut stream = SseStream::of(bare(&s, url, &[]).await);
    let first = stream.events_until(4, 10).await;
    let ids: Vec<&str> = first.iter().filter_map(|e| e["eventId"].as_str()).collect();
    assert!(ids.ends_with(&["d1", "d2"]), "{ids:?}");

    // The browser's own reconnect: the same URL with Last-Event-ID.
    let mut again = SseStream::of(bare(&s, url, &[("last-event-id", "d1")]).await);
    s.append(&t, "s1", &[delta("d3")]).await;
    let resumed = again.events_until(5, 10).await;
    let ids: Vec<&str> = resumed
        .iter()
        .filter_map(|e| e["eventId"].as_str())
        .collect();
    assert_eq!(ids, ["d2", "d3"]);

    // Nowhere else: another session's stream, the tenant stream, history,
    // any other route; and a made-up ticket.
    for path in [
        format!("/v1/sessions/s2/stream?ticket={secret}"),
        format!("/v1/events?ticket={secret}"),
        format!("/v1/sessions/s1/events?ticket={secret}"),
        format!("/v1/sessions/s1?ticket={secret}"),
        "/v1/sessions/s1/stream?ticket=nst_made-up".to_owned(),
    ] {
        let refused = Answer::of(bare(&s, &path, &[]).await).await;
        assert_eq!(
            (refused.status, refused.code()),
            (401, "NRD-0101"),
            "{path}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn tickets_keep_the_tokens_limits_and_expire() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    open_session(&s, &t, "s2").await;

    // A token limited to s1 gets no ticket for s2, and its tenant-stream
    // ticket shows s1's events only.
    let mut claims = claims("acme", "limited", &[Role::Reader]);
    claims.sessions = Some(vec!["s1".into()]);
    let limited = hs256(&claims);
    let refused = s
        .post(
            "/v1/stream-tickets",
            &limited,
            &json!({"stream": "session", "sessionId": "s2"}),
        )
        .await;
    assert_eq!((refused.status, refused.code()), (403, "NRD-0102"));
    let tenant = ticket(&s, &limited, json!({"stream": "events"})).await;
    let mut stream = SseStream::of(bare(&s, tenant["url"].as_str().unwrap(), &[]).await);
    for (session, id) in [("s2", "hidden"), ("s1", "shown")] {
        s.append(&t, session, &[delta(id)]).await;
    }
    let frame = loop {
        let f = stream.next().await.expect("a frame");
        if f.data["type"] == "message.text.delta" {
            break f;
        }
    };
    assert_eq!(frame.data["eventId"], "shown");

    // Bad requests: a session stream without its session, a tenant stream
    // with one, an unknown stream.
    for (body, pointer) in [
        (json!({"stream": "session"}), "/sessionId"),
        (json!({"stream": "events", "sessionId": "s1"}), "/sessionId"),
        (json!({"stream": "events", "sessionId": null}), "/sessionId"),
        (json!({"stream": "graph"}), "/stream"),
    ] {
        let a = s.post("/v1/stream-tickets", &t, &body).await;
        assert_eq!(
            (a.status, a.code()),
            (400, "NRD-0003"),
            "{body}: {:#}",
            a.body
        );
        assert!(
            a.body["fields"].get(pointer).is_some(),
            "{body}: {:#}",
            a.body
        );
    }

    // Expired: refused, and a new ticket resumes with lastEventId.
    let old = ticket(&s, &t, json!({"stream": "session", "sessionId": "s1"})).await;
    let (client, conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .execute(
            "update stream_tickets set expires_at = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let expired = Answer::of(bare(&s, old["url"].as_str().unwrap(), &[]).await).await;
    assert_eq!(expired.status, 401, "{:#}", expired.body);
    let new = ticket(&s, &t, json!({"stream": "session", "sessionId": "s1"})).await;
    let url = format!("{}&lastEventId=shown", new["url"].as_str().unwrap());
    s.append(&t, "s1", &[delta("after")]).await;
    let mut resumed = SseStream::of(bare(&s, &url, &[]).await);
    let got = resumed.events_until(4, 10).await;
    let ids: Vec<&str> = got.iter().filter_map(|e| e["eventId"].as_str()).collect();
    assert_eq!(ids, ["after"]);
    s.stop().await;
}

/// A ticket is refused from the moment its token would be, even within
/// its minute: it carries the token's limits, its end among them.
#[tokio::test]
async fn a_ticket_is_refused_once_its_token_would_be() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    // Accepted for about 2 s more (exp plus the verifier's leeway).
    let mut late = claims("acme", "alice", &[Role::Reader]);
    late.exp = late.iat.unwrap() + 2 - narad_server::auth::LEEWAY_SECONDS;
    let jwt = hs256(&late);
    let issued = ticket(&s, &jwt, json!({"stream": "session", "sessionId": "s1"})).await;
    let token_end = late.exp + narad_server::auth::LEEWAY_SECONDS;
    let expires = chrono::DateTime::parse_from_rfc3339(issued["expiresAt"].as_str().unwrap())
        .expect("an RFC 3339 expiry");
    assert!(
        expires.timestamp() as u64 <= token_end,
        "the ticket expires at {expires}, after its token ({token_end})"
    );
    let url = issued["url"].as_str().unwrap();
    assert_eq!(bare(&s, url, &[]).await.status(), 200);

    tokio::time::sleep(std::time::Duration::from_millis(3_000)).await;
    assert_eq!(s.get("/v1/sessions/s1", &jwt).await.status, 401);
    let refused = Answer::of(bare(&s, url, &[]).await).await;
    assert_eq!(
        (refused.status, refused.code()),
        (401, "NRD-0101"),
        "{:#}",
        refused.body
    );
    s.stop().await;
}

// ---- Client executors from a browser tab ----

/// Connects as a browser's `WebSocket` would: no Authorization, the token
/// offered as a subprotocol beside `narad`.
async fn browser_socket(
    s: &Server,
    id: &str,
    protocols: &str,
) -> Result<(reqwest::header::HeaderMap, serde_json::Value), u16> {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}/v1/executors/{id}/connect", s.base.replace("http", "ws"));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", protocols.parse().unwrap());
    let (mut socket, response) = match tokio_tungstenite::connect_async(req).await {
        Ok(ok) => ok,
        Err(tokio_tungstenite::tungstenite::Error::Http(res)) => {
            return Err(res.status().as_u16());
        }
        Err(e) => panic!("cannot connect: {e}"),
    };
    let first = loop {
        match socket.next().await.expect("a message").expect("a frame") {
            tokio_tungstenite::tungstenite::Message::Text(text) => {
                break serde_json::from_str(&text).unwrap();
            }
            _ => continue,
        }
    };
    Ok((response.headers().clone(), first))
}

#[tokio::test]
async fn a_browser_attaches_an_executor_with_its_token_as_a_subprotocol() {
    let s = Server::start().await;
    let jwt = token("acme", &[Role::Executor]);
    let (headers, attached) = browser_socket(&s, "tab-1", &format!("narad, narad.bearer.{jwt}"))
        .await
        .expect("attached");
    assert_eq!(attached["type"], "client.attached");
    assert_eq!(attached["clientExecutorId"], "tab-1");
    // The server selects `narad`, never echoes the token.
    assert_eq!(headers["sec-websocket-protocol"], "narad");

    // The same checks as the Authorization header: a bad token, a token
    // without the executor role.
    let bad = browser_socket(&s, "tab-1", "narad, narad.bearer.not-a-jwt").await;
    assert_eq!(bad.err(), Some(401));
    let reader = token("acme", &[Role::Reader]);
    let weak = browser_socket(&s, "tab-1", &format!("narad, narad.bearer.{reader}")).await;
    assert_eq!(weak.err(), Some(403));
    let none = browser_socket(&s, "tab-1", "narad").await;
    assert_eq!(none.err(), Some(401));
    s.stop().await;
}
