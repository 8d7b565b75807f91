//! The journal against a real Postgres: each test has a fresh database
//! (narad-testkit).

use std::sync::Arc;
use std::time::Duration;

use narad_journal::{AppendOptions, HistoryQuery, JournalError, MIGRATOR, TenantId};
use narad_protocol::primitives::SessionId;
use narad_testkit::TestDatabase;
use serde_json::{Value, json};

mod common;
use common::*;

// ---------------------------------------------------------------- migrations

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_again_to_a_migrated_one() {
    let db = TestDatabase::empty().await;
    narad_journal::migrate(db.url()).await.expect("first run");
    narad_journal::migrate(db.url())
        .await
        .expect("second run changes nothing");
    let client = connect(db.url()).await;
    let applied: i64 = client
        .query_one("select count(*) from _sqlx_migrations where success", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(applied as usize, MIGRATOR.iter().count());
    let tables: i64 = client
        .query_one(
            "select count(*) from pg_tables where schemaname = 'public' \
             and tablename in ('sessions', 'events', 'entities', 'outbox') and rowsecurity",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 4, "every table exists with row-level security");
    // No table holding tenants' rows goes without it (a table added later
    // included).
    let unguarded: Vec<String> = client
        .query(
            "select t.tablename::text from pg_tables t \
             where t.schemaname = 'public' and not t.rowsecurity \
               and exists (select 1 from information_schema.columns c \
                           where c.table_schema = 'public' and c.table_name = t.tablename \
                             and c.column_name = 'tenant_id')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        unguarded.is_empty(),
        "tables without row-level security: {unguarded:?}"
    );
}

// ---------------------------------------------------------------- appends

#[tokio::test]
async fn append_assigns_contiguous_sequences_in_every_domain() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let a = f
        .append(
            &s,
            &[
                user_message("m1"),
                ev("e1", "run.started", Some(("r1", "r1")), json!({})),
                ev(
                    "e2",
                    "tool.call.started",
                    Some(("r1", "r1")),
                    json!({"toolCallId": "t1", "toolName": "x", "executor": "backend", "args": {}}),
                ),
                ev(
                    "e3",
                    "run.started",
                    Some(("r1", "r2")),
                    json!({"parentRunId": "r1"}),
                ),
            ],
        )
        .await
        .unwrap();
    let seqs: Vec<(u64, Option<u64>)> = a
        .events
        .iter()
        .map(|e| (e.session_sequence, e.sequence))
        .collect();
    assert_eq!(seqs, [(1, None), (2, Some(1)), (3, Some(2)), (4, Some(3))]);
    let b = f
        .append(
            &s,
            &[ev("e4", "run.finished", Some(("r1", "r2")), json!({}))],
        )
        .await
        .unwrap();
    assert_eq!(
        (b.events[0].session_sequence, b.events[0].sequence),
        (5, Some(4))
    );
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    let stored: Vec<u64> = page
        .events
        .iter()
        .map(|e| e["sessionSequence"].as_u64().unwrap())
        .collect();
    assert_eq!(stored, [1, 2, 3, 4, 5]);
    assert_eq!(
        page.events[1]["sessionId"], "s1",
        "the journal fills sessionId"
    );
    assert!(
        page.events[1]["timestamp"].is_string(),
        "and a missing timestamp"
    );
    assert_eq!(page.next_session_sequence, None);
}

#[tokio::test]
async fn workflow_positions_are_assigned_and_filled_for_workflow_owned_runs() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let a = f
        .append(
            &s,
            &[
                ev("w1", "workflow.started", None, json!({"workflowId": "wf"})),
                ev(
                    "w2",
                    "run.started",
                    Some(("r1", "r1")),
                    json!({"workflowId": "wf"}),
                ),
                // The backend may leave out the workflowId of its run's events.
                ev("w3", "run.finished", Some(("r1", "r1")), json!({})),
                ev("w4", "workflow.finished", None, json!({"workflowId": "wf"})),
            ],
        )
        .await
        .unwrap();
    let wseq: Vec<Option<u64>> = a.events.iter().map(|e| e.workflow_sequence).collect();
    assert_eq!(wseq, [Some(1), Some(2), Some(3), Some(4)]);
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    assert_eq!(page.events[2]["workflowId"], "wf");
}

#[tokio::test]
async fn a_rejected_batch_writes_nothing_and_names_the_rule_and_the_event() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let err = f
        .append(
            &s,
            &[
                ev("e1", "run.started", Some(("r1", "r1")), json!({})),
                ev(
                    "e2",
                    "tool.call.started",
                    Some(("r1", "r1")),
                    json!({"toolCallId": "t1", "toolName": "x", "executor": "backend", "args": {}}),
                ),
                ev("e3", "run.finished", Some(("r1", "r1")), json!({})),
            ],
        )
        .await
        .unwrap_err();
    match &err {
        JournalError::Rejected { index, violation } => {
            assert_eq!(*index, 2);
            assert_eq!(violation.rule, "run.terminal.open-work");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    let body = err.to_body();
    assert_eq!(body.code, "NRD-0201");
    assert_eq!(body.rule.as_deref(), Some("run.terminal.open-work"));
    assert!(body.fields.unwrap().contains_key("/events/2"));
    assert!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .is_empty()
    );
    assert_eq!(
        f.journal
            .session(&f.tenant, "s1")
            .await
            .unwrap()
            .session_sequence,
        0
    );
    // The same ids are free to use in a valid batch.
    f.append(
        &s,
        &[ev("e1", "run.started", Some(("r1", "r1")), json!({}))],
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn invalid_proposals_are_refused_with_the_pointer_of_the_problem() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let cases = [
        (
            json!({"protocolVersion": "narad/v1", "type": "run.started", "eventId": "x", "rootRunId": "r", "runId": "r", "sequence": 4}),
            "/events/0/sequence",
        ),
        (
            json!({"protocolVersion": "narad/v1", "type": "run.started", "rootRunId": "r", "runId": "r"}),
            "/events/0/eventId",
        ),
        (
            json!({"protocolVersion": "narad/v1", "type": "run.paused", "eventId": "x", "rootRunId": "r", "runId": "r", "waitId": "w"}),
            "/events/0/reason",
        ),
        (
            json!({"protocolVersion": "narad/v1", "type": "run.started", "eventId": "x", "sessionId": "other", "rootRunId": "r", "runId": "r"}),
            "/events/0/sessionId",
        ),
    ];
    for (proposal, pointer) in cases {
        let err = f
            .append(&s, std::slice::from_ref(&proposal))
            .await
            .unwrap_err();
        let body = err.to_body();
        assert!(
            body.fields
                .as_ref()
                .is_some_and(|f| f.contains_key(pointer)),
            "{proposal}: {body:?}"
        );
        assert!(body.code == "NRD-0003", "{body:?}");
    }
    let err = f.append(&s, &[]).await.unwrap_err();
    assert!(matches!(err, JournalError::InvalidBody { .. }));
}

#[tokio::test]
async fn a_retried_batch_is_idempotent_and_a_reused_id_with_another_body_conflicts() {
    let f = fixture().await;
    let s = f.session("s1").await;
    let batch = [
        ev("e1", "run.started", Some(("r1", "r1")), json!({})),
        user_message("m1"),
    ];
    let first = f.append(&s, &batch).await.unwrap();
    assert!(!first.duplicate);
    let again = f.append(&s, &batch).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.events, first.events, "the stored sequences come back");
    assert_eq!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .len(),
        2
    );

    let changed = [ev(
        "e1",
        "run.started",
        Some(("r1", "r1")),
        json!({"input": "other"}),
    )];
    let err = f.append(&s, &changed).await.unwrap_err();
    assert!(
        matches!(&err, JournalError::EventIdConflict { event_id } if event_id == "e1"),
        "{err:?}"
    );
    assert_eq!(err.to_body().code, "NRD-0202");

    // Part retry, part new: a conflict, and nothing of it written.
    let mixed = [user_message("m1"), user_message("m2")];
    assert!(matches!(
        f.append(&s, &mixed).await,
        Err(JournalError::EventIdConflict { .. })
    ));
    // The same id in another session of the tenant conflicts too.
    let s2 = f.session("s2").await;
    assert!(matches!(
        f.append(&s2, &[user_message("m1")]).await,
        Err(JournalError::EventIdConflict { .. })
    ));
    assert_eq!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .len(),
        2
    );
}

#[tokio::test]
async fn expected_session_sequence_guards_against_concurrent_writers() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(&s, &[user_message("m1")]).await.unwrap();
    let stale = AppendOptions {
        expected_session_sequence: Some(0),
        ..AppendOptions::default()
    };
    let err = f
        .journal
        .append(&f.tenant, &s, &[user_message("m2")], stale)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        JournalError::SequenceMismatch {
            expected: 0,
            actual: 1
        }
    ));
    let fresh = AppendOptions {
        expected_session_sequence: Some(1),
        ..AppendOptions::default()
    };
    f.journal
        .append(&f.tenant, &s, &[user_message("m2")], fresh)
        .await
        .unwrap();
}

#[tokio::test]
async fn appending_to_a_missing_session_is_not_found() {
    let f = fixture().await;
    let missing = SessionId::new("nope").unwrap();
    let err = f.append(&missing, &[user_message("m1")]).await.unwrap_err();
    assert!(matches!(err, JournalError::SessionNotFound(_)));
    assert_eq!(err.to_body().code, "NRD-0007");
}

// ---------------------------------------------------------------- history

#[tokio::test]
async fn history_pages_with_every_cursor_form() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(
        &s,
        &[
            user_message("m1"),                                     // 1
            ev("a1", "run.started", Some(("r1", "r1")), json!({})), // 2, r1:1
            user_message("m2"),                                     // 3
            ev(
                "a2",
                "run.started",
                Some(("r1", "r2")),
                json!({"parentRunId": "r1"}),
            ), // 4, r1:2
            ev("a3", "run.finished", Some(("r1", "r2")), json!({})), // 5, r1:3
            ev("a4", "run.finished", Some(("r1", "r1")), json!({})), // 6, r1:4
            ev("b1", "workflow.started", None, json!({"workflowId": "wf"})), // 7, wf:1
            ev(
                "b2",
                "workflow.step.started",
                None,
                json!({"workflowId": "wf", "nodeId": "n"}),
            ), // 8, wf:2
        ],
    )
    .await
    .unwrap();
    let seqs = |p: &narad_journal::HistoryPage| -> Vec<u64> {
        p.events
            .iter()
            .map(|e| e["sessionSequence"].as_u64().unwrap())
            .collect()
    };
    // Plain paging.
    let p1 = f
        .history(
            "s1",
            HistoryQuery {
                limit: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(seqs(&p1), [1, 2, 3]);
    assert_eq!(p1.next_session_sequence, Some(3));
    let p2 = f
        .history(
            "s1",
            HistoryQuery {
                after_session_sequence: Some(3),
                limit: Some(10),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(seqs(&p2), [4, 5, 6, 7, 8]);
    assert_eq!(p2.next_session_sequence, None);
    // By run journal.
    let r = f
        .history(
            "s1",
            HistoryQuery {
                root_run_id: Some("r1".into()),
                after_sequence: Some(1),
                limit: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(seqs(&r), [4, 5]);
    assert_eq!(
        (r.next_sequence, r.next_session_sequence),
        (Some(3), Some(5))
    );
    // By workflow.
    let w = f
        .history(
            "s1",
            HistoryQuery {
                workflow_id: Some("wf".into()),
                after_workflow_sequence: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(seqs(&w), [8]);
    // Consistent cursors: run sequence 1 is session sequence 2; 2 and 3 both
    // lie between it and the next run event (at 4).
    for s in [2, 3] {
        let ok = f
            .history(
                "s1",
                HistoryQuery {
                    root_run_id: Some("r1".into()),
                    after_sequence: Some(1),
                    after_session_sequence: Some(s),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(seqs(&ok), [4, 5, 6]);
    }
    // Inconsistent cursors.
    let conflict = f
        .history(
            "s1",
            HistoryQuery {
                root_run_id: Some("r1".into()),
                after_sequence: Some(1),
                after_session_sequence: Some(5),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(conflict, JournalError::CursorConflict(_)),
        "{conflict:?}"
    );
    assert_eq!(conflict.to_body().code, "NRD-0301");
    // Malformed queries.
    for q in [
        HistoryQuery {
            limit: Some(0),
            ..Default::default()
        },
        HistoryQuery {
            limit: Some(1001),
            ..Default::default()
        },
        HistoryQuery {
            after_sequence: Some(1),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            f.history("s1", q).await,
            Err(JournalError::InvalidParameter { .. })
        ));
    }
    assert!(matches!(
        f.history("nope", HistoryQuery::default()).await,
        Err(JournalError::SessionNotFound(_))
    ));
}

// ---------------------------------------------------------------- derived state

#[tokio::test]
async fn the_stored_state_equals_the_state_rebuilt_from_events_after_a_long_random_workload() {
    let f = fixture().await;
    let mut rng = 0x5eed_u64;
    let mut next = move || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) as u8
    };
    for n in 0..6 {
        let id = format!("s{n}");
        let s = f.session(&id).await;
        let choices: Vec<u8> = (0..120).map(|_| next()).collect();
        let events = proposals(&id, &choices);
        let mut i = 0;
        while i < events.len() {
            let size = 1 + next() as usize % 7;
            let batch = &events[i..(i + size).min(events.len())];
            f.append(&s, batch)
                .await
                .unwrap_or_else(|e| panic!("{id}: batch at {i}: {e}"));
            i += size;
        }
        let stored = f.journal.stored_state(&f.tenant, &id).await.unwrap();
        let derived = f.journal.derived_state(&f.tenant, &id).await.unwrap();
        assert_eq!(
            stored, derived,
            "{id}: the stored state differs from the derived one"
        );
        assert!(stored.core.session_sequence > 100, "{id}: a long session");
        assert!(
            !f.journal.repair_state(&f.tenant, &id).await.unwrap(),
            "nothing to repair"
        );
    }
}

#[tokio::test]
async fn repair_restores_a_damaged_state() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(&s, &proposals("s1", &[1, 2, 3, 4, 5, 6, 7, 8]))
        .await
        .unwrap();
    let client = connect(f.db.url()).await;
    client
        .execute("delete from entities where kind = 'run'", &[])
        .await
        .unwrap();
    assert!(f.journal.repair_state(&f.tenant, "s1").await.unwrap());
    let stored = f.journal.stored_state(&f.tenant, "s1").await.unwrap();
    assert_eq!(
        stored,
        f.journal.derived_state(&f.tenant, "s1").await.unwrap()
    );
}

// ---------------------------------------------------------------- isolation

/// A transaction's tenant is written into a `set local` command: an id
/// holding quotes and backslashes scopes to itself, exactly, and to no
/// other tenant (row-level security compares the setting with the rows).
#[tokio::test]
async fn a_tenant_id_with_quotes_and_backslashes_scopes_to_itself() {
    let f = fixture().await;
    let odd = TenantId::new(r#"o'r\g "x"; reset narad.tenant_id; --"#).unwrap();
    let plain = TenantId::new("o").unwrap();
    let sid = SessionId::new("s1").unwrap();
    f.journal
        .create_session(
            &odd,
            narad_journal::NewSession {
                session_id: Some(sid.clone()),
                ..narad_journal::NewSession::default()
            },
        )
        .await
        .unwrap();
    f.journal
        .append(&odd, &sid, &[user_message("m1")], AppendOptions::default())
        .await
        .unwrap();
    let read = f.journal.session(&odd, "s1").await.unwrap();
    assert_eq!(read.session_sequence, 1, "the message");
    assert!(matches!(
        f.journal.session(&plain, "s1").await,
        Err(JournalError::SessionNotFound(_))
    ));
    // The rows carry the id as given, byte for byte.
    let stored: Vec<String> = connect(f.db.url())
        .await
        .query("select distinct tenant_id from events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, [odd.as_str()]);
}

#[tokio::test]
async fn row_level_security_hides_other_tenants_even_from_a_query_without_a_tenant_filter() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(&s, &[user_message("m1"), user_message("m2")])
        .await
        .unwrap();
    let client = f.journal.pool().get().await.unwrap();
    let count = async |tenant: Option<&str>| -> i64 {
        client
            .batch_execute("begin; set local role narad_app")
            .await
            .unwrap();
        if let Some(t) = tenant {
            // As narad scopes a transaction (a command, which a Citus
            // coordinator sends on to the shards' workers).
            client
                .batch_execute(&format!("set local narad.tenant_id = '{t}'"))
                .await
                .unwrap();
        }
        // No tenant filter at all: only row-level security stands between.
        let n: i64 = client
            .query_one(
                "select (select count(*) from events) + (select count(*) from sessions) \
                 + (select count(*) from entities) + (select count(*) from outbox)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        client.batch_execute("rollback").await.unwrap();
        n
    };
    assert!(count(Some("org-a")).await > 0);
    assert_eq!(count(Some("org-b")).await, 0, "another tenant sees nothing");
    assert_eq!(count(None).await, 0, "no tenant set: nothing at all");
    // Another tenant's session does not exist for it.
    let b = TenantId::new("org-b").unwrap();
    assert!(matches!(
        f.journal.session(&b, "s1").await,
        Err(JournalError::SessionNotFound(_))
    ));
    assert!(matches!(
        f.journal
            .append(&b, &s, &[user_message("m3")], AppendOptions::default())
            .await,
        Err(JournalError::SessionNotFound(_))
    ));
    // And it cannot write rows for another tenant either.
    client
        .batch_execute("begin; set local role narad_app")
        .await
        .unwrap();
    client
        .execute("select set_config('narad.tenant_id', 'org-b', true)", &[])
        .await
        .unwrap();
    let forged = client
        .execute(
            "insert into sessions (tenant_id, session_id) values ('org-a', 'forged')",
            &[],
        )
        .await;
    client.batch_execute("rollback").await.unwrap();
    assert!(
        forged.is_err(),
        "row-level security refuses a write for another tenant"
    );
}

// ---------------------------------------------------------------- concurrency

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_writers_on_one_session_get_contiguous_sequences() {
    let f = Arc::new(fixture().await);
    let s = f.session("s1").await;
    let mut tasks = Vec::new();
    for w in 0..32 {
        let (f, s) = (f.clone(), s.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                f.append(&s, &[user_message(&format!("w{w}-{i}"))])
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("no deadlock")
            .unwrap();
    }
    let page = f
        .history(
            "s1",
            HistoryQuery {
                limit: Some(1000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let seqs: Vec<u64> = page
        .events
        .iter()
        .map(|e| e["sessionSequence"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (1..=320).collect::<Vec<_>>(),
        "contiguous, nothing lost or doubled"
    );
    let ids: std::collections::BTreeSet<&str> = page
        .events
        .iter()
        .map(|e| e["eventId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 320);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_sessions_append_concurrently_without_blocking_each_other() {
    let f = Arc::new(fixture().await);
    // Hold one session's lock open: appends to the others must not wait on it.
    let held = f.session("held").await;
    let client = connect(f.db.url()).await;
    client
        .batch_execute("begin; select * from sessions where tenant_id = 'org-a' and session_id = 'held' for update")
        .await
        .unwrap();

    let mut tasks = Vec::new();
    for n in 0..200 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("s{n}");
            let s = f.session(&id).await;
            let events = proposals(&id, &[n as u8, 7, 3, 9, 1]);
            f.append(&s, &events).await.unwrap();
            events.len()
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("an append waited on another session's lock")
            .unwrap();
    }
    let blocked = f.clone();
    let waiting = tokio::spawn(async move { blocked.append(&held, &[user_message("late")]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the held session's append waits for its lock"
    );
    client.batch_execute("commit").await.unwrap();
    waiting.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_racing_top_level_starts_give_exactly_one_run() {
    for round in 0..10 {
        let f = Arc::new(fixture().await);
        let s = f.session("s1").await;
        let start = |run: &'static str| {
            let (f, s) = (f.clone(), s.clone());
            tokio::spawn(async move {
                f.append(
                    &s,
                    &[ev(
                        &format!("{run}-start"),
                        "run.started",
                        Some((run, run)),
                        json!({}),
                    )],
                )
                .await
            })
        };
        let (a, b) = (start("ra"), start("rb"));
        let results = [a.await.unwrap(), b.await.unwrap()];
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {round}: {results:?}");
        let refused = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            matches!(refused, JournalError::Rejected { violation, .. } if violation.rule == "session.slot.single"),
            "{refused:?}"
        );
    }
}

// ---------------------------------------------------------------- faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_transaction_leaves_nothing_and_the_retry_succeeds_once() {
    let f = Arc::new(fixture().await);
    let s = f.session("s1").await;
    // Hold the session's lock so that the append stops inside its transaction.
    let admin = connect(f.db.admin_url()).await;
    let holder = connect(f.db.url()).await;
    holder
        .batch_execute("begin; select * from sessions where tenant_id = 'org-a' and session_id = 's1' for update")
        .await
        .unwrap();

    let batch = vec![
        ev("e1", "run.started", Some(("r1", "r1")), json!({})),
        user_message("m1"),
    ];
    let (f2, s2, b2) = (f.clone(), s.clone(), batch.clone());
    let append = tokio::spawn(async move { f2.append(&s2, &b2).await });
    // Find the append's backend, waiting on the lock inside its transaction, and kill it.
    let pid = loop {
        let row = admin
            .query_opt(
                // Waiting on the lock (on a Citus coordinator: on the
                // worker that waits on it).
                "select pid from pg_stat_activity where datname = $1 \
                 and wait_event_type in ('Lock', 'IPC', 'Client') \
                 and state = 'active' and query like '%for update%' and pid <> pg_backend_pid()",
                &[&f.db.name()],
            )
            .await
            .unwrap();
        if let Some(r) = row {
            break r.get::<_, i32>(0);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    admin
        .execute("select pg_terminate_backend($1::int)", &[&pid])
        .await
        .unwrap();
    let killed = append.await.unwrap();
    assert!(
        matches!(killed, Err(JournalError::Database(_))),
        "{killed:?}"
    );
    holder.batch_execute("commit").await.unwrap();

    assert!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .is_empty(),
        "nothing partial"
    );
    let retried = f.append(&s, &batch).await.unwrap();
    assert!(!retried.duplicate);
    assert_eq!(retried.events[1].session_sequence, 2);
    let again = f.append(&s, &batch).await.unwrap();
    assert!(again.duplicate, "exactly once");
    assert_eq!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .len(),
        2
    );
}

// ---------------------------------------------------------------- commands

fn start(
    session: &str,
    run: &str,
    on_conflict: Option<&str>,
) -> narad_protocol::commands::StartRun {
    let mut body = json!({"sessionId": session, "runId": run});
    if let Some(c) = on_conflict {
        body["onConflict"] = json!(c);
    }
    serde_json::from_value(body).unwrap()
}

fn run_types(page: &narad_journal::HistoryPage) -> Vec<(String, String)> {
    page.events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["runId"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn start_run_rejects_a_taken_slot_naming_the_active_execution() {
    let f = fixture().await;
    f.session("s1").await;
    f.journal
        .start_run(&f.on("s1"), &start("s1", "r1", None))
        .await
        .unwrap();
    let err = f
        .journal
        .start_run(&f.on("s1"), &start("s1", "r2", Some("reject")))
        .await
        .unwrap_err();
    let body = err.to_body();
    assert_eq!(body.code, "NRD-0204");
    assert_eq!(body.rule.as_deref(), Some("session.slot.single"));
    assert_eq!(
        body.details.unwrap()["activeExecution"],
        json!({"kind": "run", "runId": "r1"})
    );
    assert_eq!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .len(),
        1,
        "nothing appended"
    );
}

#[tokio::test]
async fn an_enqueued_start_becomes_run_started_in_the_transaction_that_frees_the_slot() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.journal
        .start_run(&f.on("s1"), &start("s1", "r1", None))
        .await
        .unwrap();
    let queued = f
        .journal
        .start_run(&f.on("s1"), &start("s1", "r2", Some("enqueue")))
        .await
        .unwrap();
    let queue_id = queued.queue_id.clone().expect("queued");
    assert!(queued.appended.is_none());
    let list = f.journal.queued_starts(&f.tenant, "s1").await.unwrap();
    assert_eq!(
        (list.len(), list[0].run_id.as_str(), list[0].on_conflict),
        (1, "r2", "enqueue")
    );

    let freed = f
        .append(
            &s,
            &[ev("fin-1", "run.finished", Some(("r1", "r1")), json!({}))],
        )
        .await
        .unwrap();
    assert_eq!(freed.dequeued.as_deref(), Some(queue_id.as_str()));
    assert_eq!(
        freed.events.len(),
        2,
        "the finish and the dequeued start, in one transaction"
    );
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    assert_eq!(
        run_types(&page),
        [
            ("run.started".into(), "r1".into()),
            ("run.finished".into(), "r1".into()),
            ("run.started".into(), "r2".into())
        ]
    );
    assert!(
        f.journal
            .queued_starts(&f.tenant, "s1")
            .await
            .unwrap()
            .is_empty()
    );
    let record = f.journal.session(&f.tenant, "s1").await.unwrap();
    assert_eq!(
        record.active_execution,
        Some(json!({"kind": "run", "runId": "r2"}))
    );
    assert_eq!(
        f.journal.stored_state(&f.tenant, "s1").await.unwrap(),
        f.journal.derived_state(&f.tenant, "s1").await.unwrap()
    );
}

#[tokio::test]
async fn a_queued_start_can_be_withdrawn() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.journal
        .start_run(&f.on("s1"), &start("s1", "r1", None))
        .await
        .unwrap();
    let q = f
        .journal
        .start_run(&f.on("s1"), &start("s1", "r2", Some("enqueue")))
        .await
        .unwrap()
        .queue_id
        .unwrap();
    f.journal.withdraw_start(&f.tenant, "s1", &q).await.unwrap();
    assert!(matches!(
        f.journal.withdraw_start(&f.tenant, "s1", &q).await,
        Err(JournalError::NotFound(_))
    ));
    let freed = f
        .append(
            &s,
            &[ev("fin-1", "run.finished", Some(("r1", "r1")), json!({}))],
        )
        .await
        .unwrap();
    assert_eq!(freed.dequeued, None);
    assert_eq!(
        f.journal
            .session(&f.tenant, "s1")
            .await
            .unwrap()
            .active_execution,
        None
    );
}

#[tokio::test]
async fn an_interrupting_start_stops_the_active_run_and_goes_first() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.journal
        .start_run(&f.on("s1"), &start("s1", "r1", None))
        .await
        .unwrap();
    f.journal
        .start_run(&f.on("s1"), &start("s1", "r2", Some("enqueue")))
        .await
        .unwrap();
    let urgent = f
        .journal
        .start_run(&f.on("s1"), &start("s1", "r3", Some("interrupt")))
        .await
        .unwrap();
    assert!(
        urgent.stop_requested.is_some(),
        "the active run was asked to stop"
    );
    let order: Vec<String> = f
        .journal
        .queued_starts(&f.tenant, "s1")
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.run_id)
        .collect();
    assert_eq!(order, ["r3", "r2"]);
    f.append(
        &s,
        &[ev("c-1", "run.cancelled", Some(("r1", "r1")), json!({}))],
    )
    .await
    .unwrap();
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    let types = run_types(&page);
    assert_eq!(types[1], ("run.stop.requested".into(), "r1".into()));
    assert_eq!(types.last().unwrap(), &("run.started".into(), "r3".into()));
    assert_eq!(page.events[1]["targetRunId"], "r1");
}

#[tokio::test]
async fn a_nested_start_records_its_parents_executor_explicitly() {
    let f = fixture().await;
    f.session("s1").await;
    let mut top = start("s1", "r1", None);
    top.client_executor_id =
        Some(narad_protocol::primitives::ClientExecutorId::new("desktop-1").unwrap());
    f.journal.start_run(&f.on("s1"), &top).await.unwrap();
    let mut nested = start("s1", "r2", None);
    nested.parent_run_id = Some(narad_protocol::primitives::RunId::new("r1").unwrap());
    f.journal.start_run(&f.on("s1"), &nested).await.unwrap();
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    assert_eq!(page.events[1]["clientExecutorId"], "desktop-1");
    assert_eq!(page.events[1]["rootRunId"], "r1");
    assert_eq!(page.events[1]["parentRunId"], "r1");
}

async fn paused_on_interrupt(f: &Fixture, session: &str) {
    let s = f.session(session).await;
    f.append(
        &s,
        &[
            ev(&format!("{session}-a"), "run.started", Some(("r1", "r1")), json!({})),
            ev(&format!("{session}-b"), "interrupt.requested", Some(("r1", "r1")), json!({"interruptId": "int-1", "waitId": "w-1", "kind": "tool.approval", "actions": ["approve", "deny"]})),
            ev(&format!("{session}-c"), "run.paused", Some(("r1", "r1")), json!({"waitId": "w-1", "interruptId": "int-1", "reason": "interrupt", "resumeMode": "command"})),
        ],
    )
    .await
    .unwrap();
}

fn resolve(decision: &str) -> narad_protocol::commands::ResolveInterrupt {
    serde_json::from_value(json!({"interruptId": "int-1", "decision": decision})).unwrap()
}

#[tokio::test]
async fn resolve_interrupt_resolves_at_most_once_and_reports_the_recorded_decision() {
    let f = fixture().await;
    paused_on_interrupt(&f, "s1").await;
    let (session, appended) = f
        .journal
        .resolve_interrupt(&f.on("s1"), &resolve("approve"))
        .await
        .unwrap();
    assert_eq!(
        (session.as_str(), appended.events[0].sequence),
        ("s1", Some(4))
    );
    let err = f
        .journal
        .resolve_interrupt(&f.on("s1"), &resolve("deny"))
        .await
        .unwrap_err();
    let body = err.to_body();
    assert_eq!(body.code, "NRD-0205");
    assert_eq!(body.details.unwrap()["decision"], "approve");
    assert_eq!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .len(),
        4,
        "nothing appended"
    );
    // The same interrupt id in a second session: its owner is ambiguous
    // without the session, and each session's is its own.
    paused_on_interrupt(&f, "s2").await;
    let err = f
        .journal
        .owning_session(&f.tenant, "interrupt", "int-1", "interruptId", None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::Ambiguous {
                pointer: "/sessionId",
                ..
            }
        ),
        "int-1 now names two sessions: {err:?}"
    );
    let (session, _) = f
        .journal
        .resolve_interrupt(&f.on("s2"), &resolve("deny"))
        .await
        .unwrap();
    assert_eq!(session, "s2");
    let unknown: narad_protocol::commands::ResolveInterrupt =
        serde_json::from_value(json!({"interruptId": "nope", "decision": "approve"})).unwrap();
    assert!(matches!(
        f.journal.resolve_interrupt(&f.on("s1"), &unknown).await,
        Err(JournalError::NotFound(_))
    ));
}

#[tokio::test]
async fn resolve_interrupt_rejects_a_decision_outside_the_actions() {
    let f = fixture().await;
    paused_on_interrupt(&f, "s1").await;
    let err = f
        .journal
        .resolve_interrupt(&f.on("s1"), &resolve("maybe"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, JournalError::Rejected { violation, .. } if violation.rule == "interrupt.decision.allowed"),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_resolutions_append_exactly_one() {
    for round in 0..5 {
        let f = Arc::new(fixture().await);
        paused_on_interrupt(&f, "s1").await;
        let go = |d: &'static str| {
            let f = f.clone();
            tokio::spawn(async move { f.journal.resolve_interrupt(&f.on("s1"), &resolve(d)).await })
        };
        let (a, b) = (go("approve"), go("deny"));
        let results = [a.await.unwrap(), b.await.unwrap()];
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "round {round}: {results:?}"
        );
        let winner = results.iter().find_map(|r| r.as_ref().ok()).unwrap();
        let page = f.history("s1", HistoryQuery::default()).await.unwrap();
        assert_eq!(page.events.len(), 4);
        let recorded = page.events[3]["decision"].as_str().unwrap().to_owned();
        assert_eq!(winner.1.events[0].session_sequence, 4);
        match results.iter().find_map(|r| r.as_ref().err()).unwrap() {
            JournalError::InterruptAlreadyResolved { decision, .. } => {
                assert_eq!(decision, &recorded)
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_other_commands_build_their_events_from_current_state() {
    let f = fixture().await;
    f.session("s1").await;
    f.journal
        .start_run(&f.on("s1"), &start("s1", "r1", None))
        .await
        .unwrap();
    let cmd = |v: Value| v;
    // record-user-message, session and run scoped.
    let (m1, _) = f
        .journal
        .record_user_message(
            &f.on("s1"),
            &serde_json::from_value(cmd(
                json!({"sessionId": "s1", "messageScope": "session", "content": "hi"}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    f.journal
        .record_user_message(
            &f.on("s1"),
            &serde_json::from_value(
                json!({"sessionId": "s1", "messageScope": "run", "runId": "r1", "content": "more"}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let missing = f
        .journal
        .record_user_message(
            &f.on("s1"),
            &serde_json::from_value(
                json!({"sessionId": "s1", "messageScope": "run", "content": "?"}),
            )
            .unwrap(),
        )
        .await;
    assert!(matches!(
        missing,
        Err(JournalError::InvalidBody {
            pointer: "/runId",
            ..
        })
    ));
    // redact-message: a known message; an unknown one breaks message.unknown.
    f.journal
        .redact_message(&f.on("s1"), &serde_json::from_value(json!({"sessionId": "s1", "messageId": m1, "reason": "pii", "displayReplacement": null})).unwrap())
        .await
        .unwrap();
    let unknown = f
        .journal
        .redact_message(&f.on("s1"), &serde_json::from_value(json!({"sessionId": "s1", "messageId": "nope", "reason": "pii", "displayReplacement": "x"})).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&unknown, JournalError::Rejected { violation, .. } if violation.rule == "message.unknown")
    );
    // start-workflow while a run holds the slot.
    let busy = f
        .journal
        .start_workflow(
            &f.on("s1"),
            &serde_json::from_value(json!({"sessionId": "s1"})).unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(busy.to_body().code, "NRD-0204");
    // stop-run by run id alone.
    let (session, stopped) = f
        .journal
        .stop_run(
            &f.on("s1"),
            &serde_json::from_value(json!({"runId": "r1", "reason": "user.stop"})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        (session.as_str(), stopped.events[0].sequence),
        ("s1", Some(3))
    );
    assert!(matches!(
        f.journal
            .stop_run(
                &f.on("s1"),
                &serde_json::from_value(json!({"runId": "nope"})).unwrap()
            )
            .await,
        Err(JournalError::NotFound(_))
    ));
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    let types: Vec<&str> = page
        .events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "run.started",
            "message.user.recorded",
            "message.user.recorded",
            "message.redacted",
            "run.stop.requested"
        ]
    );
    // Once the run ends, a workflow may take the slot.
    let s = SessionId::new("s1").unwrap();
    f.append(
        &s,
        &[ev("c-1", "run.cancelled", Some(("r1", "r1")), json!({}))],
    )
    .await
    .unwrap();
    let (wf, _) = f
        .journal
        .start_workflow(
            &f.on("s1"),
            &serde_json::from_value(json!({"sessionId": "s1"})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        f.journal
            .session(&f.tenant, "s1")
            .await
            .unwrap()
            .active_execution,
        Some(json!({"kind": "workflow", "workflowId": wf}))
    );
    // archive-session, twice.
    let first = f.journal.archive_session(&f.on("s1")).await.unwrap();
    let again = f.journal.archive_session(&f.on("s1")).await.unwrap();
    assert!(first.archived_at.is_some());
    assert_eq!(
        first.archived_at, again.archived_at,
        "archiving again changes nothing"
    );
    assert!(matches!(
        f.journal.archive_session(&f.on("nope")).await,
        Err(JournalError::SessionNotFound(_))
    ));
}

#[tokio::test]
async fn cancel_workflow_cancels_an_idle_workflow_at_once() {
    let f = fixture().await;
    f.session("s1").await;
    let (wf, _) = f
        .journal
        .start_workflow(
            &f.on("s1"),
            &serde_json::from_value(json!({"sessionId": "s1"})).unwrap(),
        )
        .await
        .unwrap();
    let done = f
        .journal
        .cancel_workflow(
            &f.on("s1"),
            &serde_json::from_value(json!({"workflowId": wf, "reason": "no longer needed"}))
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(done.cancelled.is_some() && done.stop_requested.is_none());
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    assert_eq!(page.events[1]["type"], "workflow.cancelled");
    assert_eq!(page.events[1]["message"], "no longer needed");
    assert_eq!(
        f.journal
            .session(&f.tenant, "s1")
            .await
            .unwrap()
            .active_execution,
        None
    );
}

#[tokio::test]
async fn cancel_workflow_stops_its_runs_and_cancels_in_the_append_that_leaves_it_idle() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(
        &s,
        &[
            ev("w1", "workflow.started", None, json!({"workflowId": "wf"})),
            ev(
                "w2",
                "run.started",
                Some(("r1", "r1")),
                json!({"workflowId": "wf"}),
            ),
            ev(
                "w3",
                "run.started",
                Some(("r1", "r2")),
                json!({"parentRunId": "r1"}),
            ),
        ],
    )
    .await
    .unwrap();
    // A start waits for the workflow's slot meanwhile.
    f.journal
        .start_run(&f.on("s1"), &start("s1", "after", Some("enqueue")))
        .await
        .unwrap();
    let asked = f
        .journal
        .cancel_workflow(
            &f.on("s1"),
            &serde_json::from_value(json!({"workflowId": "wf"})).unwrap(),
        )
        .await
        .unwrap();
    assert!(asked.cancelled.is_none());
    assert_eq!(
        asked.stop_requested.unwrap().events.len(),
        2,
        "both open runs were asked to stop"
    );
    // The runtime ends the runs; the last terminal cancels the workflow and
    // starts the queued run, in one transaction.
    f.append(
        &s,
        &[ev("w4", "run.cancelled", Some(("r1", "r2")), json!({}))],
    )
    .await
    .unwrap();
    let last = f
        .append(
            &s,
            &[ev("w5", "run.cancelled", Some(("r1", "r1")), json!({}))],
        )
        .await
        .unwrap();
    assert_eq!(
        last.events.len(),
        3,
        "run.cancelled, workflow.cancelled, run.started"
    );
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    let types: Vec<&str> = page
        .events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        &types[types.len() - 3..],
        ["run.cancelled", "workflow.cancelled", "run.started"]
    );
    assert_eq!(page.events.last().unwrap()["runId"], "after");
    assert_eq!(
        f.journal.stored_state(&f.tenant, "s1").await.unwrap(),
        f.journal.derived_state(&f.tenant, "s1").await.unwrap()
    );
    // Nothing is left pending: another idle moment cancels nothing.
    let again = f
        .journal
        .cancel_workflow(
            &f.on("s1"),
            &serde_json::from_value(json!({"workflowId": "wf"})).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&again, JournalError::Rejected { violation, .. } if violation.rule == "workflow.terminal.once"),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_caller_that_stops_waiting_mid_transaction_leaves_nothing_for_the_next_one() {
    // One connection: whoever takes it next would get the abandoned one.
    let f = fixture_with(1, 1).await;
    f.session("s1").await;
    // Hold s1's row so that archiving it waits inside its transaction.
    let holder = connect(f.db.url()).await;
    holder
        .batch_execute("begin; select * from sessions where tenant_id = 'org-a' and session_id = 's1' for update")
        .await
        .unwrap();
    // The caller gives up (as a request whose client went away).
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        f.journal.archive_session(&f.on("s1")),
    )
    .await;
    assert!(gave_up.is_err(), "the archive was waiting on the lock");
    holder.batch_execute("commit").await.unwrap();
    // The next holder of a connection commits its own work, and only its own.
    f.append(&SessionId::new("s1").unwrap(), &[user_message("m1")])
        .await
        .unwrap();
    let s1 = f.journal.session(&f.tenant, "s1").await.unwrap();
    assert_eq!(s1.archived_at, None, "the abandoned archive never commits");
    assert_eq!(s1.session_sequence, 1);
}

#[tokio::test]
async fn outbox_retention_forgets_old_relayed_rows_and_never_events() {
    let f = fixture().await;
    let s = f.session("s1").await;
    for n in 0..5 {
        f.append(&s, &[user_message(&format!("m{n}"))])
            .await
            .unwrap();
    }
    let admin = connect(f.db.url()).await;
    // The session's creation and its first three events are two days old.
    admin
        .batch_execute(
            "update outbox set created_at = now() - interval '2 days' where session_sequence <= 3",
        )
        .await
        .unwrap();
    let day = Duration::from_secs(24 * 3600);
    // Rows become final for relays only once every older transaction of
    // the cluster has ended (other tests' included): retry until then.
    let mut forgotten = 0;
    for _ in 0..200 {
        let n = f.journal.forget_outbox(day, 2).await.unwrap();
        assert!(n <= 2, "in batches of at most 2, got {n}");
        forgotten += n;
        if forgotten >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(forgotten, 4, "the old rows are forgotten");
    assert_eq!(f.journal.forget_outbox(day, 2).await.unwrap(), 0);
    let left: i64 = admin
        .query_one("select count(*) from outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 2, "the recent rows stay");
    let horizon = f.journal.horizon(&f.tenant).await.unwrap().unwrap();
    let third = f
        .history("s1", HistoryQuery::default())
        .await
        .unwrap()
        .events[2]["eventId"]
        .clone();
    assert_eq!(
        horizon.event_id, third,
        "the horizon is the last forgotten row"
    );
    // Retention forgets a prefix of relay order only: an old row behind a
    // young one stays until the young one is old too.
    f.append(&s, &[user_message("m5")]).await.unwrap();
    admin
        .batch_execute(
            "update outbox set created_at = now() - interval '2 days' where session_sequence = 6",
        )
        .await
        .unwrap();
    assert_eq!(f.journal.forget_outbox(day, 10).await.unwrap(), 0);
    assert_eq!(
        f.journal.horizon(&f.tenant).await.unwrap().unwrap(),
        horizon,
        "the horizon never moves without a deletion"
    );
    let page = f.history("s1", HistoryQuery::default()).await.unwrap();
    assert_eq!(page.events.len(), 6, "the journal is never touched");
}

// ---------------------------------------------------------------- the pool

/// A caller waits for a pooled connection at most the pool's wait: an
/// exhausted pool is an answer (an outage, 503 NRD-0901 at the server,
/// saying why), never a hang. The background pool is a pool of its own.
#[tokio::test]
async fn an_exhausted_pool_answers_within_its_wait_and_background_has_its_own() {
    let db = TestDatabase::new(&MIGRATOR).await;
    let journal =
        narad_journal::Journal::connect_waiting(db.url(), 1, Duration::from_millis(200)).unwrap();
    let background = journal.background(1).unwrap();
    let tenant = TenantId::new("acme").unwrap();
    let held = journal.pool().get().await.expect("the one connection");

    let asked = std::time::Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(5), journal.session(&tenant, "s1"))
        .await
        .expect("answered, not hung")
        .expect_err("no connection was free");
    assert!(asked.elapsed() >= Duration::from_millis(200));
    assert!(
        matches!(
            refused,
            JournalError::Pool(deadpool_postgres::PoolError::Timeout(_))
        ),
        "{refused:?}"
    );
    assert_eq!(
        refused.code(),
        narad_protocol::ErrorCode::DatabaseUnavailable
    );
    assert!(
        refused
            .to_body()
            .message
            .contains("no database connection was free in time"),
        "{:?}",
        refused.to_body()
    );
    // Meanwhile the background pool serves.
    assert!(matches!(
        background.session(&tenant, "s1").await,
        Err(JournalError::SessionNotFound(_))
    ));
    drop(held);
    assert!(matches!(
        journal.session(&tenant, "s1").await,
        Err(JournalError::SessionNotFound(_))
    ));
}

// ---------------------------------------------------------------- relay wake-ups

/// A journal's notification wakes the other journals' (replicas')
/// listeners, not its own: its relay is woken in-process, and a wake-up of
/// its own would read the outbox a second time for every commit.
#[tokio::test]
async fn a_relay_notification_wakes_the_other_replicas_listeners_not_its_own() {
    let db = TestDatabase::new(&MIGRATOR).await;
    let a = narad_journal::Journal::connect(db.url(), 2).unwrap();
    let b = narad_journal::Journal::connect(db.url(), 2).unwrap();
    let (mut a_hears, mut b_hears) = (
        a.listen_relays().await.unwrap(),
        b.listen_relays().await.unwrap(),
    );
    let quiet = Duration::from_millis(300);
    a.notify_relays().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(5), b_hears.notified())
            .await
            .expect("b hears a's notification"),
        "b's listener is open"
    );
    assert!(
        tokio::time::timeout(quiet, a_hears.notified())
            .await
            .is_err(),
        "a does not hear its own notification"
    );
    b.notify_relays().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(5), a_hears.notified())
            .await
            .expect("a hears b's notification")
    );
    assert!(
        tokio::time::timeout(quiet, b_hears.notified())
            .await
            .is_err(),
        "b does not hear its own notification"
    );
}

// ---------------------------------------------------------------- executors

/// The executor sweeper reads a run, then pauses it: a stop asked for in
/// between must not be followed by that pause (the backend could then
/// not end the run without resuming it first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_asked_for_after_the_sweepers_read_is_not_followed_by_its_pause() {
    let f = fixture().await;
    let s = f.session("s1").await;
    f.append(
        &s,
        &[
            ev(
                "r1-start",
                "run.started",
                Some(("r1", "r1")),
                json!({"clientExecutorId": "desk-1"}),
            ),
            ev(
                "tc1-start",
                "tool.call.started",
                Some(("r1", "r1")),
                json!({"toolCallId": "tc-1", "toolName": "open.file", "executor": "client",
                       "args": {"path": "README.md"}}),
            ),
        ],
    )
    .await
    .unwrap();
    let item = narad_journal::SweepItem {
        kind: narad_journal::SweepKind::Away,
        tenant: f.tenant.clone(),
        session_id: "s1".to_owned(),
        tool_call_id: Some("tc-1".to_owned()),
        root_run_id: "r1".to_owned(),
        run_id: "r1".to_owned(),
        executor_id: "desk-1".to_owned(),
        wait_id: None,
    };
    // The sweep reads a running run whose executor is away...
    let plan = f
        .journal
        .plan_executor_pause(&f.tenant, &item)
        .await
        .unwrap()
        .expect("a running run may be paused");
    // ...a person asks the run to stop before the pause is appended.
    f.append(
        &s,
        &[ev(
            "stop",
            "run.stop.requested",
            Some(("r1", "r1")),
            json!({"targetRunId": "r1"}),
        )],
    )
    .await
    .unwrap();
    let paused = f
        .journal
        .apply_executor_pause(&f.tenant, &item, plan)
        .await
        .unwrap();
    assert!(!paused, "the pause read before the stop is not appended");
    // The backend ends the run at once, as after any stop.
    f.append(
        &s,
        &[
            ev(
                "tc1-done",
                "tool.call.finished",
                Some(("r1", "r1")),
                json!({"toolCallId": "tc-1", "outcome": "cancelled", "response": null,
                       "code": "narad.stop"}),
            ),
            ev(
                "r1-cancelled",
                "run.cancelled",
                Some(("r1", "r1")),
                json!({}),
            ),
        ],
    )
    .await
    .unwrap();
    let types: Vec<String> = f
        .history("s1", HistoryQuery::default())
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(!types.iter().any(|t| t == "run.paused"), "{types:?}");

    // With nothing appended between the read and the pause, it is.
    let s2 = f.session("s2").await;
    f.append(
        &s2,
        &[ev(
            "r2-start",
            "run.started",
            Some(("r2", "r2")),
            json!({"clientExecutorId": "desk-1"}),
        )],
    )
    .await
    .unwrap();
    let item2 = narad_journal::SweepItem {
        session_id: "s2".to_owned(),
        tool_call_id: None,
        root_run_id: "r2".to_owned(),
        run_id: "r2".to_owned(),
        ..item
    };
    let plan = f
        .journal
        .plan_executor_pause(&f.tenant, &item2)
        .await
        .unwrap()
        .unwrap();
    assert!(
        f.journal
            .apply_executor_pause(&f.tenant, &item2, plan)
            .await
            .unwrap()
    );
}
