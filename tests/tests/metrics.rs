//! `/metrics` end to end: appends by outcome, rule and code; streams
//! opened and closed; frames, watch events and executor deliveries; the
//! sampled gauges of the relay and the pool.
//!
//! The recorder is process-wide and shared by every server of the test
//! binary, so each test compares values before and after what it drives,
//! and the tests of this file run one at a time (a test runner that runs
//! them as threads of one process would otherwise mix their counts).

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use narad_server::auth::Role;
use narad_server::executors::ExecutorSettings;
use narad_tests::*;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// One test of this file at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every family narad records, with its Prometheus type.
const FAMILIES: &[(&str, &str)] = &[
    ("narad_appends_total", "counter"),
    ("narad_appended_events_total", "counter"),
    ("narad_append_duration_seconds", "histogram"),
    ("narad_append_rule_violations_total", "counter"),
    ("narad_append_refusals_total", "counter"),
    ("narad_append_one_trip_total", "counter"),
    ("narad_streams_open", "gauge"),
    ("narad_stream_frames_total", "counter"),
    ("narad_stream_slow_consumer_drops_total", "counter"),
    ("narad_outbox_lag_rows", "gauge"),
    ("narad_outbox_lag_seconds", "gauge"),
    ("narad_watch_events_total", "counter"),
    ("narad_executor_leases_active", "gauge"),
    ("narad_executor_deliveries_total", "counter"),
    ("narad_executor_token_expiries_total", "counter"),
    ("narad_db_pool_connections", "gauge"),
    ("narad_db_pool_max_connections", "gauge"),
    ("narad_db_pool_waiting", "gauge"),
];

/// How much each series moved from `before` to `after`.
fn moved(before: &Scrape, after: &Scrape, series: &str) -> f64 {
    after.get(series) - before.get(series)
}

/// Scrapes until `check` holds, for up to `seconds`; the last scrape.
async fn scrape_until(s: &Server, seconds: u64, check: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        let scrape = Scrape::of(s).await;
        if check(&scrape) {
            return scrape;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {seconds} s:\n{}",
            scrape.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn append(s: &Server, t: &str, events: Value) -> Answer {
    s.post("/v1/sessions/s1/events", t, &json!({ "events": events }))
        .await
}

#[tokio::test]
async fn appends_are_counted_by_outcome_rule_and_code() {
    let _serial = SERIAL.lock().await;
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    let before = Scrape::of(&s).await;

    append(&s, &t, json!([delta("d1")])).await.expect(201);
    append(&s, &t, json!([delta("d2"), delta("d3")]))
        .await
        .expect(201);
    // A retry of d1: an idempotent success.
    append(&s, &t, json!([delta("d1")])).await.expect(200);
    // A rule broken: a delta of a message never started.
    let mut stray = delta("d4");
    stray["messageId"] = json!("never-started");
    let broken = append(&s, &t, json!([stray])).await;
    broken.expect(409);
    let rule = broken.body["rule"].as_str().expect("a rule id").to_owned();
    // d1's id reused with another body.
    let mut reused = delta("d1");
    reused["delta"] = json!("other");
    let conflict = append(&s, &t, json!([reused])).await;
    assert_eq!((conflict.status, conflict.code()), (409, "NRD-0202"));
    // An event without its eventId: refused before the journal queues it.
    let mut anonymous = delta("d5");
    anonymous
        .as_object_mut()
        .expect("an object")
        .remove("eventId");
    let invalid = append(&s, &t, json!([anonymous])).await;
    assert_eq!((invalid.status, invalid.code()), (400, "NRD-0003"));
    // Not even a batch.
    s.post("/v1/sessions/s1/events", &t, &json!({"event": []}))
        .await
        .expect(400);

    let after = Scrape::of(&s).await;
    let m = |series: &str| moved(&before, &after, series);
    assert_eq!(m("narad_appends_total{outcome=\"appended\"}"), 2.0);
    assert_eq!(m("narad_appended_events_total"), 3.0);
    assert_eq!(m("narad_appends_total{outcome=\"duplicate\"}"), 1.0);
    assert_eq!(m("narad_appends_total{outcome=\"rejected\"}"), 4.0);
    assert_eq!(m("narad_appends_total{outcome=\"failed\"}"), 0.0);
    assert_eq!(
        m(&format!(
            "narad_append_rule_violations_total{{rule=\"{rule}\"}}"
        )),
        1.0,
        "{}",
        after.text
    );
    assert_eq!(
        m("narad_append_refusals_total{code=\"NRD-0202\"}"),
        1.0,
        "{}",
        after.text
    );
    // The event without an id, and the body without a batch.
    assert_eq!(m("narad_append_refusals_total{code=\"NRD-0003\"}"), 2.0);
    // Every answer the journal gave was timed: two appended, the
    // duplicate, the rule and the conflict.
    assert_eq!(m("narad_append_duration_seconds_count"), 5.0);
    assert!(m("narad_append_duration_seconds_sum") > 0.0);
    assert_eq!(
        m("narad_append_duration_seconds_bucket{le=\"+Inf\"}"),
        5.0,
        "{}",
        after.text
    );
    s.stop().await;
}

#[tokio::test]
async fn streams_are_counted_while_open_with_their_frames_and_watch_events() {
    let _serial = SERIAL.lock().await;
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    let open = |kind: &str| format!("narad_streams_open{{kind=\"{kind}\"}}");
    let frames = |kind: &str| format!("narad_stream_frames_total{{kind=\"{kind}\"}}");
    let before = Scrape::of(&s).await;

    let mut session = s
        .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
        .await;
    let mut tenant = s.stream("/v1/events", &t, &[]).await;
    // Capabilities first, on both.
    assert_eq!(
        session.next().await.expect("a frame").event.as_deref(),
        Some("capabilities")
    );
    assert_eq!(
        tenant.next().await.expect("a frame").event.as_deref(),
        Some("capabilities")
    );
    let during = Scrape::of(&s).await;
    assert_eq!(moved(&before, &during, &open("session")), 1.0);
    assert_eq!(moved(&before, &during, &open("tenant")), 1.0);

    append(&s, &t, json!([delta("d1"), delta("d2")]))
        .await
        .expect(201);
    // The session stream replays 1 and 2, then d1 and d2 follow live.
    session.events_until(4, 10).await;
    // The tenant stream is live from its attach: d1 and d2.
    let mut got = Vec::new();
    while got.len() < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(10), tenant.next())
            .await
            .expect("in time")
            .expect("open");
        if frame.data.get("sessionSequence").is_some() && frame.data["type"] != "session.revision" {
            got.push(frame.data["eventId"].clone());
        }
    }
    assert_eq!(got, [json!("d1"), json!("d2")]);
    // The coalescer's session.revision reaches both streams' channels.
    let during = scrape_until(&s, 10, |now| {
        moved(
            &before,
            now,
            "narad_watch_events_total{type=\"session.revision\"}",
        ) >= 1.0
    })
    .await;
    // Capabilities and four events on the session stream; capabilities
    // and two on the tenant stream.
    assert!(moved(&before, &during, &frames("session")) >= 5.0);
    assert!(moved(&before, &during, &frames("tenant")) >= 3.0);

    // Closed by their clients: the gauges come back down.
    drop(session);
    drop(tenant);
    scrape_until(&s, 10, |now| {
        moved(&before, now, &open("session")) == 0.0 && moved(&before, now, &open("tenant")) == 0.0
    })
    .await;

    s.stop().await;
}

#[tokio::test]
async fn every_family_is_described_and_typed_after_traffic() {
    let _serial = SERIAL.lock().await;
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    let mut session = s
        .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
        .await;
    append(&s, &t, json!([delta("d1")])).await.expect(201);
    let mut stray = delta("d2");
    stray["messageId"] = json!("never-started");
    append(&s, &t, json!([stray])).await.expect(409);
    let mut reused = delta("d1");
    reused["delta"] = json!("other");
    append(&s, &t, json!([reused])).await.expect(409);
    session.events_until(3, 10).await;
    drop(session);
    // The watch event, and the relay's lag once the relay has started and
    // been sampled.
    let all = scrape_until(&s, 10, |now| {
        now.has("narad_outbox_lag_rows") && now.text.contains("# TYPE narad_watch_events_total")
    })
    .await;
    for (family, kind) in FAMILIES {
        assert!(
            all.text.contains(&format!("# HELP {family} ")),
            "no HELP for {family}:\n{}",
            all.text
        );
        assert!(
            all.text.contains(&format!("# TYPE {family} {kind}\n")),
            "no TYPE {kind} for {family}:\n{}",
            all.text
        );
    }
    // One server in this process: the pool's gauges are its own.
    assert_eq!(all.get("narad_db_pool_max_connections"), 16.0);
    assert!(all.has("narad_db_pool_connections{state=\"in_use\"}"));
    assert!(all.has("narad_db_pool_connections{state=\"idle\"}"));
    assert!(all.get("narad_outbox_lag_rows") >= 0.0);
    assert!(all.get("narad_outbox_lag_seconds") >= 0.0);
    s.stop().await;
}

/// An executor attached over WebSocket.
struct Ws(
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
);

impl Ws {
    async fn connect(s: &Server, id: &str, jwt: &str) -> (Ws, Value) {
        let url = format!("{}/v1/executors/{id}/connect", s.base.replace("http", "ws"));
        let mut req = url.into_client_request().expect("a request");
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {jwt}").parse().expect("a header"),
        );
        let (socket, _) = tokio_tungstenite::connect_async(req)
            .await
            .expect("connects");
        let mut ws = Ws(socket);
        let attached = ws.next_control().await;
        assert_eq!(attached["type"], "client.attached");
        (ws, attached)
    }

    /// The next control message other than a heartbeat, within 5 s.
    async fn next_control(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(5), self.0.next())
                .await
                .expect("in time")
                .expect("open")
                .expect("a message");
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
                if v["type"] != "server.heartbeat" {
                    return v;
                }
            }
        }
    }

    async fn heartbeat(&mut self, id: &str, lease: &str) {
        let beat = json!({"type": "client.heartbeat", "protocolVersion": "narad/v1",
            "clientExecutorId": id, "leaseId": lease});
        self.0
            .send(Message::Text(beat.to_string().into()))
            .await
            .expect("sent");
    }
}

#[tokio::test]
async fn executor_sockets_leases_deliveries_and_expiries_are_counted() {
    let _serial = SERIAL.lock().await;
    // Tokens of 1 s, swept every 100 ms.
    let s = Server::start_with_executors(ExecutorSettings {
        heartbeat_interval: Duration::from_millis(200),
        lease_ttl: Duration::from_secs(30),
        token_ttl: Duration::from_millis(1_000),
        delivery_timeout: Duration::from_secs(30),
        sweep_interval: Duration::from_millis(100),
    })
    .await;
    let backend = token("acme", &[Role::Reader, Role::Writer, Role::Backend]);
    let mut executor = claims("acme", "desktop", &[Role::Executor]);
    executor.executors = None;
    let executor = hs256(&executor);
    session_with_run(&s, &backend, "s1", "r1", Some("desk")).await;
    let before = Scrape::of(&s).await;

    let (mut ws, attached) = Ws::connect(&s, "desk", &executor).await;
    let lease = attached["leaseId"].as_str().expect("a lease").to_owned();
    let during = Scrape::of(&s).await;
    assert_eq!(
        moved(&before, &during, "narad_streams_open{kind=\"executor\"}"),
        1.0
    );
    assert_eq!(moved(&before, &during, "narad_executor_leases_active"), 1.0);

    append(
        &s,
        &backend,
        json!([{"protocolVersion": "narad/v1", "type": "tool.call.started",
            "eventId": "start-tc1", "rootRunId": "r1", "runId": "r1",
            "toolCallId": "tc1", "toolName": "open.file", "executor": "client", "args": {}}]),
    )
    .await
    .expect(201);
    assert_eq!(ws.next_control().await["type"], "client.tool.execute");
    let delivered = Scrape::of(&s).await;
    assert_eq!(
        moved(&before, &delivered, "narad_executor_deliveries_total"),
        1.0
    );
    // client.attached and client.tool.execute at least (heartbeats too).
    assert!(
        moved(
            &before,
            &delivered,
            "narad_stream_frames_total{kind=\"executor\"}"
        ) >= 2.0
    );

    // The executor stays, and never finishes: the token lapses.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        ws.heartbeat("desk", &lease).await;
        let now = Scrape::of(&s).await;
        if moved(&before, &now, "narad_executor_token_expiries_total") >= 1.0 {
            assert_eq!(
                moved(&before, &now, "narad_executor_token_expiries_total"),
                1.0
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no expiry:\n{}",
            now.text
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The executor goes: its socket and lease stop counting.
    ws.0.close(None).await.expect("closed");
    drop(ws);
    scrape_until(&s, 10, |now| {
        moved(&before, now, "narad_streams_open{kind=\"executor\"}") == 0.0
            && moved(&before, now, "narad_executor_leases_active") == 0.0
    })
    .await;
    s.stop().await;
}

#[tokio::test]
async fn the_relay_lag_counts_the_rows_behind_a_cursor_and_ages_the_oldest() {
    let _serial = SERIAL.lock().await;
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    append(&s, &t, json!([delta("d1"), delta("d2")]))
        .await
        .expect(201);
    let journal = narad_journal::Journal::connect(s.db.url(), 2).expect("a journal");
    // From the beginning: every outbox row (session.created and the
    // session's four events) is behind.
    let origin = narad_journal::RelayCursor {
        txid: 0,
        position: 0,
    };
    // Rows count once no transaction older than theirs runs anywhere on
    // the cluster (the relay's horizon): other tests' transactions on the
    // same Postgres may hold it back for a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let all = loop {
        let all = journal
            .relay_backlog(origin, 1_000)
            .await
            .expect("measured");
        assert!(all.rows <= 5, "{all:?}");
        if all.rows == 5 || tokio::time::Instant::now() >= deadline {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(all.rows, 5, "{all:?}");
    assert!(all.oldest_age.is_some(), "{all:?}");
    // Counted up to the cap.
    let capped = journal.relay_backlog(origin, 4).await.expect("measured");
    assert_eq!(capped.rows, 4);
    // The hub's relay catches up: nothing is behind it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let cursor = s.hub.relay_cursor().expect("the relay has started");
        let behind = journal
            .relay_backlog(cursor, 1_000)
            .await
            .expect("measured");
        if behind.rows == 0 {
            assert_eq!(behind.oldest_age, None);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{behind:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

/// Work items ready in every runtime queue, whatever the series' labels.
fn ready_items(m: &Scrape) -> f64 {
    m.series
        .iter()
        .filter(|(k, _)| {
            k.starts_with("narad_runtime_queue_depth{") && k.contains("state=\"ready\"")
        })
        .map(|(_, v)| v)
        .sum()
}

/// Creates session `session` and queues a run in it for the runtimes of
/// `queue`.
async fn queued_run(s: &Server, t: &str, session: &str, queue: &str) {
    s.post("/v1/sessions", t, &json!({ "sessionId": session }))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-run",
        t,
        &json!({"sessionId": session, "runtime": {"queue": queue}}),
    )
    .await
    .expect(201);
}

#[tokio::test]
async fn no_label_value_comes_from_a_tenant_however_many_queues_it_names() {
    let _serial = SERIAL.lock().await;
    let s = Server::start().await;
    let t = token("marker-org", &Role::ALL);
    // The same kind of traffic once, so that every family it moves is
    // listed before the count.
    queued_run(&s, &t, "warm-up", "warm-up-queue").await;
    let before = scrape_until(&s, 15, |m| ready_items(m) >= 1.0).await;

    // Hundreds of queue names of the tenant's choosing, up to 256
    // characters long.
    let queues = 200;
    for n in 0..queues {
        let queue = format!("marker-queue-{n}-{}", "q".repeat(200));
        queued_run(&s, &t, &format!("marker-session-{n}"), &queue).await;
    }
    let after = scrape_until(&s, 15, |m| ready_items(m) >= (queues + 1) as f64).await;
    let added: Vec<&String> = after
        .series
        .keys()
        .filter(|k| !before.series.contains_key(*k))
        .collect();
    assert!(added.is_empty(), "series added: {added:#?}");
    for marker in ["marker-queue", "marker-org", "marker-session", "warm-up"] {
        assert!(
            !after.text.contains(marker),
            "{marker} appears in /metrics:\n{}",
            after.text
        );
    }
    s.stop().await;
}
