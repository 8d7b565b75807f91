//! The SDK's stream consumer against real servers: it resumes across a
//! replica stopping mid-stream and across replay blocks, and delivers each
//! authority event once, in order.

use std::time::Duration;

use narad_client::{Client, Item};
use narad_server::auth::Role;
use narad_tests::{Server, delta, open_session, token};
use serde_json::{Value, json};

/// Authority sequences until `last`, within `seconds`.
async fn authority_until(follow: &mut narad_client::Follow, last: u64, seconds: u64) -> Vec<u64> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while got.last() != Some(&last) {
        let item = tokio::time::timeout_at(deadline, follow.next())
            .await
            .unwrap_or_else(|_| panic!("no sequence {last} within {seconds} s: {got:?}"))
            .expect("the stream goes on")
            .expect("an item");
        if let Item::Authority(e) = item {
            got.push(e["sessionSequence"].as_u64().unwrap());
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn following_survives_a_replica_stopping_mid_stream() {
    let a = Server::start().await;
    let b = a.replica().await;
    let t = token("acme", &Role::ALL);
    open_session(&b, &t, "s1").await;
    let client = Client::new(vec![a.base.clone(), b.base.clone()], &t);
    let mut follow = client.follow_session("s1");
    assert_eq!(authority_until(&mut follow, 2, 10).await, [1, 2]);
    const BATCHES: u64 = 40;
    // Half the batches while the client reads from a, the other half after
    // a stopped: those can only reach the client over a new connection.
    let write = |range: std::ops::Range<u64>| {
        let (base, t) = (b.base.clone(), t.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            for n in range {
                let r = http
                    .post(format!("{base}/v1/sessions/s1/events"))
                    .bearer_auth(&t)
                    .json(&json!({"events": [delta(&format!("d{n}"))]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let first_half = write(0..BATCHES / 2);
    let mut got = authority_until(&mut follow, 12, 10).await;
    // The replica the client reads from stops; the client goes on on b.
    a.stop().await;
    first_half.await.unwrap();
    let second_half = write(BATCHES / 2..BATCHES);
    got.extend(authority_until(&mut follow, 2 + BATCHES, 30).await);
    second_half.await.unwrap();
    assert_eq!(
        got,
        (3..=2 + BATCHES).collect::<Vec<_>>(),
        "once each, in order"
    );
    assert!(follow.connections() >= 2, "it reconnected");
    // The reducer fed across both connections holds what one fed from
    // history alone holds.
    let page = b.get("/v1/sessions/s1/events?limit=1000", &t).await;
    let mut from_history = narad_protocol::reducer::Reducer::new(narad_protocol::ProfileSet::all());
    for e in page.expect(200)["events"].as_array().unwrap() {
        from_history.deliver_json(e).unwrap();
    }
    assert_eq!(
        follow.reducer().expect("followed from the start").state(),
        from_history.state()
    );
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn following_the_tenant_stream_crosses_replay_blocks() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    let total = narad_server::routes::tenant_stream::REPLAY_BLOCK as u64 + 700;
    for chunk in 0..total.div_ceil(100) {
        let events: Vec<Value> = (chunk * 100..((chunk + 1) * 100).min(total))
            .map(|n| delta(&format!("e{n}")))
            .collect();
        s.post("/v1/sessions/s1/events", &t, &json!({ "events": events }))
            .await
            .expect(201);
    }
    let client = Client::new(vec![s.base.clone()], &t);
    let mut follow = client.follow_tenant(None, Some("start-s1"));
    let got = authority_until(&mut follow, 2 + total, 60).await;
    assert_eq!(got, (3..=2 + total).collect::<Vec<_>>());
    assert_eq!(follow.connections(), 2, "one block, then the rest");
    // A cursor from another store is refused for good.
    let mut lost = client.follow_tenant(None, Some("no-such-event"));
    match lost.next().await {
        Err(narad_client::ClientError::Refused { status, body }) => {
            assert_eq!(status, 409);
            assert_eq!(body["code"], "NRD-0303");
        }
        other => panic!("refused, got {other:?}"),
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_gap_is_filled_from_history() {
    let a = Server::start().await;
    let b = a.replica().await;
    let t = token("acme", &Role::ALL);
    open_session(&a, &t, "s1").await;
    let client = Client::new(vec![a.base.clone(), b.base.clone()], &t);
    let mut follow = client.follow_tenant(None, Some("start-s1"));
    a.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [delta("old1"), delta("old2")]}),
    )
    .await
    .expect(201);
    assert_eq!(authority_until(&mut follow, 4, 10).await, [3, 4]);
    // While the client is away, its replica stops, more is appended, and
    // retention forgets everything up to old2.
    a.stop().await;
    b.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [delta("new1")]}),
    )
    .await
    .expect(201);
    let (admin, conn) = tokio_postgres::connect(b.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    admin
        .batch_execute(
            "update outbox set created_at = now() - interval '2 days' where event_id <> 'new1'",
        )
        .await
        .unwrap();
    let journal = narad_journal::Journal::connect(b.db.url(), 2).unwrap();
    let mut forgotten = 0;
    for _ in 0..400 {
        forgotten += journal
            .forget_outbox(Duration::from_secs(86_400), 1_000)
            .await
            .unwrap();
        if forgotten >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(forgotten, 5);
    // Resuming after old2 finds it forgotten: the client re-reads the
    // session's history from where it stood, and sees new1 once.
    let mut items = Vec::new();
    loop {
        let item = tokio::time::timeout(Duration::from_secs(10), follow.next())
            .await
            .expect("the stream goes on")
            .unwrap()
            .unwrap();
        let done = matches!(&item, Item::Authority(e) if e["eventId"] == "new1");
        if !matches!(item, Item::Capabilities(_) | Item::Watch(_)) {
            items.push(item);
        }
        if done {
            break;
        }
    }
    assert!(
        matches!(&items[0], Item::ReplayGap(g) if g["forgottenThrough"] == "old2"),
        "{items:?}"
    );
    assert_eq!(items.len(), 2, "{items:?}");
    b.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [delta("new2")]}),
    )
    .await
    .expect(201);
    // new1 again from the stream is skipped; new2 follows.
    assert_eq!(authority_until(&mut follow, 6, 10).await, [6]);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_over_a_limit_is_opened_again_when_retry_after_says() {
    // The first replica is over the tenant's stream limit: 429 with
    // Retry-After: 1 (a refusal at open, never a cut mid-frame).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let limited = format!("http://{}", listener.local_addr().unwrap());
    let refusals = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = refusals.clone();
    let app = axum::Router::new().fallback(move || {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "1")],
                axum::Json(json!({"code": "NRD-0501", "title": "Over a limit",
                                  "message": "open streams: retry after 1 s"})),
            )
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;

    let started = tokio::time::Instant::now();
    let client = Client::new(vec![limited, s.base.clone()], &t);
    let mut follow = client.follow_session("s1");
    assert_eq!(authority_until(&mut follow, 2, 20).await, [1, 2]);
    assert_eq!(refusals.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The SDK waited as asked before its next try (its own backoff is 100 ms).
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "reconnected after {:?}, before the 1 s Retry-After asked for",
        started.elapsed()
    );
}
