//! Statistics the journal keeps current itself: a table that grew is
//! analyzed (its cached plans are made again on what it holds now), one
//! that did not is left alone.

mod common;

use common::*;

/// How many rows Postgres thinks `table` holds (`-1`: never analyzed).
async fn reltuples(f: &Fixture, table: &str) -> f32 {
    let (admin, conn) = tokio_postgres::connect(f.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    admin
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
