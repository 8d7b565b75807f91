//! `POST /v1/chat` and its reconnect, `GET /v1/chat/{id}/stream`: the AI
//! SDK's UI message stream of a run driven as an agent runtime drives one
//! (a claim, appends under its lease). Chunk order, backend and client
//! tools, approvals (and the 409 of a decision made elsewhere first), the
//! reconnect's 204 and replay, and the refusals before any streaming.

use std::time::Duration;

use narad_server::auth::Role;
use narad_tests::{RuntimeSettings, Server, claims, hs256, token, whole_history};
use serde_json::{Value, json};

fn patient() -> RuntimeSettings {
    RuntimeSettings {
        lease_ttl: Duration::from_secs(60),
        sweep_interval: Duration::from_millis(100),
        ..RuntimeSettings::default()
    }
}

/// The person chatting: writes, reads and approves.
fn person(org: &str, sub: &str) -> String {
    hs256(&claims(
        org,
        sub,
        &[Role::Reader, Role::Writer, Role::Approver],
    ))
}

fn backend(org: &str) -> String {
    token(org, &[Role::Reader, Role::Backend])
}

fn user(id: &str, text: &str) -> Value {
    json!({"id": id, "role": "user", "parts": [{"type": "text", "text": text}]})
}

/// The UI message stream of a response: its chunks, `[DONE]` as the
/// string "[DONE]".
async fn chunks(res: reqwest::Response) -> Vec<Value> {
    let text = tokio::time::timeout(Duration::from_secs(20), res.text())
        .await
        .expect("the answer ends")
        .expect("a body");
    text.split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| json!(data)))
        .collect()
}

fn types(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .map(|c| c["type"].as_str().unwrap_or("[DONE]").to_owned())
        .collect()
}

/// Sends a chat request; the response (its body still to read).
async fn post(s: &Server, jwt: &str, body: &Value) -> reqwest::Response {
    s.http
        .post(format!("{}/v1/chat", s.base))
        .bearer_auth(jwt)
        .json(body)
        .send()
        .await
        .expect("the server answers")
}

/// A run held by the test's runtime.
struct Held {
    session: String,
    run: String,
    lease: String,
}

/// Claims the next run of the default queue.
async fn claim(s: &Server, jwt: &str) -> Held {
    for _ in 0..100 {
        let a = s.post("/v1/runtime/claims", jwt, &json!({})).await;
        if a.status == 200 {
            return Held {
                session: a.body["sessionId"].as_str().unwrap().to_owned(),
                run: a.body["runId"].as_str().unwrap().to_owned(),
                lease: a.body["lease"]["leaseId"].as_str().unwrap().to_owned(),
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no run to claim");
}

impl Held {
    /// Appends events of the run under the lease.
    async fn say(&self, s: &Server, jwt: &str, events: &[(&str, Value)]) {
        let events: Vec<Value> = events
            .iter()
            .map(|(kind, fields)| {
                let mut e = json!({"protocolVersion": "narad/v1", "type": kind,
                    "eventId": uuid::Uuid::now_v7().to_string(),
                    "rootRunId": self.run, "runId": self.run});
                for (k, v) in fields.as_object().unwrap() {
                    e[k] = v.clone();
                }
                e
            })
            .collect();
        s.post_with(
            &format!("/v1/sessions/{}/events", self.session),
            jwt,
            &json!({ "events": events }),
            &[("Narad-Runtime-Lease", &self.lease)],
        )
        .await
        .expect(201);
    }
}

/// Waits until the session's history holds an event of `kind`.
async fn history_with(s: &Server, jwt: &str, session: &str, kind: &str) -> Vec<Value> {
    for _ in 0..200 {
        let h = whole_history(s, jwt, session).await;
        if h.iter().any(|e| e["type"] == kind) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no {kind} in session {session}");
}

fn text_events(id: &str, deltas: &[&str]) -> Vec<(&'static str, Value)> {
    let mut out = vec![(
        "message.text.started",
        json!({"messageId": id, "role": "assistant", "messageScope": "run"}),
    )];
    for d in deltas {
        out.push(("message.text.delta", json!({"messageId": id, "delta": d})));
    }
    out.push(("message.text.completed", json!({"messageId": id})));
    out
}

#[tokio::test]
async fn a_streamed_answer_is_one_message_with_its_parts_in_order() {
    let s = Server::start_with_runtime(patient()).await;
    let (me, rt) = (person("acme", "ann"), backend("acme"));
    let body = json!({"id": "chat-1", "trigger": "submit-message",
        "messages": [user("u1", "What is in /tmp?")]});
    let res = post(&s, &me, &body).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-vercel-ai-ui-message-stream"], "v1");
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let reading = tokio::spawn(chunks(res));

    let run = claim(&s, &rt).await;
    assert_eq!(
        (run.session.as_str(), run.run.as_str()),
        ("chat-1", "u1.run")
    );
    let mut events = vec![
        ("reasoning.started", json!({"reasoningId": "th1"})),
        (
            "reasoning.delta",
            json!({"reasoningId": "th1", "delta": "list it"}),
        ),
        ("reasoning.completed", json!({"reasoningId": "th1"})),
        (
            "tool.call.started",
            json!({"toolCallId": "ls1", "toolName": "fs.list",
            "executor": "backend", "args": {"path": "/tmp"}}),
        ),
        (
            "tool.call.finished",
            json!({"toolCallId": "ls1", "outcome": "success",
            "response": ["a.txt"]}),
        ),
    ];
    events.extend(text_events("m1", &["One file: ", "a.txt"]));
    events.push(("run.finished", json!({})));
    run.say(&s, &rt, &events).await;

    let got = reading.await.unwrap();
    assert_eq!(
        types(&got),
        [
            "start",
            "start-step",
            "reasoning-start",
            "reasoning-delta",
            "reasoning-end",
            "tool-input-available",
            "tool-output-available",
            "text-start",
            "text-delta",
            "text-delta",
            "text-end",
            "finish-step",
            "finish",
            "[DONE]"
        ]
    );
    assert_eq!(got[0]["messageId"], "u1.run");
    assert_eq!(got[5]["providerExecuted"], true);
    assert_eq!(got[5]["input"], json!({"path": "/tmp"}));
    assert_eq!(got[6]["output"], json!(["a.txt"]));
    assert_eq!(got[8]["delta"], "One file: ");
    assert_eq!(got[12]["finishReason"], "stop");
    assert_eq!(got[12]["messageMetadata"]["narad"]["runId"], "u1.run");

    // The user message is the session's, under the UI message's id.
    let h = whole_history(&s, &me, "chat-1").await;
    assert_eq!(h[0]["type"], "message.user.recorded");
    assert_eq!(h[0]["messageId"], "u1");
    assert_eq!(h[0]["content"], "What is in /tmp?");
    // The run ended: nothing to resume.
    let a = s.get("/v1/chat/chat-1/stream", &me).await;
    assert_eq!(a.status, 204);
}

#[tokio::test]
async fn a_client_tool_ends_the_answer_and_its_output_continues_the_message() {
    let s = Server::start_with_runtime(patient()).await;
    let (me, rt) = (person("acme", "ann"), backend("acme"));
    let first = json!({"id": "chat-2", "messages": [user("u1", "Where am I?")],
        "trigger": "submit-message"});
    let reading = tokio::spawn(chunks(post(&s, &me, &first).await));
    let run = claim(&s, &rt).await;
    run.say(
        &s,
        &rt,
        &[(
            "tool.call.started",
            json!({"toolCallId": "loc1", "toolName": "getLocation", "executor": "client",
                "args": {"precise": true}}),
        )],
    )
    .await;
    let got = reading.await.unwrap();
    assert_eq!(
        types(&got),
        [
            "start",
            "start-step",
            "tool-input-available",
            "finish-step",
            "finish",
            "[DONE]"
        ]
    );
    assert!(
        got[2].get("providerExecuted").is_none(),
        "the client's tool"
    );
    assert_eq!(got[4]["finishReason"], "tool-calls");
    let metadata = got[4]["messageMetadata"].clone();
    // Reconnecting meanwhile replays the message and ends where it waits.
    let res = s
        .http
        .get(format!("{}/v1/chat/chat-2/stream", s.base))
        .bearer_auth(&me)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(types(&chunks(res).await), types(&got));

    // The client's answer: the assistant message with the tool's output.
    let next = json!({"id": "chat-2", "trigger": "submit-message", "messageId": "u1.run",
        "messages": [user("u1", "Where am I?"), {"id": "u1.run", "role": "assistant",
            "metadata": metadata, "parts": [{"type": "step-start"},
            {"type": "tool-getLocation", "toolCallId": "loc1", "state": "output-available",
             "input": {"precise": true}, "output": {"city": "Berlin"}}]}]});
    let res = post(&s, &me, &next).await;
    assert_eq!(res.status(), 200);
    let reading = tokio::spawn(chunks(res));
    let h = history_with(&s, &rt, "chat-2", "tool.call.finished").await;
    let finished = h
        .iter()
        .find(|e| e["type"] == "tool.call.finished")
        .unwrap();
    assert_eq!(finished["response"], json!({"city": "Berlin"}));
    let mut events = text_events("m2", &["Berlin."]);
    events.push(("run.finished", json!({})));
    run.say(&s, &rt, &events).await;
    let got = reading.await.unwrap();
    let got: Vec<Value> = got
        .into_iter()
        .filter(|c| c["type"] != "data-narad-run")
        .collect();
    assert_eq!(
        types(&got),
        [
            "start",
            "start-step",
            "tool-output-available",
            "text-start",
            "text-delta",
            "text-end",
            "finish-step",
            "finish",
            "[DONE]"
        ]
    );
    assert_eq!(got[0]["messageId"], "u1.run", "the same message, continued");
    assert_eq!(got[2]["output"], json!({"city": "Berlin"}));
    // The same answer again (a retried POST) writes nothing twice.
    let again = chunks(post(&s, &me, &next).await).await;
    assert_eq!(types(&again).last().unwrap(), "[DONE]");
    let h = whole_history(&s, &me, "chat-2").await;
    assert_eq!(
        h.iter()
            .filter(|e| e["type"] == "tool.call.finished")
            .count(),
        1
    );
}

#[tokio::test]
async fn an_approval_round_trip_and_a_decision_made_elsewhere_first_is_409() {
    let s = Server::start_with_runtime(patient()).await;
    let (ann, bob, rt) = (
        person("acme", "ann"),
        person("acme", "bob"),
        backend("acme"),
    );
    let ask = |run: &Held, n: &str| {
        let _ = run;
        vec![
            (
                "interrupt.requested",
                json!({"interruptId": format!("int-{n}"), "waitId": format!("w-{n}"),
                    "kind": "tool.approval", "actions": ["approve", "deny"],
                    "message": "Delete /x?", "input": {"toolName": "fs.delete", "args": {"path": "/x"}}}),
            ),
            (
                "run.paused",
                json!({"waitId": format!("w-{n}"), "reason": "interrupt",
                    "resumeMode": "command", "interruptId": format!("int-{n}")}),
            ),
        ]
    };
    let first = json!({"id": "chat-3", "messages": [user("u1", "Delete /x")]});
    let reading = tokio::spawn(chunks(post(&s, &ann, &first).await));
    let run = claim(&s, &rt).await;
    run.say(&s, &rt, &ask(&run, "1")).await;
    let got = reading.await.unwrap();
    assert_eq!(
        types(&got),
        [
            "start",
            "start-step",
            "tool-input-available",
            "tool-approval-request",
            "finish-step",
            "finish",
            "[DONE]"
        ]
    );
    assert_eq!(got[2]["toolCallId"], "interrupt:int-1");
    assert_eq!(got[2]["toolName"], "fs.delete");
    assert_eq!(got[3]["approvalId"], "int-1");
    assert_eq!(got[3]["reason"], "Delete /x?");
    let metadata = got[5]["messageMetadata"].clone();
    let answer = |approved: bool| {
        json!({"id": "chat-3", "messageId": "u1.run", "trigger": "submit-message",
            "messages": [user("u1", "Delete /x"), {"id": "u1.run", "role": "assistant",
                "metadata": metadata, "parts": [{"type": "step-start"},
                {"type": "tool-fs.delete", "toolCallId": "interrupt:int-1",
                 "state": "approval-responded", "input": {"path": "/x"}, "providerExecuted": true,
                 "approval": {"id": "int-1", "approved": approved, "reason": "fine"}}]}]})
    };
    let reading = tokio::spawn(chunks(post(&s, &ann, &answer(true)).await));
    let h = history_with(&s, &rt, "chat-3", "interrupt.resolved").await;
    let resolved = h
        .iter()
        .find(|e| e["type"] == "interrupt.resolved")
        .unwrap();
    assert_eq!(resolved["decision"], "approve");
    assert_eq!(
        resolved["actor"]["sub"], "ann",
        "the signed-in person decided"
    );
    let mut events = vec![(
        "run.resumed",
        json!({"waitId": "w-1", "interruptId": "int-1"}),
    )];
    events.extend(text_events("m1", &["Deleted."]));
    events.push(("run.finished", json!({})));
    run.say(&s, &rt, &events).await;
    let got = reading.await.unwrap();
    let got: Vec<Value> = got
        .into_iter()
        .filter(|c| c["type"] != "data-narad-run")
        .collect();
    assert_eq!(
        types(&got),
        [
            "start",
            "start-step",
            "tool-approval-response",
            "tool-output-available",
            "text-start",
            "text-delta",
            "text-end",
            "finish-step",
            "finish",
            "[DONE]"
        ]
    );
    assert_eq!(got[2]["approved"], true);

    // A second approval, decided in the console by bob first: ann's answer
    // is refused with the recorded decision, and nothing is written.
    let second = json!({"id": "chat-3", "messages": [user("u2", "Delete /y")]});
    let reading = tokio::spawn(chunks(post(&s, &ann, &second).await));
    let run = claim(&s, &rt).await;
    run.say(&s, &rt, &ask(&run, "2")).await;
    let got = reading.await.unwrap();
    let metadata = got.iter().find(|c| c["type"] == "finish").unwrap()["messageMetadata"].clone();
    s.post(
        "/v1/commands/resolve-interrupt",
        &bob,
        &json!({"sessionId": "chat-3", "interruptId": "int-2", "decision": "deny"}),
    )
    .await
    .expect(200);
    let late = json!({"id": "chat-3", "messageId": "u2.run", "trigger": "submit-message",
        "messages": [{"id": "u2.run", "role": "assistant", "metadata": metadata,
            "parts": [{"type": "tool-fs.delete", "toolCallId": "interrupt:int-2",
             "state": "approval-responded", "input": {"path": "/x"},
             "approval": {"id": "int-2", "approved": true}}]}]});
    let res = post(&s, &ann, &late).await;
    assert_eq!(res.status(), 409);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "NRD-0205");
    assert_eq!(body["details"]["decision"], "deny");
    assert_eq!(body["details"]["actor"]["sub"], "bob");
    // The reconnect shows bob's decision on the approval, and the rest
    // live.
    let res = s
        .http
        .get(format!("{}/v1/chat/chat-3/stream", s.base))
        .bearer_auth(&ann)
        .send()
        .await
        .unwrap();
    let reading = tokio::spawn(chunks(res));
    run.say(
        &s,
        &rt,
        &[
            (
                "run.resumed",
                json!({"waitId": "w-2", "interruptId": "int-2"}),
            ),
            ("run.finished", json!({})),
        ],
    )
    .await;
    let replay = reading.await.unwrap();
    assert_eq!(replay.iter().filter(|c| c["type"] == "start").count(), 1);
    let response = replay
        .iter()
        .find(|c| c["type"] == "tool-approval-response")
        .expect("the decision");
    assert_eq!(response["approved"], false);
    assert!(replay.iter().any(|c| c["type"] == "tool-output-denied"));
}

#[tokio::test]
async fn a_reconnect_is_204_without_an_active_run_and_replays_one_from_start() {
    let s = Server::start_with_runtime(patient()).await;
    let (me, rt) = (person("acme", "ann"), backend("acme"));
    s.post("/v1/sessions", &me, &json!({"sessionId": "chat-4"}))
        .await
        .expect(201);
    assert_eq!(s.get("/v1/chat/chat-4/stream", &me).await.status, 204);
    // A new chat's page resumes on mount before its first message created
    // the session: nothing to resume either, not an error on the page.
    assert_eq!(s.get("/v1/chat/nope/stream", &me).await.status, 204);
    // An id no session can have (over 256 characters) is refused, not
    // answered as a chat not created yet.
    let long = s
        .get(&format!("/v1/chat/{}/stream", "s".repeat(257)), &me)
        .await;
    assert_eq!(long.status, 400, "{}", long.body);
    assert_eq!(long.body["code"], "NRD-0008");
    assert!(
        long.body["fields"]["sessionId"].is_string(),
        "{}",
        long.body
    );
    // The transport keeps the query of its `api` on the reconnect URL: a
    // page posting to `/v1/chat?queue=…` reconnects with `?queue=…` too.
    assert_eq!(
        s.get("/v1/chat/chat-4/stream?queue=support", &me)
            .await
            .status,
        204
    );

    let body = json!({"id": "chat-4", "messages": [user("u1", "Count")]});
    let first = post(&s, &me, &body).await;
    let run = claim(&s, &rt).await;
    run.say(
        &s,
        &rt,
        &[
            (
                "message.text.started",
                json!({"messageId": "m1", "role": "assistant", "messageScope": "run"}),
            ),
            (
                "message.text.delta",
                json!({"messageId": "m1", "delta": "one "}),
            ),
        ],
    )
    .await;
    // The first answer's client goes away mid-answer; a reconnect gets the
    // whole message from start, then the rest live.
    drop(first);
    let res = s
        .http
        .get(format!("{}/v1/chat/chat-4/stream", s.base))
        .bearer_auth(&me)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-vercel-ai-ui-message-stream"], "v1");
    let reading = tokio::spawn(chunks(res));
    tokio::time::sleep(Duration::from_millis(200)).await;
    run.say(
        &s,
        &rt,
        &[
            (
                "message.text.delta",
                json!({"messageId": "m1", "delta": "two"}),
            ),
            ("message.text.completed", json!({"messageId": "m1"})),
            ("run.finished", json!({})),
        ],
    )
    .await;
    let got = reading.await.unwrap();
    assert_eq!(
        types(&got),
        [
            "start",
            "start-step",
            "text-start",
            "text-delta",
            "text-delta",
            "text-end",
            "finish-step",
            "finish",
            "[DONE]"
        ]
    );
    assert_eq!(got[0]["messageId"], "u1.run");
    let text: String = got
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "one two", "once, in order");
}

#[tokio::test]
async fn requests_that_cannot_be_served_are_refused_before_any_streaming() {
    let s = Server::start_with_runtime(patient()).await;
    let me = person("acme", "ann");
    let refused = |body: Value| {
        let s = &s;
        let me = &me;
        async move {
            let res = post(s, me, &body).await;
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap();
            (status, body)
        }
    };
    let (status, body) = refused(json!({"id": "c", "messages": []})).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("NRD-0003")));
    assert!(body["fields"]["/messages"].is_string(), "{body}");
    let (status, body) = refused(json!({"id": "c", "trigger": "regenerate-message",
        "messages": [user("u1", "hi")]}))
    .await;
    assert_eq!((status, body["code"].as_str()), (400, Some("NRD-0003")));
    assert!(body["fields"]["/trigger"].is_string(), "{body}");
    let (status, body) = refused(json!({"id": "c", "messages": [{"id": "u1", "role": "user",
        "parts": [{"type": "file", "mediaType": "image/png", "url": "data:,"}]}]}))
    .await;
    assert_eq!((status, body["code"].as_str()), (400, Some("NRD-0003")));
    assert!(body["fields"]["/messages/0/parts/0"].is_string(), "{body}");
    let (status, body) = refused(json!({"id": "", "messages": [user("u1", "hi")]})).await;
    assert_eq!((status, body["fields"]["/id"].is_string()), (400, true));

    // Roles and the sessions claim, as on every route.
    let reader = token("acme", &[Role::Reader]);
    let res = post(
        &s,
        &reader,
        &json!({"id": "c", "messages": [user("u1", "hi")]}),
    )
    .await;
    assert_eq!(res.status(), 403);
    let mut limited = claims("acme", "ann", &[Role::Reader, Role::Writer]);
    limited.sessions = Some(vec!["mine".into()]);
    let res = post(
        &s,
        &hs256(&limited),
        &json!({"id": "c", "messages": [user("u1", "hi")]}),
    )
    .await;
    assert_eq!(res.status(), 403);
    let res = s
        .http
        .post(format!("{}/v1/chat", s.base))
        .json(&json!({"id": "c", "messages": [user("u1", "hi")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);

    // A new message while the session's run is active: 409, nothing
    // recorded.
    let first = post(
        &s,
        &me,
        &json!({"id": "busy", "messages": [user("u1", "one")]}),
    )
    .await;
    assert_eq!(first.status(), 200);
    let (status, body) = refused(json!({"id": "busy", "messages": [user("u2", "two")]})).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("NRD-0204")));
    assert_eq!(body["details"]["activeExecution"]["runId"], "u1.run");
    let h = whole_history(&s, &me, "busy").await;
    assert_eq!(
        h.iter()
            .filter(|e| e["type"] == "message.user.recorded")
            .count(),
        1
    );
    // A ticket for the session's stream opens its chat (with the roles of
    // the token that asked for it).
    let t = s
        .post(
            "/v1/stream-tickets",
            &me,
            &json!({"stream": "session", "sessionId": "busy"}),
        )
        .await;
    let ticket = t.expect(201)["ticket"].as_str().unwrap().to_owned();
    let res = s
        .http
        .get(format!("{}/v1/chat/busy/stream?ticket={ticket}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = s
        .http
        .get(format!("{}/v1/chat/other/stream?ticket={ticket}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
}

/// Settings whose abort grace is short: a broken-off stream stops its run
/// within a test's patience.
fn quick_abort() -> RuntimeSettings {
    RuntimeSettings {
        front_end_abort_grace: Some(Duration::from_millis(300)),
        ..patient()
    }
}

/// The session's `run.stop.requested` events after `wait`.
async fn stops_after(s: &Server, jwt: &str, session: &str, wait: Duration) -> Vec<Value> {
    tokio::time::sleep(wait).await;
    whole_history(s, jwt, session)
        .await
        .into_iter()
        .filter(|e| e["type"] == "run.stop.requested")
        .collect()
}

#[tokio::test]
async fn an_abort_stops_the_run_after_the_grace_unless_a_front_end_comes_back() {
    let s = Server::start_with_runtime(quick_abort()).await;
    let other = s.replica_with_runtime(quick_abort()).await;
    let (me, rt) = (person("acme", "ann"), backend("acme"));

    // The transport's abort (`stop()`): the stream is broken off mid-answer
    // and nobody comes back. The run is asked to stop, by the person.
    let aborted = post(
        &s,
        &me,
        &json!({"id": "chat-a", "messages": [user("u1", "Go")]}),
    )
    .await;
    let run = claim(&s, &rt).await;
    run.say(&s, &rt, &text_events("m1", &["one "])[..2]).await;
    drop(aborted);
    let stop = history_with(&s, &rt, "chat-a", "run.stop.requested").await;
    let stop: Vec<&Value> = stop
        .iter()
        .filter(|e| e["type"] == "run.stop.requested")
        .collect();
    assert_eq!(stop.len(), 1);
    assert_eq!(stop[0]["runId"], run.run.as_str());
    assert_eq!(stop[0]["reason"], "front_end.abort");
    assert_eq!(stop[0]["actor"]["sub"], "ann", "{}", stop[0]);

    // A reload with `resume: true`: broken off, and the page reconnects
    // within the grace, on another replica. Nothing is stopped; the
    // reconnected page gets the answer to its end.
    let reloaded = post(
        &s,
        &me,
        &json!({"id": "chat-b", "messages": [user("u2", "Go")]}),
    )
    .await;
    let run = claim(&s, &rt).await;
    run.say(&s, &rt, &text_events("m2", &["one "])[..2]).await;
    drop(reloaded);
    let res = other
        .http
        .get(format!("{}/v1/chat/chat-b/stream", other.base))
        .bearer_auth(&me)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let reading = tokio::spawn(chunks(res));
    assert_eq!(
        stops_after(&s, &rt, "chat-b", Duration::from_millis(900)).await,
        Vec::<Value>::new()
    );
    run.say(
        &s,
        &rt,
        &[
            ("message.text.completed", json!({"messageId": "m2"})),
            ("run.finished", json!({})),
        ],
    )
    .await;
    let got = reading.await.unwrap();
    assert_eq!(got[got.len() - 2]["finishReason"], "stop");

    // A stream that ended with its answer stops nothing, and neither does
    // one broken off after its run ended.
    let done = post(
        &s,
        &me,
        &json!({"id": "chat-c", "messages": [user("u3", "Go")]}),
    )
    .await;
    let run = claim(&s, &rt).await;
    let mut events = text_events("m3", &["done"]);
    events.push(("run.finished", json!({})));
    run.say(&s, &rt, &events).await;
    assert_eq!(types(&chunks(done).await).last().unwrap(), "[DONE]");
    assert_eq!(
        stops_after(&s, &rt, "chat-c", Duration::from_millis(900)).await,
        Vec::<Value>::new()
    );
}

#[tokio::test]
async fn with_no_abort_grace_a_broken_off_stream_stops_nothing() {
    let s = Server::start_with_runtime(RuntimeSettings {
        front_end_abort_grace: None,
        ..patient()
    })
    .await;
    let (me, rt) = (person("acme", "ann"), backend("acme"));
    let aborted = post(
        &s,
        &me,
        &json!({"id": "chat-d", "messages": [user("u1", "Go")]}),
    )
    .await;
    let run = claim(&s, &rt).await;
    run.say(&s, &rt, &text_events("m1", &["one "])[..2]).await;
    drop(aborted);
    assert_eq!(
        stops_after(&s, &rt, "chat-d", Duration::from_millis(700)).await,
        Vec::<Value>::new()
    );
}
