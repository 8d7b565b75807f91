//! Session streams: capabilities first, then every event exactly once, in
//! order, however clients attach, resume, or which replica they use.

use std::time::Duration;

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

fn sequences(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["sessionSequence"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_opens_with_capabilities_replays_then_follows_live() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    let mut stream = s
        .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
        .await;
    let first = stream.next().await.unwrap();
    assert_eq!(first.event.as_deref(), Some("capabilities"));
    assert_eq!(first.id, None, "control frames carry no id");
    assert_eq!(first.data["currentSessionSequence"], 2);
    assert_eq!(sequences(&stream.events_until(2, 10).await), [1, 2]);
    s.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [delta("d1"), delta("d2")]}),
    )
    .await
    .expect(201);
    let live = stream.events_until(4, 10).await;
    assert_eq!(sequences(&live), [3, 4]);
    assert_eq!(live[0]["eventId"], "d1");

    // Resume after an event id, or after a sequence.
    let mut resumed = s
        .stream("/v1/sessions/s1/stream", &t, &[("last-event-id", "d1")])
        .await;
    resumed.next().await.unwrap();
    assert_eq!(sequences(&resumed.events_until(4, 10).await), [4]);
    let mut after = s
        .stream("/v1/sessions/s1/stream?afterSessionSequence=3", &t, &[])
        .await;
    after.next().await.unwrap();
    assert_eq!(sequences(&after.events_until(4, 10).await), [4]);
    let bad = s
        .http
        .get(format!("{}/v1/sessions/s1/stream", s.base))
        .bearer_auth(&t)
        .header("last-event-id", "no-such-event")
        .send()
        .await
        .unwrap();
    let bad = Answer::of(bad).await;
    assert_eq!(
        (bad.status, bad.code()),
        (409, "NRD-0303"),
        "{:#}",
        bad.body
    );
    let other = token("globex", &Role::ALL);
    let theirs = s
        .http
        .get(format!("{}/v1/sessions/s1/stream", s.base))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_attaching_during_appends_miss_nothing_and_repeat_nothing() {
    let s = std::sync::Arc::new(Server::start().await);
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    const BATCHES: usize = 120;
    let writer = {
        let (s, t) = (s.clone(), t.clone());
        tokio::spawn(async move {
            for b in 0..BATCHES {
                let events: Vec<Value> = (0..1 + b % 3)
                    .map(|k| delta(&format!("d{b}-{k}")))
                    .collect();
                s.post("/v1/sessions/s1/events", &t, &json!({"events": events}))
                    .await
                    .expect(201);
                if b % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    // The last sessionSequence: 2 + 1 + 2 + 3 + 1 + ... over the batches.
    let last = 2 + (0..BATCHES).map(|b| 1 + b % 3).sum::<usize>() as u64;
    let mut readers = Vec::new();
    for n in 0..8u64 {
        let (s, t) = (s.clone(), t.clone());
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(n * 15)).await;
            let mut stream = s
                .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
                .await;
            stream.next().await.unwrap();
            stream.events_until(last, 60).await
        }));
    }
    writer.await.unwrap();
    for r in readers {
        let got = sequences(&r.await.unwrap());
        assert_eq!(
            got,
            (1..=last).collect::<Vec<_>>(),
            "every event once, in order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_append_through_one_replica_reaches_a_subscriber_of_another() {
    let a = Server::start().await;
    let b = a.replica().await;
    let t = token("acme", &Role::ALL);
    open_session(&a, &t, "s1").await;
    let mut on_b = b
        .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
        .await;
    on_b.next().await.unwrap();
    assert_eq!(sequences(&on_b.events_until(2, 10).await), [1, 2]);
    a.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [delta("via-a")]}),
    )
    .await
    .expect(201);
    let got = on_b.events_until(3, 10).await;
    assert_eq!(got[0]["eventId"], "via-a");
    // A stopping server ends its streams, so that clients resume elsewhere.
    b.stop().await;
    let ended = tokio::time::timeout(Duration::from_secs(5), on_b.next()).await;
    assert!(matches!(ended, Ok(None)), "the stream ended: {ended:?}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_that_does_not_keep_up_is_dropped_and_the_others_get_everything() {
    let s = std::sync::Arc::new(Server::start().await);
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    // A reader that never reads past the headers.
    let slow = s
        .http
        .get(format!("{}/v1/sessions/s1/stream", s.base))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(slow.status(), 200);
    let mut fast = s
        .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
        .await;
    fast.next().await.unwrap();
    // More than the slow connection's socket buffers and queues hold. The
    // writer stays at most two batches ahead of the fast reader: on a
    // loaded two-core machine a test reader is not fast by itself, and the
    // point is that the slow reader's backlog never holds the others back.
    const BATCHES: u64 = 600;
    const PER_BATCH: u64 = 50;
    let last = 2 + BATCHES * PER_BATCH;
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = {
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut got = Vec::new();
            while got
                .last()
                .is_none_or(|e: &Value| e["sessionSequence"] != last)
            {
                let frame = tokio::time::timeout(Duration::from_secs(60), fast.next())
                    .await
                    .expect("frames keep coming")
                    .expect("the fast reader is never dropped");
                if frame.event.is_none() && frame.data.get("sessionSequence").is_some() {
                    let n = frame.data["sessionSequence"].as_u64().unwrap();
                    progress.store(n, std::sync::atomic::Ordering::Relaxed);
                    got.push(frame.data);
                }
            }
            got
        })
    };
    for b in 0..BATCHES {
        let behind = 2 + b.saturating_sub(2) * PER_BATCH;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while progress.load(std::sync::atomic::Ordering::Relaxed) < behind {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fast reader stalled"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Deltas of 512 bytes: 15 MB in all (in batches under the test
        // server's body limit), beyond what the slow
        // connection's socket buffers and queue can hold, however large the
        // blocks its frames are gathered into.
        let events: Vec<Value> = (0..PER_BATCH)
            .map(|k| {
                let mut d = delta(&format!("d{b}-{k}"));
                d["delta"] = json!("x".repeat(512));
                d
            })
            .collect();
        s.post("/v1/sessions/s1/events", &t, &json!({"events": events}))
            .await
            .expect(201);
    }
    let got = sequences(&reader.await.unwrap());
    assert_eq!(
        got,
        (1..=last).collect::<Vec<_>>(),
        "the fast reader got everything"
    );
    assert!(
        s.hub.slow_consumers_dropped() >= 1,
        "the slow reader was dropped, not waited for"
    );
    drop(slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_without_a_position_is_hydrated_with_the_transcript() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    s.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [delta("d1"), delta("d2")]}),
    )
    .await
    .expect(201);
    let mut stream = s.stream("/v1/sessions/s1/stream", &t, &[]).await;
    assert_eq!(
        stream.next().await.unwrap().event.as_deref(),
        Some("capabilities")
    );
    let hydrate = stream.next().await.unwrap();
    assert_eq!(hydrate.event.as_deref(), Some("hydrate"));
    assert_eq!(hydrate.id, None, "hydrate records carry no id");
    let snapshot = &hydrate.data;
    assert_eq!(snapshot["type"], "messages.snapshot");
    assert_eq!(snapshot["coversThroughSessionSequence"], 4);
    assert_eq!(snapshot["messages"][0]["messageId"], "m1");
    assert_eq!(snapshot["messages"][0]["content"], "xx");
    assert!(snapshot.get("eventId").is_none() && snapshot.get("sessionSequence").is_none());
    // Then the authority from the start (the client's lifecycle state),
    // and live.
    s.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [delta("d3")]}),
    )
    .await
    .expect(201);
    assert_eq!(
        sequences(&stream.events_until(5, 10).await),
        [1, 2, 3, 4, 5]
    );

    // A client that did not negotiate the conversation profile gets no
    // snapshot: the authority it negotiated, from the start.
    let mut core = s
        .stream("/v1/sessions/s1/stream?profiles=narad.core/v1", &t, &[])
        .await;
    core.next().await.unwrap();
    let first = core.next().await.unwrap();
    assert_eq!(first.event, None);
    assert_eq!(first.data["type"], "run.started");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_listen_connection_is_re_established_and_nothing_is_lost() {
    let a = Server::start().await;
    let b = a.replica().await;
    let t = token("acme", &Role::ALL);
    open_session(&a, &t, "s1").await;
    let mut on_b = b
        .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
        .await;
    on_b.next().await.unwrap();
    assert_eq!(sequences(&on_b.events_until(2, 10).await), [1, 2]);
    let (admin, conn) = tokio_postgres::connect(a.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let listening = |n: u64| {
        let b = &b;
        async move {
            for _ in 0..100 {
                if b.hub.listens() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the relay listens {n} time(s)");
        }
    };
    listening(1).await;
    // Every relay listener of this database loses its connection, while
    // appends go on through A.
    let killed: i64 = admin
        .query_one(
            "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity \
             where datname = current_database() and application_name = $1) k",
            &[&narad_journal::relay::LISTENER_APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 2, "one listener per replica");
    for n in 0..20 {
        a.post(
            "/v1/sessions/s1/events",
            &t,
            &json!({"events": [delta(&format!("during-{n}"))]}),
        )
        .await
        .expect(201);
    }
    listening(2).await;
    let got = on_b.events_until(22, 15).await;
    assert_eq!(sequences(&got), (3..=22).collect::<Vec<_>>());
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_readers_each_get_every_event_once() {
    let s = std::sync::Arc::new(Server::start().await);
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    let mut readers = Vec::new();
    for _ in 0..100 {
        let mut stream = s
            .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
            .await;
        stream.next().await.unwrap();
        readers.push(stream);
    }
    const BATCHES: u64 = 50;
    const PER_BATCH: u64 = 20;
    let last = 2 + BATCHES * PER_BATCH;
    let tasks: Vec<_> = readers
        .into_iter()
        .map(|mut r| tokio::spawn(async move { sequences(&r.events_until(last, 120).await) }))
        .collect();
    for b in 0..BATCHES {
        let events: Vec<Value> = (0..PER_BATCH)
            .map(|k| delta(&format!("d{b}-{k}")))
            .collect();
        s.post("/v1/sessions/s1/events", &t, &json!({ "events": events }))
            .await
            .expect(201);
    }
    let expected: Vec<u64> = (1..=last).collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), expected);
    }
    assert_eq!(
        s.hub.slow_consumers_dropped(),
        0,
        "readers that keep up stay"
    );
}
