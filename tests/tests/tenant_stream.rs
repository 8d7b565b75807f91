//! The tenant stream (`GET /v1/events`) and watch events: relay order,
//! resume, blocks, replay gaps, cursors from another store, per-frame
//! authorisation, and the coalescer's notifications.

use std::collections::BTreeSet;
use std::time::Duration;

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

async fn append(s: &Server, t: &str, session: &str, ids: &[String]) {
    let events: Vec<Value> = ids.iter().map(|id| delta(id)).collect();
    s.post(
        &format!("/v1/sessions/{session}/events"),
        t,
        &json!({ "events": events }),
    )
    .await
    .expect(201);
}

/// Registers the extension `acme-tools/NAME` and opens the tenant stream
/// with its signature.
async fn extension_stream(s: &Server, admin: &str, name: &str) -> SseStream {
    let secret = s
        .post(
            "/v1/extensions",
            admin,
            &json!({"publisher": "acme-tools", "name": name}),
        )
        .await
        .expect(201)["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    s.signed_stream(
        "/v1/events",
        &Signed::now(&format!("acme/acme-tools/{name}"), &secret),
    )
    .await
}

/// Frames (after the capabilities frame) until one whose id is `last`, or
/// the stream ends; panics after `seconds`.
async fn frames_until(stream: &mut SseStream, last: &str, seconds: u64) -> Vec<Frame> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        let frame = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no frame {last} within {seconds} s; got {}", got.len()));
        let Some(frame) = frame else { return got };
        let done = frame.id.as_deref() == Some(last);
        got.push(frame);
        if done {
            return got;
        }
    }
}

/// The authority eventIds among frames.
fn authority_ids(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f.data.get("sessionSequence").is_some())
        .map(|f| f.id.clone().expect("authority frames carry their id"))
        .collect()
}

async fn open(s: &Server, path: &str, t: &str, headers: &[(&str, &str)]) -> SseStream {
    let mut stream = s.stream(path, t, headers).await;
    let first = stream.next().await.expect("a capabilities frame");
    assert_eq!(first.event.as_deref(), Some("capabilities"));
    assert_eq!(first.id, None);
    stream
}

async fn status(s: &Server, path: &str, t: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = s.http.get(format!("{}{path}", s.base)).bearer_auth(t);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = req.send().await.unwrap();
    let code = response.status().as_u16();
    if code == 200 {
        return (code, Value::Null);
    }
    (code, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tenant_stream_is_live_resumable_and_never_shows_another_tenant() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let other = token("globex", &Role::ALL);
    open_session(&s, &t, "s1").await;
    open_session(&s, &other, "s1").await;
    let mut live = open(&s, "/v1/events", &t, &[]).await;
    let mut theirs = open(&s, "/v1/events", &other, &[]).await;
    open_session(&s, &t, "s2").await;
    let mut narrowed = open(&s, "/v1/events?sessionId=s2", &t, &[]).await;
    append(&s, &t, "s1", &["a1".into(), "a2".into()]).await;
    append(&s, &other, "s1", &["g1".into()]).await;
    append(&s, &t, "s2", &["b1".into()]).await;

    let got = frames_until(&mut live, "b1", 10).await;
    let ids = authority_ids(&got);
    assert!(
        ids.ends_with(&["a1".into(), "a2".into(), "b1".into()]),
        "{ids:?}"
    );
    assert!(!ids.contains(&"g1".to_owned()), "never another tenant's");
    let created: Vec<&Frame> = got
        .iter()
        .filter(|f| f.data["type"] == "session.created")
        .collect();
    assert_eq!(created.len(), 1, "session.created of s2 travels the stream");
    assert_eq!(created[0].data["sessionId"], "s2");
    assert_eq!(created[0].data["workspaceId"], "acme");
    assert_eq!(
        created[0].id.as_deref(),
        created[0].data["eventId"].as_str()
    );

    let only_s2 = authority_ids(&frames_until(&mut narrowed, "b1", 10).await);
    assert_eq!(only_s2.last().map(String::as_str), Some("b1"));
    assert!(
        only_s2.iter().all(|i| !i.starts_with('a')),
        "one session: {only_s2:?}"
    );

    let globex = authority_ids(&frames_until(&mut theirs, "g1", 10).await);
    // Live from now: everything committed after the attach (and possibly
    // rows committed just before it, while older transactions ran).
    assert_eq!(globex.last().map(String::as_str), Some("g1"));
    for acme in ["a1", "a2", "b1", "start-s2"] {
        assert!(!globex.iter().any(|i| i == acme), "{globex:?}");
    }

    // Resume after a2: exactly what followed, in the same order.
    let mut resumed = open(&s, "/v1/events", &t, &[("last-event-id", "a2")]).await;
    let after = authority_ids(&frames_until(&mut resumed, "b1", 10).await);
    let whole = authority_ids(&got);
    let pos = whole.iter().position(|i| i == "a2").unwrap();
    assert_eq!(after, whole[pos + 1..].to_vec());

    // Unknown ids, and ids from a store newer than this one.
    let (code, body) = status(&s, "/v1/events", &t, &[("last-event-id", "nope")]).await;
    assert_eq!((code, body["code"].as_str()), (409, Some("NRD-0303")));
    let future = uuid_v7_at_hours_from_now(1);
    let (code, body) = status(&s, "/v1/events", &t, &[("last-event-id", &future)]).await;
    assert_eq!(
        (code, body["code"].as_str()),
        (409, Some("NRD-0302")),
        "{body}"
    );
    let (code, _) = status(&s, "/v1/events?sessionId=nope", &t, &[]).await;
    assert_eq!(code, 404);
    // Another tenant's event id is unknown here.
    let (code, body) = status(&s, "/v1/events", &t, &[("last-event-id", "g1")]).await;
    assert_eq!((code, body["code"].as_str()), (409, Some("NRD-0303")));
    s.stop().await;
}

fn uuid_v7_at_hours_from_now(hours: u64) -> String {
    let at = std::time::SystemTime::now() + Duration::from_secs(hours * 3600);
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap();
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, since.as_secs(), since.subsec_nanos());
    uuid::Uuid::new_v7(ts).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_backlog_is_served_in_blocks_that_resume_exactly() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    append(&s, &t, "s1", &["first".into()]).await;
    let total = narad_server::routes::tenant_stream::REPLAY_BLOCK + 1_500;
    let ids: Vec<String> = (0..total).map(|n| format!("e{n}")).collect();
    for chunk in ids.chunks(100) {
        append(&s, &t, "s1", chunk).await;
    }
    let last = ids.last().unwrap().clone();
    let mut cursor = "first".to_owned();
    let mut got = Vec::new();
    let mut connections = 0;
    while cursor != last {
        connections += 1;
        assert!(connections <= 5, "the replay makes progress");
        let mut stream = open(&s, "/v1/events", &t, &[("last-event-id", &cursor)]).await;
        let block = authority_ids(&frames_until(&mut stream, &last, 30).await);
        assert!(!block.is_empty());
        cursor = block.last().unwrap().clone();
        got.extend(block);
    }
    assert_eq!(connections, 2, "one full block, then the rest");
    assert_eq!(got, ids, "nothing lost, nothing repeated across blocks");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_from_a_forgotten_event_opens_with_a_replay_gap() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    append(&s, &t, "s1", &["old1".into(), "old2".into()]).await;
    append(&s, &t, "s1", &["new1".into()]).await;
    // Everything up to old2 is two days old; retention forgets it.
    let (admin, conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    admin
        .batch_execute(
            "update outbox set created_at = now() - interval '2 days' \
             where event_id <> 'new1'",
        )
        .await
        .unwrap();
    let journal = narad_journal::Journal::connect(s.db.url(), 2).unwrap();
    let day = Duration::from_secs(24 * 3600);
    // Rows become final only once every older transaction of the cluster
    // ended (other tests' included): retry until the five old rows
    // (session.created, run.started, message.text.started, old1, old2) go.
    let mut forgotten = 0;
    for _ in 0..400 {
        forgotten += journal.forget_outbox(day, 1_000).await.unwrap();
        if forgotten >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(forgotten, 5, "the old rows, and only those, are forgotten");

    let mut stream = open(&s, "/v1/events", &t, &[("last-event-id", "old1")]).await;
    let gap = stream.next().await.unwrap();
    assert_eq!(gap.event.as_deref(), Some("replay-gap"));
    assert_eq!(gap.id, None, "a replay-gap moves no cursor");
    assert_eq!(gap.data["forgottenThrough"], "old2");
    let rest = authority_ids(&frames_until(&mut stream, "new1", 10).await);
    assert_eq!(rest, ["new1"]);
    // A cursor past the horizon needs no gap.
    let mut fresh = open(&s, "/v1/events", &t, &[("last-event-id", "new1")]).await;
    append(&s, &t, "s1", &["newer".into()]).await;
    let next = frames_until(&mut fresh, "newer", 10).await;
    assert!(
        next.iter()
            .all(|f| f.event.as_deref() != Some("replay-gap"))
    );
    // History still holds every event.
    let page = s.get("/v1/sessions/s1/events?limit=100", &t).await;
    assert_eq!(page.expect(200)["events"].as_array().unwrap().len(), 6);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_events_coalesce_bursts_and_resume_after_what_they_cover() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    let mut stream = open(&s, "/v1/sessions/s1/stream?afterSessionSequence=2", &t, &[]).await;
    let ids: Vec<String> = (0..40).map(|n| format!("w{n}")).collect();
    for chunk in ids.chunks(4) {
        append(&s, &t, "s1", chunk).await;
    }
    // Authority 3..=42, and session.revision notifications among them.
    let mut revisions = Vec::new();
    let mut authority = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while revisions.last() != Some(&42) {
        let f = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("a session.revision covering 42")
            .unwrap();
        match f.data["type"].as_str().unwrap() {
            "session.revision" => {
                assert_eq!(f.id.as_deref(), f.data["eventId"].as_str());
                let r = f.data["revision"].as_u64().unwrap();
                assert_eq!(f.data["cursor"]["sessionSequence"], r);
                // Either authority the client held when it attached, or
                // authority this stream already sent.
                assert!(
                    r <= 2 || authority.contains(&r),
                    "a watch event follows the authority it covers: {r} {authority:?}"
                );
                revisions.push(r);
            }
            "run.revision" => assert_eq!(f.data["runId"], "r1"),
            // session.created, when its row reached the relay after the
            // attach.
            _ if f.data.get("sessionSequence").is_none() => {}
            _ => authority.push(f.data["sessionSequence"].as_u64().unwrap()),
        }
    }
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "revisions never regress: {revisions:?}"
    );
    assert!(
        revisions.len() <= 10,
        "40 events in 10 appends: at most one notification per window: {revisions:?}"
    );
    // Resume from a watch event's id: after the authority it covers.
    let watch_id = {
        let mut again = open(
            &s,
            "/v1/sessions/s1/stream?afterSessionSequence=41",
            &t,
            &[],
        )
        .await;
        append(&s, &t, "s1", &["x1".into()]).await;
        loop {
            let f = again.next().await.unwrap();
            if f.data["type"] == "session.revision" && f.data["revision"] == 43 {
                break f.id.unwrap();
            }
        }
    };
    let mut resumed = open(
        &s,
        "/v1/sessions/s1/stream",
        &t,
        &[("last-event-id", &watch_id)],
    )
    .await;
    append(&s, &t, "s1", &["x2".into()]).await;
    let next = resumed.events_until(44, 10).await;
    assert_eq!(next.len(), 1, "resumed right after the covered event");
    assert_eq!(next[0]["eventId"], "x2");
    // On the tenant stream too.
    let mut tenant = open(&s, "/v1/events", &t, &[("last-event-id", &watch_id)]).await;
    let got = authority_ids(&frames_until(&mut tenant, "x2", 10).await);
    assert_eq!(got, ["x2"]);
    // A watch id covering more than the session holds comes from another
    // store.
    let ahead = narad_protocol::watch::WatchId {
        type_name: "session.revision".into(),
        session_id: Some("s1".into()),
        scope_id: None,
        revision: 900,
        covers: Some(900),
        txid: None,
    }
    .encode();
    for path in ["/v1/events", "/v1/sessions/s1/stream"] {
        let (code, body) = status(&s, path, &t, &[("last-event-id", &ahead)]).await;
        assert_eq!(
            (code, body["code"].as_str()),
            (409, Some("NRD-0302")),
            "{path}"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_limited_to_sessions_sees_only_those_and_profiles_filter_frames() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    open_session(&s, &t, "s2").await;
    let mut claims = claims("acme", "guest", &[Role::Reader]);
    claims.sessions = Some(vec!["s2".into()]);
    let guest = hs256(&claims);
    let mut all = open(&s, "/v1/events", &guest, &[]).await;
    // Core profile only: no message.* frames, but run lifecycle.
    let mut core = open(&s, "/v1/events?profiles=narad.core/v1", &t, &[]).await;
    append(&s, &t, "s1", &["hidden".into()]).await;
    append(&s, &t, "s2", &["shown".into()]).await;
    s.post("/v1/sessions", &t, &json!({"sessionId": "s3"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-run",
        &t,
        &json!({"sessionId": "s3", "runId": "r3"}),
    )
    .await
    .expect(201);
    let got = frames_until(&mut all, "shown", 10).await;
    let sessions: BTreeSet<&str> = got
        .iter()
        .filter_map(|f| f.data["sessionId"].as_str())
        .collect();
    assert_eq!(
        sessions,
        BTreeSet::from(["s2"]),
        "only the session it may see"
    );
    assert!(got.iter().all(|f| f.data["type"] != "workspace.revision"));
    for path in [
        "/v1/sessions/s1/stream",
        "/v1/sessions/s1/events",
        "/v1/events?sessionId=s1",
    ] {
        let (code, body) = status(&s, path, &guest, &[]).await;
        assert_eq!(
            (code, body["code"].as_str()),
            (403, Some("NRD-0102")),
            "{path}"
        );
    }
    let (code, _) = status(&s, "/v1/sessions/s2/stream", &guest, &[]).await;
    assert_eq!(code, 200);

    // The core-only stream: message deltas and session.created never
    // reach it; run.started (core) does.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let f = tokio::time::timeout_at(deadline, core.next())
            .await
            .expect("run.started arrives")
            .unwrap();
        let ty = f.data["type"].as_str().unwrap().to_owned();
        assert!(!ty.starts_with("message."), "a conversation frame: {ty}");
        assert_ne!(ty, "session.created", "a workspace-profile frame");
        if ty == "run.started" {
            assert_eq!(f.data["runId"], "r3");
            break;
        }
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signed_extensions_read_the_tenant_stream_and_updates_and_archives_are_announced() {
    let s = Server::start().await;
    let admin = token("acme", &Role::ALL);
    open_session(&s, &admin, "s1").await;
    let mut stream = extension_stream(&s, &admin, "watcher").await;
    assert_eq!(
        stream.next().await.unwrap().event.as_deref(),
        Some("capabilities")
    );
    // An update is announced with the entry as it now is; one that
    // changes nothing is not.
    let update =
        json!({"sessionId": "s1", "title": "Release checklist", "metadata": {"team": "platform"}});
    for _ in 0..2 {
        let updated = s
            .post("/v1/commands/update-session", &admin, &update)
            .await
            .expect(200)
            .clone();
        assert_eq!(updated["title"], "Release checklist");
        assert_eq!(updated["metadata"], json!({"team": "platform"}));
    }
    // Neither field: nothing to change.
    let refused = s
        .post(
            "/v1/commands/update-session",
            &admin,
            &json!({"sessionId": "s1"}),
        )
        .await
        .expect(400)
        .clone();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("give at least one"),
        "{refused}"
    );
    s.post(
        "/v1/commands/archive-session",
        &admin,
        &json!({"sessionId": "s1"}),
    )
    .await
    .expect(200);
    // Archiving twice announces once.
    s.post(
        "/v1/commands/archive-session",
        &admin,
        &json!({"sessionId": "s1"}),
    )
    .await
    .expect(200);
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Until the workspace.revision that follows the archive.
    while !seen
        .iter()
        .skip_while(|t: &&String| *t != "session.archived")
        .any(|t| t == "workspace.revision")
    {
        let f = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("the archive is announced")
            .unwrap();
        seen.push(f.data["type"].as_str().unwrap().to_owned());
        if f.data["type"] == "session.archived" {
            assert_eq!(f.data["sessionId"], "s1");
            assert_eq!(f.data["revision"], 2);
        }
        if f.data["type"] == "session.updated" {
            assert_eq!(f.data["sessionId"], "s1");
            assert_eq!(f.data["workspaceId"], "acme");
            assert_eq!(f.data["title"], "Release checklist");
            assert_eq!(f.data["metadata"], json!({"team": "platform"}));
            assert_eq!(f.data["revision"], 2);
        }
    }
    for announced in ["session.updated", "session.archived"] {
        assert_eq!(
            seen.iter().filter(|t| *t == announced).count(),
            1,
            "{announced}: {seen:?}"
        );
    }
    assert!(
        seen.iter().position(|t| t == "session.updated")
            < seen.iter().position(|t| t == "session.archived"),
        "in commit order: {seen:?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_extensions_open_stream_ends_when_it_is_disabled() {
    let s = Server::start().await;
    let admin = token("acme", &Role::ALL);
    open_session(&s, &admin, "s1").await;
    let mut stream = extension_stream(&s, &admin, "tap").await;
    stream.next().await.unwrap();
    // Frames keep coming while the registration is disabled: the check
    // keeps its own schedule.
    let writer = {
        let (base, t) = (s.base.clone(), admin.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            for n in 0..60 {
                let _ = http
                    .post(format!("{base}/v1/sessions/s1/events"))
                    .bearer_auth(&t)
                    .json(&json!({"events": [delta(&format!("x{n}"))]}))
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let disabled = s
        .call(
            reqwest::Method::PATCH,
            "/v1/extensions/acme-tools/tap",
            Some(&admin),
            Some(serde_json::to_vec(&json!({"enabled": false})).unwrap()),
        )
        .await;
    assert_eq!(disabled.expect(200)["enabled"], false);
    let limit = narad_server::routes::sse::EXTENSION_RECHECK + Duration::from_secs(5);
    let ended = tokio::time::timeout(limit, async { while stream.next().await.is_some() {} }).await;
    assert!(
        ended.is_ok(),
        "the stream ended within {limit:?} of the disable"
    );
    writer.abort();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_streams_attaching_during_appends_miss_nothing_and_repeat_nothing() {
    let s = std::sync::Arc::new(Server::start().await);
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    const BATCHES: usize = 100;
    let ids: Vec<Vec<String>> = (0..BATCHES)
        .map(|b| (0..1 + b % 3).map(|k| format!("d{b}-{k}")).collect())
        .collect();
    let last = ids.last().unwrap().last().unwrap().clone();
    let writer = {
        let (s, t, ids) = (s.clone(), t.clone(), ids.clone());
        tokio::spawn(async move {
            for (b, batch) in ids.iter().enumerate() {
                append(&s, &t, "s1", batch).await;
                if b % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    let mut readers = Vec::new();
    for n in 0..6u64 {
        let (s, t, last) = (s.clone(), t.clone(), last.clone());
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(n * 20)).await;
            // Replay after the session's opening, then live, on one
            // connection: the subscription is taken before the replay.
            let mut stream = open(&s, "/v1/events", &t, &[("last-event-id", "start-s1")]).await;
            authority_ids(&frames_until(&mut stream, &last, 60).await)
        }));
    }
    writer.await.unwrap();
    let expected: Vec<String> = ids.into_iter().flatten().collect();
    for r in readers {
        assert_eq!(r.await.unwrap(), expected, "every event once, in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_from_now_leaves_out_what_committed_before_attach_however_late_the_relay_is() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s1").await;
    open_session(&s, &t, "s2").await;
    // A transaction older than the next appends holds the relay back: what
    // commits now is not relayed until it ends.
    let (holder, conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    holder
        .batch_execute("begin; select pg_current_xact_id()")
        .await
        .unwrap();
    append(&s, &t, "s1", &["before-attach".into()]).await;
    let mut stream = open(&s, "/v1/events", &t, &[]).await;
    append(&s, &t, "s2", &["after-attach".into()]).await;
    holder.batch_execute("commit").await.unwrap();
    let got = frames_until(&mut stream, "after-attach", 10).await;
    let ids: Vec<&str> = got.iter().filter_map(|f| f.id.as_deref()).collect();
    assert!(ids.contains(&"after-attach"), "{ids:?}");
    assert!(
        !ids.contains(&"before-attach"),
        "committed before the stream attached: {ids:?}"
    );
    s.stop().await;
}
