//! The append path's speed without maintenance by hand: statistics the
//! journal keeps current itself (a table that grew is analyzed, its cached
//! plans made again on what it holds now; one that did not is left alone),
//! and the rows every append rewrites updated HOT, so that they neither
//! bloat nor write index entries while nobody vacuums.

mod common;

use common::*;

/// How many rows Postgres thinks `table` holds (`-1`: never analyzed).
async fn reltuples(f: &Fixture, table: &str) -> f32 {
    admin(f)
        .await
        .query_one(
            "select reltuples from pg_class where relname = $1",
            &[&table],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn tables_that_grew_are_analyzed_and_others_are_left_alone() {
    let f = fixture().await;
    let sid = f.session("s1").await;
    let batch: Vec<_> = (0..200).map(|n| user_message(&format!("m{n}"))).collect();
    f.append(&sid, &batch).await.unwrap();
    // 200 rows are under the threshold: nothing is analyzed yet.
    assert_eq!(
        f.journal.keep_statistics().await.unwrap(),
        Vec::<String>::new()
    );
    for round in 0..4 {
        let batch: Vec<_> = (0..200)
            .map(|n| user_message(&format!("m{round}-{n}")))
            .collect();
        f.append(&sid, &batch).await.unwrap();
    }
    // The counters reach the statistics views within a second or so.
    let mut analyzed = Vec::new();
    for _ in 0..50 {
        analyzed = f.journal.keep_statistics().await.unwrap();
        if !analyzed.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(analyzed.contains(&"events".to_owned()), "{analyzed:?}");
    assert!(analyzed.contains(&"outbox".to_owned()), "{analyzed:?}");
    assert!(
        !analyzed.contains(&"sessions".to_owned()),
        "one row changed: {analyzed:?}"
    );
    assert_eq!(reltuples(&f, "events").await, 1000.0);
    // Analyzed: nothing is due again until the table grows by a tenth more.
    assert_eq!(
        f.journal.keep_statistics().await.unwrap(),
        Vec::<String>::new()
    );
}

/// The columns an append rewrites on every group: a session's sequence and
/// core, an entity's state.
const REWRITTEN: &[(&str, &str)] = &[
    ("sessions", "session_sequence"),
    ("sessions", "core"),
    ("entities", "state"),
];

/// The indexes that use `table.column`: as a key, in an expression or in a
/// predicate.
async fn indexes_using(admin: &tokio_postgres::Client, table: &str, column: &str) -> Vec<String> {
    admin
        .query(
            "select i.relname::text from pg_depend d \
             join pg_class i on i.oid = d.objid and i.relkind = 'i' \
             join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid \
             where d.classid = 'pg_class'::regclass and d.refobjid = $1::text::regclass \
               and a.attname = $2 \
             union \
             select i.relname::text from pg_index x join pg_class i on i.oid = x.indexrelid \
             join pg_attribute a on a.attrelid = x.indrelid and a.attnum = any(x.indkey) \
             where x.indrelid = $1::text::regclass and a.attname = $2 \
             order by 1",
            &[&table, &column],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn admin(f: &Fixture) -> tokio_postgres::Client {
    connect(f.db.url()).await
}

#[tokio::test]
async fn no_index_uses_a_column_every_append_rewrites() {
    // An update is HOT only when no column an index uses changed; one such
    // index makes every append write a new version into all the table's
    // indexes, and the table bloats while nobody vacuums.
    let f = fixture().await;
    let admin = admin(&f).await;
    for (table, column) in REWRITTEN {
        assert_eq!(
            indexes_using(&admin, table, column).await,
            Vec::<String>::new(),
            "{table}.{column} is used by these indexes, so its updates cannot be HOT"
        );
    }
}

#[tokio::test]
async fn an_index_predicate_on_a_rewritten_column_is_seen() {
    // The check above, against an index like the inbox's that broke HOT
    // entity updates (its predicate read the state).
    let f = fixture().await;
    let admin = admin(&f).await;
    admin
        .batch_execute(
            "create index probe_predicate on entities (tenant_id) \
             where kind = 'interrupt' and state ->> 'decision' is null; \
             create index probe_key on sessions (core)",
        )
        .await
        .unwrap();
    assert_eq!(
        indexes_using(&admin, "entities", "state").await,
        vec!["probe_predicate".to_string()]
    );
    assert_eq!(
        indexes_using(&admin, "sessions", "core").await,
        vec!["probe_key".to_string()]
    );
}

/// `table`'s sequential and index scans so far, as `pg_stat_user_tables`
/// has them.
async fn scans(admin: &tokio_postgres::Client, table: &str) -> (i64, i64) {
    let row = admin
        .query_one(
            "select coalesce(seq_scan, 0), coalesce(idx_scan, 0) from pg_stat_user_tables \
             where relname = $1",
            &[&table],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn appends_look_rows_up_by_key_on_tables_analyzed_while_nearly_empty() {
    // A prepared statement keeps the plan made on a nearly empty table,
    // where reading the whole table is cheapest, until the next ANALYZE;
    // the append group's lookups must stay index lookups meanwhile.
    let f = fixture().await;
    let sid = f.session("s1").await;
    f.append(&sid, &[user_message("m0")]).await.unwrap();
    let admin = admin(&f).await;
    admin.batch_execute("analyze").await.unwrap();
    // What this connection's analyze read is reported before the count.
    admin
        .batch_execute("select pg_stat_force_next_flush()")
        .await
        .unwrap();
    let before = scans(&admin, "events").await;
    const APPENDS: i64 = 40;
    for n in 1..=APPENDS {
        f.append(&sid, &[user_message(&format!("m{n}"))])
            .await
            .unwrap();
    }
    // Each backend reports its counters within seconds of going idle.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut now = scans(&admin, "events").await;
    while now.1 - before.1 < APPENDS && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        admin
            .batch_execute("select pg_stat_clear_snapshot()")
            .await
            .unwrap();
        now = scans(&admin, "events").await;
    }
    assert!(
        now.1 - before.1 >= APPENDS,
        "every append looks its eventIds up by index: {before:?} → {now:?}"
    );
    assert_eq!(
        now.0 - before.0,
        0,
        "no append read the whole events table: {before:?} → {now:?}"
    );
}
