//! What the API makes of input it cannot take: U+0000 (which Postgres
//! cannot store), integers past 2^53 − 1, paths that are not UTF-8, wrong
//! methods, missing upgrade headers, announced bodies over the limit,
//! request ids that are not short printable text, and mutated bodies. Every
//! answer is the error envelope, a 4xx naming where the problem is; none
//! is a 5xx.

use std::io::{Read, Write};
use std::time::Duration;

use narad_server::auth::Role;
use narad_tests::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use reqwest::Method;
use serde_json::{Value, json};

fn all_roles(org: &str) -> String {
    token(org, &Role::ALL)
}

fn delta(id: &str, text: &str) -> Value {
    json!({"protocolVersion": "narad/v1", "type": "message.text.delta", "eventId": id,
        "rootRunId": "r1", "runId": "r1", "messageId": "m1", "delta": text})
}

/// Asserts a 400 envelope with `code` that names `field`.
#[track_caller]
fn refused(a: &Answer, code: &str, field: &str) {
    assert_eq!(a.status, 400, "{:#}", a.body);
    assert_eq!(a.code(), code, "{:#}", a.body);
    assert!(
        a.body["fields"].get(field).is_some(),
        "fields should name {field:?}: {:#}",
        a.body
    );
}

#[tokio::test]
async fn nul_in_any_string_is_invalid_input_not_an_outage() {
    let s = Server::start().await;
    let t = all_roles("acme");
    open_session(&s, &t, "s1").await;

    let id = s
        .post("/v1/sessions", &t, &json!({"sessionId": "a\u{0}b"}))
        .await;
    refused(&id, "NRD-0003", "/sessionId");
    let title = s
        .post(
            "/v1/sessions",
            &t,
            &json!({"sessionId": "s2", "title": "t\u{0}"}),
        )
        .await;
    refused(&title, "NRD-0003", "/title");
    // In an object key too, escaped as a JSON pointer escapes.
    let key = s
        .post(
            "/v1/sessions",
            &t,
            &json!({"sessionId": "s3", "metadata": {"a/\u{0}": 1}}),
        )
        .await;
    refused(&key, "NRD-0003", "/metadata/a~1\u{0}");
    let model_output = s
        .post(
            "/v1/sessions/s1/events",
            &t,
            &json!({"events": [delta("d1", "x\u{0}y")]}),
        )
        .await;
    refused(&model_output, "NRD-0003", "/events/0/delta");
    let said = s
        .post(
            "/v1/commands/record-user-message",
            &t,
            &json!({"sessionId": "s1", "messageScope": "session", "content": "\u{0}"}),
        )
        .await;
    refused(&said, "NRD-0003", "/content");
    // The same text escaped in the JSON source.
    let escaped = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(&t),
            Some(br#"{"sessionId": "s4", "title": "\u0000"}"#.to_vec()),
        )
        .await;
    refused(&escaped, "NRD-0003", "/title");
    let claim = s
        .call(
            Method::POST,
            "/v1/runtime/claims",
            Some(&t),
            Some(br#"{"runtimeId": "rt\u0000"}"#.to_vec()),
        )
        .await;
    refused(&claim, "NRD-0003", "/runtimeId");

    // Paths and query strings name the parameter.
    refused(
        &s.get("/v1/sessions/%00", &t).await,
        "NRD-0008",
        "sessionId",
    );
    refused(
        &s.get("/v1/sessions/s1/events?rootRunId=r%00", &t).await,
        "NRD-0008",
        "rootRunId",
    );
    refused(
        &s.get("/v1/sessions?after=%00", &t).await,
        "NRD-0008",
        "after",
    );
    // Nothing was written.
    s.get("/v1/sessions/s2", &t).await.expect(404);
    s.stop().await;
}

#[tokio::test]
async fn database_errors_other_than_an_outage_are_internal_with_the_cause_logged() {
    let s = Server::start().await;
    let (client, conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    let failed = client
        .batch_execute("select 1 / 0")
        .await
        .expect_err("division by zero");
    let e = narad_journal::JournalError::from(failed);
    assert_eq!(e.code(), narad_protocol::ErrorCode::Internal);
    let body = e.to_body();
    assert_eq!(body.code, "NRD-0001");
    assert!(!body.message.contains("22012"), "{}", body.message);
    let logged = e.to_string();
    assert!(logged.contains("22012"), "the SQLSTATE is logged: {logged}");
    assert!(logged.contains("division by zero"), "{logged}");

    // A connection that is gone is an outage: retry with backoff.
    let pid: i32 = client
        .query_one("select pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let (admin, admin_conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let admin_task = tokio::spawn(async move {
        let _ = admin_conn.await;
    });
    admin
        .execute("select pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let mut gone = None;
    for _ in 0..50 {
        if let Err(e) = client.batch_execute("select 1").await {
            gone = Some(e);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = narad_journal::JournalError::from(gone.expect("the connection is closed"));
    assert_eq!(
        e.code(),
        narad_protocol::ErrorCode::DatabaseUnavailable,
        "{e}"
    );
    task.abort();
    admin_task.abort();
    s.stop().await;
}

#[tokio::test]
async fn integers_past_2_pow_53_are_refused_everywhere() {
    let s = Server::start().await;
    let t = all_roles("acme");
    open_session(&s, &t, "n").await;
    for n in [
        "9223372036854775808",
        "9007199254740992",
        "18446744073709551616",
    ] {
        refused(
            &s.get(
                &format!("/v1/sessions/n/events?afterSessionSequence={n}"),
                &t,
            )
            .await,
            "NRD-0008",
            "afterSessionSequence",
        );
        refused(
            &s.get(
                &format!("/v1/sessions/n/events?rootRunId=r1&afterSequence={n}"),
                &t,
            )
            .await,
            "NRD-0008",
            "afterSequence",
        );
        let streamed = s
            .http
            .get(format!(
                "{}/v1/sessions/n/stream?afterSessionSequence={n}",
                s.base
            ))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap();
        refused(
            &Answer::of(streamed).await,
            "NRD-0008",
            "afterSessionSequence",
        );
    }
    // The largest safe integer is a cursor like any other.
    let edge = s
        .get(
            "/v1/sessions/n/events?afterSessionSequence=9007199254740991",
            &t,
        )
        .await;
    assert_eq!(edge.expect(200)["events"], json!([]));

    // Body fields of the protocol: the body code, with the pointer.
    let expected = s
        .post(
            "/v1/sessions/n/events",
            &t,
            &json!({"events": [delta("d1", "x")], "expectedSessionSequence": 9007199254740992u64}),
        )
        .await;
    refused(&expected, "NRD-0003", "/expectedSessionSequence");
    let release = s
        .call(
            Method::POST,
            "/v1/runtime/leases/no-such-lease/release",
            Some(&t),
            Some(br#"{"handledThrough": 9223372036854775808}"#.to_vec()),
        )
        .await;
    refused(&release, "NRD-0003", "/handledThrough");

    // A Last-Event-ID that decodes as narad's watch id with a revision
    // past the range is no id this store gave out.
    let watch = narad_protocol::watch::WatchId {
        type_name: "workspace.revision".into(),
        session_id: None,
        scope_id: None,
        revision: 1 << 63,
        covers: None,
        txid: None,
    }
    .encode();
    let tenant = s
        .http
        .get(format!("{}/v1/events", s.base))
        .bearer_auth(&t)
        .header("last-event-id", &watch)
        .send()
        .await
        .unwrap();
    let unknown = Answer::of(tenant).await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (409, "NRD-0303"),
        "{:#}",
        unknown.body
    );
    assert!(unknown.body["fields"].get("Last-Event-ID").is_some());
    s.stop().await;
}

/// An integer beyond 64 bits in a free-form value (a model's output, a
/// tool's answer) would be stored as the nearest float: a value the client
/// never sent. It is refused with its pointer, nothing written, and the
/// integers 64 bits hold (and floats, however large) are kept as sent.
#[tokio::test]
async fn integers_beyond_64_bits_in_any_value_are_refused_not_rounded() {
    let s = Server::start().await;
    let t = all_roles("acme");
    open_session(&s, &t, "w").await;
    let custom = |id: &str, value: &str| {
        format!(
            r#"{{"events": [{{"protocolVersion": "narad/v1", "type": "session.custom",
                "eventId": "{id}", "name": "acme.n", "value": {value}}}]}}"#
        )
        .into_bytes()
    };
    for (value, pointer) in [
        (r#"{"big": 18446744073709551617}"#, "/events/0/value/big"),
        (r#"[1, -9223372036854775809]"#, "/events/0/value/1"),
        (
            r#"{"a/b": [{"c": 100000000000000000000000}]}"#,
            "/events/0/value/a~1b/0/c",
        ),
    ] {
        let append = s
            .call(
                Method::POST,
                "/v1/sessions/w/events",
                Some(&t),
                Some(custom("wide", value)),
            )
            .await;
        refused(&append, "NRD-0003", pointer);
        assert!(
            append.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("send it as a string")),
            "{:#}",
            append.body
        );
    }
    let said = s
        .call(
            Method::POST,
            "/v1/commands/record-user-message",
            Some(&t),
            Some(
                br#"{"sessionId": "w", "messageScope": "session", "content": [{"type": "text", "text": "n"}], "metadata": {"n": 18446744073709551616}}"#
                    .to_vec(),
            ),
        )
        .await;
    refused(&said, "NRD-0003", "/metadata/n");
    // Nothing was written: the session holds its run and message alone.
    let history = s
        .get("/v1/sessions/w/events?afterSessionSequence=2", &t)
        .await;
    assert_eq!(history.expect(200)["events"], json!([]));

    // What 64 bits hold, and floats, are kept as they were sent.
    let kept =
        r#"{"u": 18446744073709551615, "i": -9223372036854775808, "f": 1.8446744073709552e19}"#;
    s.call(
        Method::POST,
        "/v1/sessions/w/events",
        Some(&t),
        Some(custom("kept", kept)),
    )
    .await
    .expect(201);
    let history = s
        .get("/v1/sessions/w/events?afterSessionSequence=2", &t)
        .await;
    let value = &history.expect(200)["events"][0]["value"];
    assert_eq!(value["u"].as_u64(), Some(u64::MAX), "{value}");
    assert_eq!(value["i"].as_i64(), Some(i64::MIN), "{value}");
    assert_eq!(value["f"].as_f64(), Some(1.8446744073709552e19), "{value}");
    s.stop().await;
}

/// JSON has one number type and JSON Schema counts `2.0` as an integer: a
/// field that takes an integer takes it written with a fraction or an
/// exponent too, in every body.
#[tokio::test]
async fn integers_written_as_floats_are_integers() {
    let s = Server::start().await;
    let t = all_roles("acme");
    open_session(&s, &t, "f").await;
    let claim = s
        .post(
            "/v1/runtime/claims",
            &t,
            &json!({"runtimeId": "rt", "waitMs": 0.0}),
        )
        .await;
    assert_eq!(claim.status, 204, "{:#}", claim.body);
    let appended = s
        .post(
            "/v1/sessions/f/events",
            &t,
            &json!({"events": [{"protocolVersion": "narad/v1", "type": "session.custom",
                "eventId": "e1", "name": "acme.n", "value": {"n": 1e3}}],
                "expectedSessionSequence": 2.0}),
        )
        .await;
    assert_eq!(appended.status, 201, "{:#}", appended.body);
    let history = whole_history(&s, &t, "f").await;
    let custom = history.iter().find(|e| e["eventId"] == "e1").unwrap();
    assert_eq!(custom["value"], json!({"n": 1000}));
    // Not integral: still refused where an integer is required.
    let fraction = s
        .post(
            "/v1/runtime/claims",
            &t,
            &json!({"runtimeId": "rt", "waitMs": 0.5}),
        )
        .await;
    refused(&fraction, "NRD-0003", "/waitMs");
    // A member is left out, never null (serde alone would read null as
    // absent, where the document says an integer).
    let null = s
        .post(
            "/v1/runtime/claims",
            &t,
            &json!({"runtimeId": "rt", "waitMs": null}),
        )
        .await;
    refused(&null, "NRD-0003", "/waitMs");
    // A runtime's name is an id: 1 to 256 characters.
    let unnamed = s
        .post("/v1/runtime/claims", &t, &json!({"runtimeId": ""}))
        .await;
    refused(&unnamed, "NRD-0003", "/runtimeId");
}

#[tokio::test]
async fn a_wrong_method_is_405_with_allow_in_the_envelope() {
    let s = Server::start().await;
    let t = all_roles("acme");
    let res = s
        .http
        .delete(format!("{}/v1/sessions", s.base))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 405);
    let allow = res
        .headers()
        .get("allow")
        .expect("an Allow header")
        .to_str()
        .unwrap()
        .to_owned();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    let a = Answer::of(res).await;
    assert_eq!(a.code(), "NRD-0009", "{:#}", a.body);
    assert_eq!(a.body["title"], "Method not allowed");
    s.stop().await;
}

#[tokio::test]
async fn a_path_that_is_not_utf8_is_refused_in_the_envelope() {
    let s = Server::start().await;
    let t = all_roles("acme");
    refused(
        &s.get("/v1/sessions/%C0%AF", &t).await,
        "NRD-0008",
        "sessionId",
    );
    refused(
        &s.call(
            Method::DELETE,
            "/v1/sessions/s1/queued-starts/%FF",
            Some(&t),
            None,
        )
        .await,
        "NRD-0008",
        "queueId",
    );
    refused(
        &s.get("/v1/sessions?after=%C0%AF", &t).await,
        "NRD-0008",
        "after",
    );
    s.stop().await;
}

#[tokio::test]
async fn connect_without_upgrade_headers_is_refused_in_the_envelope() {
    let s = Server::start().await;
    let t = token("acme", &[Role::Executor]);
    let a = s.get("/v1/executors/desktop-1/connect", &t).await;
    refused(&a, "NRD-0008", "Upgrade");
    assert!(
        a.body["message"].as_str().unwrap().contains("WebSocket"),
        "{:#}",
        a.body
    );
    // A handshake whose key is not 16 bytes in base64 (RFC 6455 §4.1) is
    // refused before the switch, like any other malformed header.
    for key in [
        "0",
        "not base64!",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    ] {
        let res = s
            .http
            .get(format!("{}/v1/executors/desktop-1/connect", s.base))
            .bearer_auth(&t)
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", key)
            .send()
            .await
            .unwrap();
        refused(&Answer::of(res).await, "NRD-0008", "Sec-WebSocket-Key");
    }
    s.stop().await;
}

#[tokio::test]
async fn an_empty_batch_is_an_invalid_body_at_events() {
    let s = Server::start().await;
    let t = all_roles("acme");
    open_session(&s, &t, "s1").await;
    let a = s
        .post("/v1/sessions/s1/events", &t, &json!({"events": []}))
        .await;
    refused(&a, "NRD-0003", "/events");
    s.stop().await;
}

#[tokio::test]
async fn malformed_json_on_claims_is_malformed_json() {
    let s = Server::start().await;
    let t = all_roles("acme");
    for path in [
        "/v1/runtime/claims",
        "/v1/runtime/leases/no-such-lease/release",
    ] {
        let a = s
            .call(
                Method::POST,
                path,
                Some(&t),
                Some(b"{\"waitMs\": ".to_vec()),
            )
            .await;
        assert_eq!(a.status, 400, "{path}: {:#}", a.body);
        assert_eq!(a.code(), "NRD-0002", "{path}: {:#}", a.body);
    }
    // An empty body is still `{}`.
    let empty = s
        .call(
            Method::POST,
            "/v1/runtime/claims",
            Some(&t),
            Some(Vec::new()),
        )
        .await;
    assert_eq!(empty.status, 204, "{:#}", empty.body);
    s.stop().await;
}

/// Sends only the head of a request announcing `length` body bytes, and
/// reads what comes back within two seconds.
fn announce(base: &str, path: &str, token: &str, length: usize) -> String {
    let addr = base.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    write!(
        tcp,
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&answer).contains("\"code\"") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn an_announced_length_over_the_limit_is_refused_before_the_body() {
    let s = Server::start().await;
    let t = all_roles("acme");
    let base = s.base.clone();
    let answer =
        tokio::task::spawn_blocking(move || announce(&base, "/v1/sessions", &t, MAX_BODY + 1))
            .await
            .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "answered at once: {answer:?}"
    );
    assert!(answer.contains("NRD-0006"), "{answer}");
    s.stop().await;
}

#[tokio::test]
async fn request_ids_are_kept_only_when_short_and_printable() {
    let s = Server::start().await;
    let id_of = |value: reqwest::header::HeaderValue| {
        let http = s.http.clone();
        let url = format!("{}/healthz", s.base);
        async move {
            let res = http
                .get(url)
                .header("x-request-id", value)
                .send()
                .await
                .unwrap();
            res.headers()
                .get("x-request-id")
                .expect("every answer has an id")
                .to_str()
                .expect("printable")
                .to_owned()
        }
    };
    let short = "client-chosen-id.1";
    assert_eq!(id_of(short.parse().unwrap()).await, short);
    let long = "x".repeat(129);
    let replaced = id_of(long.parse().unwrap()).await;
    assert_ne!(replaced, long);
    assert!(replaced.len() <= 128);
    let exactly = "y".repeat(128);
    assert_eq!(id_of(exactly.parse().unwrap()).await, exactly);
    let bytes = reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
    let replaced = id_of(bytes).await;
    assert!(replaced.is_ascii() && !replaced.is_empty(), "{replaced:?}");
    let spaced = id_of("two words".parse().unwrap()).await;
    assert_ne!(spaced, "two words");
    s.stop().await;
}

#[tokio::test]
async fn last_event_id_that_is_not_text_is_refused() {
    let s = Server::start().await;
    let t = all_roles("acme");
    open_session(&s, &t, "s1").await;
    for path in ["/v1/sessions/s1/stream", "/v1/events"] {
        let res = s
            .http
            .get(format!("{}{path}", s.base))
            .bearer_auth(&t)
            .header(
                "last-event-id",
                reqwest::header::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
            )
            .send()
            .await
            .unwrap();
        // Not a stream that ignores the header and never ends.
        let a = tokio::time::timeout(Duration::from_secs(5), Answer::of(res))
            .await
            .expect("an answer, not a stream");
        refused(&a, "NRD-0008", "Last-Event-ID");
    }
    s.stop().await;
}

/// A valid batch, then mutations of it: fields removed, replaced with
/// other JSON, bytes flipped, text cut short.
fn mutated_batches() -> Vec<Vec<u8>> {
    let valid = json!({"events": [
        {"protocolVersion": "narad/v1", "type": "message.text.started", "eventId": "m-start",
         "rootRunId": "r1", "runId": "r1", "messageId": "m2", "role": "assistant",
         "messageScope": "run"},
        delta("m-delta", "hello")
    ], "expectedSessionSequence": 3});
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::from),
        Just(json!("\u{0}")),
        Just(json!([])),
        Just(json!({})),
    ];
    let paths = [
        "",
        "/events",
        "/events/0",
        "/events/1",
        "/events/0/type",
        "/events/0/eventId",
        "/events/0/protocolVersion",
        "/events/1/delta",
        "/events/1/messageId",
        "/events/0/runId",
        "/expectedSessionSequence",
    ];
    let json_mutation = (
        proptest::sample::select(paths.to_vec()),
        leaf,
        any::<bool>(),
    )
        .prop_map(move |(path, leaf, remove)| {
            let mut v = valid.clone();
            if remove && !path.is_empty() {
                let (parent, key) = path.rsplit_once('/').unwrap();
                match v.pointer_mut(parent) {
                    Some(Value::Object(o)) => {
                        o.remove(key);
                    }
                    Some(Value::Array(a)) => {
                        if let Ok(i) = key.parse::<usize>() {
                            a.remove(i);
                        }
                    }
                    _ => {}
                }
            } else if let Some(slot) = v.pointer_mut(path) {
                *slot = leaf;
            }
            serde_json::to_vec(&v).unwrap()
        });
    let text = serde_json::to_vec(&json!({"events": [delta("m-delta", "hello")]})).unwrap();
    let len = text.len();
    let byte_mutation = (0..len, any::<u8>(), 0..=len).prop_map(move |(at, byte, cut)| {
        let mut t = text.clone();
        t[at] = byte;
        t.truncate(cut.max(1));
        t
    });
    let strategy = prop_oneof![3 => json_mutation, 1 => byte_mutation];
    let mut runner = TestRunner::deterministic();
    (0..150)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect()
}

#[tokio::test]
async fn mutated_append_bodies_never_get_a_server_error() {
    let s = Server::start().await;
    let t = all_roles("acme");
    open_session(&s, &t, "s1").await;
    for body in mutated_batches() {
        let a = s
            .call(
                Method::POST,
                "/v1/sessions/s1/events",
                Some(&t),
                Some(body.clone()),
            )
            .await;
        assert!(
            a.status < 500,
            "{} for {}: {:#}",
            a.status,
            String::from_utf8_lossy(&body),
            a.body
        );
        if a.status >= 400 {
            assert!(a.code().starts_with("NRD-"), "{:#}", a.body);
        }
    }
    s.stop().await;
}
