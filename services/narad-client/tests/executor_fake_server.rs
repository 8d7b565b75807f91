//! The executor runtime against a small fake of the server's executor
//! endpoints (a WebSocket that attaches and delivers, an HTTP finish
//! endpoint that answers as told): attachment, heartbeats, execution,
//! finishes under the delivering lease across reconnects, retries,
//! restarts and refusals. The real server is exercised by the end-to-end
//! tests.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use narad_client::executor::AcceptedToken;
use narad_client::{
    Executor, ExecutorError, ExecutorStats, MemoryTokenStore, StatsSnapshot, TokenStore, ToolResult,
};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

const JWT: &str = "executor-jwt";
const FUTURE: &str = "2999-01-01T00:00:00Z";

/// What the fake server saw, and what it is told to do.
#[derive(Default)]
struct Fake {
    attachments: u64,
    /// The current connection's lease and the way to push frames to it.
    lease: Option<String>,
    outbox: Option<mpsc::UnboundedSender<Message>>,
    client_heartbeats: Vec<Value>,
    /// Every finish posted, with the status it was answered.
    finishes: Vec<(u16, Value)>,
    /// Statuses for the next finishes (200 once empty).
    finish_statuses: VecDeque<u16>,
    /// Send no server.heartbeat.
    silent: bool,
}

type Shared = Arc<Mutex<Fake>>;

struct FakeServer {
    base: String,
    state: Shared,
    _stop: oneshot::Sender<()>,
}

impl FakeServer {
    async fn start() -> FakeServer {
        let state = Shared::default();
        let app = Router::new()
            .route("/v1/executors/{id}/connect", get(connect))
            .route("/v1/executors/{id}/finish", post(finish))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        FakeServer {
            base,
            state,
            _stop: stop,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Fake) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Sends a frame on the current connection.
    fn push(&self, frame: Value) {
        let outbox = self.with(|f| f.outbox.clone()).expect("a connection");
        outbox.send(Message::text(frame.to_string())).unwrap();
    }

    /// Closes the current connection from the server's side.
    fn drop_connection(&self) {
        let outbox = self.with(|f| f.outbox.take()).expect("a connection");
        outbox.send(Message::Close(None)).unwrap();
    }

    fn finishes(&self) -> Vec<(u16, Value)> {
        self.with(|f| f.finishes.clone())
    }
}

async fn connect(
    Path(id): Path<String>,
    State(state): State<Shared>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok());
    if bearer != Some(&format!("Bearer {JWT}")) {
        let body = json!({"code": "NRD-0101", "title": "Unauthorized", "message": "bad token"});
        return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    }
    upgrade.on_upgrade(move |socket| attach(socket, id, state))
}

async fn attach(mut socket: WebSocket, id: String, state: Shared) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (lease, silent) = {
        let mut s = state.lock().unwrap();
        s.attachments += 1;
        let lease = format!("L{}", s.attachments);
        s.lease = Some(lease.clone());
        s.outbox = Some(tx);
        (lease, s.silent)
    };
    let attached = json!({
        "type": "client.attached",
        "protocolVersion": "narad/v1",
        "clientExecutorId": id,
        "leaseId": lease,
        "heartbeatIntervalMs": 100,
        "leaseExpiresAt": FUTURE,
    });
    if socket
        .send(Message::text(attached.to_string()))
        .await
        .is_err()
    {
        return;
    }
    let mut beat = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = beat.tick(), if !silent => {
                let heartbeat = json!({
                    "type": "server.heartbeat",
                    "protocolVersion": "narad/v1",
                    "clientExecutorId": id,
                    "leaseId": lease,
                    "leaseExpiresAt": FUTURE,
                    "timestamp": "2026-08-05T04:00:00Z",
                });
                if socket.send(Message::text(heartbeat.to_string())).await.is_err() {
                    return;
                }
            }
            out = rx.recv() => match out {
                Some(Message::Close(_)) | None => {
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                Some(frame) => {
                    if socket.send(frame).await.is_err() {
                        return;
                    }
                }
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    state.lock().unwrap().client_heartbeats.push(v);
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

async fn finish(
    Path(_id): Path<String>,
    State(state): State<Shared>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    assert_eq!(
        headers.get("authorization").unwrap().to_str().unwrap(),
        format!("Bearer {JWT}")
    );
    let status = {
        let mut s = state.lock().unwrap();
        let status = s.finish_statuses.pop_front().unwrap_or(200);
        s.finishes.push((status, body.clone()));
        status
    };
    let answer = if status == 200 {
        json!({
            "toolCallId": body["toolCallId"],
            "eventId": "e1",
            "sessionSequence": 5,
            "duplicate": false,
        })
    } else {
        json!({"code": "NRD-9999", "title": "Unavailable", "message": "try later"})
    };
    (StatusCode::from_u16(status).unwrap(), axum::Json(answer)).into_response()
}

fn execute(token: &str, lease: &str, tool: &str, args: Value) -> Value {
    json!({
        "type": "client.tool.execute",
        "protocolVersion": "narad/v1",
        "clientExecutorId": "exec-1",
        "leaseId": lease,
        "executionToken": token,
        "executionTokenExpiresAt": FUTURE,
        "toolCallId": format!("tc-{token}"),
        "toolName": tool,
        "args": args,
    })
}

/// Waits (up to 10 s) until `done` holds of the executor's counters.
async fn until(stats: &ExecutorStats, what: &str, done: impl Fn(&StatsSnapshot) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(&stats.snapshot()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within 10 s: {:?}",
            stats.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An executor with `echo` (counting its runs) and `wait` (which waits for
/// a permit), running in the background until `stop` is sent.
struct Running {
    stats: ExecutorStats,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), ExecutorError>>,
    gate: Arc<tokio::sync::Semaphore>,
}

fn start(base: &str, jwt: &str, store: Arc<MemoryTokenStore>) -> Running {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let waiting = gate.clone();
    let executor = Executor::builder(vec![base.to_owned()], jwt, "exec-1")
        .tool("echo", |args| async move { ToolResult::ok(args.into()) })
        .tool("wait", move |_| {
            let gate = waiting.clone();
            async move {
                let _ = gate.acquire().await;
                ToolResult::ok(json!("waited"))
            }
        })
        .store(store)
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(100))
        .shutdown_grace(Duration::from_secs(2))
        .build()
        .unwrap();
    let stats = executor.stats();
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(executor.run(async {
        let _ = stopped.await;
    }));
    Running {
        stats,
        stop,
        done,
        gate,
    }
}

impl Running {
    async fn stop(self) -> Result<(), ExecutorError> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.done)
            .await
            .expect("the executor stops within its grace")
            .unwrap()
    }
}

#[tokio::test]
async fn an_assigned_call_runs_once_and_is_finished_over_http() {
    let server = FakeServer::start().await;
    let store = Arc::new(MemoryTokenStore::new());
    let exec = start(&server.base, JWT, store.clone());
    until(&exec.stats, "attaching", |s| s.attachments == 1).await;
    assert_eq!(exec.stats.lease().unwrap().as_str(), "L1");

    server.push(execute("t1", "L1", "echo", json!({"say": "hi"})));
    until(&exec.stats, "the finish", |s| s.finishes_accepted == 1).await;
    let (_, finish) = &server.finishes()[0];
    assert_eq!(
        finish,
        &json!({
            "type": "client.tool.finish",
            "protocolVersion": "narad/v1",
            "executionToken": "t1",
            "outcome": "success",
            "response": {"say": "hi"},
            "clientExecutorId": "exec-1",
            "leaseId": "L1",
            "toolCallId": "tc-t1",
        })
    );

    // Delivered again: the finish is resent, the tool does not run again.
    server.push(execute("t1", "L1", "echo", json!({"say": "hi"})));
    until(&exec.stats, "the duplicate", |s| {
        s.duplicate_deliveries == 1
    })
    .await;
    // A call for a tool the executor lacks is answered without running.
    server.push(execute("t2", "L1", "rm.rf", json!({})));
    until(&exec.stats, "the unknown tool's finish", |s| {
        s.finishes_accepted == 2
    })
    .await;
    let finishes = server.finishes();
    let (_, unknown) = finishes.last().unwrap();
    assert_eq!(unknown["executionToken"], "t2");
    assert_eq!(unknown["outcome"], "error");
    assert_eq!(unknown["code"], "unknown_tool");

    // The executor heartbeats under its lease, every interval (100 ms).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.with(|f| f.client_heartbeats.is_empty()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no client.heartbeat"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        server.with(|f| f.client_heartbeats[0].clone()),
        json!({
            "type": "client.heartbeat",
            "protocolVersion": "narad/v1",
            "clientExecutorId": "exec-1",
            "leaseId": "L1",
        })
    );

    exec.stop().await.unwrap();
    assert!(
        store.pending().unwrap().is_empty(),
        "every finish had a final answer"
    );
}

#[tokio::test]
async fn a_finish_is_retried_across_a_reconnect_under_its_delivering_lease() {
    let server = FakeServer::start().await;
    server.with(|f| f.finish_statuses.extend([503, 502]));
    let exec = start(&server.base, JWT, Arc::new(MemoryTokenStore::new()));
    until(&exec.stats, "attaching", |s| s.attachments == 1).await;

    // Delivered under L1; the server drops the connection while it runs.
    server.push(execute("t1", "L1", "wait", json!({})));
    until(&exec.stats, "the tool starting", |s| {
        s.executions_started == 1
    })
    .await;
    server.drop_connection();
    until(&exec.stats, "reattaching", |s| s.attachments == 2).await;
    assert_eq!(exec.stats.lease().unwrap().as_str(), "L2");
    exec.gate.add_permits(1);
    until(&exec.stats, "the finish", |s| s.finishes_accepted == 1).await;

    let finishes = server.finishes();
    let statuses: Vec<u16> = finishes.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [503, 502, 200]);
    for (_, finish) in &finishes {
        assert_eq!(finish["leaseId"], "L1", "the lease it was delivered under");
        assert_eq!(finish["response"], "waited");
    }
    assert_eq!(exec.stats.snapshot().executions_started, 1);
    exec.stop().await.unwrap();
}

#[tokio::test]
async fn a_delivery_under_a_superseded_lease_is_not_run() {
    let server = FakeServer::start().await;
    let exec = start(&server.base, JWT, Arc::new(MemoryTokenStore::new()));
    until(&exec.stats, "attaching", |s| s.attachments == 1).await;
    server.push(execute("t1", "L0", "echo", json!({})));
    until(&exec.stats, "the refusal", |s| s.stale_lease_refused == 1).await;
    let s = exec.stats.snapshot();
    assert_eq!((s.executions_started, s.finishes_sent), (0, 0));
    assert!(server.finishes().is_empty());
    exec.stop().await.unwrap();
}

#[tokio::test]
async fn a_restarted_executor_finishes_the_interrupted_call_as_client_restarted() {
    let server = FakeServer::start().await;
    let store = Arc::new(MemoryTokenStore::new());
    // An earlier process accepted t1 under L7 and stopped mid-call.
    let delivered = execute("t1", "L7", "echo", json!({}));
    let accepted: AcceptedToken = AcceptedToken {
        execution_token: serde_json::from_value(delivered["executionToken"].clone()).unwrap(),
        client_executor_id: serde_json::from_value(delivered["clientExecutorId"].clone()).unwrap(),
        lease_id: serde_json::from_value(delivered["leaseId"].clone()).unwrap(),
        tool_call_id: serde_json::from_value(delivered["toolCallId"].clone()).unwrap(),
        tool_name: "echo".to_owned(),
        execution_token_expires_at: serde_json::from_value(json!(FUTURE)).unwrap(),
    };
    assert!(store.accept(&accepted).unwrap());

    let exec = start(&server.base, JWT, store.clone());
    until(&exec.stats, "the finish", |s| s.finishes_accepted == 1).await;
    let (_, finish) = &server.finishes()[0];
    assert_eq!(finish["executionToken"], "t1");
    assert_eq!(finish["outcome"], "error");
    assert_eq!(finish["code"], "client_restarted");
    assert_eq!(finish["leaseId"], "L7", "the token's original lease");
    let s = exec.stats.snapshot();
    assert_eq!((s.executions_started, s.restarted_recovered), (0, 1));
    exec.stop().await.unwrap();
    assert!(store.pending().unwrap().is_empty());
}

#[tokio::test]
async fn a_silent_server_is_left_for_a_new_connection() {
    let server = FakeServer::start().await;
    server.with(|f| f.silent = true);
    let exec = start(&server.base, JWT, Arc::new(MemoryTokenStore::new()));
    // Three silent heartbeat intervals (300 ms) end each connection.
    until(&exec.stats, "two reconnects", |s| s.attachments >= 3).await;
    exec.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_token_stops_the_executor() {
    let server = FakeServer::start().await;
    let exec = start(
        &server.base,
        "not-the-jwt",
        Arc::new(MemoryTokenStore::new()),
    );
    let err = tokio::time::timeout(Duration::from_secs(10), exec.done)
        .await
        .expect("the executor gives up at once")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, ExecutorError::Refused { status: 401, ref body } if body["code"] == "NRD-0101"),
        "{err}"
    );
}
