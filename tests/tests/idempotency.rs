//! `Idempotency-Key`: a keyed request sent again gets its first answer
//! again (marked `Idempotent-Replayed: true`) and acts once; a key reused
//! with another request is refused 422 NRD-0211, one in flight 409
//! NRD-0212 with `Retry-After`; keys are the tenant's, erased with their
//! session, counted, and replays are in the audit log. A command whose
//! client chose its object's id (`messageId`, `runId`) is a replay when
//! sent again exactly, key or not.

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn keyed(s: &Server, path: &str, token: &str, body: &Value, key: &str) -> Answer {
    s.post_with(path, token, body, &[("idempotency-key", key)])
        .await
}

async fn count(db: &tokio_postgres::Client, sql: &str, tenant: &str) -> i64 {
    db.query_one(sql, &[&tenant]).await.expect("counts").get(0)
}

/// The events of `session` of type `ty`.
async fn events_of(s: &Server, token: &str, session: &str, ty: &str) -> Vec<Value> {
    whole_history(s, token, session)
        .await
        .into_iter()
        .filter(|e| e["type"] == ty)
        .collect()
}

#[tokio::test]
async fn a_command_sent_again_with_its_key_answers_the_first_answer_and_acts_once() {
    let s = Server::start().await;
    let t = token("acme", &[Role::Reader, Role::Writer]);
    let created = keyed(&s, "/v1/sessions", &t, &json!({"title": "t"}), "k-session").await;
    let again = keyed(&s, "/v1/sessions", &t, &json!({"title": "t"}), "k-session").await;
    assert_eq!(created.status, 201);
    assert!(!created.replayed);
    assert_eq!((again.status, again.replayed), (201, true));
    assert_eq!(
        again.body, created.body,
        "the same session, not a second one"
    );
    let session = created.body["sessionId"].as_str().unwrap().to_owned();
    let listed = s.get("/v1/sessions", &t).await;
    assert_eq!(listed.expect(200)["sessions"].as_array().unwrap().len(), 1);

    let say = json!({"sessionId": session, "messageScope": "session", "content": "hi"});
    let first = keyed(&s, "/v1/commands/record-user-message", &t, &say, "k-say").await;
    let second = keyed(&s, "/v1/commands/record-user-message", &t, &say, "k-say").await;
    first.expect(201);
    assert!(second.replayed);
    assert_eq!(second.body, first.body);
    assert_eq!(
        events_of(&s, &t, &session, "message.user.recorded")
            .await
            .len(),
        1,
        "recorded once"
    );

    // start-run with onConflict enqueue while a run holds the slot: one
    // queued start, however often it is sent.
    let start = json!({"sessionId": session});
    keyed(&s, "/v1/commands/start-run", &t, &start, "k-run-1")
        .await
        .expect(201);
    let queued = json!({"sessionId": session, "onConflict": "enqueue"});
    let q1 = keyed(&s, "/v1/commands/start-run", &t, &queued, "k-run-2").await;
    let q2 = keyed(&s, "/v1/commands/start-run", &t, &queued, "k-run-2").await;
    q1.expect(202);
    assert_eq!((q2.status, q2.replayed), (202, true));
    assert_eq!(q2.body, q1.body);
    let waiting = s
        .get(&format!("/v1/sessions/{session}/queued-starts"), &t)
        .await;
    assert_eq!(
        waiting.expect(200)["queuedStarts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Without a key, the same command acts again: the key is what makes
    // it safe.
    s.post("/v1/commands/record-user-message", &t, &say)
        .await
        .expect(201);
    assert_eq!(
        events_of(&s, &t, &session, "message.user.recorded")
            .await
            .len(),
        2
    );
}

#[tokio::test]
async fn a_refusal_is_kept_and_replayed_too_but_not_a_failure_of_the_server() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let resolve = json!({"interruptId": "nope", "decision": "approve"});
    let first = keyed(&s, "/v1/commands/resolve-interrupt", &t, &resolve, "k-404").await;
    let again = keyed(&s, "/v1/commands/resolve-interrupt", &t, &resolve, "k-404").await;
    assert_eq!((first.status, first.code()), (404, "NRD-0007"));
    assert_eq!((again.status, again.replayed), (404, true));
    assert_eq!(again.body, first.body);
}

#[tokio::test]
async fn a_key_sent_with_another_request_is_refused_and_nothing_is_done() {
    let s = Server::start().await;
    let ada = token("acme", &[Role::Reader, Role::Writer]);
    let bob = hs256(&claims("acme", "bob", &[Role::Reader, Role::Writer]));
    let other_org = token("globex", &[Role::Reader, Role::Writer]);
    keyed(&s, "/v1/sessions", &ada, &json!({"sessionId": "s-1"}), "k")
        .await
        .expect(201);
    // Another body, another route, another person of the organisation.
    for (path, tok, body) in [
        ("/v1/sessions", &ada, json!({"sessionId": "s-2"})),
        (
            "/v1/commands/create-session",
            &ada,
            json!({"sessionId": "s-1"}),
        ),
        ("/v1/sessions", &bob, json!({"sessionId": "s-1"})),
    ] {
        let refused = keyed(&s, path, tok, &body, "k").await;
        assert_eq!(
            (refused.status, refused.code()),
            (422, "NRD-0211"),
            "{path}"
        );
        assert!(refused.body["fields"]["Idempotency-Key"].is_string());
    }
    let db = s.admin_db().await;
    assert_eq!(
        count(
            &db,
            "select count(*) from sessions where tenant_id = $1",
            "acme"
        )
        .await,
        1,
        "nothing done for a reused key"
    );
    // Keys are an organisation's own: the same key elsewhere is new.
    keyed(
        &s,
        "/v1/sessions",
        &other_org,
        &json!({"sessionId": "s-1"}),
        "k",
    )
    .await
    .expect(201);
}

#[tokio::test]
async fn a_malformed_key_is_refused_with_its_field() {
    let s = Server::start().await;
    let t = token("acme", &[Role::Reader, Role::Writer]);
    for key in ["", "\" \"", "a b", &"k".repeat(256), "tab\tkey"] {
        let refused = keyed(&s, "/v1/sessions", &t, &json!({}), key).await;
        assert_eq!(
            (refused.status, refused.code()),
            (400, "NRD-0008"),
            "{key:?}"
        );
        assert!(refused.body["fields"]["Idempotency-Key"].is_string());
    }
    // The draft's quoted form names the same key as the bare one.
    let quoted = keyed(&s, "/v1/sessions", &t, &json!({}), "\"k-1\"").await;
    let bare = keyed(&s, "/v1/sessions", &t, &json!({}), "k-1").await;
    quoted.expect(201);
    assert!(bare.replayed);
    assert_eq!(bare.body, quoted.body);
}

#[tokio::test]
async fn a_repeat_while_the_first_runs_is_refused_409_with_retry_after_then_replayed() {
    let s = Server::start_with_blobs(
        BlobBackend::Postgres,
        narad_server::runtime::RuntimeSettings::default(),
        narad_server::quotas::LimitValues::default(),
    )
    .await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s-1").await;
    let path = "/v1/sessions/s-1/blobs?name=slow.bin";
    // The first upload sends half its bytes, by hand, and waits.
    let mut first = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .expect("connects");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: narad\r\nAuthorization: Bearer {t}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 8\r\n\
         Idempotency-Key: k-upload\r\nConnection: close\r\n\r\n1234"
    );
    first.write_all(head.as_bytes()).await.unwrap();
    // The first holds the key: wait until it is in flight.
    let db = s.admin_db().await;
    for _ in 0..100 {
        if count(
            &db,
            "select count(*) from idempotency_keys where tenant_id = $1",
            "acme",
        )
        .await
            == 1
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let url = format!("{}{path}", s.base);
    let repeat = || {
        s.http
            .post(&url)
            .bearer_auth(&t)
            .header("content-type", "application/octet-stream")
            .header("idempotency-key", "k-upload")
            .body(b"12345678".to_vec())
            .send()
    };
    let busy = Answer::of(repeat().await.unwrap()).await;
    assert_eq!((busy.status, busy.code()), (409, "NRD-0212"));
    assert!(busy.retry_after.is_some_and(|s| s >= 1));
    first.write_all(b"5678").await.unwrap();
    let mut raw = Vec::new();
    first.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 201"), "{raw}");
    let first: Value = serde_json::from_str(raw.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let replayed = Answer::of(repeat().await.unwrap()).await;
    assert_eq!((replayed.status, replayed.replayed), (201, true));
    assert_eq!(replayed.body, first, "the same blob");
    assert_eq!(
        count(
            &db,
            "select count(*) from blobs where tenant_id = $1",
            "acme"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn keys_go_with_their_session_and_expire() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s-1").await;
    open_session(&s, &t, "s-2").await;
    for (session, key) in [("s-1", "k-1"), ("s-2", "k-2")] {
        keyed(
            &s,
            "/v1/commands/record-user-message",
            &t,
            &json!({"sessionId": session, "messageScope": "session", "content": "hi"}),
            key,
        )
        .await
        .expect(201);
    }
    let db = s.admin_db().await;
    let keys = "select count(*) from idempotency_keys where tenant_id = $1";
    assert_eq!(count(&db, keys, "acme").await, 2);
    s.call(reqwest::Method::DELETE, "/v1/sessions/s-1", Some(&t), None)
        .await
        .expect(200);
    let left: Vec<String> = db
        .query(
            "select key from idempotency_keys where tenant_id = 'acme'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["k-2"], "the erased session's key went with it");
    // An expired key is forgotten, and the request runs again.
    db.execute(
        "update idempotency_keys set expires_at = now() - interval '1 second'",
        &[],
    )
    .await
    .unwrap();
    let said = json!({"sessionId": "s-2", "messageScope": "session", "content": "hi"});
    let again = keyed(&s, "/v1/commands/record-user-message", &t, &said, "k-2").await;
    assert_eq!((again.status, again.replayed), (201, false));
    db.execute(
        "update idempotency_keys set expires_at = now() - interval '1 second'",
        &[],
    )
    .await
    .unwrap();
    let journal = narad_journal::Journal::connect(s.db.url(), 1).expect("a journal");
    assert_eq!(journal.forget_idempotency_keys(100).await.unwrap(), 1);
    assert_eq!(count(&db, keys, "acme").await, 0);
}

#[tokio::test]
async fn replays_are_in_the_audit_log_and_counted() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "s-1").await;
    let before = Scrape::of(&s).await;
    let say = json!({"sessionId": "s-1", "messageScope": "session", "content": "hi"});
    let first = keyed(&s, "/v1/commands/record-user-message", &t, &say, "k").await;
    keyed(&s, "/v1/commands/record-user-message", &t, &say, "k").await;
    keyed(&s, "/v1/commands/record-user-message", &t, &json!({}), "k").await;
    let log = s
        .get("/v1/audit?action=record-user-message", &t)
        .await
        .expect(200)["entries"]
        .clone();
    let entries: Vec<(u64, bool, Value)> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["status"].as_u64().unwrap(),
                e["replayed"].as_bool().unwrap(),
                e["eventIds"].clone(),
            )
        })
        .collect();
    let appended = json!([first.body["appended"]["events"][0]["eventId"]]);
    assert_eq!(
        entries,
        [(201, false, appended.clone()), (201, true, appended)],
        "the first, then its replay naming the events the first appended; a reused key is no action"
    );
    let after = Scrape::of(&s).await;
    for (outcome, n) in [("first", 1.0), ("replayed", 1.0), ("reused", 1.0)] {
        let series = format!("narad_idempotency_keys_total{{outcome=\"{outcome}\"}}");
        assert_eq!(after.get(&series) - before.get(&series), n, "{series}");
    }
}

#[tokio::test]
async fn a_command_naming_its_own_ids_sent_again_exactly_is_a_replay_without_a_key() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    s.post("/v1/sessions", &t, &json!({"sessionId": "s-1"}))
        .await
        .expect(201);
    let say =
        json!({"sessionId": "s-1", "messageScope": "session", "messageId": "m-1", "content": "hi"});
    let first = s.post("/v1/commands/record-user-message", &t, &say).await;
    let again = s.post("/v1/commands/record-user-message", &t, &say).await;
    first.expect(201);
    again.expect(201);
    assert_eq!(
        again.body["appended"]["events"][0]["sessionSequence"],
        first.body["appended"]["events"][0]["sessionSequence"]
    );
    assert_eq!(
        events_of(&s, &t, "s-1", "message.user.recorded")
            .await
            .len(),
        1
    );
    // The same id with another content is a conflict, not a replay.
    let other = json!({"sessionId": "s-1", "messageScope": "session", "messageId": "m-1", "content": "bye"});
    let refused = s.post("/v1/commands/record-user-message", &t, &other).await;
    assert_eq!((refused.status, refused.code()), (409, "NRD-0202"));

    let start = json!({"sessionId": "s-1", "runId": "r-1", "input": {"q": 1}});
    s.post("/v1/commands/start-run", &t, &start)
        .await
        .expect(201);
    let again = s.post("/v1/commands/start-run", &t, &start).await;
    again.expect(201);
    assert_eq!(events_of(&s, &t, "s-1", "run.started").await.len(), 1);
    // Queued behind r-1: the same start is the same queued start.
    let queued = json!({"sessionId": "s-1", "runId": "r-2", "onConflict": "enqueue"});
    let q1 = s.post("/v1/commands/start-run", &t, &queued).await;
    let q2 = s.post("/v1/commands/start-run", &t, &queued).await;
    assert_eq!(q1.expect(202)["queueId"], q2.expect(202)["queueId"]);
    let waiting = s.get("/v1/sessions/s-1/queued-starts", &t).await;
    assert_eq!(
        waiting.expect(200)["queuedStarts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}
