//! Appends to a session this process knows go in one round trip, behind a
//! guard: whatever changed the session elsewhere (another replica's
//! append, a runtime's claim, a lock held, a retried eventId), the answer
//! is the one the two-round-trip append gives.

use std::time::Duration;

use narad_journal::WorkOrder;
use narad_journal::{AppendOptions, Fence, HistoryQuery, Journal, JournalError, TenantId};
use narad_protocol::commands::OnLost;
use narad_protocol::primitives::SessionId;
use serde_json::{Value, json};

mod common;
use common::*;

fn start(run: &str, message: &str) -> Vec<Value> {
    vec![
        ev(
            &format!("start-{run}"),
            "run.started",
            Some((run, run)),
            json!({}),
        ),
        ev(
            &format!("open-{message}"),
            "message.text.started",
            Some((run, run)),
            json!({"messageId": message, "role": "assistant", "messageScope": "run"}),
        ),
    ]
}

fn delta(id: &str, run: &str, message: &str) -> Value {
    ev(
        id,
        "message.text.delta",
        Some((run, run)),
        json!({"messageId": message, "delta": "x"}),
    )
}

async fn append_on(
    journal: &Journal,
    tenant: &TenantId,
    session: &str,
    events: &[Value],
    options: AppendOptions,
) -> Result<narad_journal::Appended, JournalError> {
    let sid = SessionId::new(session).unwrap();
    journal.append(tenant, &sid, events, options).await
}

fn sequences(a: &narad_journal::Appended) -> Vec<u64> {
    a.events.iter().map(|e| e.session_sequence).collect()
}

/// The history's (sessionSequence, eventId), which must count 1, 2, 3…
async fn history(f: &Fixture, session: &str) -> Vec<(u64, String)> {
    let page = f.history(session, HistoryQuery::default()).await.unwrap();
    let seen: Vec<(u64, String)> = page
        .events
        .iter()
        .map(|e| {
            (
                e["sessionSequence"].as_u64().unwrap(),
                e["eventId"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (n, (seq, _)) in seen.iter().enumerate() {
        assert_eq!(*seq, n as u64 + 1, "no gap, no duplicate: {seen:?}");
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_to_a_known_session_take_one_round_trip_and_store_what_a_rebuild_derives() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(&s, &start("r1", "m1")).await.unwrap();
    let before = f.journal.append_stats();
    for n in 1..=5 {
        let a = f
            .append(&s, &[delta(&format!("d{n}"), "r1", "m1")])
            .await
            .unwrap();
        assert_eq!(sequences(&a), [2 + n]);
        assert_eq!(a.events[0].sequence, Some(2 + n), "the run's sequence");
    }
    let after = f.journal.append_stats();
    assert_eq!(after.one_trip - before.one_trip, 5, "{after:?}");
    assert_eq!(after.one_trip_fell_back, before.one_trip_fell_back);

    // A refusal decided on what is known is the engine's refusal: the
    // message is completed, so a delta to it breaks a rule.
    let done = ev(
        "done",
        "message.text.completed",
        Some(("r1", "r1")),
        json!({"messageId": "m1"}),
    );
    f.append(&s, &[done]).await.unwrap();
    match f.append(&s, &[delta("late", "r1", "m1")]).await {
        Err(JournalError::Rejected { index: 0, .. }) => {}
        other => panic!("a delta to a completed message is refused: {other:?}"),
    }
    let after = f.journal.append_stats();
    assert_eq!(after.one_trip - before.one_trip, 7, "{after:?}");

    // A key not read before (another message) goes the two-round-trip way.
    let other = ev(
        "open-m2",
        "message.text.started",
        Some(("r1", "r1")),
        json!({"messageId": "m2", "role": "assistant", "messageScope": "run"}),
    );
    assert_eq!(sequences(&f.append(&s, &[other]).await.unwrap()), [9]);
    assert_eq!(f.journal.append_stats().one_trip, after.one_trip);

    let seen = history(&f, "s1").await;
    assert_eq!(seen.len(), 9);
    assert_eq!(
        f.journal.stored_state(&f.tenant, "s1").await.unwrap(),
        f.journal.derived_state(&f.tenant, "s1").await.unwrap(),
        "the state written in one round trip is the state the events derive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replicas_append_makes_what_a_process_knows_stale_and_nothing_is_lost() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let replica = Journal::connect(f.db.url(), 4).unwrap();
    f.append(&s, &start("r1", "m1")).await.unwrap();
    f.append(&s, &[delta("d1", "r1", "m1")]).await.unwrap();
    let known = f.journal.append_stats();

    // The other replica appends: this process's knowledge is stale.
    let b = append_on(
        &replica,
        &f.tenant,
        "s1",
        &[delta("d2", "r1", "m1")],
        AppendOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(sequences(&b), [4]);
    let a = f.append(&s, &[delta("d3", "r1", "m1")]).await.unwrap();
    assert_eq!(
        sequences(&a),
        [5],
        "decided on the stored state, not the known one"
    );
    let stats = f.journal.append_stats();
    assert_eq!(
        stats.one_trip_fell_back - known.one_trip_fell_back,
        1,
        "{stats:?}"
    );
    assert_eq!(stats.one_trip, known.one_trip, "{stats:?}");

    // Read afresh, the session is known again.
    let a = f.append(&s, &[delta("d4", "r1", "m1")]).await.unwrap();
    assert_eq!(sequences(&a), [6]);
    assert_eq!(f.journal.append_stats().one_trip, known.one_trip + 1);
    let ids: Vec<String> = history(&f, "s1")
        .await
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(ids, ["start-r1", "open-m1", "d1", "d2", "d3", "d4"]);

    // A writer of the session row that appends no event (a state repair)
    // makes it stale too: here the stored message is made completed, as a
    // repair would store it, and the next delta is refused on that state.
    let other = connect(f.db.url()).await;
    let s2 = f.session("s2").await;
    let mut events = start("r1", "m1");
    events.push(ev(
        "done",
        "message.text.completed",
        Some(("r1", "r1")),
        json!({"messageId": "m1"}),
    ));
    for e in &mut events {
        e["eventId"] = json!(format!("s2-{}", e["eventId"].as_str().unwrap()));
    }
    f.append(&s2, &events).await.unwrap();
    other
        .batch_execute(
            "begin; select set_config('narad.tenant_id', 'org-a', true); \
             update entities e set state = c.state from entities c \
             where c.session_id = 's2' and c.kind = e.kind and c.id = e.id \
               and e.session_id = 's1' and e.kind = 'message' and e.id = 'm1'; \
             update sessions set core = core where session_id = 's1'; commit",
        )
        .await
        .unwrap();
    match f.append(&s, &[delta("d5", "r1", "m1")]).await {
        Err(JournalError::Rejected { .. }) => {}
        other => panic!("decided on the repaired state, the message is completed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_to_a_known_session_is_answered_from_the_stored_events() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let first = f.append(&s, &start("r1", "m1")).await.unwrap();
    let d1 = f.append(&s, &[delta("d1", "r1", "m1")]).await.unwrap();

    // The same batches again: the engine alone would refuse the start (the
    // run is running); the stored events answer both as retries.
    let again = f.append(&s, &start("r1", "m1")).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(sequences(&again), sequences(&first));
    let again = f.append(&s, &[delta("d1", "r1", "m1")]).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(sequences(&again), sequences(&d1));
    // A new event reusing a stored eventId is a conflict.
    let mut reused = delta("d1", "r1", "m1");
    reused["delta"] = json!("something else");
    match f.append(&s, &[reused]).await {
        Err(JournalError::EventIdConflict { event_id }) => assert_eq!(event_id, "d1"),
        other => panic!("d1 is taken: {other:?}"),
    }
    assert_eq!(history(&f, "s1").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_a_runtime_claimed_refuses_a_backends_append_without_its_lease() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let backend = AppendOptions {
        fence: Fence::Backend { lease: None },
        ..AppendOptions::default()
    };
    let queued = AppendOptions {
        work: Some(WorkOrder {
            queue: "default".to_owned(),
            on_lost: OnLost::Retry,
            max_attempts: 1,
        }),
        ..backend.clone()
    };
    f.journal
        .append(&f.tenant, &s, &start("r1", "m1"), queued)
        .await
        .unwrap();
    // Queued, not claimed: a backend may append.
    append_on(
        &f.journal,
        &f.tenant,
        "s1",
        &[delta("d1", "r1", "m1")],
        backend.clone(),
    )
    .await
    .unwrap();
    let known = f.journal.append_stats();

    let (claim, _) = f
        .journal
        .claim_run(&f.tenant, None, "runtime-1", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the run is ready");
    match append_on(
        &f.journal,
        &f.tenant,
        "s1",
        &[delta("d2", "r1", "m1")],
        backend,
    )
    .await
    {
        Err(JournalError::RuntimeLeaseRequired(_)) => {}
        other => panic!("the run is held by a runtime: {other:?}"),
    }
    let stats = f.journal.append_stats();
    assert_eq!(
        stats.one_trip_fell_back - known.one_trip_fell_back,
        1,
        "{stats:?}"
    );
    // Under the runtime's lease it is appended.
    let leased = AppendOptions {
        fence: Fence::Backend {
            lease: Some(claim.lease.lease_id),
        },
        ..AppendOptions::default()
    };
    let a = append_on(
        &f.journal,
        &f.tenant,
        "s1",
        &[delta("d3", "r1", "m1")],
        leased,
    )
    .await
    .unwrap();
    assert_eq!(sequences(&a), [4]);
    let ids: Vec<String> = history(&f, "s1")
        .await
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(ids, ["start-r1", "open-m1", "d1", "d3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_session_locked_elsewhere_is_appended_once_the_lock_is_released() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(&s, &start("r1", "m1")).await.unwrap();
    f.append(&s, &[delta("d1", "r1", "m1")]).await.unwrap();
    let known = f.journal.append_stats();

    // Another transaction (a command, another replica) holds the session.
    let other = connect(f.db.url()).await;
    other
        .batch_execute(
            "begin; select set_config('narad.tenant_id', 'org-a', true); \
             select 1 from sessions where tenant_id = 'org-a' and session_id = 's1' for update",
        )
        .await
        .unwrap();
    let journal = f.journal.clone();
    let tenant = f.tenant.clone();
    let waiting = tokio::spawn(async move {
        append_on(
            &journal,
            &tenant,
            "s1",
            &[delta("d2", "r1", "m1")],
            AppendOptions::default(),
        )
        .await
    });
    // The guard does not wait for the lock: the append falls back, and
    // waits for it alone.
    for _ in 0..1000 {
        if f.journal.append_stats().one_trip_fell_back > known.one_trip_fell_back {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        f.journal.append_stats().one_trip_fell_back - known.one_trip_fell_back,
        1
    );
    assert!(!waiting.is_finished(), "the append waits for the lock");
    other.batch_execute("commit").await.unwrap();
    let a = waiting.await.unwrap().unwrap();
    assert_eq!(sequences(&a), [4]);
    assert_eq!(history(&f, "s1").await.len(), 4);
}
