//! Who may do what through the commands and the append endpoint: session-
//! limited tokens on every command route (both resolve paths included),
//! who may write which decision or tool result (the `issuer.*` rules),
//! actor provenance stamped by the server, and ids used in more than one
//! session.

use std::time::Duration;

use narad_server::auth::Role;
use narad_server::executors::ExecutorSettings;
use narad_tests::{Answer, Server, claims, hs256, token, whole_history};
use serde_json::{Value, json};

/// A token of tenant acme for `sub` with `roles`, limited to `sessions`.
fn limited(sub: &str, roles: &[Role], sessions: &[&str]) -> String {
    let mut c = claims("acme", sub, roles);
    c.sessions = Some(sessions.iter().map(|s| (*s).to_owned()).collect());
    hs256(&c)
}

/// A token of tenant acme for `sub` with `roles`.
fn person(sub: &str, roles: &[Role]) -> String {
    hs256(&claims("acme", sub, roles))
}

/// The token that sets the scene: every role.
fn admin() -> String {
    token("acme", &Role::ALL)
}

fn event(id: &str, ty: &str, run: &str, body: Value) -> Value {
    let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": id,
        "rootRunId": run, "runId": run});
    for (k, v) in body.as_object().expect("an object") {
        e[k] = v.clone();
    }
    e
}

async fn append(s: &Server, token: &str, session: &str, events: Vec<Value>) -> Answer {
    s.post(
        &format!("/v1/sessions/{session}/events"),
        token,
        &json!({ "events": events }),
    )
    .await
}

/// Creates `session` with run `run` started (bound to `executor` if named).
async fn with_run(s: &Server, session: &str, run: &str, executor: Option<&str>) {
    narad_tests::session_with_run(s, &admin(), session, run, executor).await;
}

/// Creates `session` with run `run` paused on blocking interrupt
/// `interrupt` (actions approve, deny).
async fn paused_on(s: &Server, session: &str, run: &str, interrupt: &str) {
    with_run(s, session, run, None).await;
    append(
        s,
        &admin(),
        session,
        vec![
            event(
                &format!("{session}-ask"),
                "interrupt.requested",
                run,
                json!({"interruptId": interrupt, "waitId": "w1", "kind": "tool.approval",
                "actions": ["approve", "deny"]}),
            ),
            event(
                &format!("{session}-pause"),
                "run.paused",
                run,
                json!({"waitId": "w1", "interruptId": interrupt, "reason": "interrupt",
                "resumeMode": "command"}),
            ),
        ],
    )
    .await
    .expect(201);
}

/// Creates `session` with workflow `workflow` started.
async fn with_workflow(s: &Server, session: &str, workflow: &str) {
    s.post("/v1/sessions", &admin(), &json!({ "sessionId": session }))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-workflow",
        &admin(),
        &json!({"sessionId": session, "workflowId": workflow}),
    )
    .await
    .expect(201);
}

async fn history(s: &Server, session: &str) -> Vec<Value> {
    whole_history(s, &admin(), session).await
}

fn types(h: &[Value]) -> Vec<&str> {
    h.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// Resolves through the spec's path or the command route.
async fn resolve(s: &Server, token: &str, spec_path: bool, body: Value) -> Answer {
    let path = if spec_path {
        "/api/narad/v1/commands/resolve-interrupt"
    } else {
        "/v1/commands/resolve-interrupt"
    };
    s.post(path, token, &body).await
}

// ------------------------------------------------- session-limited tokens

#[tokio::test]
async fn a_session_limited_token_resolves_only_its_own_sessions_interrupts_on_both_paths() {
    let s = Server::start().await;
    for spec_path in [true, false] {
        let (a, b) = if spec_path {
            ("a1", "b1")
        } else {
            ("a2", "b2")
        };
        paused_on(&s, a, "r1", &format!("int-{a}")).await;
        paused_on(&s, b, "r1", &format!("int-{b}")).await;
        let approver = limited("alice", &[Role::Approver, Role::Reader], &[a]);
        // The history route's answer for the other session is the answer.
        let elsewhere = s.get(&format!("/v1/sessions/{b}/events"), &approver).await;
        let refused = resolve(
            &s,
            &approver,
            spec_path,
            json!({"interruptId": format!("int-{b}"), "decision": "approve"}),
        )
        .await;
        assert_eq!(refused.status, 403, "{spec_path}: {}", refused.body);
        assert_eq!(refused.body["code"], "NRD-0102");
        assert_eq!(refused.body["message"], elsewhere.expect(403)["message"]);
        // Naming the other session does not help.
        let named = resolve(
            &s,
            &approver,
            spec_path,
            json!({"interruptId": format!("int-{b}"), "sessionId": b, "decision": "approve"}),
        )
        .await;
        assert_eq!(named.status, 403, "{}", named.body);
        assert_eq!(history(&s, b).await.len(), 3, "nothing written to {b}");
        // Its own session's interrupt it resolves.
        let own = resolve(
            &s,
            &approver,
            spec_path,
            json!({"interruptId": format!("int-{a}"), "decision": "approve"}),
        )
        .await;
        assert_eq!(own.expect(200)["sessionId"], a);
        assert_eq!(types(&history(&s, a).await)[3], "interrupt.resolved");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_session_limited_token_acts_on_its_own_sessions_and_no_other_on_every_command_route() {
    let s = Server::start().await;
    with_run(&s, "a", "r-a", None).await;
    with_run(&s, "b", "r-b", None).await;
    with_workflow(&s, "aw", "wf-a").await;
    with_workflow(&s, "bw", "wf-b").await;
    // A message of b to redact.
    s.post(
        "/v1/commands/record-user-message",
        &admin(),
        &json!({"sessionId": "b", "messageId": "m-b", "messageScope": "session", "content": "hi"}),
    )
    .await
    .expect(201);
    s.post("/v1/sessions", &admin(), &json!({"sessionId": "b3"}))
        .await
        .expect(201);
    let t = limited(
        "alice",
        &[Role::Writer, Role::Reader],
        &["a", "aw", "a3", "a4"],
    );
    let before = |names: &[&str]| {
        let s = &s;
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        async move {
            let mut all = Vec::new();
            for n in names {
                all.push((
                    history(s, &n).await,
                    s.get(&format!("/v1/sessions/{n}"), &admin()).await.body,
                ));
            }
            all
        }
    };
    let scene = before(&["b", "bw", "b3"]).await;
    let refused = [
        ("start-run", json!({"sessionId": "b3", "runId": "x"})),
        ("stop-run", json!({"runId": "r-b"})),
        ("stop-run", json!({"runId": "r-b", "sessionId": "b"})),
        ("cancel-workflow", json!({"workflowId": "wf-b"})),
        (
            "cancel-workflow",
            json!({"workflowId": "wf-b", "sessionId": "bw"}),
        ),
        (
            "record-user-message",
            json!({"sessionId": "b", "messageScope": "session", "content": "x"}),
        ),
        ("start-workflow", json!({"sessionId": "b3"})),
        (
            "redact-message",
            json!({"sessionId": "b", "messageId": "m-b", "reason": "pii", "displayReplacement": null}),
        ),
        (
            "update-session",
            json!({"sessionId": "b", "title": "mine now"}),
        ),
        ("archive-session", json!({"sessionId": "b"})),
        ("create-session", json!({"sessionId": "b4"})),
        ("create-session", json!({})),
    ];
    for (command, body) in refused {
        let a = s.post(&format!("/v1/commands/{command}"), &t, &body).await;
        assert_eq!(a.status, 403, "{command} {body}: {}", a.body);
        assert_eq!(a.body["code"], "NRD-0102", "{command}");
    }
    assert_eq!(before(&["b", "bw", "b3"]).await, scene, "nothing written");
    assert_eq!(s.get("/v1/sessions/b4", &admin()).await.status, 404);

    // Its own sessions, through the same routes.
    let allowed = [
        ("stop-run", json!({"runId": "r-a"}), 200),
        (
            "record-user-message",
            json!({"sessionId": "a", "messageId": "m-a", "messageScope": "session", "content": "x"}),
            201,
        ),
        (
            "redact-message",
            json!({"sessionId": "a", "messageId": "m-a", "reason": "pii", "displayReplacement": null}),
            200,
        ),
        (
            "update-session",
            json!({"sessionId": "a", "title": "mine"}),
            200,
        ),
        ("cancel-workflow", json!({"workflowId": "wf-a"}), 200),
        ("create-session", json!({"sessionId": "a3"}), 201),
        ("start-run", json!({"sessionId": "a3", "runId": "r3"}), 201),
        ("stop-run", json!({"runId": "r3", "sessionId": "a3"}), 200),
        ("create-session", json!({"sessionId": "a4"}), 201),
        ("start-workflow", json!({"sessionId": "a4"}), 201),
        ("archive-session", json!({"sessionId": "a"}), 200),
    ];
    for (command, body, status) in allowed {
        let a = s.post(&format!("/v1/commands/{command}"), &t, &body).await;
        assert_eq!(a.status, status, "{command} {body}: {}", a.body);
    }
    assert!(types(&history(&s, "a").await).contains(&"run.stop.requested"));
    assert!(types(&history(&s, "aw").await).contains(&"workflow.cancelled"));
    s.stop().await;
}

// ------------------------------------------------------- who writes what

#[tokio::test]
async fn a_backend_may_not_approve_an_interrupt_but_may_expire_it() {
    let s = Server::start().await;
    paused_on(&s, "s1", "r1", "i1").await;
    let backend = person("runtime", &[Role::Backend]);
    let approve = event(
        "res",
        "interrupt.resolved",
        "r1",
        json!({"interruptId": "i1", "waitId": "w1", "decision": "approve"}),
    );
    let a = append(&s, &backend, "s1", vec![approve]).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert_eq!(a.body["code"], "NRD-0201");
    assert_eq!(a.body["rule"], "issuer.backend.decision");
    assert!(
        a.body["fields"]["/events/0/decision"].is_string(),
        "{}",
        a.body
    );
    assert_eq!(history(&s, "s1").await.len(), 3, "nothing written");
    let expire = event(
        "exp",
        "interrupt.resolved",
        "r1",
        json!({"interruptId": "i1", "waitId": "w1", "decision": "expired"}),
    );
    append(&s, &backend, "s1", vec![expire]).await.expect(201);
    s.stop().await;
}

#[tokio::test]
async fn a_backend_gives_a_client_call_no_result_and_closes_it_only_under_a_stop() {
    let s = Server::start_with_executors(ExecutorSettings {
        sweep_interval: Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    with_run(&s, "s1", "r1", Some("desk")).await;
    let backend = person("runtime", &[Role::Backend]);
    let call = |id: &str| {
        event(
            &format!("start-{id}"),
            "tool.call.started",
            "r1",
            json!({"toolCallId": id, "toolName": "open.file", "executor": "client", "args": {}}),
        )
    };
    append(&s, &backend, "s1", vec![call("c1"), call("c2")])
        .await
        .expect(201);
    let finish = |n: &str, id: &str, body: Value| {
        let mut b = json!({"toolCallId": id, "response": null});
        for (k, v) in body.as_object().unwrap() {
            b[k] = v.clone();
        }
        event(n, "tool.call.finished", "r1", b)
    };
    let refused = [
        (
            finish(
                "f1",
                "c1",
                json!({"outcome": "success", "response": {"made": "up"}}),
            ),
            "/outcome",
        ),
        (
            finish("f2", "c1", json!({"outcome": "cancelled"})),
            "/outcome",
        ),
        (
            finish("f3", "c1", json!({"outcome": "error", "code": "oops"})),
            "/outcome",
        ),
        // The error closes of §11.3 are the server's: it issued no token
        // to this call, and none expired; it delivered nothing.
        (
            finish(
                "f4",
                "c1",
                json!({"outcome": "error", "code": "client_execution_expired"}),
            ),
            "/outcome",
        ),
        (
            finish(
                "f5",
                "c2",
                json!({"outcome": "error", "code": "client_unavailable"}),
            ),
            "/outcome",
        ),
        (
            finish(
                "f5b",
                "c2",
                json!({"outcome": "error", "code": "delivery_failed"}),
            ),
            "/outcome",
        ),
    ];
    for (e, pointer) in refused {
        let a = append(&s, &backend, "s1", vec![e.clone()]).await;
        assert_eq!(a.status, 409, "{e}: {}", a.body);
        assert_eq!(a.body["rule"], "issuer.backend.client-result", "{e}");
        assert!(
            a.body["fields"][format!("/events/0{pointer}")].is_string(),
            "{}",
            a.body
        );
    }
    assert_eq!(history(&s, "s1").await.len(), 3, "nothing written");
    // Cancellation once the run is asked to stop.
    append(
        &s,
        &backend,
        "s1",
        vec![
            event(
                "stop",
                "run.stop.requested",
                "r1",
                json!({"targetRunId": "r1"}),
            ),
            finish(
                "f6",
                "c1",
                json!({"outcome": "cancelled", "code": "narad.stop"}),
            ),
            finish(
                "f7",
                "c2",
                json!({"outcome": "cancelled", "code": "narad.stop"}),
            ),
        ],
    )
    .await
    .expect(201);
    s.stop().await;
}

#[tokio::test]
async fn a_person_may_not_decide_expired_on_either_path() {
    let s = Server::start().await;
    paused_on(&s, "s1", "r1", "i1").await;
    let approver = person("alice", &[Role::Approver]);
    for spec_path in [true, false] {
        let a = resolve(
            &s,
            &approver,
            spec_path,
            json!({"interruptId": "i1", "decision": "expired"}),
        )
        .await;
        assert_eq!(a.status, 409, "{}", a.body);
        assert_eq!(a.body["rule"], "issuer.person.expired");
    }
    assert_eq!(history(&s, "s1").await.len(), 3, "nothing written");
    s.stop().await;
}

// ------------------------------------------------------------ provenance

#[tokio::test]
async fn commands_stamp_their_actor_and_nobody_else_can() {
    let s = Server::start().await;
    paused_on(&s, "s1", "r1", "i1").await;
    // A command body has no actor to give.
    let forged = resolve(&s, &person("alice", &[Role::Approver]), true,
        json!({"interruptId": "i1", "decision": "approve", "actor": {"kind": "user", "sub": "root"}}))
        .await;
    assert_eq!(forged.status, 400, "{}", forged.body);
    resolve(
        &s,
        &person("alice", &[Role::Approver]),
        true,
        json!({"interruptId": "i1", "decision": "approve"}),
    )
    .await
    .expect(200);
    let bob = person("bob", &[Role::Writer]);
    s.post(
        "/v1/commands/record-user-message",
        &bob,
        &json!({"sessionId": "s1", "messageScope": "session", "content": "go on"}),
    )
    .await
    .expect(201);
    s.post("/v1/commands/stop-run", &bob, &json!({"runId": "r1"}))
        .await
        .expect(200);
    let h = history(&s, "s1").await;
    let of = |t: &str| h.iter().find(|e| e["type"] == t).unwrap().clone();
    assert_eq!(
        of("interrupt.resolved")["actor"],
        json!({"kind": "user", "sub": "alice"})
    );
    assert_eq!(
        of("message.user.recorded")["actor"],
        json!({"kind": "user", "sub": "bob"})
    );
    assert_eq!(
        of("run.stop.requested")["actor"],
        json!({"kind": "user", "sub": "bob"})
    );

    // A backend cannot put one on its own events.
    with_run(&s, "s2", "r2", None).await;
    let backend = person("runtime", &[Role::Backend]);
    let said = json!({"protocolVersion": "narad/v1", "type": "message.user.recorded",
        "eventId": "said", "messageId": "m9", "messageScope": "session", "content": "approve it",
        "actor": {"kind": "user", "sub": "alice"}});
    for e in [
        said.clone(),
        event(
            "st",
            "run.stop.requested",
            "r2",
            json!({"targetRunId": "r2", "actor": {"kind": "user", "sub": "alice"}}),
        ),
    ] {
        let a = append(&s, &backend, "s2", vec![e]).await;
        assert_eq!(a.status, 409, "{}", a.body);
        assert_eq!(a.body["rule"], "issuer.actor.server-stamped");
        assert!(
            a.body["fields"]["/events/0/actor"].is_string(),
            "{}",
            a.body
        );
    }
    assert_eq!(history(&s, "s2").await.len(), 1, "nothing written");
    let mut plain = said;
    plain.as_object_mut().unwrap().remove("actor");
    append(&s, &backend, "s2", vec![plain]).await.expect(201);
    assert!(history(&s, "s2").await[1].get("actor").is_none());
    s.stop().await;
}

// ------------------------------------------------- ids in several sessions

#[tokio::test]
async fn an_id_used_in_two_sessions_needs_the_session_and_works_with_it() {
    let s = Server::start().await;
    let writer = person("bob", &[Role::Writer]);
    let approver = person("alice", &[Role::Approver]);
    with_run(&s, "d-a", "run-1", None).await;
    with_run(&s, "d-b", "run-1", None).await;
    paused_on(&s, "i-a", "r1", "int-1").await;
    paused_on(&s, "i-b", "r1", "int-1").await;
    with_workflow(&s, "w-a", "wf-1").await;
    with_workflow(&s, "w-b", "wf-1").await;
    let ambiguous = [
        ("stop-run", json!({"runId": "run-1"}), &writer),
        (
            "resolve-interrupt",
            json!({"interruptId": "int-1", "decision": "approve"}),
            &approver,
        ),
        ("cancel-workflow", json!({"workflowId": "wf-1"}), &writer),
    ];
    for (command, body, t) in ambiguous {
        let a = s.post(&format!("/v1/commands/{command}"), t, &body).await;
        assert_eq!(a.status, 400, "{command}: {}", a.body);
        assert_eq!(a.body["code"], "NRD-0008");
        assert!(a.body["fields"]["/sessionId"].is_string(), "{}", a.body);
        let text = a.body.to_string();
        assert!(
            !text.contains("d-a") && !text.contains("d-b") && !text.contains("i-b"),
            "{text}"
        );
    }
    // The spec's path says the same.
    let a = s
        .post(
            "/api/narad/v1/commands/resolve-interrupt",
            &approver,
            &json!({"interruptId": "int-1", "decision": "approve"}),
        )
        .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(history(&s, "d-a").await.len(), 1, "nothing written");
    assert_eq!(history(&s, "i-a").await.len(), 3, "nothing written");

    let named = [
        (
            "stop-run",
            json!({"runId": "run-1", "sessionId": "d-b"}),
            &writer,
            "d-b",
            "d-a",
            "run.stop.requested",
        ),
        (
            "resolve-interrupt",
            json!({"interruptId": "int-1", "sessionId": "i-a", "decision": "deny"}),
            &approver,
            "i-a",
            "i-b",
            "interrupt.resolved",
        ),
        (
            "cancel-workflow",
            json!({"workflowId": "wf-1", "sessionId": "w-b"}),
            &writer,
            "w-b",
            "w-a",
            "workflow.cancelled",
        ),
    ];
    for (command, body, t, acted, untouched, ty) in named {
        let before = history(&s, untouched).await;
        let a = s.post(&format!("/v1/commands/{command}"), t, &body).await;
        assert_eq!(a.expect(200)["sessionId"], acted, "{command}");
        assert_eq!(
            types(&history(&s, acted).await).last(),
            Some(&ty),
            "{command}"
        );
        assert_eq!(history(&s, untouched).await, before, "{command}");
    }
    // A session that does not hold the id: not found there.
    let a = s
        .post(
            "/v1/commands/stop-run",
            &writer,
            &json!({"runId": "run-1", "sessionId": "w-a"}),
        )
        .await;
    assert_eq!(a.status, 404, "{}", a.body);
    // One session using an id needs no sessionId.
    with_run(&s, "solo", "run-solo", None).await;
    s.post(
        "/v1/commands/stop-run",
        &writer,
        &json!({"runId": "run-solo"}),
    )
    .await
    .expect(200);
    s.stop().await;
}
