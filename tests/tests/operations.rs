//! `GET /v1/operations`: a tenant's client executors with their leases and
//! calls, its runtime queues and the runs runtimes hold (role admin).

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::json;

#[tokio::test]
async fn operations_show_executors_queues_and_held_runs() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let empty = s.get("/v1/operations", &t).await;
    assert_eq!(
        *empty.expect(200),
        json!({"executors": [], "queues": [], "claims": []})
    );

    // An executor attaches; a run bound to it waits for a client tool.
    let attached = s.post("/v1/executors/desk-1/attach", &t, &json!({})).await;
    let lease = attached.expect(201)["leaseId"].as_str().unwrap().to_owned();
    s.post("/v1/sessions", &t, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-run",
        &t,
        &json!({"sessionId": "s1", "runId": "r1", "clientExecutorId": "desk-1"}),
    )
    .await
    .expect(201);
    s.post(
        "/v1/sessions/s1/events",
        &t,
        &json!({"events": [{"protocolVersion": "narad/v1", "type": "tool.call.started", "eventId": "tc",
            "rootRunId": "r1", "runId": "r1", "toolCallId": "tc1", "toolName": "clock.now",
            "executor": "client", "args": {}}]}),
    )
    .await
    .expect(201);

    // Two runs for runtimes on queue q: one is claimed.
    for (session, run) in [("s2", "r2"), ("s3", "r3")] {
        s.post("/v1/sessions", &t, &json!({ "sessionId": session }))
            .await
            .expect(201);
        s.post(
            "/v1/commands/start-run",
            &t,
            &json!({"sessionId": session, "runId": run, "runtime": {"queue": "q"}}),
        )
        .await
        .expect(201);
    }
    let claimed = s
        .post(
            "/v1/runtime/claims",
            &t,
            &json!({"queue": "q", "runtimeId": "worker-7"}),
        )
        .await;
    let held = claimed.expect(200)["runId"].as_str().unwrap().to_owned();

    let answer = s.get("/v1/operations", &t).await;
    let ops = answer.expect(200);
    let executor = &ops["executors"][0];
    assert_eq!(executor["clientExecutorId"], "desk-1");
    assert_eq!(executor["leaseId"], lease.as_str());
    assert_eq!(executor["live"], true);
    assert_eq!(
        executor["waitingCalls"].as_u64().unwrap() + executor["runningCalls"].as_u64().unwrap(),
        1,
        "{executor}"
    );
    assert_eq!(ops["queues"][0]["queue"], "q");
    assert_eq!(ops["queues"][0]["ready"], 1);
    assert_eq!(ops["queues"][0]["claimed"], 1);
    assert!(ops["queues"][0]["oldestReadyAt"].is_string());
    let claim = &ops["claims"][0];
    assert_eq!(claim["runId"], held.as_str());
    assert_eq!(claim["runtimeId"], "worker-7");
    assert_eq!(claim["attempt"], 1);
    assert_eq!(claim["stopRequested"], false);

    // Admins only; another tenant sees nothing of this one.
    let reader = s
        .get("/v1/operations", &token("acme", &[Role::Reader]))
        .await;
    assert_eq!((reader.status, reader.code()), (403, "NRD-0102"));
    let other = s
        .get("/v1/operations", &token("other", &[Role::Admin]))
        .await;
    assert_eq!(
        *other.expect(200),
        json!({"executors": [], "queues": [], "claims": []})
    );
}
