//! Per-tenant rate limits and quotas: over a limit the answer is 429 with
//! `Retry-After` and the limit's own code, nothing is written, other
//! organisations are not touched, streams are refused at open (never cut),
//! limits hold across replicas, an operator's override takes effect, and
//! `/metrics` counts refusals by limit without tenant ids.

use std::time::Duration;

use narad_server::auth::Role;
use narad_server::quotas::{Limit, LimitValues};
use narad_tests::*;
use serde_json::{Value, json};

fn limits(pairs: &[(Limit, u64)]) -> LimitValues {
    pairs
        .iter()
        .fold(LimitValues::default(), |v, (l, n)| v.with(*l, Some(*n)))
}

async fn append_one(s: &Server, t: &str, session: &str, id: &str) -> Answer {
    s.post(
        &format!("/v1/sessions/{session}/events"),
        t,
        &json!({"events": [delta(id)]}),
    )
    .await
}

/// Every 429 of a limit looks the same from outside.
fn assert_limited(a: &Answer, code: &str, limit: &str) {
    assert_eq!(a.status, 429, "{}", a.body);
    assert_eq!(a.body["code"], code, "{}", a.body);
    assert_eq!(a.body["details"]["limit"], limit, "{}", a.body);
    let wait = a.retry_after.expect("Retry-After");
    assert!((1..=3600).contains(&wait), "Retry-After {wait}");
}

#[tokio::test]
async fn an_organisation_over_its_event_rate_gets_429s_and_nothing_is_written() {
    let s = Server::start_with_limits(limits(&[
        (Limit::EventsPerSecond, 10),
        (Limit::EventsBurst, 10),
    ]))
    .await;
    let acme = token("acme", &[Role::Writer, Role::Backend, Role::Reader]);
    let globex = token("globex", &[Role::Writer, Role::Backend, Role::Reader]);
    // The bucket refills at 10/s while the loop runs; on a slow machine the
    // loop takes long enough for that to matter, so the bound counts it.
    let began = std::time::Instant::now();
    open_session(&s, &acme, "a").await;
    open_session(&s, &globex, "g").await;
    // The two appends of open_session took two of acme's ten.
    let mut accepted = 0;
    let mut refused = None;
    for i in 0..30 {
        let a = append_one(&s, &acme, "a", &format!("a{i}")).await;
        match a.status {
            201 => accepted += 1,
            _ => {
                refused = Some(a);
                break;
            }
        }
    }
    let refill = (10.0 * began.elapsed().as_secs_f64()).ceil() as usize;
    let refused = refused.expect("acme is refused within 30 appends");
    assert_limited(&refused, "NRD-0601", "eventsPerSecond");
    assert!(
        (7..=9 + refill).contains(&accepted),
        "about the burst passes: {accepted} (refill while looping: {refill})"
    );
    // Nothing of the refused append is in the journal.
    let history = whole_history(&s, &acme, "a").await;
    assert_eq!(history.len(), 2 + accepted);

    // globex is untouched by acme's flood.
    for i in 0..5 {
        append_one(&s, &globex, "g", &format!("g{i}"))
            .await
            .expect(201);
    }

    // After Retry-After, acme appends again; the same eventId that was
    // refused is now accepted (the refusal wrote nothing).
    tokio::time::sleep(Duration::from_secs(refused.retry_after.unwrap())).await;
    append_one(&s, &acme, "a", &format!("a{accepted}"))
        .await
        .expect(201);

    // A batch larger than the burst is not refused forever: it drains the
    // bucket and leaves a debt.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let batch: Vec<Value> = (0..25).map(|i| delta(&format!("big{i}"))).collect();
    s.post("/v1/sessions/a/events", &acme, &json!({"events": batch}))
        .await
        .expect(201);
    let after_debt = append_one(&s, &acme, "a", "after-debt").await;
    assert_limited(&after_debt, "NRD-0601", "eventsPerSecond");

    // Refusals are counted by limit, never by tenant.
    let scrape = Scrape::of(&s).await;
    assert!(scrape.get("narad_limit_refusals_total{limit=\"events_per_second\"}") >= 2.0);
    for line in scrape
        .text
        .lines()
        .filter(|l| l.starts_with("narad_limit_refusals_total"))
    {
        assert!(!line.contains("acme"), "{line}");
    }
    s.stop().await;
}

#[tokio::test]
async fn commands_and_sessions_have_limits_of_their_own() {
    let s = Server::start_with_limits(limits(&[
        (Limit::CommandsPerSecond, 1),
        (Limit::CommandsBurst, 3),
        (Limit::Sessions, 2),
    ]))
    .await;
    let acme = token("acme", &[Role::Writer]);
    // Sessions: two, by either route; the third is refused and not made.
    s.post("/v1/sessions", &acme, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/create-session",
        &acme,
        &json!({"sessionId": "s2"}),
    )
    .await
    .expect(201);
    let third = s
        .post("/v1/sessions", &acme, &json!({"sessionId": "s3"}))
        .await;
    assert_limited(&third, "NRD-0605", "sessions");
    // Commands: three in a burst were spent by those three calls.
    let fourth = s
        .post(
            "/v1/commands/update-session",
            &acme,
            &json!({"sessionId": "s1", "title": "t"}),
        )
        .await;
    assert_limited(&fourth, "NRD-0602", "commandsPerSecond");
    tokio::time::sleep(Duration::from_secs(fourth.retry_after.unwrap())).await;
    let listed = s.get("/v1/sessions", &token("acme", &[Role::Reader])).await;
    let ids: Vec<&str> = listed.expect(200)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["sessionId"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    // Rate refusals are counted, not written to the audit log one by one.
    let log = s
        .get("/v1/audit?limit=100", &token("acme", &[Role::Admin]))
        .await;
    let statuses: Vec<u64> = log.expect(200)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_u64().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [201, 201, 429],
        "the session limit's refusal is audited"
    );
    s.stop().await;
}

#[tokio::test]
async fn streams_over_the_limit_are_refused_at_open_on_every_replica_and_never_cut() {
    let l = limits(&[(Limit::OpenStreams, 2)]);
    let s = Server::start_with_limits(l).await;
    let replica = s.replica_with_limits(l).await;
    let acme = token("acme", &[Role::Writer, Role::Backend, Role::Reader]);
    let globex = token("globex", &[Role::Reader]);
    open_session(&s, &acme, "a").await;
    let mut first = s.stream("/v1/sessions/a/stream", &acme, &[]).await;
    let mut second = replica.stream("/v1/events", &acme, &[]).await;
    // The third, on either replica, is refused before it is a stream.
    for server in [&s, &replica] {
        let third = server.get("/v1/sessions/a/stream", &acme).await;
        assert_limited(&third, "NRD-0603", "openStreams");
        let tenant = server.get("/v1/events", &acme).await;
        assert_limited(&tenant, "NRD-0603", "openStreams");
    }
    // Another organisation's streams are its own business.
    let _other = s.stream("/v1/events", &globex, &[]).await;
    // The two open ones go on delivering.
    s.append(&acme, "a", &[delta("after-refusal")]).await;
    let seen = first.events_until(3, 10).await;
    assert!(seen.iter().any(|e| e["eventId"] == "after-refusal"));
    let mut tenant_saw = false;
    for _ in 0..20 {
        match second.next().await {
            Some(f) if f.data["eventId"] == "after-refusal" => {
                tenant_saw = true;
                break;
            }
            Some(_) => {}
            None => break,
        }
    }
    assert!(tenant_saw, "the tenant stream delivers after a refusal");
    // Closing one frees its place.
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let again = s
            .http
            .get(format!("{}/v1/sessions/a/stream", s.base))
            .bearer_auth(&acme)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if again == 200 {
            break;
        }
        assert_eq!(again, 429);
        assert!(
            tokio::time::Instant::now() < deadline,
            "a closed stream's place is freed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    replica.stop().await;
    s.stop().await;
}

#[tokio::test]
async fn attached_executors_are_limited_and_reattaching_is_always_allowed() {
    let s = Server::start_with_limits(limits(&[(Limit::AttachedExecutors, 1)])).await;
    let exec = token("acme", &[Role::Executor]);
    s.post("/v1/executors/desk/attach", &exec, &json!({}))
        .await
        .expect(201);
    s.post("/v1/executors/desk/attach", &exec, &json!({}))
        .await
        .expect(201);
    let other = s
        .post("/v1/executors/laptop/attach", &exec, &json!({}))
        .await;
    assert_limited(&other, "NRD-0604", "attachedExecutors");
    // The socket is refused before it switches protocols.
    let socket = s
        .http
        .get(format!("{}/v1/executors/laptop/connect", s.base))
        .bearer_auth(&exec)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(socket.status(), 429);
    assert!(socket.headers().contains_key("retry-after"));
    // Another organisation attaches its own.
    s.post(
        "/v1/executors/laptop/attach",
        &token("globex", &[Role::Executor]),
        &json!({}),
    )
    .await
    .expect(201);
    s.stop().await;
}

#[tokio::test]
async fn an_operator_override_lifts_or_tightens_one_organisation_at_once() {
    let s = Server::start_with_limits(limits(&[(Limit::Sessions, 1)])).await;
    let operator = token(OPERATOR_ORG, &[Role::Admin]);
    let acme = token("acme", &[Role::Writer]);
    let globex = token("globex", &[Role::Writer]);
    for t in [&acme, &globex] {
        s.post("/v1/sessions", t, &json!({})).await.expect(201);
        assert_limited(
            &s.post("/v1/sessions", t, &json!({})).await,
            "NRD-0605",
            "sessions",
        );
    }
    let put = s
        .call(
            reqwest::Method::PUT,
            "/v1/admin/tenants/acme/limits",
            Some(&operator),
            Some(serde_json::to_vec(&json!({"sessions": null})).unwrap()),
        )
        .await;
    assert_eq!(put.expect(200)["effective"]["sessions"], Value::Null);
    s.post("/v1/sessions", &acme, &json!({})).await.expect(201);
    assert_eq!(
        s.post("/v1/sessions", &globex, &json!({})).await.status,
        429
    );
    s.stop().await;
}

#[tokio::test]
async fn one_rate_holds_over_every_replica_together() {
    let l = limits(&[(Limit::EventsPerSecond, 1), (Limit::EventsBurst, 20)]);
    let s = Server::start_with_limits(l).await;
    let replica = s.replica_with_limits(l).await;
    let acme = token("acme", &[Role::Writer, Role::Backend, Role::Reader]);
    open_session(&s, &acme, "a").await;
    // Appends alternate between the replicas until both refuse: together
    // they let through about one burst (each takes chunks of one token at
    // this rate), not a burst each.
    let mut accepted = 0;
    let mut refused = [false, false];
    for i in 0..100 {
        let server = if i % 2 == 0 { &s } else { &replica };
        let a = append_one(server, &acme, "a", &format!("e{i}")).await;
        match a.status {
            201 => accepted += 1,
            429 => refused[i % 2] = true,
            other => panic!("{other}: {}", a.body),
        }
        if refused == [true, true] {
            break;
        }
    }
    assert_eq!(refused, [true, true]);
    assert!(
        (16..=22).contains(&accepted),
        "one burst over both replicas: {accepted}"
    );
    replica.stop().await;
    s.stop().await;
}
