//! Resuming a stream from any frame's id gives exactly the frames after it,
//! whatever happened in between: watch events interleaved with authority,
//! retention running during a slow replay, the database dumped and
//! restored into another cluster.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

/// Frames whose content a replay carries again: authority events, and on
/// the tenant stream the catalogue changes the outbox keeps. Coalesced
/// watch events (`*.revision`) are notifications of the live feed only.
fn replayable(frame: &Frame, tenant_stream: bool) -> bool {
    frame.id.is_some()
        && (frame.data.get("sessionSequence").is_some()
            || (tenant_stream
                && matches!(
                    frame.data["type"].as_str(),
                    Some("session.created" | "session.updated" | "session.archived")
                )))
}

/// Reads frames until one has id `last`, then `linger` more of quiet
/// (watch events trail the authority they cover).
async fn read_through(stream: &mut SseStream, last: &str, linger: Duration) -> Vec<Frame> {
    read_until(stream, |f| f.id.as_deref() == Some(last), linger).await
}

/// Reads frames until one is `done`, then `linger` more of quiet.
async fn read_until(
    stream: &mut SseStream,
    mut done: impl FnMut(&Frame) -> bool,
    linger: Duration,
) -> Vec<Frame> {
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let frame = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("not done within 30 s; got {frames:#?}"))
            .expect("the stream stays open");
        let done = done(&frame);
        frames.push(frame);
        if done {
            break;
        }
    }
    while let Ok(Some(frame)) = tokio::time::timeout(linger, stream.next()).await {
        frames.push(frame);
    }
    frames
}

/// The ids of the replayable frames a stream resumed with `Last-Event-ID`
/// `id` delivers, read until `last` arrives (or, when nothing is
/// expected, for a short while).
async fn resumed(
    s: &Server,
    path: &str,
    token: &str,
    id: &str,
    last: Option<&str>,
    tenant_stream: bool,
) -> Vec<String> {
    let mut stream = s.stream(path, token, &[("last-event-id", id)]).await;
    let mut got = Vec::new();
    let wait = if last.is_some() { 30_000 } else { 400 };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    while let Ok(Some(frame)) = tokio::time::timeout_at(deadline, stream.next()).await {
        if replayable(&frame, tenant_stream) {
            let frame_id = frame.id.clone().expect("replayable frames have ids");
            got.push(frame_id.clone());
            if Some(frame_id.as_str()) == last {
                break;
            }
        }
    }
    got
}

/// Checks that resuming `path` from every id of `frames` gives exactly the
/// replayable frames after it; returns how many ids were tried.
async fn check_every_resume(
    s: &Server,
    path: &str,
    token: &str,
    frames: &[Frame],
    tenant_stream: bool,
) -> usize {
    let mut tried = 0;
    for (i, frame) in frames.iter().enumerate() {
        let Some(id) = &frame.id else { continue };
        let expected: Vec<String> = frames[i + 1..]
            .iter()
            .filter(|f| replayable(f, tenant_stream))
            .map(|f| f.id.clone().expect("an id"))
            .collect();
        let got = resumed(
            s,
            path,
            token,
            id,
            expected.last().map(String::as_str),
            tenant_stream,
        )
        .await;
        assert_eq!(
            got, expected,
            "{path}: resuming from frame {i} ({}, id {id}) gave other frames than those after it",
            frame.data["type"]
        );
        tried += 1;
    }
    tried
}

/// Appends batches of deltas to `sessions` in turn, with pauses shorter
/// and longer than the coalescing window, so that watch events fall
/// between authority frames; one catalogue change on the way. Ends with a
/// delta whose eventId is `end`, then a last catalogue change (title
/// `final`), whose `workspace.revision` ends the tenant stream's frames.
async fn write_mixed(s: &Server, t: &str, sessions: &[&str], batches: usize) {
    for i in 0..batches {
        let session = sessions[i % sessions.len()];
        let events: Vec<Value> = (0..1 + i % 4)
            .map(|k| delta(&format!("{session}-{i}-{k}")))
            .collect();
        s.post(
            &format!("/v1/sessions/{session}/events"),
            t,
            &json!({ "events": events }),
        )
        .await
        .expect(201);
        if i == batches / 2 {
            s.post(
                "/v1/commands/update-session",
                t,
                &json!({"sessionId": sessions[0], "title": "renamed"}),
            )
            .await
            .expect(200);
        }
        tokio::time::sleep(Duration::from_millis([0, 20, 70][i % 3])).await;
    }
    s.post(
        &format!("/v1/sessions/{}/events", sessions[0]),
        t,
        &json!({ "events": [delta("end")] }),
    )
    .await
    .expect(201);
    s.post(
        "/v1/commands/update-session",
        t,
        &json!({"sessionId": sessions[1], "title": "final"}),
    )
    .await
    .expect(200);
}

/// A tenant stream's frames through the `workspace.revision` that follows
/// [`write_mixed`]'s last catalogue change.
async fn tenant_frames_of_mixed(stream: &mut SseStream) -> Vec<Frame> {
    let mut final_seen = false;
    read_until(
        stream,
        |f| {
            if f.data["title"] == "final" {
                final_seen = true;
            }
            final_seen && f.data["type"] == "workspace.revision"
        },
        Duration::from_millis(300),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resuming_from_any_frame_gives_exactly_the_frames_after_it() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let mut tenant = s.stream("/v1/events", &t, &[]).await;
    tenant.next().await.expect("capabilities");
    open_session(&s, &t, "ra").await;
    open_session(&s, &t, "rb").await;
    let mut session = s
        .stream("/v1/sessions/ra/stream?afterSessionSequence=0", &t, &[])
        .await;
    write_mixed(&s, &t, &["ra", "rb"], 36).await;

    let tenant_frames = tenant_frames_of_mixed(&mut tenant).await;
    let session_frames = read_through(&mut session, "end", Duration::from_millis(300)).await;
    let watches = |frames: &[Frame]| {
        frames
            .iter()
            .filter(|f| f.id.is_some() && !replayable(f, true))
            .count()
    };
    // The stream is mixed: watch events among the authority.
    assert!(watches(&tenant_frames) >= 5, "{tenant_frames:#?}");
    assert!(watches(&session_frames) >= 5, "{session_frames:#?}");

    let tried = check_every_resume(&s, "/v1/events", &t, &tenant_frames, true).await;
    assert!(tried > 100, "{tried} ids tried");
    let tried = check_every_resume(&s, "/v1/sessions/ra/stream", &t, &session_frames, false).await;
    assert!(tried > 40, "{tried} ids tried");
}

/// A large delta of run r1's message m1.
fn big_delta(id: &str, bytes: usize) -> Value {
    let mut d = delta(id);
    d["delta"] = json!("x".repeat(bytes));
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_during_a_slow_replay_is_announced_as_a_replay_gap() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "slow").await;
    // About 20 MB of frames: far more than socket buffers hold, so that the
    // replay waits on its reader with most of the outbox still to read.
    let total = 4_000;
    for batch in 0..total / 10 {
        let events: Vec<Value> = (0..10)
            .map(|k| big_delta(&format!("big-{}", batch * 10 + k), 5_000))
            .collect();
        s.post("/v1/sessions/slow/events", &t, &json!({ "events": events }))
            .await
            .expect(201);
    }
    let mut replay = s
        .stream("/v1/events", &t, &[("last-event-id", "start-slow")])
        .await;
    let mut got = Vec::new();
    while got.len() < 10 {
        let frame = replay.next().await.expect("frames");
        if let Some(id) = frame.id {
            got.push(id);
        }
    }
    // The reader stalls; retention forgets everything final meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let journal = narad_journal::Journal::connect(s.db.url(), 2).expect("a journal");
    // Retention forgets only final rows: a transaction another test holds
    // open on the same cluster holds them back for a while.
    let mut forgotten = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while forgotten <= 3_000 && tokio::time::Instant::now() < deadline {
        forgotten += journal
            .forget_outbox(Duration::ZERO, 100_000)
            .await
            .expect("retention runs");
        if forgotten <= 3_000 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(forgotten > 3_000, "{forgotten} rows forgotten");
    s.post(
        "/v1/sessions/slow/events",
        &t,
        &json!({ "events": [delta("after-retention")] }),
    )
    .await
    .expect(201);

    let mut gap = None;
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(30), replay.next())
            .await
            .expect("the replay goes on")
            .expect("the stream stays open");
        if frame.event.as_deref() == Some("replay-gap") {
            assert!(frame.id.is_none(), "a replay-gap moves no cursor");
            gap = Some((got.len(), frame.data));
            continue;
        }
        let Some(id) = frame.id else { continue };
        if id == "after-retention" {
            break;
        }
        if frame.data.get("sessionSequence").is_some() {
            got.push(id);
        }
    }
    // What arrived is the history's prefix, in order, none twice; the rest
    // is announced, not silently skipped.
    let expected: Vec<String> = (0..total).map(|n| format!("big-{n}")).collect();
    assert_eq!(
        got,
        expected[..got.len()],
        "the replay's frames are history's prefix"
    );
    let (at, data) = gap.unwrap_or_else(|| {
        panic!(
            "{} of {total} events arrived and no replay-gap said the rest was forgotten",
            got.len()
        )
    });
    assert_eq!(at, got.len(), "the gap comes where the frames stop");
    assert!(got.len() < total, "retention ran during the replay");
    assert!(data["forgottenThrough"].is_string(), "{data}");
}

/// Copies the stream-relevant state of `db` into a database of another
/// cluster whose transaction counter is far lower, as an operator moving
/// narad to a new server would (pg_dump, pg_restore).
struct Moved {
    db: Arc<narad_testkit::TestDatabase>,
    _cluster: Option<narad_localpg::Cluster>,
}

/// `pg_dump` of `from`, restored with `pg_restore` into a new cluster (its
/// counter starts low). Without Postgres binaries (a Docker-only
/// machine), the copy is a database of the same server whose stored
/// positions are moved ahead by a billion transactions: what the stored
/// rows of a busier cluster look like to this one.
async fn moved(from: &narad_testkit::TestDatabase) -> Moved {
    let Some(bin) = narad_localpg::bindir() else {
        let to = narad_testkit::TestDatabase::empty_on_server(from.admin_url()).await;
        let (admin, conn) = tokio_postgres::connect(from.admin_url(), tokio_postgres::NoTls)
            .await
            .expect("the admin connection");
        tokio::spawn(conn);
        admin
            .batch_execute(&format!("drop database {}", to.name()))
            .await
            .expect("drop the empty copy");
        admin
            .batch_execute(&format!(
                "select pg_terminate_backend(pid) from pg_stat_activity where datname = '{0}';
                 create database {1} template {0}",
                from.name(),
                to.name()
            ))
            .await
            .expect("a copy");
        let (c, conn) = tokio_postgres::connect(to.url(), tokio_postgres::NoTls)
            .await
            .expect("the copy");
        tokio::spawn(conn);
        c.batch_execute(
            "update outbox set txid = (txid::text::bigint + 1000000000)::text::xid8;
             update events set txid = (txid::text::bigint + 1000000000)::text::xid8;
             update outbox_horizons set txid = (txid::text::bigint + 1000000000)::text::xid8;",
        )
        .await
        .expect("positions moved ahead");
        return Moved {
            db: Arc::new(to),
            _cluster: None,
        };
    };
    let dir = std::env::temp_dir().join(format!("narad-moved-{}", uuid::Uuid::now_v7().simple()));
    let cluster = narad_localpg::Cluster::new(&dir, &bin);
    let admin = cluster
        .start(narad_localpg::Durability::Throwaway)
        .await
        .expect("a new cluster");
    let to = narad_testkit::TestDatabase::empty_on_server(&admin).await;
    let (c, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .expect("the new cluster");
    tokio::spawn(conn);
    c.batch_execute(
        "do $$ begin
           if not exists (select 1 from pg_roles where rolname = 'narad_app') then
             create role narad_app nologin;
           end if;
         end $$",
    )
    .await
    .expect("the role narad runs its queries as");
    let dump = dir.with_extension("dump");
    let run = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(bin.join(program))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let dump_path = dump.to_str().expect("a path");
    run(
        "pg_dump",
        &[
            "--format=custom",
            "--file",
            dump_path,
            "--dbname",
            from.url(),
        ],
    );
    run(
        "pg_restore",
        &[
            "--no-owner",
            "--exit-on-error",
            "--dbname",
            to.url(),
            dump_path,
        ],
    );
    let _ = std::fs::remove_file(&dump);
    Moved {
        db: Arc::new(to),
        _cluster: Some(cluster),
    }
}

/// Makes sure the cluster of `db` has run at least `at_least` transactions.
async fn age_cluster(db: &narad_testkit::TestDatabase, at_least: i64) {
    let (c, conn) = tokio_postgres::connect(db.admin_url(), tokio_postgres::NoTls)
        .await
        .expect("the admin connection");
    tokio::spawn(conn);
    let now: i64 = c
        .query_one("select pg_current_xact_id()::text::bigint", &[])
        .await
        .expect("a transaction id")
        .get(0);
    if now < at_least {
        c.batch_execute(&format!(
            "do $$ begin for i in 1..{} loop perform pg_current_xact_id(); commit; end loop; end $$",
            at_least - now
        ))
        .await
        .expect("transactions burnt");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_stream_cursors_survive_a_dump_and_restore_into_another_cluster() {
    let before = Server::start().await;
    age_cluster(&before.db, 50_000).await;
    let t = token("acme", &Role::ALL);
    let mut tenant = before.stream("/v1/events", &t, &[]).await;
    tenant.next().await.expect("capabilities");
    open_session(&before, &t, "ma").await;
    open_session(&before, &t, "mb").await;
    write_mixed(&before, &t, &["ma", "mb"], 12).await;
    let old = tenant_frames_of_mixed(&mut tenant).await;
    drop(tenant);
    let from = before.db.clone();
    before.stop().await;

    let moved = moved(&from).await;
    let after = Server::start_on_database(moved.db.clone()).await;

    // Every cursor of the old cluster resumes where it was: before any
    // write on the new one, and after it.
    let tried = check_every_resume(&after, "/v1/events", &t, &old, true).await;
    assert!(tried > 30, "{tried} ids tried");
    let last_old = old.iter().rev().find_map(|f| f.id.clone()).expect("an id");
    let mut from_last = after
        .stream("/v1/events", &t, &[("last-event-id", &last_old)])
        .await;
    let mut live = after.stream("/v1/events", &t, &[]).await;
    live.next().await.expect("capabilities");
    open_session(&after, &t, "mc").await;
    for n in 0..5 {
        after
            .post(
                "/v1/sessions/ma/events",
                &t,
                &json!({ "events": [delta(&format!("new-{n}"))] }),
            )
            .await
            .expect(201);
    }
    let new_ids = |frames: Vec<Frame>| -> Vec<String> {
        frames
            .into_iter()
            .filter(|f| replayable(f, true))
            .filter_map(|f| f.id)
            .collect()
    };
    let from_last = new_ids(read_through(&mut from_last, "new-4", Duration::ZERO).await);
    let live = new_ids(read_through(&mut live, "new-4", Duration::ZERO).await);
    let old_ids: HashSet<String> = old.iter().filter_map(|f| f.id.clone()).collect();
    assert!(
        from_last.iter().all(|id| !old_ids.contains(id)),
        "an old event came again: {from_last:?}"
    );
    assert_eq!(from_last, live, "the old cursor and a live stream agree");
    assert_eq!(
        live.iter()
            .filter(|id| id.starts_with("new-"))
            .cloned()
            .collect::<Vec<_>>(),
        (0..5).map(|n| format!("new-{n}")).collect::<Vec<_>>()
    );
    // And from the first old cursor: the old frames after it, then the new.
    let first_old = old.iter().find_map(|f| f.id.clone()).expect("an id");
    let whole = resumed(&after, "/v1/events", &t, &first_old, Some("new-4"), true).await;
    let first_at = old
        .iter()
        .position(|f| f.id.as_deref() == Some(first_old.as_str()))
        .expect("there");
    let mut expected: Vec<String> = old[first_at + 1..]
        .iter()
        .filter(|f| replayable(f, true))
        .filter_map(|f| f.id.clone())
        .collect();
    expected.extend(live);
    assert_eq!(whole, expected);
    after.stop().await;
}

#[tokio::test]
async fn an_event_id_beyond_ascii_resumes_like_any_other() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "u1").await;
    for id in ["évent-1", "évent-2"] {
        s.post(
            "/v1/sessions/u1/events",
            &t,
            &json!({ "events": [delta(id)] }),
        )
        .await
        .expect(201);
    }
    for path in ["/v1/sessions/u1/stream", "/v1/events"] {
        let got = resumed(&s, path, &t, "évent-1", Some("évent-2"), true).await;
        assert_eq!(got, ["évent-2"], "{path} resumes right after évent-1");
    }
}
