//! Streams open while the database restarts resume without loss once it is
//! back.

use std::sync::Arc;
use std::time::Duration;

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

/// Posts until the server answers `expected` (the database may be down).
async fn post_until(s: &Server, path: &str, t: &str, body: &Value, expected: u16) {
    for _ in 0..200 {
        let a = s.post(path, t, body).await;
        if a.status == expected {
            return;
        }
        // A retried append is idempotent: its eventId may have landed.
        if a.status == 409 && a.body["code"] == "NRD-0202" {
            panic!("a retried append conflicts: {:#}", a.body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{path} never answered {expected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_open_across_a_database_restart_resume_without_loss() {
    // A cluster of the test's own, so that restarting it disturbs no other
    // test. Without Postgres binaries (a Docker-only machine), every
    // connection of the test database is terminated instead: what narad
    // sees of a restart, without the downtime.
    let bin = narad_localpg::bindir();
    let dir = std::env::temp_dir().join(format!("narad-restart-{}", std::process::id()));
    let cluster = bin.as_ref().map(|b| narad_localpg::Cluster::new(&dir, b));
    let db = match &cluster {
        Some(c) => {
            let admin = c
                .start(narad_localpg::Durability::Throwaway)
                .await
                .expect("a cluster of the test's own");
            Arc::new(
                narad_testkit::TestDatabase::on_server(&admin, &narad_journal::MIGRATOR)
                    .await
                    .expect("a database"),
            )
        }
        None => Arc::new(narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await),
    };
    let a = Server::start_on_database(db.clone()).await;
    let b = a.replica().await;
    let t = token("acme", &Role::ALL);
    session_with_run(&a, &t, "s1", "r1", None).await;
    let started = json!({"events": [{"protocolVersion": "narad/v1", "type": "message.text.started",
        "eventId": "m1-start", "rootRunId": "r1", "runId": "r1", "messageId": "m1",
        "role": "assistant", "messageScope": "run"}]});
    a.post("/v1/sessions/s1/events", &t, &started)
        .await
        .expect(201);
    let mut on_b = b
        .stream("/v1/sessions/s1/stream?afterSessionSequence=0", &t, &[])
        .await;
    on_b.next().await.unwrap();
    let mut tenant = b.stream("/v1/events", &t, &[]).await;
    tenant.next().await.unwrap();
    for n in 0..5 {
        let body = json!({"events": [delta(&format!("before-{n}"))]});
        post_until(&a, "/v1/sessions/s1/events", &t, &body, 201).await;
    }
    assert_eq!(on_b.events_until(7, 10).await.len(), 7);

    match &cluster {
        Some(c) => {
            c.stop().expect("the cluster stops");
            tokio::time::sleep(Duration::from_millis(500)).await;
            c.start(narad_localpg::Durability::Throwaway)
                .await
                .expect("the cluster starts again");
        }
        None => {
            let (admin, conn) = tokio_postgres::connect(db.admin_url(), tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            admin
                .execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity \
                     where datname = $1 and pid <> pg_backend_pid()",
                    &[&db.name()],
                )
                .await
                .unwrap();
        }
    }
    for n in 0..5 {
        let body = json!({"events": [delta(&format!("after-{n}"))]});
        post_until(&a, "/v1/sessions/s1/events", &t, &body, 201).await;
    }
    // The session stream opened before the restart goes on from where it
    // stood; the tenant stream too.
    let after = on_b.events_until(12, 30).await;
    let ids: Vec<&str> = after
        .iter()
        .map(|e| e["eventId"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["after-0", "after-1", "after-2", "after-3", "after-4"],
        "nothing lost, nothing repeated"
    );
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("after-4") {
        let f = tokio::time::timeout(Duration::from_secs(30), tenant.next())
            .await
            .expect("the tenant stream goes on")
            .expect("open");
        if f.data.get("sessionSequence").is_some() {
            seen.push(f.id.unwrap());
        }
    }
    let tail: Vec<&str> = seen
        .iter()
        .map(String::as_str)
        .skip_while(|i| !i.starts_with("after"))
        .collect();
    assert_eq!(
        tail,
        ["after-0", "after-1", "after-2", "after-3", "after-4"]
    );
    a.stop().await;
    b.stop().await;
    if let Some(c) = cluster {
        let _ = c.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
