//! Erasure and retention: a session erased is gone from every table in
//! one transaction, its streams end, it answers 410, its id and its
//! events' ids stay refused, the tenant stream carries a notice without
//! content; a tenant's erasure works in batches and resumes after a crash;
//! a retention policy lists what it would erase, then erases it.

use std::time::Duration;

use narad_journal::{Journal, TenantId};
use narad_server::auth::Role;
use narad_server::runtime::RuntimeSettings;
use narad_tests::*;
use serde_json::{Value, json};

async fn delete(s: &Server, path: &str, token: &str) -> Answer {
    s.call(reqwest::Method::DELETE, path, Some(token), None)
        .await
}

/// Rows of `session` in every table that holds session content.
async fn rows_left(db: &tokio_postgres::Client, tenant: &str, session: &str) -> Vec<(String, i64)> {
    let mut left = Vec::new();
    for table in [
        "sessions",
        "events",
        "entities",
        "queued_starts",
        "pending_cancellations",
        "run_work",
        "client_calls",
        "executor_pauses",
        "interrupt_deadlines",
        "idempotency_keys",
        "front_end_returns",
    ] {
        let n: i64 = db
            .query_one(
                &format!("select count(*) from {table} where tenant_id = $1 and session_id = $2"),
                &[&tenant, &session],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            left.push((table.to_owned(), n));
        }
    }
    // The outbox keeps only the erasure's own notice.
    let n: i64 = db
        .query_one(
            "select count(*) from outbox where tenant_id = $1 and session_id = $2 \
             and body ->> 'type' is distinct from 'session.erased'",
            &[&tenant, &session],
        )
        .await
        .unwrap()
        .get(0);
    if n > 0 {
        left.push(("outbox".into(), n));
    }
    left
}

/// The sessions `tenant` holds in the database (row-level security aside).
async fn sessions_held(s: &Server, tenant: &str) -> i64 {
    s.admin_db()
        .await
        .query_one(
            "select count(*) from sessions where tenant_id = $1",
            &[&tenant],
        )
        .await
        .unwrap()
        .get(0)
}

/// The sessions a retention preview lists, sorted.
fn due(preview: &Value) -> Vec<&str> {
    let mut due: Vec<&str> = preview["due"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["sessionId"].as_str().unwrap())
        .collect();
    due.sort_unstable();
    due
}

async fn wait_for(what: &str, seconds: u64, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_erased_session_is_gone_everywhere_and_stays_gone() {
    let s = Server::start().await;
    let t = token(
        "acme",
        &[Role::Writer, Role::Backend, Role::Reader, Role::Approver],
    );
    let admin = token("acme", &[Role::Admin, Role::Reader]);
    // A session with a title, a run waiting on an approval with a
    // deadline, and a start queued behind it.
    waiting_on_interrupt(
        &s,
        &t,
        "a",
        json!({"title": "secret plans"}),
        "i1",
        json!({"expiresAt": "2999-01-01T00:00:00Z"}),
    )
    .await;
    s.post_with(
        "/v1/commands/start-run",
        &t,
        &json!({"sessionId": "a", "runId": "r2", "onConflict": "enqueue"}),
        &[("idempotency-key", "start-r2")],
    )
    .await
    .expect(202);
    open_session(&s, &t, "b").await;
    let mut session_stream = s.stream("/v1/sessions/a/stream", &t, &[]).await;
    let mut tenant_stream = s.stream("/v1/events", &t, &[]).await;

    // Who may: admins only, of this organisation, and of this session.
    assert_eq!(delete(&s, "/v1/sessions/a", &t).await.status, 403);
    let limited = hs256(&{
        let mut c = claims("acme", "limited", &[Role::Admin]);
        c.sessions = Some(vec!["b".into()]);
        c
    });
    assert_eq!(delete(&s, "/v1/sessions/a", &limited).await.status, 403);
    let other = token("globex", &[Role::Admin]);
    assert_eq!(delete(&s, "/v1/sessions/a", &other).await.status, 404);

    let stored = whole_history(&s, &t, "a").await.len();
    assert!(stored >= 3, "{stored}");
    // A chat front end reads its active run (a row of front_end_returns).
    let chat = s
        .http
        .get(format!("{}/v1/chat/a/stream", s.base))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    let db = s.admin_db().await;
    assert!(
        rows_left(&db, "acme", "a")
            .await
            .contains(&("front_end_returns".to_owned(), 1))
    );
    let erased = delete(&s, "/v1/sessions/a", &admin).await;
    let erased = erased.expect(200);
    assert_eq!(erased["sessionId"], "a");
    assert_eq!(erased["eventsErased"], stored, "{erased}");

    // Nothing of it is left in any table.
    drop(chat);
    assert_eq!(
        rows_left(&db, "acme", "a").await,
        Vec::<(String, i64)>::new()
    );
    assert!(
        !rows_left(&db, "acme", "b").await.is_empty(),
        "b is untouched"
    );

    // Its stream ends; the tenant stream says so, without content.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while session_stream.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the erased session's stream ends");
    let mut notice = None;
    for _ in 0..50 {
        match tenant_stream.next().await {
            Some(f) if f.event.as_deref() == Some("session-erased") => {
                notice = Some(f.data);
                break;
            }
            Some(_) => {}
            None => break,
        }
    }
    let notice = notice.expect("a session-erased frame on the tenant stream");
    assert_eq!(notice["sessionId"], "a");
    assert_eq!(notice["type"], "session.erased");
    assert!(notice.get("title").is_none() && notice.get("metadata").is_none());

    // Afterwards: 410 wherever it is read, again on a second erasure.
    for path in [
        "/v1/sessions/a",
        "/v1/sessions/a/events",
        "/v1/sessions/a/stream",
        "/v1/sessions/a/documents",
    ] {
        let a = s.get(path, &t).await;
        assert_eq!(a.status, 410, "{path}: {}", a.body);
        assert_eq!(a.body["code"], "NRD-0208", "{path}");
    }
    assert_eq!(delete(&s, "/v1/sessions/a", &admin).await.status, 410);
    // Its id cannot name a new session, nor its events' ids be used again.
    let again = s.post("/v1/sessions", &t, &json!({"sessionId": "a"})).await;
    assert_eq!(again.status, 410, "{}", again.body);
    let replay = s
        .post(
            "/v1/sessions/b/events",
            &t,
            &json!({"events": [delta("i1-q")]}),
        )
        .await;
    assert_eq!(replay.status, 409, "{}", replay.body);
    assert_eq!(replay.body["code"], "NRD-0202");
    let appended = s
        .post(
            "/v1/sessions/a/events",
            &t,
            &json!({"events": [delta("d9")]}),
        )
        .await;
    assert_eq!(appended.status, 410, "{}", appended.body);
    assert_eq!(appended.body["code"], "NRD-0208");

    // The audit log keeps only the erasure itself for this session.
    let log = s.get("/v1/audit?sessionId=a", &admin).await;
    let actions: Vec<Value> = log.expect(200)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].clone())
        .collect();
    assert_eq!(actions, [json!("erase-session"), json!("erase-session")]);
    let scrape = Scrape::of(&s).await;
    assert!(scrape.get("narad_sessions_erased_total{reason=\"request\"}") >= 1.0);
    s.stop().await;
}

#[tokio::test]
async fn a_tenant_is_erased_in_batches_and_resumes_after_a_crash() {
    let s = Server::start().await;
    let operator = token(OPERATOR_ORG, &[Role::Admin]);
    let acme = token("acme", &[Role::Writer, Role::Backend, Role::Reader]);
    let globex = token("globex", &[Role::Writer, Role::Backend, Role::Reader]);
    for i in 0..130 {
        s.post(
            "/v1/sessions",
            &acme,
            &json!({"sessionId": format!("s{i}")}),
        )
        .await
        .expect(201);
    }
    open_session(&s, &acme, "busy").await;
    open_session(&s, &globex, "kept").await;

    // Not anyone may: an organisation's own admin cannot.
    assert_eq!(
        delete(&s, "/v1/admin/tenants/acme", &token("acme", &[Role::Admin]))
            .await
            .status,
        403
    );

    // A crash after one batch: the request is recorded, a batch of 40 is
    // erased, and the process goes away before finishing.
    let journal = Journal::connect(s.db.url(), 2).expect("a journal");
    let org = TenantId::new("acme").unwrap();
    journal
        .request_tenant_erasure(&org, "someone")
        .await
        .unwrap();
    // The server's sweeper may take the request up at once and erase some
    // of the same sessions meanwhile: each is erased by one of them, so
    // this batch erases at most 40 and the total below stays exact.
    let (erased, done) = journal.erase_tenant_batch(&org, 40).await.unwrap();
    assert!(
        (1..=40).contains(&erased) && !done,
        "{erased} erased, done: {done}"
    );

    // The sweeper resumes it and finishes.
    wait_for("the erasure finishes", 30, async || {
        let status = s.get("/v1/admin/tenants/acme/erasure", &operator).await;
        status.expect(200)["state"] == "erased"
    })
    .await;
    let status = s.get("/v1/admin/tenants/acme/erasure", &operator).await;
    // Some by the crashed process, the rest by the sweeper.
    assert_eq!(status.expect(200)["sessionsErased"], 131);
    assert_eq!(sessions_held(&s, "acme").await, 0);
    // Its credentials are refused from then on.
    let listed = s.get("/v1/sessions", &acme).await;
    assert_eq!((listed.status, listed.code()), (410, "NRD-0210"));
    // globex is untouched.
    assert_eq!(s.get("/v1/sessions/kept", &globex).await.status, 200);

    // Asked again through the API: answered at once, finished soon.
    let asked = delete(&s, "/v1/admin/tenants/acme", &operator).await;
    assert_eq!(asked.status, 202, "{}", asked.body);
    assert_eq!(asked.body["state"], "erasing");
    wait_for("the second erasure finishes", 30, async || {
        s.get("/v1/admin/tenants/acme/erasure", &operator)
            .await
            .expect(200)["state"]
            == "erased"
    })
    .await;
    s.stop().await;
}

/// From the moment its erasure is asked for, an organisation writes
/// nothing more and opens no stream, on this replica at once and on the
/// others within the refresh; its erasure finishes while a client keeps
/// creating sessions, and nothing created meanwhile stays.
#[tokio::test]
async fn an_organisation_being_erased_writes_nothing_more() {
    let s = Server::start().await;
    let other = s.replica().await;
    let operator = token(OPERATOR_ORG, &[Role::Admin]);
    let acme = token("acme", &[Role::Writer, Role::Backend, Role::Reader]);
    open_session(&s, &acme, "s0").await;
    let ticket = s
        .post(
            "/v1/stream-tickets",
            &acme,
            &json!({"stream": "session", "sessionId": "s0"}),
        )
        .await
        .expect(201)["url"]
        .as_str()
        .unwrap()
        .to_owned();

    // A client creating sessions as fast as it can, through the other
    // replica, until it is refused.
    let creator = {
        let other_base = other.base.clone();
        let http = other.http.clone();
        let acme = acme.clone();
        tokio::spawn(async move {
            let mut created = 0u32;
            for i in 0.. {
                let answer = Answer::of(
                    http.post(format!("{other_base}/v1/sessions"))
                        .bearer_auth(&acme)
                        .json(&json!({"sessionId": format!("c{i}")}))
                        .send()
                        .await
                        .unwrap(),
                )
                .await;
                match answer.status {
                    201 => created += 1,
                    _ => return (created, answer.status, answer.code().to_owned()),
                }
            }
            unreachable!()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = delete(&s, "/v1/admin/tenants/acme", &operator).await;
    assert_eq!(asked.status, 202, "{}", asked.body);

    // This replica refuses everything of acme at once.
    let created = s
        .post("/v1/sessions", &acme, &json!({"sessionId": "late"}))
        .await;
    assert_eq!(
        (created.status, created.code()),
        (410, "NRD-0210"),
        "{}",
        created.body
    );
    let appended = s
        .post(
            "/v1/sessions/s0/events",
            &acme,
            &json!({"events": [delta("late-delta")]}),
        )
        .await;
    assert_eq!((appended.status, appended.code()), (410, "NRD-0210"));
    let stream = s
        .http
        .get(format!("{}/v1/sessions/s0/stream", s.base))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 410);
    let ticketed = Answer::of(
        s.http
            .get(format!("{}{ticket}", s.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((ticketed.status, ticketed.code()), (410, "NRD-0210"));

    // The other replica within its refresh: the creator is refused.
    let (made, status, code) = tokio::time::timeout(Duration::from_secs(10), creator)
        .await
        .expect("the other replica refuses within its refresh")
        .unwrap();
    assert_eq!((status, code.as_str()), (410, "NRD-0210"));
    assert!(made > 0, "the creator created sessions before the erasure");

    wait_for("the erasure finishes", 30, async || {
        s.get("/v1/admin/tenants/acme/erasure", &operator)
            .await
            .expect(200)["state"]
            == "erased"
    })
    .await;
    assert_eq!(
        sessions_held(&s, "acme").await,
        0,
        "sessions of acme outlived its erasure"
    );
    // And it stays closed: erased is not reopened.
    let after = other
        .post("/v1/sessions", &acme, &json!({"sessionId": "after"}))
        .await;
    assert_eq!((after.status, after.code()), (410, "NRD-0210"));
    other.stop().await;
    s.stop().await;
}

#[tokio::test]
async fn retention_lists_what_is_due_then_erases_it() {
    // This replica's sweeper applies retention once at its start (no
    // policy yet), then not for an hour: the dry run is read undisturbed.
    let s = Server::start_with_runtime(RuntimeSettings {
        sweep_interval: Duration::from_millis(100),
        retention_sweep: Duration::from_secs(3600),
        ..RuntimeSettings::default()
    })
    .await;
    let operator = token(OPERATOR_ORG, &[Role::Admin]);
    let acme = token(
        "acme",
        &[Role::Writer, Role::Backend, Role::Reader, Role::Admin],
    );
    for id in ["archived", "idle", "fresh"] {
        open_session(&s, &acme, id).await;
    }
    s.post(
        "/v1/commands/archive-session",
        &acme,
        &json!({"sessionId": "archived"}),
    )
    .await
    .expect(200);
    let db = s.admin_db().await;
    db.execute(
        "update sessions set archived_at = now() - interval '3 days' \
         where tenant_id = 'acme' and session_id = 'archived'",
        &[],
    )
    .await
    .unwrap();
    db.execute(
        "update events set recorded_at = now() - interval '3 days' \
         where tenant_id = 'acme' and session_id = 'idle'",
        &[],
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // No policy: nothing due.
    let none = s.get("/v1/admin/tenants/acme/retention", &acme).await;
    assert_eq!(none.expect(200)["due"], json!([]));

    // The dry run comes first: a policy of two days previewed before it is
    // set lists what it would erase, and nothing is erased.
    let staged = s
        .get("/v1/admin/tenants/acme/retention?days=2", &acme)
        .await;
    let staged = staged.expect(200).clone();
    assert_eq!(due(&staged), ["archived", "idle"], "{staged}");
    assert_eq!(
        (&staged["retentionDays"], &staged["previewDays"]),
        (&Value::Null, &json!(2))
    );
    let longer = s
        .get("/v1/admin/tenants/acme/retention?days=5", &acme)
        .await;
    assert_eq!(longer.expect(200)["due"], json!([]));
    for bad in ["0", "36501", "x"] {
        let refused = s
            .get(
                &format!("/v1/admin/tenants/acme/retention?days={bad}"),
                &acme,
            )
            .await;
        assert_eq!((refused.status, refused.code()), (400, "NRD-0008"), "{bad}");
        assert!(refused.body["fields"].get("days").is_some(), "{bad}");
    }

    // A policy of two days: the dry run lists the archived and the idle
    // session, and erases nothing.
    let set = s
        .call(
            reqwest::Method::PUT,
            "/v1/admin/tenants/acme/limits",
            Some(&operator),
            Some(serde_json::to_vec(&json!({"retentionDays": 2})).unwrap()),
        )
        .await;
    assert_eq!(set.expect(200)["effective"]["retentionDays"], 2);
    for _ in 0..2 {
        let preview = s.get("/v1/admin/tenants/acme/retention", &acme).await;
        let preview = preview.expect(200).clone();
        assert_eq!(due(&preview), ["archived", "idle"], "{preview}");
        assert_eq!(preview["retentionDays"], 2);
        for id in ["archived", "idle", "fresh"] {
            assert_eq!(
                s.get(&format!("/v1/sessions/{id}"), &acme).await.status,
                200
            );
        }
    }

    // A replica whose sweeper applies retention often erases them.
    let replica = s
        .replica_with_runtime(RuntimeSettings {
            sweep_interval: Duration::from_millis(100),
            retention_sweep: Duration::from_millis(100),
            ..RuntimeSettings::default()
        })
        .await;
    wait_for("retention erases the due sessions", 20, async || {
        s.get("/v1/sessions/archived", &acme).await.status == 410
            && s.get("/v1/sessions/idle", &acme).await.status == 410
    })
    .await;
    assert_eq!(s.get("/v1/sessions/fresh", &acme).await.status, 200);
    let after = s.get("/v1/admin/tenants/acme/retention", &acme).await;
    assert_eq!(after.expect(200)["due"], json!([]));
    let scrape = Scrape::of(&s).await;
    assert!(scrape.get("narad_sessions_erased_total{reason=\"retention\"}") >= 2.0);
    replica.stop().await;
    s.stop().await;
}
