//! Client executors (§11) end to end: a real server (two replicas where it
//! matters), real Postgres, executors over WebSocket and over HTTP.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use narad_server::auth::Role;
use narad_server::executors::ExecutorSettings;
use narad_tests::{Server, claims, hs256, session_with_run, token};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Timing short enough for tests: heartbeats every 200 ms, leases of 1 s,
/// tokens of 2 s, delivery given up after 3 s, sweeps every 100 ms.
fn quick() -> ExecutorSettings {
    ExecutorSettings {
        heartbeat_interval: Duration::from_millis(200),
        lease_ttl: Duration::from_millis(1_000),
        token_ttl: Duration::from_millis(2_000),
        delivery_timeout: Duration::from_millis(3_000),
        sweep_interval: Duration::from_millis(100),
    }
}

/// Timing where nothing lapses within a test.
fn patient() -> ExecutorSettings {
    ExecutorSettings {
        heartbeat_interval: Duration::from_millis(200),
        lease_ttl: Duration::from_secs(60),
        token_ttl: Duration::from_secs(60),
        delivery_timeout: Duration::from_secs(60),
        sweep_interval: Duration::from_millis(100),
    }
}

fn executor_token(org: &str, ids: Option<&[&str]>) -> String {
    let mut c = claims(org, "desktop", &[Role::Executor]);
    c.executors = ids.map(|ids| ids.iter().map(|s| s.to_string()).collect());
    hs256(&c)
}

fn backend(org: &str) -> String {
    token(org, &[Role::Reader, Role::Writer, Role::Backend])
}

/// An executor attached over WebSocket.
struct Ws {
    socket: Socket,
    attached: Value,
}

impl Ws {
    async fn connect(s: &Server, id: &str, jwt: &str) -> Result<Ws, u16> {
        let url = format!("{}/v1/executors/{id}/connect", s.base.replace("http", "ws"));
        let mut req = url.into_client_request().expect("a request");
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {jwt}").parse().expect("a header"),
        );
        let (socket, _) = match tokio_tungstenite::connect_async(req).await {
            Ok(ok) => ok,
            Err(tokio_tungstenite::tungstenite::Error::Http(res)) => {
                return Err(res.status().as_u16());
            }
            Err(e) => panic!("cannot connect: {e}"),
        };
        let mut ws = Ws {
            socket,
            attached: Value::Null,
        };
        ws.attached = ws.next_control().await.expect("client.attached");
        assert_eq!(ws.attached["type"], "client.attached");
        Ok(ws)
    }

    fn lease(&self) -> &str {
        self.attached["leaseId"].as_str().expect("a lease")
    }

    /// The next control message other than a heartbeat, within 5 s.
    async fn next_control(&mut self) -> Option<Value> {
        self.next_within(Duration::from_secs(5)).await
    }

    /// The next control message other than a heartbeat within `wait`.
    async fn next_within(&mut self, wait: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .ok()??;
            match msg.ok()? {
                Message::Text(t) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
                    assert_eq!(v["protocolVersion"], "narad/v1");
                    if v["type"] != "server.heartbeat" {
                        return Some(v);
                    }
                }
                Message::Close(_) => return None,
                _ => {}
            }
        }
    }

    /// The close code the server ends the socket with, within `wait`.
    async fn close_code(&mut self, wait: Duration) -> Option<u16> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .ok()??;
            if let Message::Close(frame) = msg.ok()? {
                return frame.map(|f| u16::from(f.code));
            }
        }
    }

    async fn send(&mut self, v: &Value) {
        self.socket
            .send(Message::Text(v.to_string().into()))
            .await
            .expect("sent");
    }

    async fn heartbeat(&mut self, id: &str) {
        let beat = json!({"type": "client.heartbeat", "protocolVersion": "narad/v1",
            "clientExecutorId": id, "leaseId": self.lease()});
        self.socket
            .send(Message::Text(beat.to_string().into()))
            .await
            .expect("sent");
    }
}

/// Session s1 with run r1 bound to executor `desk`, attached over a
/// socket, and client call tc1 (args `{}`) delivered to it: the backend's
/// token, the executor's token, the socket and the `client.tool.execute`.
async fn one_call(s: &Server) -> (String, String, Ws, Value) {
    let b = backend("acme");
    let e = executor_token("acme", None);
    session_for(s, &b, "s1", "desk").await;
    let mut ws = Ws::connect(s, "desk", &e).await.expect("attached");
    start_call(s, &b, "s1", "tc1", json!({})).await;
    let execute = ws.next_control().await.expect("execute");
    (b, e, ws, execute)
}

/// Timing for tests where only the lease may lapse.
fn leases_lapse() -> ExecutorSettings {
    ExecutorSettings {
        token_ttl: Duration::from_secs(30),
        delivery_timeout: Duration::from_secs(30),
        ..quick()
    }
}

/// A session with run r1 bound to `executor`.
async fn session_for(s: &Server, jwt: &str, session: &str, executor: &str) {
    session_with_run(s, jwt, session, "r1", Some(executor)).await;
}

/// Starts client tool call `call` of run r1.
async fn start_call(s: &Server, jwt: &str, session: &str, call: &str, args: Value) {
    s.post(
        &format!("/v1/sessions/{session}/events"),
        jwt,
        &json!({"events": [{"protocolVersion": "narad/v1", "type": "tool.call.started",
            "eventId": format!("start-{call}"), "rootRunId": "r1", "runId": "r1",
            "toolCallId": call, "toolName": "open.file", "executor": "client", "args": args}]}),
    )
    .await
    .expect(201);
}

fn finish_body(execute: &Value, lease: &str, outcome: &str, response: Value) -> Value {
    json!({"type": "client.tool.finish", "protocolVersion": "narad/v1",
        "executionToken": execute["executionToken"], "outcome": outcome, "response": response,
        "clientExecutorId": execute["clientExecutorId"], "leaseId": lease,
        "toolCallId": execute["toolCallId"]})
}

async fn history(s: &Server, jwt: &str, session: &str) -> Vec<Value> {
    let page = s
        .get(&format!("/v1/sessions/{session}/events?limit=1000"), jwt)
        .await;
    page.expect(200)["events"]
        .as_array()
        .expect("events")
        .clone()
}

fn of_type<'a>(events: &'a [Value], t: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == t).collect()
}

/// Waits up to `seconds` for the session's history to hold `n` events of
/// type `t`.
async fn wait_for(s: &Server, jwt: &str, session: &str, t: &str, n: usize, seconds: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        let events = history(s, jwt, session).await;
        if of_type(&events, t).len() >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {n} × {t} within {seconds} s: {events:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn attach_execute_finish_and_repeat() {
    let s = Server::start_with_executors(patient()).await;
    let b = backend("acme");
    let e = executor_token("acme", None);
    session_for(&s, &b, "s1", "desk").await;
    let mut ws = Ws::connect(&s, "desk", &e).await.expect("attached");
    // §11.1: client.attached carries a lease, the heartbeat interval and
    // the lease's expiry.
    assert_eq!(ws.attached["clientExecutorId"], "desk");
    assert_eq!(ws.attached["heartbeatIntervalMs"], 200);
    assert!(ws.attached["leaseExpiresAt"].as_str().is_some());

    let args = json!({"path": "/tmp/a", "nested": {"n": [1, 2]}});
    start_call(&s, &b, "s1", "tc1", args.clone()).await;
    let execute = ws.next_control().await.expect("client.tool.execute");
    // Rule 3: toolName and args exactly as started; bound to this lease.
    assert_eq!(execute["type"], "client.tool.execute");
    assert_eq!(execute["toolCallId"], "tc1");
    assert_eq!(execute["toolName"], "open.file");
    assert_eq!(execute["args"], args);
    assert_eq!(execute["leaseId"], ws.lease());
    assert!(execute["executionTokenExpiresAt"].as_str().is_some());
    // Exactly one control per call, even as heartbeats go by.
    ws.heartbeat("desk").await;
    assert_eq!(ws.next_within(Duration::from_millis(700)).await, None);

    // Rules 6–7: the terminal carries exactly the finish's outcome and
    // response.
    let response = json!({"bytes": 12, "text": "hello"});
    let body = finish_body(&execute, ws.lease(), "success", response.clone());
    let first = s.post("/v1/executors/desk/finish", &e, &body).await;
    let first = first.expect(200).clone();
    assert_eq!(first["duplicate"], false);
    let events = history(&s, &b, "s1").await;
    let finished = of_type(&events, "tool.call.finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"], "success");
    assert_eq!(finished[0]["response"], response);
    assert_eq!(finished[0]["eventId"], first["eventId"]);

    // Rule 8: the same finish again is idempotent, another is refused.
    let again = s.post("/v1/executors/desk/finish", &e, &body).await;
    assert_eq!(again.expect(200)["duplicate"], true);
    assert_eq!(again.body["eventId"], first["eventId"]);
    let other = finish_body(&execute, ws.lease(), "error", json!("changed my mind"));
    let other = s.post("/v1/executors/desk/finish", &e, &other).await;
    assert_eq!((other.status, other.code()), (409, "NRD-0404"));
    let events = history(&s, &b, "s1").await;
    assert_eq!(of_type(&events, "tool.call.finished").len(), 1);
}

#[tokio::test]
async fn controls_reach_only_the_bound_executor_across_replicas() {
    let a_server = Server::start_with_executors(patient()).await;
    let b_server = a_server.replica_with_executors(patient()).await;
    let b = backend("acme");
    let e = executor_token("acme", None);
    session_for(&a_server, &b, "sa", "exec-a").await;
    session_for(&a_server, &b, "sb", "exec-b").await;
    // Executor a attached to replica B; the call is started through A.
    let mut wa = Ws::connect(&b_server, "exec-a", &e).await.expect("a");
    let mut wb = Ws::connect(&a_server, "exec-b", &e).await.expect("b");
    start_call(&a_server, &b, "sa", "ta", json!({"for": "a"})).await;
    let got = wa.next_control().await.expect("a's control");
    assert_eq!(got["toolCallId"], "ta");
    assert_eq!(got["clientExecutorId"], "exec-a");
    // Rule 1: b never sees a's control.
    assert_eq!(wb.next_within(Duration::from_millis(800)).await, None);
    start_call(&a_server, &b, "sb", "tb", json!({"for": "b"})).await;
    let got = wb.next_control().await.expect("b's control");
    assert_eq!(got["toolCallId"], "tb");
    assert_eq!(wa.next_within(Duration::from_millis(500)).await, None);
}

#[tokio::test]
async fn forged_foreign_and_misdirected_finishes_are_refused() {
    let s = Server::start_with_executors(patient()).await;
    let (b, e, ws, execute) = one_call(&s).await;
    let lease = ws.lease().to_owned();

    // Forged token.
    let mut forged = finish_body(&execute, &lease, "success", json!(1));
    forged["executionToken"] = json!("0".repeat(64));
    let r = s.post("/v1/executors/desk/finish", &e, &forged).await;
    assert_eq!((r.status, r.code()), (403, "NRD-0402"));
    // Another executor of the same tenant presenting it.
    let mut other = finish_body(&execute, &lease, "success", json!(1));
    other["clientExecutorId"] = json!("laptop");
    let r = s.post("/v1/executors/laptop/finish", &e, &other).await;
    assert_eq!((r.status, r.code()), (403, "NRD-0402"));
    // Another tenant's executor presenting it.
    let foreign = executor_token("globex", None);
    let r = s
        .post(
            "/v1/executors/desk/finish",
            &foreign,
            &finish_body(&execute, &lease, "success", json!(1)),
        )
        .await;
    assert_eq!((r.status, r.code()), (403, "NRD-0402"));
    // Another call's id beside the token.
    let mut wrong_call = finish_body(&execute, &lease, "success", json!(1));
    wrong_call["toolCallId"] = json!("tc-other");
    let r = s.post("/v1/executors/desk/finish", &e, &wrong_call).await;
    assert_eq!((r.status, r.code()), (403, "NRD-0402"));
    // A lease other than the token's.
    let r = s
        .post(
            "/v1/executors/desk/finish",
            &e,
            &finish_body(&execute, "not-the-lease", "success", json!(1)),
        )
        .await;
    assert_eq!((r.status, r.code()), (409, "NRD-0401"));
    // Nothing of it was written.
    let events = history(&s, &b, "s1").await;
    assert!(of_type(&events, "tool.call.finished").is_empty());
    // The genuine finish still lands.
    let r = s
        .post(
            "/v1/executors/desk/finish",
            &e,
            &finish_body(&execute, &lease, "success", json!(1)),
        )
        .await;
    r.expect(200);
}

#[tokio::test]
async fn attaching_needs_the_executor_role_and_a_listed_id() {
    let s = Server::start_with_executors(patient()).await;
    let limited = executor_token("acme", Some(&["desk"]));
    assert!(Ws::connect(&s, "desk", &limited).await.is_ok());
    assert_eq!(Ws::connect(&s, "laptop", &limited).await.err(), Some(403));
    let reader = token("acme", &[Role::Reader, Role::Writer, Role::Backend]);
    assert_eq!(Ws::connect(&s, "desk", &reader).await.err(), Some(403));
    let r = s
        .post("/v1/executors/laptop/attach", &limited, &json!({}))
        .await;
    assert_eq!((r.status, r.code()), (403, "NRD-0102"));
}

#[tokio::test]
async fn a_superseded_lease_finishes_its_own_token_and_the_new_lease_cannot_claim_it() {
    let s = Server::start_with_executors(patient()).await;
    let b = backend("acme");
    let e = executor_token("acme", None);
    session_for(&s, &b, "s1", "desk").await;
    let mut first = Ws::connect(&s, "desk", &e).await.expect("attached");
    start_call(&s, &b, "s1", "tc1", json!({})).await;
    let execute = first.next_control().await.expect("execute");
    let old_lease = first.lease().to_owned();
    // Reattachment: a new lease, superseding the first.
    let mut second = Ws::connect(&s, "desk", &e).await.expect("reattached");
    assert_ne!(second.lease(), old_lease);
    // The old connection's heartbeat is refused: its socket closes.
    first.heartbeat("desk").await;
    assert_eq!(first.next_control().await, None, "closed");
    // A new call goes to the new lease only.
    start_call(&s, &b, "s1", "tc2", json!({})).await;
    let execute2 = second.next_control().await.expect("execute tc2");
    assert_eq!(execute2["toolCallId"], "tc2");
    assert_eq!(execute2["leaseId"], second.lease());
    // The new lease cannot claim the old token…
    let claim = finish_body(&execute, second.lease(), "success", json!("x"));
    let r = s.post("/v1/executors/desk/finish", &e, &claim).await;
    assert_eq!((r.status, r.code()), (409, "NRD-0401"));
    // …and the old lease may still finish it (§11.1's one exception).
    let r = s
        .post(
            "/v1/executors/desk/finish",
            &e,
            &finish_body(&execute, &old_lease, "success", json!("x")),
        )
        .await;
    r.expect(200);
    // The HTTP heartbeat of the superseded lease is refused too.
    let beat = json!({"type": "client.heartbeat", "protocolVersion": "narad/v1",
        "clientExecutorId": "desk", "leaseId": old_lease});
    let r = s.post("/v1/executors/desk/heartbeat", &e, &beat).await;
    assert_eq!((r.status, r.code()), (409, "NRD-0401"));
}

#[tokio::test]
async fn an_expired_token_closes_its_call_exactly_once_with_two_sweepers() {
    let a = Server::start_with_executors(quick()).await;
    let replica = a.replica_with_executors(quick()).await;
    let b = backend("acme");
    let e = executor_token("acme", None);
    session_for(&a, &b, "s1", "desk").await;
    let mut ws = Ws::connect(&a, "desk", &e).await.expect("attached");
    start_call(&a, &b, "s1", "tc1", json!({})).await;
    let execute = ws.next_control().await.expect("execute");
    // Keep the lease alive, never finish.
    for _ in 0..15 {
        ws.heartbeat("desk").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for(&a, &b, "s1", "tool.call.finished", 1, 5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = history(&a, &b, "s1").await;
    let finished = of_type(&events, "tool.call.finished");
    assert_eq!(finished.len(), 1, "{events:#?}");
    assert_eq!(finished[0]["outcome"], "error");
    assert_eq!(finished[0]["code"], "client_execution_expired");
    // A finish after expiry is refused and writes nothing.
    let r = replica
        .post(
            "/v1/executors/desk/finish",
            &e,
            &finish_body(&execute, ws.lease(), "success", json!(1)),
        )
        .await;
    assert_eq!((r.status, r.code()), (410, "NRD-0403"));
    assert_eq!(
        of_type(&history(&a, &b, "s1").await, "tool.call.finished").len(),
        1
    );
}

#[tokio::test]
async fn an_executor_gone_mid_call_pauses_the_run_and_its_return_resumes_it() {
    let s = Server::start_with_executors(leases_lapse()).await;
    let (b, e, ws, execute) = one_call(&s).await;
    let old_lease = ws.lease().to_owned();
    drop(ws); // killed: no more heartbeats
    wait_for(&s, &b, "s1", "run.paused", 1, 5).await;
    let events = history(&s, &b, "s1").await;
    let paused = of_type(&events, "run.paused")[0];
    assert_eq!(paused["reason"], "client_executor_unavailable");
    assert_eq!(paused["resumeMode"], "automatic");
    // Missing heartbeats never end the run (§11.2).
    assert!(of_type(&events, "run.error").is_empty());
    assert!(of_type(&events, "tool.call.finished").is_empty());

    let _back = Ws::connect(&s, "desk", &e).await.expect("reattached");
    wait_for(&s, &b, "s1", "run.resumed", 1, 5).await;
    let events = history(&s, &b, "s1").await;
    let resumed = of_type(&events, "run.resumed");
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0]["waitId"], paused["waitId"]);
    // The restarted executor finishes the accepted token under its
    // original lease.
    let mut body = finish_body(&execute, &old_lease, "error", json!(null));
    body["code"] = json!("client_restarted");
    s.post("/v1/executors/desk/finish", &e, &body)
        .await
        .expect(200);
    let events = history(&s, &b, "s1").await;
    assert_eq!(
        of_type(&events, "tool.call.finished")[0]["code"],
        "client_restarted"
    );
}

#[tokio::test]
async fn a_call_no_executor_takes_is_closed_unavailable_and_its_run_resumes() {
    let s = Server::start_with_executors(quick()).await;
    let b = backend("acme");
    session_for(&s, &b, "s1", "nobody-home").await;
    start_call(&s, &b, "s1", "tc1", json!({})).await;
    wait_for(&s, &b, "s1", "run.paused", 1, 5).await;
    wait_for(&s, &b, "s1", "tool.call.finished", 1, 8).await;
    wait_for(&s, &b, "s1", "run.resumed", 1, 5).await;
    let events = history(&s, &b, "s1").await;
    let finished = of_type(&events, "tool.call.finished");
    assert_eq!(finished[0]["outcome"], "error");
    assert_eq!(finished[0]["code"], "client_unavailable");
    // The run may now end: nothing of it is open or paused.
    s.post(
        "/v1/sessions/s1/events",
        &b,
        &json!({"events": [{"protocolVersion": "narad/v1", "type": "run.finished",
            "eventId": "end", "rootRunId": "r1", "runId": "r1"}]}),
    )
    .await
    .expect(201);
}

#[tokio::test]
async fn a_stop_during_a_client_call_cancels_it() {
    let s = Server::start_with_executors(quick()).await;
    let (b, _, mut ws, _) = one_call(&s).await;
    s.post(
        "/v1/commands/stop-run",
        &b,
        &json!({"runId": "r1", "reason": "user"}),
    )
    .await
    .expect(200);
    for _ in 0..15 {
        ws.heartbeat("desk").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for(&s, &b, "s1", "tool.call.finished", 1, 5).await;
    let events = history(&s, &b, "s1").await;
    let finished = of_type(&events, "tool.call.finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"], "cancelled");
    // A call started before the stop but never delivered is cancelled at
    // once.
    let s2 = Server::start_with_executors(quick()).await;
    session_for(&s2, &b, "s2", "away").await;
    start_call(&s2, &b, "s2", "tc2", json!({})).await;
    s2.post("/v1/commands/stop-run", &b, &json!({"runId": "r1"}))
        .await
        .expect(200);
    wait_for(&s2, &b, "s2", "tool.call.finished", 1, 2).await;
    let events = history(&s2, &b, "s2").await;
    assert_eq!(
        of_type(&events, "tool.call.finished")[0]["outcome"],
        "cancelled"
    );
}

#[tokio::test]
async fn the_http_form_attaches_polls_and_renews() {
    let s = Server::start_with_executors(patient()).await;
    let b = backend("acme");
    let e = executor_token("acme", None);
    session_for(&s, &b, "s1", "poller").await;
    let attached = s.post("/v1/executors/poller/attach", &e, &json!({})).await;
    let lease = attached.expect(201)["leaseId"]
        .as_str()
        .expect("a lease")
        .to_owned();
    assert_eq!(attached.body["type"], "client.attached");
    // Nothing waits yet: an empty answer after the wait.
    let empty = s
        .get(
            &format!("/v1/executors/poller/controls?leaseId={lease}&waitMs=200"),
            &e,
        )
        .await;
    assert_eq!(empty.expect(200)["controls"], json!([]));
    // A poll waiting when the call starts receives it.
    let poll = {
        let (base, e, lease) = (s.base.clone(), e.clone(), lease.clone());
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .get(format!(
                    "{base}/v1/executors/poller/controls?leaseId={lease}&waitMs=10000"
                ))
                .bearer_auth(e)
                .send()
                .await
                .expect("answers");
            r.json::<Value>().await.expect("JSON")
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    start_call(&s, &b, "s1", "tc1", json!({"k": "v"})).await;
    let got = poll.await.expect("the poll");
    let controls = got["controls"].as_array().expect("controls");
    assert_eq!(controls.len(), 1);
    assert_eq!(controls[0]["type"], "client.tool.execute");
    assert_eq!(controls[0]["args"], json!({"k": "v"}));
    // Handed out once: the next poll finds nothing.
    let again = s
        .get(
            &format!("/v1/executors/poller/controls?leaseId={lease}&waitMs=0"),
            &e,
        )
        .await;
    assert_eq!(again.expect(200)["controls"], json!([]));
    let beat = json!({"type": "client.heartbeat", "protocolVersion": "narad/v1",
        "clientExecutorId": "poller", "leaseId": lease});
    let renewed = s.post("/v1/executors/poller/heartbeat", &e, &beat).await;
    assert_eq!(renewed.expect(200)["leaseId"], lease.as_str());
    let r = s
        .post(
            "/v1/executors/poller/finish",
            &e,
            &finish_body(&controls[0], &lease, "success", json!({"ok": true})),
        )
        .await;
    r.expect(200);
    // An unknown lease polls nothing: 409.
    let r = s
        .get("/v1/executors/poller/controls?leaseId=nope", &e)
        .await;
    assert_eq!((r.status, r.code()), (409, "NRD-0401"));
}

/// Polls `controls` under `lease` (waiting up to `wait_ms`): the status,
/// the error code and how long the answer took.
async fn timed_poll(
    base: &str,
    e: &str,
    executor: &str,
    lease: &str,
    wait_ms: u64,
) -> (u16, String, Duration) {
    let started = tokio::time::Instant::now();
    let r = reqwest::Client::new()
        .get(format!(
            "{base}/v1/executors/{executor}/controls?leaseId={lease}&waitMs={wait_ms}"
        ))
        .bearer_auth(e)
        .send()
        .await
        .expect("answers");
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("JSON");
    let code = body["code"].as_str().unwrap_or_default().to_owned();
    (status, code, started.elapsed())
}

#[tokio::test]
async fn a_poll_under_a_lease_superseded_meanwhile_answers_409_at_once() {
    // Heartbeats far apart: only the attachment's wakeup can end the poll
    // before its 20 s.
    let s = Server::start_with_executors(ExecutorSettings {
        heartbeat_interval: Duration::from_secs(25),
        lease_ttl: Duration::from_secs(60),
        ..patient()
    })
    .await;
    let e = executor_token("acme", None);
    for by_socket in [false, true] {
        let attached = s.post("/v1/executors/desk/attach", &e, &json!({})).await;
        let lease = attached.expect(201)["leaseId"]
            .as_str()
            .expect("a lease")
            .to_owned();
        let poll = {
            let (base, e) = (s.base.clone(), e.clone());
            tokio::spawn(async move { timed_poll(&base, &e, "desk", &lease, 20_000).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _socket = if by_socket {
            Some(Ws::connect(&s, "desk", &e).await.expect("attached"))
        } else {
            s.post("/v1/executors/desk/attach", &e, &json!({}))
                .await
                .expect(201);
            None
        };
        let (status, code, took) = poll.await.expect("the poll");
        assert_eq!((status, code.as_str()), (409, "NRD-0401"));
        assert!(
            took < Duration::from_secs(10),
            "answered after {took:?}, not at the attachment"
        );
    }
}

#[tokio::test]
async fn a_poll_whose_lease_lapses_meanwhile_answers_409_before_its_wait() {
    let s = Server::start_with_executors(quick()).await;
    let e = executor_token("acme", None);
    let attached = s.post("/v1/executors/desk/attach", &e, &json!({})).await;
    let lease = attached.expect(201)["leaseId"]
        .as_str()
        .expect("a lease")
        .to_owned();
    // No heartbeat: the lease (1 s) lapses long before the 20 s wait.
    let (status, code, took) = timed_poll(&s.base, &e, "desk", &lease, 20_000).await;
    assert_eq!((status, code.as_str()), (409, "NRD-0401"));
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
}

#[tokio::test]
async fn a_finish_on_the_socket_is_recorded_and_a_silent_executor_is_let_go() {
    let s = Server::start_with_executors(quick()).await;
    let (b, e, mut ws, execute) = one_call(&s).await;
    // The socket's finish needs no leaseId: the connection's lease is the
    // token's.
    let mut finish = finish_body(&execute, ws.lease(), "success", json!({"on": "socket"}));
    finish.as_object_mut().expect("an object").remove("leaseId");
    ws.send(&finish).await;
    wait_for(&s, &b, "s1", "tool.call.finished", 1, 5).await;
    let events = history(&s, &b, "s1").await;
    assert_eq!(
        of_type(&events, "tool.call.finished")[0]["response"],
        json!({"on": "socket"})
    );
    // No heartbeats from here on: after a whole lease the server closes
    // the socket with 4002.
    assert_eq!(
        ws.close_code(Duration::from_secs(5)).await,
        Some(narad_server::executors::close::HEARTBEATS_MISSING)
    );
    // Anything but a control closes the socket with 1008.
    let mut ws = Ws::connect(&s, "desk", &e).await.expect("attached");
    ws.send(&json!({"type": "tool.call.started", "protocolVersion": "narad/v1"}))
        .await;
    assert_eq!(
        ws.close_code(Duration::from_secs(5)).await,
        Some(narad_server::executors::close::PROTOCOL)
    );
}

#[tokio::test]
async fn a_finish_under_the_old_lease_resumes_a_run_whose_executor_stays_away() {
    let s = Server::start_with_executors(leases_lapse()).await;
    let (b, e, ws, execute) = one_call(&s).await;
    let lease = ws.lease().to_owned();
    drop(ws);
    wait_for(&s, &b, "s1", "run.paused", 1, 5).await;
    // A one-shot worker reports its result and never attaches again: the
    // run no longer waits on it, so it resumes.
    s.post(
        "/v1/executors/desk/finish",
        &e,
        &finish_body(&execute, &lease, "success", json!("done")),
    )
    .await
    .expect(200);
    wait_for(&s, &b, "s1", "run.resumed", 1, 5).await;
}

#[tokio::test]
async fn a_goodbye_makes_the_executor_unavailable_at_once() {
    // Leases of a minute: only the goodbye can explain a prompt pause.
    let s = Server::start_with_executors(patient()).await;
    let (b, _, mut ws, _) = one_call(&s).await;
    ws.socket.close(None).await.expect("closes");
    wait_for(&s, &b, "s1", "run.paused", 1, 5).await;
}

#[tokio::test]
async fn calls_closed_undelivered_or_of_a_stopping_run_are_never_handed_out() {
    // A sweeper that never comes: the journal's own guards are tested.
    let s = Server::start_with_executors(ExecutorSettings {
        sweep_interval: Duration::from_secs(3600),
        ..patient()
    })
    .await;
    let b = backend("acme");
    session_for(&s, &b, "s1", "desk").await;
    let journal = narad_journal::Journal::connect(s.db.url(), 2).expect("a journal");
    let tenant = narad_journal::TenantId::new("acme").expect("an id");
    let lease = journal
        .attach_executor(&tenant, "desk", Duration::from_secs(60))
        .await
        .expect("a lease");
    let deliver = || {
        journal.deliver_client_calls(
            &tenant,
            "desk",
            &lease.lease_id,
            Duration::from_secs(60),
            10,
        )
    };
    // Delivered first: closing it as undelivered does nothing.
    start_call(&s, &b, "s1", "tc1", json!({})).await;
    assert_eq!(deliver().await.expect("delivers").len(), 1);
    let closed = journal
        .close_client_call(
            &tenant,
            "s1",
            "tc1",
            true,
            ("error", "client_unavailable", "x"),
        )
        .await
        .expect("answers");
    assert!(!closed, "a delivered call is not closed as undelivered");
    assert!(of_type(&history(&s, &b, "s1").await, "tool.call.finished").is_empty());
    // Closed as undelivered first: it is never handed out.
    start_call(&s, &b, "s1", "tc2", json!({})).await;
    let closed = journal
        .close_client_call(
            &tenant,
            "s1",
            "tc2",
            true,
            ("error", "client_unavailable", "x"),
        )
        .await
        .expect("answers");
    assert!(closed);
    assert!(deliver().await.expect("delivers").is_empty());
    // A call of a run asked to stop is not handed out either.
    start_call(&s, &b, "s1", "tc3", json!({})).await;
    s.post("/v1/commands/stop-run", &b, &json!({"runId": "r1"}))
        .await
        .expect(200);
    assert!(deliver().await.expect("delivers").is_empty());
}

/// A stopping server closes executor sockets with 1001 (going away): the
/// executor attaches again elsewhere.
#[tokio::test]
async fn a_stopping_server_closes_executor_sockets_going_away() {
    let s = Server::start_with_executors(patient()).await;
    let mut ws = Ws::connect(&s, "desk-1", &executor_token("acme", None))
        .await
        .expect("attaches");
    // The database outlives the server, as a real one does.
    let _db = s.db.clone();
    let stopping = tokio::spawn(s.stop());
    assert_eq!(ws.close_code(Duration::from_secs(10)).await, Some(1001));
    stopping.await.expect("the server stops");
}

/// An expiry close is a fact about the token: the server writes
/// `client_execution_expired` only once a token was issued for the call and
/// its expiry has passed, whoever asks it to (§11.3 rule 9).
#[tokio::test]
async fn an_expiry_close_waits_for_the_tokens_real_expiry() {
    let a = Server::start_with_executors(ExecutorSettings {
        sweep_interval: Duration::from_secs(3600),
        ..quick()
    })
    .await;
    let b = backend("acme");
    let e = executor_token("acme", None);
    session_for(&a, &b, "s1", "desk").await;
    let mut ws = Ws::connect(&a, "desk", &e).await.expect("attached");
    start_call(&a, &b, "s1", "tc1", json!({})).await;
    ws.next_control().await.expect("execute");
    let journal = narad_journal::Journal::connect(a.db.url(), 2).unwrap();
    let tenant = narad_journal::TenantId::new("acme").unwrap();
    let expire = || {
        journal.close_client_call(
            &tenant,
            "s1",
            "tc1",
            false,
            ("error", "client_execution_expired", "the token expired"),
        )
    };
    assert!(!expire().await.unwrap(), "closed while its token is live");
    assert!(of_type(&history(&a, &b, "s1").await, "tool.call.finished").is_empty());
    let (db, conn) = tokio_postgres::connect(a.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    db.execute(
        "update client_calls set token_expires_at = now() - interval '1 second' \
         where tool_call_id = 'tc1'",
        &[],
    )
    .await
    .unwrap();
    assert!(expire().await.unwrap(), "closed once its token expired");
    let events = history(&a, &b, "s1").await;
    let finished = of_type(&events, "tool.call.finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["code"], "client_execution_expired");
}
