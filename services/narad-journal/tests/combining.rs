//! Concurrent appends share transactions, and each is still decided alone.
//!
//! To make requests meet in one group, these journals run one append
//! transaction at a time on a pool of one connection, and the test holds
//! that connection until every request waits.

use std::time::Duration;

use narad_journal::{AppendOptions, HistoryQuery, Journal, JournalError, NewSession, TenantId};
use narad_protocol::primitives::SessionId;
use serde_json::{Value, json};

mod common;
use common::*;

/// Waits until `n` appends wait in the journal's queue.
async fn until_waiting(journal: &Journal, n: u64) {
    for _ in 0..1000 {
        if journal.append_stats().waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the appends never queued: {:?}", journal.append_stats());
}

fn spawn_append(
    journal: &Journal,
    tenant: &TenantId,
    session: &str,
    events: Vec<Value>,
    options: AppendOptions,
) -> tokio::task::JoinHandle<Result<narad_journal::Appended, JournalError>> {
    let (journal, tenant) = (journal.clone(), tenant.clone());
    let session = SessionId::new(session).unwrap();
    tokio::spawn(async move { journal.append(&tenant, &session, &events, options).await })
}

fn types_and_ids(page: &narad_journal::HistoryPage) -> Vec<(u64, String)> {
    page.events
        .iter()
        .map(|e| {
            (
                e["sessionSequence"].as_u64().unwrap(),
                e["eventId"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_appends_share_a_transaction_and_each_is_decided_alone() {
    let f = fixture_with(1, 1).await;
    f.session("s1").await;
    f.session("s2").await;
    let other = TenantId::new("org-b").unwrap();
    f.journal
        .create_session(
            &other,
            NewSession {
                session_id: Some(SessionId::new("s1").unwrap()),
                ..NewSession::default()
            },
        )
        .await
        .unwrap();
    let before = f.journal.append_stats();

    let held = f.journal.pool().get().await.unwrap();
    let plain = AppendOptions::default();
    let a = spawn_append(
        &f.journal,
        &f.tenant,
        "s1",
        vec![user_message("a")],
        plain.clone(),
    );
    // A delta for a message nobody started breaks a rule.
    let bad = spawn_append(
        &f.journal,
        &f.tenant,
        "s1",
        vec![
            user_message("b1"),
            ev(
                "b2",
                "message.text.delta",
                Some(("r0", "r0")),
                json!({"messageId": "nope", "delta": "x"}),
            ),
        ],
        plain.clone(),
    );
    let c = spawn_append(
        &f.journal,
        &f.tenant,
        "s1",
        vec![user_message("c")],
        plain.clone(),
    );
    let stale = spawn_append(
        &f.journal,
        &f.tenant,
        "s1",
        vec![user_message("d")],
        AppendOptions {
            expected_session_sequence: Some(99),
            ..AppendOptions::default()
        },
    );
    let e = spawn_append(
        &f.journal,
        &f.tenant,
        "s2",
        vec![user_message("e")],
        plain.clone(),
    );
    let g = spawn_append(
        &f.journal,
        &other,
        "s1",
        vec![user_message("g")],
        plain.clone(),
    );
    until_waiting(&f.journal, 6).await;
    drop(held);

    let a = a.await.unwrap().unwrap();
    let c = c.await.unwrap().unwrap();
    let e = e.await.unwrap().unwrap();
    let g = g.await.unwrap().unwrap();
    match bad.await.unwrap() {
        Err(JournalError::Rejected { index: 1, .. }) => {}
        other => panic!("the bad batch is refused at its second event: {other:?}"),
    }
    match stale.await.unwrap() {
        Err(JournalError::SequenceMismatch { expected: 99, .. }) => {}
        other => panic!("the stale batch is refused: {other:?}"),
    }

    let stats = f.journal.append_stats();
    assert_eq!(stats.grouped - before.grouped, 6, "{stats:?}");
    // On a distributed database a transaction holds one tenant's appends
    // (one shard group): the five of one tenant and the other's one.
    let distributed = distributed(f.db.url()).await;
    let transactions = if distributed { 2 } else { 1 };
    if distributed {
        // Nor is a group sent the one-round-trip way there.
        assert_eq!(stats.one_trip, 0, "{stats:?}");
    }
    assert_eq!(
        stats.groups - before.groups,
        transactions,
        "six waiting appends took one transaction per tenant at most: {stats:?}"
    );
    assert_eq!(stats.alone, before.alone, "none went alone: {stats:?}");

    // s1 holds a and c, contiguous, whichever came first; nothing of b or d.
    let s1 = types_and_ids(&f.history("s1", HistoryQuery::default()).await.unwrap());
    let mut ids: Vec<&str> = s1.iter().map(|(_, id)| id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["a", "c"]);
    assert_eq!(s1.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 2]);
    let mut got = [a.events[0].session_sequence, c.events[0].session_sequence];
    got.sort();
    assert_eq!(got, [1, 2]);
    // Each session's and tenant's sequences are their own.
    assert_eq!(e.events[0].session_sequence, 1);
    assert_eq!(g.events[0].session_sequence, 1);
    let theirs = f
        .journal
        .history(&other, "s1", &HistoryQuery::default())
        .await
        .unwrap();
    assert_eq!(types_and_ids(&theirs), [(1, "g".to_owned())]);
    // The stored engine state is the one the events alone give.
    for session in ["s1", "s2"] {
        assert_eq!(
            f.journal.stored_state(&f.tenant, session).await.unwrap(),
            f.journal.derived_state(&f.tenant, session).await.unwrap(),
            "{session}"
        );
    }
    assert_eq!(
        f.journal.stored_state(&other, "s1").await.unwrap(),
        f.journal.derived_state(&other, "s1").await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_write_fails_appends_each_request_alone() {
    let f = fixture_with(1, 1).await;
    f.session("s1").await;
    f.session("s2").await;
    // Another transaction writes eventId "x" (to a third session) and stays
    // open: the group's insert of "x" waits for it, then fails. (Like every
    // connection that writes the journal, it attaches to the stream clock.)
    let other = connect(f.db.url()).await;
    other
        .batch_execute(
            "select stream_clock_attach(); begin; insert into events (tenant_id, session_id, session_sequence, event_id, type, \
             body, proposal_sha256) values ('org-a', 's3', 1, 'x', 'message.user.recorded', \
             '{}', '\\x00')",
        )
        .await
        .unwrap();
    let before = f.journal.append_stats();

    let held = f.journal.pool().get().await.unwrap();
    let plain = AppendOptions::default();
    let x = spawn_append(
        &f.journal,
        &f.tenant,
        "s1",
        vec![user_message("x")],
        plain.clone(),
    );
    let y = spawn_append(
        &f.journal,
        &f.tenant,
        "s2",
        vec![user_message("y")],
        plain.clone(),
    );
    until_waiting(&f.journal, 2).await;
    drop(held);

    // Commit the other transaction once the group waits on it.
    let admin = connect(f.db.admin_url()).await;
    for _ in 0..1000 {
        let waiting = admin
            .query_opt(
                "select pid from pg_stat_activity where datname = $1 and wait_event_type = 'Lock' \
                 and state = 'active' and pid <> pg_backend_pid()",
                &[&f.db.name()],
            )
            .await
            .unwrap();
        if waiting.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    other.batch_execute("commit").await.unwrap();

    match x.await.unwrap() {
        Err(JournalError::EventIdConflict { event_id }) => assert_eq!(event_id, "x"),
        other => panic!("x was taken by the other transaction: {other:?}"),
    }
    let y = y.await.unwrap().unwrap();
    assert_eq!(
        y.events[0].session_sequence, 1,
        "y is appended all the same"
    );
    let stats = f.journal.append_stats();
    assert_eq!(stats.failed_groups - before.failed_groups, 1, "{stats:?}");
    assert_eq!(stats.alone - before.alone, 2, "{stats:?}");
    assert!(
        f.history("s1", HistoryQuery::default())
            .await
            .unwrap()
            .events
            .is_empty()
    );
    assert_eq!(
        types_and_ids(&f.history("s2", HistoryQuery::default()).await.unwrap()),
        [(1, "y".to_owned())]
    );
}
