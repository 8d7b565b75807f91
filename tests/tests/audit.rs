//! The audit log (`GET /v1/audit`, role `admin`): every command and admin
//! action with its actor, request id, outcome and the eventIds appended;
//! filters and pages; another tenant's log is out of reach.

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

fn ids(events: &Value) -> Vec<String> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["eventId"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn every_command_and_admin_action_is_recorded_with_its_outcome() {
    let s = Server::start().await;
    let admin = hs256(&claims("acme", "ada", &Role::ALL));
    let writer = hs256(&claims("acme", "wes", &[Role::Reader, Role::Writer]));

    s.post("/v1/sessions", &writer, &json!({"sessionId": "s-1"}))
        .await
        .expect(201);
    let said = s
        .post_with(
            "/v1/commands/record-user-message",
            &writer,
            &json!({"sessionId": "s-1", "messageScope": "session", "content": "hello"}),
            &[("x-request-id", "req-said-1")],
        )
        .await;
    let said_ids = ids(&said.expect(201)["appended"]["events"]);
    let started = s
        .post(
            "/v1/commands/start-run",
            &writer,
            &json!({"sessionId": "s-1", "runId": "r-1"}),
        )
        .await;
    let started_ids = ids(&started.expect(201)["appended"]["events"]);
    // Refused: no such interrupt; a body that is no command; no role.
    s.post(
        "/v1/commands/resolve-interrupt",
        &admin,
        &json!({"interruptId": "nope", "decision": "approve"}),
    )
    .await
    .expect(404);
    s.post("/v1/commands/stop-run", &writer, &json!({"runId": 7}))
        .await
        .expect(400);
    s.post(
        "/v1/commands/resolve-interrupt",
        &writer,
        &json!({"sessionId": "s-1", "interruptId": "i", "decision": "approve"}),
    )
    .await
    .expect(403);
    s.post(
        "/v1/extensions",
        &admin,
        &json!({"publisher": "acme", "name": "audit"}),
    )
    .await
    .expect(201);

    let log = s.get("/v1/audit", &admin).await;
    let entries = log.expect(200)["entries"].as_array().unwrap().clone();
    let summary: Vec<(String, u64, Option<String>, Option<String>)> = entries
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["status"].as_u64().unwrap(),
                e["code"].as_str().map(str::to_owned),
                e["sessionId"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let s1 = Some("s-1".to_owned());
    assert_eq!(
        summary,
        [
            ("create-session".to_owned(), 201, None, s1.clone()),
            ("record-user-message".to_owned(), 201, None, s1.clone()),
            ("start-run".to_owned(), 201, None, s1.clone()),
            (
                "resolve-interrupt".to_owned(),
                404,
                Some("NRD-0007".to_owned()),
                None
            ),
            (
                "stop-run".to_owned(),
                400,
                Some("NRD-0003".to_owned()),
                None
            ),
            (
                "resolve-interrupt".to_owned(),
                403,
                Some("NRD-0102".to_owned()),
                s1.clone()
            ),
            ("register-extension".to_owned(), 201, None, None),
        ]
    );
    assert_eq!(entries[1]["requestId"], "req-said-1");
    assert!(
        entries[0]["requestId"]
            .as_str()
            .is_some_and(|r| !r.is_empty())
    );
    assert_eq!(entries[1]["eventIds"], json!(said_ids));
    assert_eq!(entries[2]["eventIds"], json!(started_ids));
    assert_eq!(entries[3]["eventIds"], json!([]));
    assert_eq!(entries[1]["actor"], json!({"kind": "user", "sub": "wes"}));
    assert_eq!(entries[6]["actor"], json!({"kind": "user", "sub": "ada"}));
    let positions: Vec<i64> = entries
        .iter()
        .map(|e| e["position"].as_i64().unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
}

#[tokio::test]
async fn the_log_filters_pages_and_stays_within_its_tenant() {
    let s = Server::start().await;
    let admin = hs256(&claims("acme", "ada", &Role::ALL));
    let writer = hs256(&claims("acme", "wes", &[Role::Reader, Role::Writer]));
    for session in ["a", "b"] {
        s.post("/v1/sessions", &writer, &json!({"sessionId": session}))
            .await
            .expect(201);
        for i in 0..3 {
            s.post(
                "/v1/commands/record-user-message",
                &admin,
                &json!({"sessionId": session, "messageScope": "session", "content": format!("m{i}")}),
            )
            .await
            .expect(201);
        }
    }
    let count = |page: &Value| page["entries"].as_array().unwrap().len();
    let only_a = s.get("/v1/audit?sessionId=a", &admin).await;
    assert_eq!(count(only_a.expect(200)), 4);
    let by_wes = s.get("/v1/audit?sub=wes", &admin).await;
    assert_eq!(count(by_wes.expect(200)), 2);
    let said = s
        .get("/v1/audit?action=record-user-message&sessionId=b", &admin)
        .await;
    assert_eq!(count(said.expect(200)), 3);
    let future = s.get("/v1/audit?since=2999-01-01T00:00:00Z", &admin).await;
    assert_eq!(count(future.expect(200)), 0);
    let past = s.get("/v1/audit?until=2000-01-01T00:00:00Z", &admin).await;
    assert_eq!(count(past.expect(200)), 0);
    // Any time RFC 3339 can write, however Postgres would read its text.
    let ever = s.get("/v1/audit?since=0000-01-01T00:00:00Z", &admin).await;
    assert_eq!(count(ever.expect(200)), 8);
    let lower = s
        .get("/v1/audit?until=2999-01-01t00:00:00%2B23:59", &admin)
        .await;
    assert_eq!(count(lower.expect(200)), 8);

    // Pages of 3: every entry once, in order.
    let mut seen = Vec::new();
    let mut path = "/v1/audit?limit=3".to_owned();
    loop {
        let answer = s.get(&path, &admin).await;
        let page = answer.expect(200);
        seen.extend(
            page["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["position"].as_i64().unwrap()),
        );
        match page["nextAfter"].as_str() {
            Some(after) => path = format!("/v1/audit?limit=3&after={after}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 8);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));

    // Bad parameters are refused with the field named.
    for bad in [
        "since=yesterday",
        "after=x",
        "limit=0",
        "limit=1001",
        "sessionid=a",
    ] {
        let answer = s.get(&format!("/v1/audit?{bad}"), &admin).await;
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
        assert_eq!(answer.body["code"], "NRD-0008", "{bad}");
    }
    // Not an admin: refused. Another tenant: its own (empty) log.
    assert_eq!(s.get("/v1/audit", &writer).await.status, 403);
    let other = hs256(&claims("globex", "gus", &Role::ALL));
    let theirs = s.get("/v1/audit", &other).await;
    assert_eq!(count(theirs.expect(200)), 0);
}
