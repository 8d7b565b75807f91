//! Usage over time (`GET /v1/usage`): what run terminals carried, summed
//! per day (in a named time zone) or per session and split by the model
//! each run named; one tenant's alone, a limited token's sessions alone;
//! bad parameters refused with their name.

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

/// Starts run `run` in `session` (created when new) with `input`, and ends
/// it with `terminal` carrying `extra` (its usage).
async fn run(
    s: &Server,
    t: &str,
    session: &str,
    run: &str,
    input: Value,
    terminal: &str,
    extra: Value,
) {
    let created = s
        .post("/v1/sessions", t, &json!({"sessionId": session}))
        .await;
    assert!(matches!(created.status, 201 | 409), "{created:?}");
    s.post(
        "/v1/commands/start-run",
        t,
        &json!({"sessionId": session, "runId": run, "input": input}),
    )
    .await
    .expect(201);
    s.append(
        t,
        session,
        &[run_event(&format!("{run}-end"), terminal, run, extra)],
    )
    .await;
}

async fn usage(s: &Server, t: &str, query: &str) -> Value {
    s.get(&format!("/v1/usage?{query}"), t)
        .await
        .expect(200)
        .clone()
}

/// The buckets as (key, model, runs, usage).
fn buckets(page: &Value) -> Vec<(String, Option<String>, u64, Value)> {
    page["buckets"]
        .as_array()
        .unwrap_or_else(|| panic!("no buckets in {page}"))
        .iter()
        .map(|b| {
            (
                b["key"].as_str().unwrap().to_owned(),
                b["model"].as_str().map(str::to_owned),
                b["runs"].as_u64().unwrap(),
                b["usage"].clone(),
            )
        })
        .collect()
}

/// Today in a zone `hours` ahead of UTC.
fn today(hours: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::hours(hours))
        .format("%Y-%m-%d")
        .to_string()
}

#[tokio::test]
async fn usage_is_summed_per_day_and_per_session_by_model_from_every_run_terminal() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let before = [today(0), today(14), today(-11)];
    let small = json!({"model": "small-1", "prompt": "hi"});
    run(
        &s,
        &t,
        "s-1",
        "r-1",
        small.clone(),
        "run.finished",
        json!({"usage": {"inputTokens": 100, "outputTokens": 10}}),
    )
    .await;
    run(
        &s,
        &t,
        "s-1",
        "r-2",
        small.clone(),
        "run.error",
        json!({"code": "model_failed", "message": "it failed", "usage": {"inputTokens": 5.5}}),
    )
    .await;
    run(
        &s,
        &t,
        "s-2",
        "r-3",
        json!({"model": "large-2"}),
        "run.cancelled",
        json!({"usage": {"inputTokens": 1000, "outputTokens": 300, "cachedTokens": 7}}),
    )
    .await;
    // A run that named no model (its input is text), and one without usage.
    run(
        &s,
        &t,
        "s-2",
        "r-4",
        json!("plain text"),
        "run.finished",
        json!({"usage": {"outputTokens": 1}}),
    )
    .await;
    run(
        &s,
        &t,
        "s-3",
        "r-5",
        json!({"model": "small-1"}),
        "run.finished",
        json!({}),
    )
    .await;
    // Another tenant's runs count for it alone.
    let other = token("globex", &Role::ALL);
    run(
        &s,
        &other,
        "s-1",
        "r-1",
        small,
        "run.finished",
        json!({"usage": {"inputTokens": 999_999}}),
    )
    .await;

    let day = today(0);
    if [today(0), today(14), today(-11)] != before {
        // A midnight passed while the runs ran: the buckets may be two.
        return;
    }
    let page = usage(&s, &t, "").await;
    assert_eq!(page["zone"], "UTC");
    assert_eq!(
        buckets(&page),
        [
            (
                day.clone(),
                Some("large-2".into()),
                1,
                json!({"inputTokens": 1000.0, "outputTokens": 300.0, "cachedTokens": 7.0})
            ),
            (
                day.clone(),
                Some("small-1".into()),
                3,
                json!({"inputTokens": 105.5, "outputTokens": 10.0})
            ),
            (day.clone(), None, 1, json!({"outputTokens": 1.0})),
        ]
    );
    let by_session = usage(&s, &t, "by=session").await;
    assert_eq!(
        buckets(&by_session),
        [
            (
                "s-1".into(),
                Some("small-1".into()),
                2,
                json!({"inputTokens": 105.5, "outputTokens": 10.0})
            ),
            (
                "s-2".into(),
                Some("large-2".into()),
                1,
                json!({"inputTokens": 1000.0, "outputTokens": 300.0, "cachedTokens": 7.0})
            ),
            ("s-2".into(), None, 1, json!({"outputTokens": 1.0})),
            ("s-3".into(), Some("small-1".into()), 1, json!({})),
        ]
    );
    // Named sessions alone.
    let named = usage(&s, &t, "by=session&sessions=s-3,s-1,nope").await;
    let keys: Vec<String> = buckets(&named).into_iter().map(|b| b.0).collect();
    assert_eq!(keys, ["s-1", "s-3"]);
    let globex = usage(&s, &other, "by=session").await;
    assert_eq!(
        buckets(&globex),
        [(
            "s-1".into(),
            Some("small-1".into()),
            1,
            json!({"inputTokens": 999_999.0})
        )]
    );

    // The window: nothing before it, nothing at or after its end.
    let past = usage(&s, &t, "until=2020-01-01T00:00:00Z").await;
    assert_eq!(past["buckets"], json!([]));
    assert_eq!(past["since"], "2019-12-02T00:00:00.000000Z");
    let future = usage(
        &s,
        &t,
        "since=2999-01-01T00:00:00Z&until=2999-06-01T00:00:00Z",
    )
    .await;
    assert_eq!(future["buckets"], json!([]));
    // Offsets may carry a time past the years RFC 3339 writes; the window
    // answered stays within them.
    let first = usage(
        &s,
        &t,
        "since=0000-01-01T00:00:00%2B23:59&until=0000-02-01T00:00:00Z",
    )
    .await;
    assert_eq!(first["since"], "0000-01-01T00:00:00.000000Z");
    let last = usage(
        &s,
        &t,
        "since=9999-12-01T00:00:00Z&until=9999-12-31T23:59:59-23:59",
    )
    .await;
    assert_eq!(last["until"], "9999-12-31T23:59:59.999999Z");

    // Days in the reader's zone: 14 hours ahead of UTC and 11 behind
    // (the two are always on different days, so one differs from UTC's).
    for (zone, hours) in [("Pacific/Kiritimati", 14), ("Pacific/Pago_Pago", -11)] {
        let page = usage(&s, &t, &format!("zone={zone}")).await;
        assert_eq!(page["zone"], zone);
        let days: Vec<String> = buckets(&page).into_iter().map(|b| b.0).collect();
        assert_eq!(days, vec![today(hours); 3], "{zone}");
    }
}

#[tokio::test]
async fn a_token_limited_to_sessions_sums_those_alone() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    for (session, tokens) in [("s-1", 1), ("s-2", 20), ("s-3", 300)] {
        run(
            &s,
            &t,
            session,
            &format!("{session}-r"),
            json!({"model": "m"}),
            "run.finished",
            json!({"usage": {"inputTokens": tokens}}),
        )
        .await;
    }
    let mut c = claims("acme", "limited", &[Role::Reader]);
    c.sessions = Some(vec!["s-1".into(), "s-3".into()]);
    let limited = hs256(&c);
    let page = usage(&s, &limited, "").await;
    assert_eq!(buckets(&page)[0].3, json!({"inputTokens": 301.0}));
    let by_session = usage(&s, &limited, "by=session&sessions=s-2,s-3").await;
    let keys: Vec<String> = buckets(&by_session).into_iter().map(|b| b.0).collect();
    assert_eq!(keys, ["s-3"]);
    // Without the read role: refused.
    let writer = token("acme", &[Role::Writer]);
    let refused = s.get("/v1/usage", &writer).await;
    assert_eq!(refused.status, 403, "{refused:?}");
}

#[tokio::test]
async fn bad_parameters_are_refused_with_their_name() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    for (query, field) in [
        ("by=week", "by"),
        ("zone=Mars/Olympus", "zone"),
        ("zone=", "zone"),
        ("zone=0.5", "zone"),
        ("zone=%2B3", "zone"),
        ("zone=Europe/Paris;drop", "zone"),
        ("since=yesterday", "since"),
        ("until=2026-13-01T00:00:00Z", "until"),
        (
            "since=2020-01-01T00:00:00Z&until=2026-01-01T00:00:00Z",
            "until",
        ),
        ("sessions=a,,b", "sessions"),
        ("sessions=", "sessions"),
        ("colour=blue", "colour"),
    ] {
        let answer = s.get(&format!("/v1/usage?{query}"), &t).await;
        assert_eq!(answer.status, 400, "{query}: {answer:?}");
        assert_eq!(answer.body["code"], "NRD-0008", "{query}: {answer:?}");
        assert!(
            answer.body["fields"].get(field).is_some(),
            "{query}: {field} not named in {answer:?}"
        );
    }
    let many: Vec<String> = (0..101).map(|i| format!("s-{i}")).collect();
    let answer = s
        .get(
            &format!("/v1/usage?by=session&sessions={}", many.join(",")),
            &t,
        )
        .await;
    assert_eq!(answer.status, 400, "{answer:?}");
}
