//! `POST /v1/ag-ui`: a session as an AG-UI agent. A runtime claims the
//! run the route starts and appends under its lease, as a real one does;
//! the answer is read as the AG-UI events it streams.

use std::time::Duration;

use narad_server::auth::Role;
use narad_tests::{RuntimeSettings, Server, token, whole_history};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

fn everyone(org: &str) -> String {
    token(
        org,
        &[Role::Reader, Role::Writer, Role::Backend, Role::Approver],
    )
}

/// An AG-UI answer: its status, and its events (or its error body).
struct Answer {
    status: u16,
    events: Vec<Value>,
    error: Value,
}

impl Answer {
    fn types(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or_default())
            .collect()
    }

    fn last(&self) -> &Value {
        self.events.last().expect("an event")
    }
}

/// POSTs `body` to /v1/ag-ui in the background; the answer read whole.
fn post(s: &Server, jwt: &str, body: Value) -> JoinHandle<Answer> {
    let (http, url, jwt) = (
        s.http.clone(),
        format!("{}/v1/ag-ui", s.base),
        jwt.to_owned(),
    );
    tokio::spawn(async move {
        let res = http
            .post(url)
            .bearer_auth(jwt)
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
            .await
            .expect("sent");
        let status = res.status().as_u16();
        let text = tokio::time::timeout(Duration::from_secs(20), res.text())
            .await
            .expect("the stream ends")
            .expect("read");
        if status != 200 {
            return Answer {
                status,
                events: Vec::new(),
                error: serde_json::from_str(&text).unwrap_or(Value::Null),
            };
        }
        assert!(!text.contains('\r'), "\\n framing only");
        let events = text
            .split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).expect("JSON"))
            .collect();
        Answer {
            status,
            events,
            error: Value::Null,
        }
    })
}

/// The session's one `tool.call.finished`, once history holds it.
async fn the_call_finished(s: &Server, jwt: &str, session: &str) -> Value {
    loop {
        let h = whole_history(s, jwt, session).await;
        if count(&h, "tool.call.finished") == 1 {
            return h
                .into_iter()
                .find(|e| e["type"] == "tool.call.finished")
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn input(thread: &str, run: &str, messages: Value) -> Value {
    json!({"threadId": thread, "runId": run, "state": {}, "messages": messages,
        "tools": [], "context": [], "forwardedProps": {}})
}

fn user(id: &str, text: &str) -> Value {
    json!({"id": id, "role": "user", "content": text})
}

/// The runtime's claim of the next run: (session, run, lease).
async fn claim(s: &Server, jwt: &str) -> (String, String, String) {
    let a = s
        .post("/v1/runtime/claims", jwt, &json!({"waitMs": 10_000}))
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    (
        a.body["sessionId"].as_str().unwrap().to_owned(),
        a.body["runId"].as_str().unwrap().to_owned(),
        a.body["lease"]["leaseId"].as_str().unwrap().to_owned(),
    )
}

/// Appends run-tree events of `run` under `lease`.
async fn append(s: &Server, jwt: &str, session: &str, run: &str, lease: &str, events: Vec<Value>) {
    let events: Vec<Value> = events
        .into_iter()
        .map(|mut e| {
            e["protocolVersion"] = json!("narad/v1");
            e["eventId"] = json!(uuid::Uuid::now_v7().to_string());
            e["rootRunId"] = json!(run);
            e["runId"] = json!(run);
            e
        })
        .collect();
    s.post_with(
        &format!("/v1/sessions/{session}/events"),
        jwt,
        &json!({ "events": events }),
        &[("Narad-Runtime-Lease", lease)],
    )
    .await
    .expect(201);
}

fn count(history: &[Value], ty: &str) -> usize {
    history.iter().filter(|e| e["type"] == ty).count()
}

#[tokio::test]
async fn errors_before_the_stream_are_http_errors() {
    let s = Server::start().await;
    let jwt = everyone("acme");
    let a = post(&s, &jwt, json!({"threadId": "t1", "runId": "a1"}))
        .await
        .unwrap();
    assert_eq!(a.status, 400, "{}", a.error);
    assert_eq!(a.error["code"], "NRD-0003");
    let a = post(
        &s,
        &jwt,
        json!({"threadId": "t1", "runId": "a1", "messages": [{"id": "m", "role": "user"}]}),
    )
    .await
    .unwrap();
    assert_eq!(a.status, 400, "{}", a.error);
    assert!(
        a.error["fields"].to_string().contains("/messages/0"),
        "{}",
        a.error
    );
    let reader = token("acme", &[Role::Reader]);
    let a = post(&s, &reader, input("t1", "a1", json!([user("u1", "hi")])))
        .await
        .unwrap();
    assert_eq!(
        (a.status, a.error["code"].as_str()),
        (403, Some("NRD-0102"))
    );
    let mut limited = narad_tests::claims("acme", "u", &[Role::Writer]);
    limited.sessions = Some(vec!["other".into()]);
    let a = post(
        &s,
        &narad_tests::hs256(&limited),
        input("t1", "a1", json!([])),
    )
    .await
    .unwrap();
    assert_eq!(a.status, 403);
    // A queue is 1 to 256 characters, named where it came from: the query
    // parameter (it was refused naming the body's member), or the member.
    let empty_query = s
        .http
        .post(format!("{}/v1/ag-ui?queue=", s.base))
        .bearer_auth(&jwt)
        .json(&input("t1", "a1", json!([user("u1", "hi")])))
        .send()
        .await
        .expect("sent");
    assert_eq!(empty_query.status().as_u16(), 400);
    let error: Value = empty_query.json().await.expect("JSON");
    assert_eq!(
        (error["code"].as_str(), error["fields"]["queue"].is_string()),
        (Some("NRD-0008"), true),
        "{error}"
    );
    let mut member = input("t1", "a1", json!([user("u1", "hi")]));
    member["forwardedProps"] = json!({"narad": {"queue": ""}});
    let a = post(&s, &jwt, member).await.unwrap();
    assert_eq!(a.status, 400, "{}", a.error);
    assert!(
        a.error["fields"]["/forwardedProps/narad/queue"].is_string(),
        "{}",
        a.error
    );
    for status in ["resolved", "cancelled"] {
        // A resume naming no interrupt of the thread is not found, however
        // it answers (a cancel was refused 400 for offering no cancel).
        let mut resume = input("t1", "a1", json!([]));
        resume["resume"] =
            json!([{"interruptId": "nope", "status": status, "payload": {"decision": "approve"}}]);
        let a = post(&s, &jwt, resume).await.unwrap();
        assert_eq!(
            (a.status, a.error["code"].as_str()),
            (404, Some("NRD-0007")),
            "{status}: {}",
            a.error
        );
    }
}

#[tokio::test]
async fn a_streamed_answer_in_order_and_one_run_per_ag_ui_run() {
    let s = Server::start().await;
    let jwt = everyone("acme");
    let body = input("t1", "a1", json!([user("u1", "hello")]));
    let answer = post(&s, &jwt, body.clone());
    let (session, run, lease) = claim(&s, &jwt).await;
    assert_eq!((session.as_str(), run.as_str()), ("t1", "a1"));
    append(&s, &jwt, "t1", "a1", &lease, vec![
        json!({"type": "progress.recorded", "progressId": "p1", "category": "plan", "label": "Thinking", "status": "active", "privacy": "public"}),
        json!({"type": "reasoning.started", "reasoningId": "r1"}),
        json!({"type": "reasoning.delta", "reasoningId": "r1", "delta": "hm"}),
        json!({"type": "reasoning.completed", "reasoningId": "r1"}),
        json!({"type": "message.text.started", "messageId": "m1", "role": "assistant", "messageScope": "run"}),
        json!({"type": "message.text.delta", "messageId": "m1", "delta": "Hel"}),
    ]).await;
    append(&s, &jwt, "t1", "a1", &lease, vec![
        json!({"type": "message.text.delta", "messageId": "m1", "delta": "lo"}),
        json!({"type": "message.text.completed", "messageId": "m1"}),
        json!({"type": "tool.call.started", "toolCallId": "c1", "toolName": "search", "executor": "backend", "args": {"q": "x"}}),
        json!({"type": "tool.call.finished", "toolCallId": "c1", "outcome": "success", "response": {"hits": 1}}),
        json!({"type": "state.snapshot", "scope": "session", "revision": 1, "state": {"n": 1}}),
        json!({"type": "run.custom", "name": "acme.note", "value": {"k": 1}}),
        json!({"type": "run.finished", "usage": {"inputTokens": 5, "outputTokens": 7}}),
    ]).await;
    let a = answer.await.unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(
        a.types(),
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_END",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "STATE_SNAPSHOT",
            "CUSTOM",
            "STEP_FINISHED",
            "RUN_FINISHED",
        ]
    );
    assert_eq!(a.events[0]["threadId"], "t1");
    assert_eq!(a.events[0]["runId"], "a1");
    assert_eq!(a.events[0]["metadata"]["narad"]["runId"], "a1");
    assert_eq!(a.events[12]["delta"], "{\"q\":\"x\"}");
    assert_eq!(a.events[14]["content"], "{\"hits\":1}");
    assert_eq!(a.last()["outcome"], json!({"type": "success"}));
    assert_eq!(
        a.last()["usage"],
        json!([{"inputTokens": 5, "outputTokens": 7}])
    );
    assert!(!serde_json::to_string(&a.events).unwrap().contains("null"));

    // The same input again: nothing recorded or started twice; the
    // transcript, and the end.
    let again = post(&s, &jwt, body).await.unwrap();
    assert_eq!(
        again.types(),
        [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "STATE_SNAPSHOT",
            "RUN_FINISHED"
        ]
    );
    let roles: Vec<&str> = again.events[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "reasoning", "assistant", "assistant", "tool"]
    );
    assert_eq!(again.events[1]["messages"][2]["content"], "Hello");
    // The history the client sends back, with a new message: one more of each.
    let next = input(
        "t1",
        "a2",
        json!([user("u1", "hello"), {"id": "m1", "role": "assistant", "content": "Hello"}, user("u2", "more")]),
    );
    let answer = post(&s, &jwt, next);
    let (_, run, lease) = claim(&s, &jwt).await;
    assert_eq!(run, "a2");
    append(
        &s,
        &jwt,
        "t1",
        "a2",
        &lease,
        vec![json!({"type": "run.error", "code": "model_down", "message": "no model"})],
    )
    .await;
    let a = answer.await.unwrap();
    assert_eq!(a.types(), ["RUN_STARTED", "RUN_ERROR"]);
    assert_eq!(
        (a.last()["code"].as_str(), a.last()["message"].as_str()),
        (Some("model_down"), Some("no model"))
    );
    let h = whole_history(&s, &jwt, "t1").await;
    assert_eq!(
        (count(&h, "message.user.recorded"), count(&h, "run.started")),
        (2, 2)
    );
}

#[tokio::test]
async fn an_interrupt_ends_the_ag_ui_run_and_a_resume_continues_it() {
    let s = Server::start().await;
    let jwt = everyone("acme");
    let answer = post(
        &s,
        &jwt,
        input("t1", "a1", json!([user("u1", "delete it")])),
    );
    let (_, run, lease) = claim(&s, &jwt).await;
    append(&s, &jwt, "t1", &run, &lease, vec![
        json!({"type": "message.text.started", "messageId": "m1", "role": "assistant", "messageScope": "run"}),
        json!({"type": "message.text.delta", "messageId": "m1", "delta": "May I"}),
        json!({"type": "interrupt.requested", "interruptId": "i1", "waitId": "w1", "kind": "tool.approval",
            "actions": ["approve", "deny"], "title": "Delete?"}),
        json!({"type": "run.paused", "waitId": "w1", "reason": "interrupt", "resumeMode": "command", "interruptId": "i1"}),
    ]).await;
    let a = answer.await.unwrap();
    // AG-UI's interrupt lifecycle: what a resume needs (the messages) is
    // snapshot before the interrupt outcome.
    assert_eq!(
        a.types(),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "MESSAGES_SNAPSHOT",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(
        a.events[4]["messages"],
        json!([
            {"id": "u1", "role": "user", "content": "delete it"},
            {"id": "m1", "role": "assistant", "content": "May I"},
        ])
    );
    let outcome = &a.last()["outcome"];
    assert_eq!(outcome["type"], "interrupt");
    assert_eq!(outcome["interrupts"][0]["id"], "i1");
    assert_eq!(outcome["interrupts"][0]["reason"], "tool.approval");
    assert_eq!(outcome["interrupts"][0]["message"], "Delete?");
    assert_eq!(
        outcome["interrupts"][0]["responseSchema"]["properties"]["decision"]["enum"],
        json!(["approve", "deny"])
    );
    assert_eq!(
        outcome["interrupts"][0]["metadata"]["narad"]["waitId"],
        "w1"
    );

    // A rejoin while it waits: the transcript, and the interrupt again.
    let rejoin = post(
        &s,
        &jwt,
        input("t1", "a1b", json!([user("u1", "delete it")])),
    )
    .await
    .unwrap();
    assert_eq!(
        rejoin.types(),
        [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(rejoin.last()["outcome"]["type"], "interrupt");

    let mut resume = input("t1", "a2", json!([user("u1", "delete it")]));
    resume["resume"] =
        json!([{"interruptId": "i1", "status": "resolved", "payload": {"decision": "approve"}}]);
    let answer = post(&s, &jwt, resume.clone());
    // The runtime goes on once the decision is in.
    let h = loop {
        let h = whole_history(&s, &jwt, "t1").await;
        if count(&h, "interrupt.resolved") == 1 {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let resolved = h
        .iter()
        .find(|e| e["type"] == "interrupt.resolved")
        .unwrap();
    assert_eq!(resolved["decision"], "approve");
    assert_eq!(resolved["actor"]["kind"], "user");
    if count(&h, "run.resumed") == 0 {
        append(
            &s,
            &jwt,
            "t1",
            &run,
            &lease,
            vec![json!({"type": "run.resumed", "waitId": "w1"})],
        )
        .await;
    }
    append(
        &s,
        &jwt,
        "t1",
        &run,
        &lease,
        vec![
            json!({"type": "message.text.delta", "messageId": "m1", "delta": " go."}),
            json!({"type": "message.text.completed", "messageId": "m1"}),
            json!({"type": "run.finished"}),
        ],
    )
    .await;
    let a = answer.await.unwrap();
    assert_eq!(a.status, 200, "{}", a.error);
    let types = a.types();
    assert_eq!(types[0], "RUN_STARTED");
    assert_eq!(a.events[0]["runId"], "a2");
    assert_eq!(
        &types[types.len() - 4..],
        [
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(a.last()["outcome"]["type"], "success");

    // The same resume from someone else, later: 409 with the decision.
    let other = token("acme", &[Role::Writer, Role::Approver]);
    let mut late = resume;
    late["runId"] = json!("a3");
    late["resume"][0]["payload"]["decision"] = json!("deny");
    let a = post(&s, &other, late).await.unwrap();
    assert_eq!(
        (a.status, a.error["code"].as_str()),
        (409, Some("NRD-0205")),
        "{}",
        a.error
    );
    assert_eq!(a.error["details"]["decision"], "approve", "{}", a.error);
    assert_eq!(
        a.error["details"]["actor"], resolved["actor"],
        "who decided first: {}",
        a.error
    );
}

#[tokio::test]
async fn a_frontend_tool_round_trip() {
    let s = Server::start().await;
    let jwt = everyone("acme");
    let tools = json!([{"name": "confirm", "description": "ask the person", "parameters": {"type": "object"}}]);
    let mut first = input("t1", "a1", json!([user("u1", "book it")]));
    first["tools"] = tools.clone();
    let answer = post(&s, &jwt, first);
    let (_, run, lease) = claim(&s, &jwt).await;
    let h = whole_history(&s, &jwt, "t1").await;
    let started = h.iter().find(|e| e["type"] == "run.started").unwrap();
    assert_eq!(started["clientExecutorId"], "front-end:t1");
    assert_eq!(started["input"]["prompt"], "book it");
    assert_eq!(started["input"]["agUi"]["tools"][0]["name"], "confirm");
    append(&s, &jwt, "t1", &run, &lease, vec![
        json!({"type": "tool.call.started", "toolCallId": "c1", "toolName": "confirm", "executor": "client", "args": {"what": "flight"}}),
    ]).await;
    let a = answer.await.unwrap();
    assert_eq!(
        a.types(),
        [
            "RUN_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(
        a.last()["outcome"],
        json!({"type": "success", "pendingToolCallIds": ["c1"]})
    );

    // The client answers in its next input.
    let mut next = input(
        "t1",
        "a2",
        json!([
            user("u1", "book it"),
            {"id": "c1", "role": "assistant", "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "confirm", "arguments": "{\"what\":\"flight\"}"}}]},
            {"id": "tm1", "role": "tool", "toolCallId": "c1", "content": "{\"ok\":true}"},
        ]),
    );
    next["tools"] = tools;
    let answer = post(&s, &jwt, next);
    let finished = the_call_finished(&s, &jwt, "t1").await;
    assert_eq!(
        (finished["outcome"].clone(), finished["response"].clone()),
        (json!("success"), json!({"ok": true}))
    );
    append(&s, &jwt, "t1", &run, &lease, vec![
        json!({"type": "message.text.started", "messageId": "m2", "role": "assistant", "messageScope": "run"}),
        json!({"type": "message.text.delta", "messageId": "m2", "delta": "Booked."}),
        json!({"type": "message.text.completed", "messageId": "m2"}),
        json!({"type": "run.cancelled", "code": "narad.stop"}),
    ]).await;
    let a = answer.await.unwrap();
    assert_eq!(a.status, 200, "{}", a.error);
    let types = a.types();
    assert!(
        !types.contains(&"TOOL_CALL_RESULT"),
        "the client has its own result: {types:?}"
    );
    assert_eq!(
        &types[types.len() - 4..],
        [
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(a.last()["outcome"], json!({"type": "cancelled"}));
}

#[tokio::test]
async fn a_client_call_of_a_chat_run_is_answered_through_ag_ui_in_one_session() {
    let s = Server::start_with_runtime(RuntimeSettings {
        lease_ttl: Duration::from_secs(60),
        sweep_interval: Duration::from_millis(100),
        ..RuntimeSettings::default()
    })
    .await;
    let jwt = everyone("acme");
    // Started by the AI SDK's chat route, the run calls the client's tool.
    let first = json!({"id": "s1", "trigger": "submit-message",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Where am I?"}]}]});
    let chat = s
        .http
        .post(format!("{}/v1/chat", s.base))
        .bearer_auth(&jwt)
        .json(&first)
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    let reading = tokio::spawn(chat.text());
    let (_, run, lease) = claim(&s, &jwt).await;
    append(&s, &jwt, "s1", &run, &lease, vec![
        json!({"type": "tool.call.started", "toolCallId": "loc1", "toolName": "getLocation", "executor": "client", "args": {"precise": true}}),
    ]).await;
    let text = tokio::time::timeout(Duration::from_secs(20), reading)
        .await
        .expect("the chat answer ends")
        .unwrap()
        .unwrap();
    assert!(text.contains("tool-input-available"), "{text}");

    // An AG-UI client of the same session answers it.
    let tools = json!([{"name": "getLocation", "description": "where the person is"}]);
    let mut next = input(
        "s1",
        "a1",
        json!([
            user("u1", "Where am I?"),
            {"id": "loc1", "role": "assistant", "toolCalls": [{"id": "loc1", "type": "function", "function": {"name": "getLocation", "arguments": "{\"precise\":true}"}}]},
            {"id": "tm1", "role": "tool", "toolCallId": "loc1", "content": "{\"city\":\"Berlin\"}"},
        ]),
    );
    next["tools"] = tools;
    let answer = post(&s, &jwt, next);
    let finished = the_call_finished(&s, &jwt, "s1").await;
    assert_eq!(
        (finished["outcome"].clone(), finished["response"].clone()),
        (json!("success"), json!({"city": "Berlin"}))
    );
    append(&s, &jwt, "s1", &run, &lease, vec![
        json!({"type": "message.text.started", "messageId": "m2", "role": "assistant", "messageScope": "run"}),
        json!({"type": "message.text.delta", "messageId": "m2", "delta": "Berlin."}),
        json!({"type": "message.text.completed", "messageId": "m2"}),
        json!({"type": "run.finished"}),
    ]).await;
    let a = answer.await.unwrap();
    assert_eq!(a.status, 200, "{}", a.error);
    assert_eq!(a.last()["type"], "RUN_FINISHED");
    assert_eq!(a.last()["outcome"], json!({"type": "success"}));
    let said: String = a
        .events
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(said, "Berlin.");
    // One session, one run, one transcript.
    let h = whole_history(&s, &jwt, "s1").await;
    assert_eq!(count(&h, "run.started"), 1);
    assert_eq!(count(&h, "message.user.recorded"), 1);
}

#[tokio::test]
async fn the_clients_history_is_taken_as_it_comes_and_only_what_is_read_is_checked() {
    let s = Server::start().await;
    let jwt = everyone("acme");
    // Message kinds and shapes the route never reads (an assistant's
    // tool calls without their function, an activity, extra members, a
    // tool message answering no call of narad's) are no reason to refuse:
    // nothing new, so the answer is the thread as it stands.
    let history = json!([
        {"id": "a1", "role": "assistant", "content": "", "toolCalls": [{}], "extra": 1},
        {"id": "act", "role": "activity", "activityType": "x", "content": {}},
        {"id": "t1", "role": "tool", "toolCallId": "elsewhere", "content": "done"},
        // null is taken as absent, as the document says (schemathesis sent
        // this one).
        {"id": "0", "role": "", "content": false, "error": null, "toolCallId": null},
        {"id": "1", "role": "", "content": null, "error": "", "toolCallId": "schemathesis"},
    ]);
    let a = post(&s, &jwt, input("h1", "r1", history)).await.unwrap();
    assert_eq!(a.status, 200, "{}", a.error);
    let types: Vec<&str> = a.events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.first(), Some(&"RUN_STARTED"), "{types:?}");
    assert_eq!(types.last(), Some(&"RUN_FINISHED"), "{types:?}");
    // What the route does read must hold: a tool message names its call,
    // a user message has content, ids are ids.
    for (message, pointer) in [
        (
            json!({"id": "t2", "role": "tool", "content": "x"}),
            "/messages/0/toolCallId",
        ),
        (
            json!({"id": "t3", "role": "tool", "content": "x", "toolCallId": null}),
            "/messages/0/toolCallId",
        ),
        (json!({"id": "u2", "role": "user"}), "/messages/0/content"),
        (
            json!({"id": "u3", "role": "user", "content": null}),
            "/messages/0/content",
        ),
        (
            json!({"id": "u".repeat(257), "role": "user", "content": "x"}),
            "/messages/0/id",
        ),
    ] {
        let a = post(&s, &jwt, input("h1", "r2", json!([message])))
            .await
            .unwrap();
        assert_eq!(a.status, 400, "{}", a.error);
        assert!(
            a.error["fields"][pointer].is_string(),
            "{pointer}: {}",
            a.error
        );
    }
}

#[tokio::test]
async fn an_abort_run_stops_the_narad_run_after_the_grace_unless_the_thread_is_rejoined() {
    let s = Server::start_with_runtime(RuntimeSettings {
        lease_ttl: Duration::from_secs(60),
        front_end_abort_grace: Some(Duration::from_millis(300)),
        ..RuntimeSettings::default()
    })
    .await;
    let jwt = everyone("acme");
    let open = |thread: &str, run: &str, messages: Value| {
        let (http, url, jwt, body) = (
            s.http.clone(),
            format!("{}/v1/ag-ui", s.base),
            jwt.clone(),
            input(thread, run, messages),
        );
        async move {
            let res = http
                .post(url)
                .bearer_auth(jwt)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res
        }
    };

    // `abortRun()`: the stream is broken off and the thread is not rejoined.
    let aborted = open("t-abort", "ag-1", json!([user("u1", "Go")])).await;
    let (session, run, lease) = claim(&s, &jwt).await;
    append(
        &s,
        &jwt,
        &session,
        &run,
        &lease,
        vec![json!({"type": "message.text.started",
        "messageId": "m1", "role": "assistant", "messageScope": "run"})],
    )
    .await;
    drop(aborted);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let h = whole_history(&s, &jwt, "t-abort").await;
    let stops: Vec<&Value> = h
        .iter()
        .filter(|e| e["type"] == "run.stop.requested")
        .collect();
    assert_eq!(stops.len(), 1, "{h:?}");
    assert_eq!(
        (stops[0]["runId"].as_str(), stops[0]["reason"].as_str()),
        (Some(run.as_str()), Some("front_end.abort"))
    );

    // Broken off, then rejoined within the grace (the same input again):
    // the run goes on.
    let broken = open("t-rejoin", "ag-2", json!([user("u2", "Go")])).await;
    let (session, run, lease) = claim(&s, &jwt).await;
    drop(broken);
    let rejoined = open("t-rejoin", "ag-3", json!([user("u2", "Go")])).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        count(
            &whole_history(&s, &jwt, "t-rejoin").await,
            "run.stop.requested"
        ),
        0
    );
    append(
        &s,
        &jwt,
        &session,
        &run,
        &lease,
        vec![json!({"type": "run.finished"})],
    )
    .await;
    let text = tokio::time::timeout(Duration::from_secs(20), rejoined.text())
        .await
        .unwrap()
        .unwrap();
    assert!(text.contains("RUN_FINISHED"), "{text}");
}
