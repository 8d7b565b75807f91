//! The agent runtime loop against a real server and Postgres: queued runs
//! are each handled once, by one of several runtimes, and finished; a stop
//! reaches the handler within a second, long before the next heartbeat; a
//! failed handler's run goes to the next attempt; a released run is
//! claimed again from exactly where its handler left off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_client::runtime::{ClaimReason, RunContext, RunHandler, Runtime, RuntimeError};
use narad_server::auth::Role;
use narad_tests::{RuntimeSettings, Server, token, whole_history};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Leases short enough that a lapse is repaired within about a second.
fn quick_leases() -> RuntimeSettings {
    RuntimeSettings {
        lease_ttl: Duration::from_millis(1_500),
        sweep_interval: Duration::from_millis(100),
        stall: Duration::from_secs(5),
        ..RuntimeSettings::default()
    }
}

/// The runtimes' token.
fn backend() -> String {
    token("acme", &[Role::Backend])
}

/// The token of whoever starts, stops and reads runs.
fn driver() -> String {
    token("acme", &[Role::Reader, Role::Writer, Role::Backend])
}

fn runtime(s: &Server, name: &str) -> Runtime {
    Runtime::builder(vec![s.base.clone()], backend())
        .runtime_id(name)
        .claim_wait(Duration::from_secs(2))
        .shutdown_grace(Duration::from_secs(5))
        .build()
        .expect("a runtime")
}

/// A runtime running in a task until [`Running::stop`].
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), RuntimeError>>,
}

impl Running {
    fn spawn(runtime: Runtime, handler: impl RunHandler) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(runtime.run(handler, async move {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the runtime stops within its grace")
            .expect("joins")
            .expect("stops cleanly");
    }
}

/// Creates session `session` and starts run `run` in it for runtimes.
async fn start_run(s: &Server, session: &str, run: &str) {
    let jwt = driver();
    s.post("/v1/sessions", &jwt, &json!({ "sessionId": session }))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-run",
        &jwt,
        &json!({"sessionId": session, "runId": run, "runtime": {"queue": "agents"}}),
    )
    .await
    .expect(201);
}

/// The session's history once `done` holds for it (within 20 s).
async fn history_when(s: &Server, session: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let jwt = driver();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let history = whole_history(s, &jwt, session).await;
        if done(&history) {
            return history;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{session} never got there: {history:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn has(history: &[Value], event_type: &str) -> bool {
    history.iter().any(|e| e["type"] == event_type)
}

/// The terminals of run `run`.
fn terminals<'a>(history: &'a [Value], run: &str) -> Vec<&'a Value> {
    history
        .iter()
        .filter(|e| {
            e["runId"] == run
                && matches!(
                    e["type"].as_str(),
                    Some("run.finished" | "run.error" | "run.cancelled")
                )
        })
        .collect()
}

/// One handler invocation, as the handler saw it.
#[derive(Debug, Clone)]
struct Call {
    runtime: &'static str,
    attempt: u32,
    reason: ClaimReason,
    cursor: u64,
    /// The types and sessionSequences of `ctx.history()`.
    read: Vec<(String, u64)>,
    /// `ctx.handled_through()` when the handler returned.
    handled_through: u64,
}

/// Invocations by run id.
type Calls = Arc<Mutex<HashMap<String, Vec<Call>>>>;

fn record(calls: &Calls, ctx: &RunContext, runtime: &'static str, read: &[Value]) {
    calls
        .lock()
        .unwrap()
        .entry(ctx.run_id().to_string())
        .or_default()
        .push(Call {
            runtime,
            attempt: ctx.attempt(),
            reason: ctx.reason(),
            cursor: ctx.cursor(),
            read: read
                .iter()
                .map(|e| {
                    (
                        e["type"].as_str().unwrap_or_default().to_owned(),
                        e["sessionSequence"].as_u64().unwrap_or_default(),
                    )
                })
                .collect(),
            handled_through: 0,
        });
}

fn returned(calls: &Calls, ctx: &RunContext) {
    if let Some(call) = calls
        .lock()
        .unwrap()
        .get_mut(ctx.run_id().as_str())
        .and_then(|c| c.last_mut())
    {
        call.handled_through = ctx.handled_through();
    }
}

/// Streams "Hello, world" as an assistant message, a delta per append,
/// and finishes the run.
struct Streamer {
    name: &'static str,
    calls: Calls,
}

impl RunHandler for Streamer {
    async fn handle(&self, ctx: RunContext) -> Result<(), RuntimeError> {
        let read = ctx.history().await?;
        record(&self.calls, &ctx, self.name, &read);
        let m = format!("m-{}", ctx.run_id());
        ctx.append(vec![ctx.event(
            "message.text.started",
            json!({"messageId": m, "role": "assistant", "messageScope": "run"}),
        )])
        .await?;
        for delta in ["Hello", ", ", "world"] {
            ctx.append(vec![ctx.event(
                "message.text.delta",
                json!({"messageId": m, "delta": delta}),
            )])
            .await?;
        }
        ctx.append(vec![
            ctx.event("message.text.completed", json!({"messageId": m})),
            ctx.event("run.finished", json!({})),
        ])
        .await?;
        returned(&self.calls, &ctx);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_finish_twenty_runs_each_handled_once() {
    let s = Server::start_with_runtime(quick_leases()).await;
    let calls = Calls::default();
    let a = Running::spawn(
        runtime(&s, "a"),
        Streamer {
            name: "a",
            calls: calls.clone(),
        },
    );
    let b = Running::spawn(
        runtime(&s, "b"),
        Streamer {
            name: "b",
            calls: calls.clone(),
        },
    );
    let runs: Vec<(String, String)> = (0..20)
        .map(|i| (format!("s{i}"), format!("r{i}")))
        .collect();
    futures::future::join_all(
        runs.iter()
            .map(|(session, run)| start_run(&s, session, run)),
    )
    .await;

    for (session, run) in &runs {
        let history = history_when(&s, session, |h| has(h, "run.finished")).await;
        let ended = terminals(&history, run);
        assert_eq!(ended.len(), 1, "{run}: one terminal: {history:#?}");
        assert_eq!(ended[0]["type"], "run.finished", "{run}");
        let text: String = history
            .iter()
            .filter(|e| e["type"] == "message.text.delta")
            .map(|e| e["delta"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(text, "Hello, world", "{run}");
        // The handler records what it handled once its last append has
        // returned, which may be after run.finished is readable: wait for it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while calls.lock().unwrap()[run.as_str()]
            .last()
            .is_some_and(|c| c.handled_through == 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The handler read from the run's start, which is new to it.
        let calls = calls.lock().unwrap();
        let mine = &calls[run.as_str()];
        assert_eq!(mine.len(), 1, "{run} was handled once: {mine:?}");
        let call = &mine[0];
        assert_eq!((call.attempt, call.reason), (1, ClaimReason::Started));
        assert_eq!(call.read[0], ("run.started".to_owned(), call.cursor + 1));
        let last = history.last().expect("events");
        assert_eq!(
            call.handled_through,
            last["sessionSequence"].as_u64().unwrap()
        );
    }
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 20);
    let by_a = calls.values().filter(|c| c[0].runtime == "a").count();
    println!("runs handled: {by_a} by a, {} by b", 20 - by_a);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_reaches_the_handler_long_before_the_next_heartbeat() {
    // Leases of 30 s renewed every 10 s: only the control poll can bring
    // the stop within a second.
    let s = Server::start_with_runtime(RuntimeSettings {
        sweep_interval: Duration::from_millis(100),
        ..RuntimeSettings::default()
    })
    .await;
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<String>();
    let handler = move |ctx: RunContext| {
        let started_tx = started_tx.clone();
        async move {
            let _ = started_tx.send(ctx.run_id().to_string());
            tokio::select! {
                () = ctx.stop_requested() => {}
                () = tokio::time::sleep(Duration::from_secs(30)) => {
                    return Err(RuntimeError::handler("no stop arrived"));
                }
            }
            ctx.append(vec![ctx.event(
                "run.cancelled",
                json!({"code": "user_stop", "message": "stopped as asked"}),
            )])
            .await?;
            Ok::<(), RuntimeError>(())
        }
    };
    let running = Running::spawn(
        Runtime::builder(vec![s.base.clone()], backend())
            .queue("agents")
            .heartbeat_interval(Duration::from_secs(10))
            .claim_wait(Duration::from_secs(2))
            .build()
            .expect("a runtime"),
        handler,
    );
    start_run(&s, "s1", "r1").await;
    let claimed = tokio::time::timeout(Duration::from_secs(10), started.recv())
        .await
        .expect("the run is claimed")
        .expect("a run id");
    assert_eq!(claimed, "r1");

    let asked = tokio::time::Instant::now();
    s.post(
        "/v1/commands/stop-run",
        &driver(),
        &json!({"runId": "r1", "reason": "user.stop"}),
    )
    .await
    .expect(200);
    let history = history_when(&s, "s1", |h| has(h, "run.cancelled")).await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the stop took {:?}",
        asked.elapsed()
    );
    let ended = terminals(&history, "r1");
    assert_eq!(ended.len(), 1, "{history:#?}");
    // The handler's cancellation, not the server's for an unheld run.
    assert_eq!(ended[0]["code"], "user_stop");
    let stop_at = history
        .iter()
        .position(|e| e["type"] == "run.stop.requested")
        .expect("the stop is recorded");
    assert!(stop_at < history.len() - 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handler_leaves_the_run_to_the_next_attempt() {
    let s = Server::start_with_runtime(quick_leases()).await;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        move |ctx: RunContext| {
            let calls = calls.clone();
            async move {
                let read = ctx.history().await?;
                record(&calls, &ctx, "a", &read);
                if ctx.attempt() == 1 {
                    return Err(RuntimeError::handler("the model is unavailable"));
                }
                ctx.append(vec![ctx.event("run.finished", json!({}))])
                    .await?;
                Ok::<(), RuntimeError>(())
            }
        }
    };
    let running = Running::spawn(runtime(&s, "a"), handler);
    start_run(&s, "s1", "r1").await;
    let history = history_when(&s, "s1", |h| !terminals(h, "r1").is_empty()).await;
    let ended = terminals(&history, "r1");
    assert_eq!(ended.len(), 1, "{history:#?}");
    assert_eq!(ended[0]["type"], "run.finished", "{history:#?}");
    let calls = calls.lock().unwrap()["r1"].clone();
    let seen: Vec<_> = calls.iter().map(|c| (c.attempt, c.reason)).collect();
    assert_eq!(
        seen,
        [(1, ClaimReason::Started), (2, ClaimReason::Retry)],
        "{calls:?}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_run_longer_than_its_lease() {
    // Leases of 1.5 s; the runtime's interval (10 s) is shortened to a
    // third of what is left of each lease.
    let s = Server::start_with_runtime(quick_leases()).await;
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        move |ctx: RunContext| {
            let calls = calls.clone();
            async move {
                record(&calls, &ctx, "a", &[]);
                tokio::select! {
                    () = ctx.lost() => return Err(RuntimeError::handler("the lease lapsed")),
                    () = tokio::time::sleep(Duration::from_secs(4)) => {}
                }
                ctx.append(vec![ctx.event("run.finished", json!({}))])
                    .await?;
                Ok::<(), RuntimeError>(())
            }
        }
    };
    let running = Running::spawn(runtime(&s, "a"), handler);
    start_run(&s, "s1", "r1").await;
    let history = history_when(&s, "s1", |h| !terminals(h, "r1").is_empty()).await;
    let ended = terminals(&history, "r1");
    assert_eq!(ended.len(), 1, "{history:#?}");
    assert_eq!(ended[0]["type"], "run.finished", "{history:#?}");
    assert_eq!(calls.lock().unwrap()["r1"].len(), 1, "never retried");
    running.stop().await;
}

/// Waits for the user the first time (releasing the run), answers and
/// finishes the second time.
struct Conversation {
    calls: Calls,
}

impl RunHandler for Conversation {
    async fn handle(&self, ctx: RunContext) -> Result<(), RuntimeError> {
        let read = ctx.history().await?;
        record(&self.calls, &ctx, "a", &read);
        let m = format!("m{}", ctx.handled_through());
        let mut events = vec![
            ctx.event(
                "message.text.started",
                json!({"messageId": m, "role": "assistant", "messageScope": "run"}),
            ),
            ctx.event(
                "message.text.delta",
                json!({"messageId": m, "delta": "thinking"}),
            ),
            ctx.event("message.text.completed", json!({"messageId": m})),
        ];
        if ctx.reason() == ClaimReason::Event {
            events.push(ctx.event("run.finished", json!({})));
        }
        ctx.append(events).await?;
        returned(&self.calls, &ctx);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_run_is_claimed_again_after_what_its_handler_saw() {
    let s = Server::start_with_runtime(quick_leases()).await;
    let calls = Calls::default();
    let running = Running::spawn(
        runtime(&s, "a"),
        Conversation {
            calls: calls.clone(),
        },
    );
    start_run(&s, "s1", "r1").await;
    history_when(&s, "s1", |h| has(h, "message.text.completed")).await;

    // Another backend writes to the run's journal once the runtime has
    // given the run back.
    let note = json!({"events": [
        {"protocolVersion": "narad/v1", "type": "message.text.started", "eventId": "note-start",
         "rootRunId": "r1", "runId": "r1", "messageId": "note", "role": "system",
         "messageScope": "run"},
        {"protocolVersion": "narad/v1", "type": "message.text.completed", "eventId": "note-end",
         "rootRunId": "r1", "runId": "r1", "messageId": "note"},
    ]});
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = s.post("/v1/sessions/s1/events", &driver(), &note).await;
        if answer.status == 201 {
            break;
        }
        // Still held: the handler has not returned yet.
        assert_eq!(answer.code(), "NRD-0502", "{:#}", answer.body);
        assert!(tokio::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let history = history_when(&s, "s1", |h| has(h, "run.finished")).await;
    assert_eq!(terminals(&history, "r1").len(), 1, "{history:#?}");

    let calls = calls.lock().unwrap()["r1"].clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    let (first, second) = (&calls[0], &calls[1]);
    assert_eq!(first.reason, ClaimReason::Started);
    assert_eq!(second.reason, ClaimReason::Event);
    assert_eq!(second.attempt, 1, "a release is not a lost attempt");
    // The second claim starts after what the first handler read and wrote,
    // and reads exactly what the other backend wrote.
    assert_eq!(second.cursor, first.handled_through);
    assert_eq!(
        second.read,
        [
            ("message.text.started".to_owned(), first.handled_through + 1),
            (
                "message.text.completed".to_owned(),
                first.handled_through + 2
            ),
        ]
    );
    running.stop().await;
}

/// A runtime killed mid-run (its task aborted: no release, no more
/// heartbeats) loses its run to another runtime, which finds the dead
/// runtime's dangling tool call already closed `runtime_lost`.
#[tokio::test]
async fn a_killed_runtime_s_run_is_finished_by_another() {
    let s = Server::start_with_runtime(quick_leases()).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let doomed = {
        let started = started.clone();
        move |ctx: RunContext| {
            let started = started.clone();
            async move {
                ctx.append(vec![ctx.event(
                    "tool.call.started",
                    json!({"toolCallId": "tc1", "toolName": "search", "executor": "backend", "args": {}}),
                )])
                .await?;
                started.notify_one();
                std::future::pending::<()>().await;
                Ok::<(), RuntimeError>(())
            }
        }
    };
    let killed = Running::spawn(runtime(&s, "doomed"), doomed);
    start_run(&s, "s1", "r1").await;
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the first runtime started its call");
    killed.task.abort();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let survivor = {
        let seen = seen.clone();
        move |ctx: RunContext| {
            let seen = seen.clone();
            async move {
                let read = ctx.history().await?;
                seen.lock().unwrap().push((ctx.attempt(), read));
                ctx.append(vec![ctx.event("run.finished", json!({}))])
                    .await?;
                Ok::<(), RuntimeError>(())
            }
        }
    };
    let running = Running::spawn(runtime(&s, "survivor"), survivor);
    let history = history_when(&s, "s1", |h| !terminals(h, "r1").is_empty()).await;
    let kinds: Vec<&str> = history
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "run.started",
            "tool.call.started",
            "tool.call.finished",
            "run.finished"
        ]
    );
    assert_eq!(history[2]["code"], "runtime_lost");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one more holder");
    assert_eq!(seen[0].0, 2, "the second attempt");
    assert!(
        seen[0].1.iter().any(|e| e["type"] == "tool.call.finished"),
        "the survivor read the closed call: {:?}",
        seen[0].1
    );
    running.stop().await;
}
