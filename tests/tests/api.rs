//! The HTTP API end to end: sessions, commands, backend appends, history,
//! capabilities, health, errors, and the OpenAPI document.

use std::collections::BTreeSet;

use narad_server::auth::Role;
use narad_tests::run_event as event;
use narad_tests::*;
use reqwest::Method;
use serde_json::json;

fn all_roles(org: &str) -> String {
    token(org, &Role::ALL)
}

#[tokio::test]
async fn a_whole_session_over_http() {
    let s = Server::start().await;
    let t = all_roles("acme");
    let created = s
        .post(
            "/v1/sessions",
            &t,
            &json!({"sessionId": "s1", "title": "demo"}),
        )
        .await;
    assert_eq!(created.expect(201)["sessionSequence"], 0);
    assert!(created.request_id.is_some());
    s.post("/v1/sessions", &t, &json!({"sessionId": "s1"}))
        .await
        .expect(409);

    // A person starts a run; the runtime streams an answer.
    let started = s
        .post(
            "/v1/commands/start-run",
            &t,
            &json!({"sessionId": "s1", "runId": "r1"}),
        )
        .await;
    assert_eq!(
        started.expect(201)["appended"]["events"][0]["sessionSequence"],
        1
    );
    let batch = json!({"events": [
        event("e2", "message.text.started", "r1", json!({"messageId": "m1", "role": "assistant", "messageScope": "run"})),
        event("e3", "message.text.delta", "r1", json!({"messageId": "m1", "delta": "Hello"})),
        event("e4", "message.text.completed", "r1", json!({"messageId": "m1"})),
    ]});
    let appended = s.post("/v1/sessions/s1/events", &t, &batch).await;
    let sequences: Vec<u64> = appended.expect(201)["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["sessionSequence"].as_u64().unwrap())
        .collect();
    assert_eq!(sequences, [2, 3, 4]);
    // A retry is idempotent; a reused id with another body conflicts.
    let retried = s.post("/v1/sessions/s1/events", &t, &batch).await;
    assert_eq!(retried.expect(200)["duplicate"], true);
    let reused = s
        .post(
            "/v1/sessions/s1/events",
            &t,
            &json!({"events": [event("e3", "message.text.delta", "r1", json!({"messageId": "m1", "delta": "Bye"}))]}),
        )
        .await;
    reused.expect(409);
    assert_eq!(reused.code(), "NRD-0202");

    // A batch breaking a rule names it, and writes nothing.
    let refused = s
        .post(
            "/v1/sessions/s1/events",
            &t,
            &json!({"events": [
                event("e5", "message.text.started", "r1", json!({"messageId": "m2", "role": "assistant", "messageScope": "run"})),
                event("e6", "message.text.delta", "r1", json!({"messageId": "never-started", "delta": "x"})),
            ]}),
        )
        .await;
    refused.expect(409);
    assert_eq!(refused.code(), "NRD-0201");
    assert!(refused.body["rule"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(refused.body["fields"]["/events/1"].is_string());

    // Optimistic concurrency.
    let stale = s
        .post(
            "/v1/sessions/s1/events",
            &t,
            &json!({"expectedSessionSequence": 3, "events": [event("e7", "run.finished", "r1", json!({}))]}),
        )
        .await;
    assert_eq!(stale.code(), "NRD-0203");
    s.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"expectedSessionSequence": 4, "events": [event("e7", "run.finished", "r1", json!({}))]}),
    )
    .await
    .expect(201);

    // History, paged and filtered.
    let page = s.get("/v1/sessions/s1/events?limit=2", &t).await;
    let page = page.expect(200);
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
    assert_eq!(page["nextSessionSequence"], 2);
    let rest = s
        .get("/v1/sessions/s1/events?afterSessionSequence=2", &t)
        .await;
    let types: Vec<&str> = rest.expect(200)["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "message.text.delta",
            "message.text.completed",
            "run.finished"
        ]
    );
    let by_run = s
        .get("/v1/sessions/s1/events?rootRunId=r1&afterSequence=4", &t)
        .await;
    assert_eq!(by_run.expect(200)["events"][0]["eventId"], "e7");
    let conflict = s
        .get(
            "/v1/sessions/s1/events?afterSessionSequence=1&rootRunId=r1&afterSequence=4",
            &t,
        )
        .await;
    conflict.expect(400);
    assert_eq!(conflict.code(), "NRD-0301");
    let misspelt = s.get("/v1/sessions/s1/events?afterSessionSeq=1", &t).await;
    assert_eq!(misspelt.code(), "NRD-0008");
    assert!(misspelt.body["fields"]["afterSessionSeq"].is_string());
    let bad_number = s.get("/v1/sessions/s1/events?limit=ten", &t).await;
    assert_eq!(bad_number.code(), "NRD-0008");
    let too_many = s.get("/v1/sessions/s1/events?limit=5000", &t).await;
    assert_eq!(too_many.code(), "NRD-0008");

    // Capabilities and the session record.
    let caps = s.get("/v1/capabilities?sessionId=s1", &t).await;
    let caps = caps.expect(200);
    assert_eq!(caps["type"], "capabilities");
    assert_eq!(caps["protocolVersion"], "narad/v1");
    assert_eq!(caps["currentSessionSequence"], 5);
    assert!(caps.get("activeExecution").is_none(), "the run ended");
    assert_eq!(caps["activeProfiles"][0], "narad.core/v1");
    assert_eq!(caps["history"]["maxPageSize"], 1000);
    let session = s.get("/v1/sessions/s1", &t).await;
    assert_eq!(session.expect(200)["sessionSequence"], 5);
    s.stop().await;
}

#[tokio::test]
async fn every_command_over_http() {
    let s = Server::start().await;
    let t = all_roles("acme");
    let cmd = |name: &str| format!("/v1/commands/{name}");
    s.post(&cmd("create-session"), &t, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    s.post(
        &cmd("start-run"),
        &t,
        &json!({"sessionId": "s1", "runId": "r1"}),
    )
    .await
    .expect(201);
    // The slot is taken: reject names the active execution; enqueue waits.
    let busy = s
        .post(
            &cmd("start-run"),
            &t,
            &json!({"sessionId": "s1", "runId": "r2"}),
        )
        .await;
    busy.expect(409);
    assert_eq!(busy.code(), "NRD-0204");
    assert_eq!(busy.body["details"]["activeExecution"]["runId"], "r1");
    let queued = s
        .post(
            &cmd("start-run"),
            &t,
            &json!({"sessionId": "s1", "runId": "r2", "onConflict": "enqueue"}),
        )
        .await;
    let queue_id = queued.expect(202)["queueId"].as_str().unwrap().to_owned();
    let listed = s.get("/v1/sessions/s1/queued-starts", &t).await;
    assert_eq!(listed.expect(200)["queuedStarts"][0]["queueId"], queue_id);
    let withdraw = s
        .call(
            Method::DELETE,
            &format!("/v1/sessions/s1/queued-starts/{queue_id}"),
            Some(&t),
            None,
        )
        .await;
    withdraw.expect(204);
    let again = s
        .call(
            Method::DELETE,
            &format!("/v1/sessions/s1/queued-starts/{queue_id}"),
            Some(&t),
            None,
        )
        .await;
    again.expect(404);

    // A person speaks; the runtime asks for approval; a person decides.
    let said = s
        .post(
            &cmd("record-user-message"),
            &t,
            &json!({"sessionId": "s1", "messageScope": "session", "content": "hi"}),
        )
        .await;
    let message_id = said.expect(201)["messageId"].as_str().unwrap().to_owned();
    s.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [
            event("i-req", "interrupt.requested", "r1", json!({"interruptId": "i1", "waitId": "w1", "kind": "tool.approval", "actions": ["approve", "deny"]})),
            event("p1", "run.paused", "r1", json!({"waitId": "w1", "reason": "interrupt", "resumeMode": "command", "interruptId": "i1"})),
        ]}),
    )
    .await
    .expect(201);
    let resolved = s
        .post(
            "/api/narad/v1/commands/resolve-interrupt",
            &t,
            &json!({"interruptId": "i1", "decision": "approve"}),
        )
        .await;
    assert_eq!(resolved.expect(200)["sessionId"], "s1");
    let twice = s
        .post(
            &cmd("resolve-interrupt"),
            &t,
            &json!({"interruptId": "i1", "decision": "deny"}),
        )
        .await;
    twice.expect(409);
    assert_eq!(twice.code(), "NRD-0205");
    assert_eq!(twice.body["details"]["decision"], "approve");

    s.post(&cmd("redact-message"), &t, &json!({"sessionId": "s1", "messageId": message_id, "reason": "privacy", "displayReplacement": null}))
        .await
        .expect(200);
    let stopped = s
        .post(
            &cmd("stop-run"),
            &t,
            &json!({"runId": "r1", "reason": "user"}),
        )
        .await;
    assert_eq!(stopped.expect(200)["sessionId"], "s1");
    s.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [
            event("res", "run.resumed", "r1", json!({"waitId": "w1"})),
            event("end", "run.cancelled", "r1", json!({"code": "user.stop"})),
        ]}),
    )
    .await
    .expect(201);

    // Workflows.
    let wf = s
        .post(
            &cmd("start-workflow"),
            &t,
            &json!({"sessionId": "s1", "workflowId": "w1"}),
        )
        .await;
    assert_eq!(wf.expect(201)["workflowId"], "w1");
    let cancelled = s
        .post(&cmd("cancel-workflow"), &t, &json!({"workflowId": "w1"}))
        .await;
    assert!(cancelled.expect(200)["cancelled"].is_object());

    let archived = s
        .post(&cmd("archive-session"), &t, &json!({"sessionId": "s1"}))
        .await;
    assert!(archived.expect(200)["archivedAt"].is_string());

    // Bodies: unknown command, unknown field, wrong type.
    let unknown = s.post(&cmd("start-runn"), &t, &json!({})).await;
    unknown.expect(404);
    assert!(
        unknown.body["message"]
            .as_str()
            .unwrap()
            .contains("start-run")
    );
    let typo = s
        .post(
            &cmd("start-run"),
            &t,
            &json!({"sessionId": "s1", "onConflit": "enqueue"}),
        )
        .await;
    typo.expect(400);
    let wrong = s.post(&cmd("stop-run"), &t, &json!({"runId": 7})).await;
    wrong.expect(400);
    assert!(
        wrong.body["fields"]["/runId"].is_string(),
        "{:#}",
        wrong.body
    );
    s.stop().await;
}

#[tokio::test]
async fn bodies_that_cannot_be_read_get_clear_errors() {
    let s = Server::start().await;
    let t = all_roles("acme");
    let malformed = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(&t),
            Some(b"{\"sessionId\": ".to_vec()),
        )
        .await;
    malformed.expect(400);
    assert_eq!(malformed.code(), "NRD-0002");
    assert!(
        malformed.body["message"]
            .as_str()
            .unwrap()
            .contains("line 1")
    );
    let empty = s
        .call(Method::POST, "/v1/sessions", Some(&t), Some(Vec::new()))
        .await;
    assert_eq!(empty.code(), "NRD-0002");
    let huge = vec![b' '; MAX_BODY + 1];
    let too_large = s
        .call(Method::POST, "/v1/sessions", Some(&t), Some(huge))
        .await;
    too_large.expect(413);
    assert_eq!(too_large.code(), "NRD-0006");
    let not_events = s
        .post("/v1/sessions/s1/events", &t, &json!({"event": []}))
        .await;
    not_events.expect(400);
    let no_route = s.get("/v1/nothing-here", &t).await;
    no_route.expect(404);
    assert_eq!(no_route.code(), "NRD-0007");
    let internal = s.call(Method::GET, "/healthz", None, None).await;
    internal.expect(200);
    s.stop().await;
}

#[tokio::test]
async fn health_and_readiness() {
    let s = Server::start().await;
    let health = s.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.expect(200)["status"], "ok");
    let ready = s.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.expect(200)["status"], "ready");
    // Remove a migration's record: the server is no longer ready.
    let (admin, conn) = tokio_postgres_connect(s.db.url()).await;
    admin
        .batch_execute("delete from _sqlx_migrations where version = (select max(version) from _sqlx_migrations)")
        .await
        .unwrap();
    drop(conn);
    let unready = s.call(Method::GET, "/readyz", None, None).await;
    unready.expect(503);
    s.stop().await;
}

async fn tokio_postgres_connect(
    url: &str,
) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client, task)
}

/// Every route the API must have, as (method, path) with path parameters.
const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/sessions"),
    ("get", "/v1/sessions"),
    ("get", "/v1/sessions/{sessionId}"),
    ("get", "/v1/sessions/{sessionId}/documents"),
    ("get", "/v1/interrupts"),
    ("get", "/v1/operations"),
    ("get", "/v1/audit"),
    ("get", "/v1/search"),
    ("get", "/v1/usage"),
    ("get", "/v1/admin/tenants/{org}/limits"),
    ("put", "/v1/admin/tenants/{org}/limits"),
    ("delete", "/v1/admin/tenants/{org}"),
    ("get", "/v1/admin/tenants/{org}/erasure"),
    ("get", "/v1/admin/tenants/{org}/retention"),
    ("delete", "/v1/sessions/{sessionId}"),
    ("post", "/v1/sessions/{sessionId}/blobs"),
    ("get", "/v1/blobs/{blobId}"),
    ("patch", "/v1/blobs/{blobId}"),
    ("get", "/v1/blobs/{blobId}/upload"),
    ("get", "/v1/sessions/{sessionId}/queued-starts"),
    ("delete", "/v1/sessions/{sessionId}/queued-starts/{queueId}"),
    ("post", "/v1/commands/create-session"),
    ("post", "/v1/commands/start-run"),
    ("post", "/v1/commands/stop-run"),
    ("post", "/v1/commands/resolve-interrupt"),
    ("post", "/v1/commands/record-user-message"),
    ("post", "/v1/commands/start-workflow"),
    ("post", "/v1/commands/cancel-workflow"),
    ("post", "/v1/commands/redact-message"),
    ("post", "/v1/commands/update-session"),
    ("post", "/v1/commands/archive-session"),
    ("post", "/api/narad/v1/commands/resolve-interrupt"),
    ("post", "/v1/sessions/{sessionId}/events"),
    ("get", "/v1/sessions/{sessionId}/events"),
    ("get", "/v1/sessions/{sessionId}/stream"),
    ("post", "/v1/stream-tickets"),
    ("get", "/v1/events"),
    ("post", "/v1/extensions"),
    ("get", "/v1/extensions"),
    ("patch", "/v1/extensions/{publisher}/{name}"),
    ("get", "/v1/capabilities"),
    ("post", "/v1/ag-ui"),
    ("post", "/v1/chat"),
    ("get", "/v1/chat/{sessionId}/stream"),
    ("get", "/v1/executors/{clientExecutorId}/connect"),
    ("post", "/v1/executors/{clientExecutorId}/attach"),
    ("post", "/v1/executors/{clientExecutorId}/heartbeat"),
    ("post", "/v1/executors/{clientExecutorId}/finish"),
    ("get", "/v1/executors/{clientExecutorId}/controls"),
    ("post", "/v1/runtime/claims"),
    ("post", "/v1/runtime/leases/{leaseId}/heartbeat"),
    ("post", "/v1/runtime/leases/{leaseId}/release"),
    ("get", "/v1/runtime/leases/{leaseId}/controls"),
    ("get", "/healthz"),
    ("get", "/metrics"),
    ("get", "/readyz"),
    ("get", "/openapi.json"),
];

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_routes_that_answer() {
    let s = Server::start().await;
    let doc = s.call(Method::GET, "/openapi.json", None, None).await;
    let doc = doc.expect(200).clone();
    assert_eq!(doc["openapi"], "3.1.0");
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|m| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()))
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, expected, "documented routes");

    // Each documented route exists: it answers, and not with the
    // fallback's "no route here".
    let t = all_roles("acme");
    for (method, path) in &expected {
        let concrete = path
            .replace("{sessionId}", "s-none")
            .replace("{queueId}", "q-none")
            .replace("{clientExecutorId}", "x-none")
            .replace("{blobId}", "b-none")
            .replace("{publisher}", "p")
            .replace("{name}", "n");
        // The tenant stream never ends; narrowed to no session it answers.
        let concrete = if concrete == "/v1/events" {
            "/v1/events?sessionId=s-none".to_owned()
        } else {
            concrete
        };
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let body = (method == Method::POST || method == Method::PATCH).then(|| b"{}".to_vec());
        let a = s.call(method.clone(), &concrete, Some(&t), body).await;
        let fallback = a.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("GET /openapi.json lists every route"));
        assert!(
            !fallback,
            "{method} {path} is documented but not routed: {:#}",
            a.body
        );
        // Every operation has a description of its answers.
        assert!(a.status < 500, "{method} {path}: {:#}", a.body);
    }
    s.stop().await;
}

#[tokio::test]
async fn sessions_are_listed_in_pages() {
    let s = Server::start().await;
    let t = all_roles("acme");
    for n in 0..5 {
        s.post("/v1/sessions", &t, &json!({"sessionId": format!("s{n}")}))
            .await
            .expect(201);
    }
    let mut seen = Vec::new();
    let mut path = "/v1/sessions?limit=2".to_owned();
    loop {
        let page = s.get(&path, &t).await;
        let page = page.expect(200).clone();
        let ids: Vec<String> = page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["sessionId"].as_str().unwrap().to_owned())
            .collect();
        assert!(ids.len() <= 2);
        seen.extend(ids);
        match page["nextAfter"].as_str() {
            Some(after) => path = format!("/v1/sessions?limit=2&after={after}"),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["s0", "s1", "s2", "s3", "s4"],
        "each once, oldest first"
    );
    s.get("/v1/sessions?limit=0", &t).await.expect(400);
    s.get("/v1/sessions?limit=501", &t).await.expect(400);
    s.stop().await;
}
