//! The executor runtime against a real server and Postgres: tools run from
//! `client.tool.execute` only, each token at most once, even across an
//! executor process restart mid-call, and every call ends with exactly
//! one `tool.call.finished`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use narad_client::executor::{Executor, FileTokenStore, ToolResult};
use narad_server::auth::Role;
use narad_server::executors::ExecutorSettings;
use narad_tests::{Server, claims, hs256, session_with_run, token};
use serde_json::{Value, json};

fn settings() -> ExecutorSettings {
    ExecutorSettings {
        heartbeat_interval: Duration::from_millis(200),
        lease_ttl: Duration::from_millis(1_500),
        token_ttl: Duration::from_secs(30),
        delivery_timeout: Duration::from_secs(30),
        sweep_interval: Duration::from_millis(100),
    }
}

fn executor_jwt(org: &str) -> String {
    hs256(&claims(org, "desktop", &[Role::Executor]))
}

async fn history(s: &Server, jwt: &str, session: &str) -> Vec<Value> {
    s.get(&format!("/v1/sessions/{session}/events?limit=1000"), jwt)
        .await
        .expect(200)["events"]
        .as_array()
        .expect("events")
        .clone()
}

async fn finished(s: &Server, jwt: &str, session: &str, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let done: Vec<Value> = history(s, jwt, session)
            .await
            .into_iter()
            .filter(|e| e["type"] == "tool.call.finished")
            .collect();
        if done.len() >= n {
            return done;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {n} finished calls: {done:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_call(s: &Server, jwt: &str, session: &str, call: &str, tool: &str, args: Value) {
    s.post(
        &format!("/v1/sessions/{session}/events"),
        jwt,
        &json!({"events": [{"protocolVersion": "narad/v1", "type": "tool.call.started",
            "eventId": format!("start-{call}"), "rootRunId": "r1", "runId": "r1",
            "toolCallId": call, "toolName": tool, "executor": "client", "args": args}]}),
    )
    .await
    .expect(201);
}

async fn session_for(s: &Server, jwt: &str, session: &str, executor: &str) {
    session_with_run(s, jwt, session, "r1", Some(executor)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_run_from_controls_and_their_results_become_the_terminal() {
    let s = Server::start_with_executors(settings()).await;
    let b = token("acme", &[Role::Reader, Role::Writer, Role::Backend]);
    session_for(&s, &b, "s1", "desk").await;
    let dir = std::env::temp_dir().join(format!("narad-exec-{}", uuid_like()));
    std::fs::create_dir_all(&dir).expect("a dir");
    let runs = Arc::new(AtomicU64::new(0));
    let executor = {
        let runs = runs.clone();
        Executor::builder(vec![s.base.clone()], executor_jwt("acme"), "desk")
            .tool("echo", move |args| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    ToolResult::ok(Value::Object(args))
                }
            })
            .store(FileTokenStore::open(dir.join("tokens")).expect("a store"))
            .build()
            .expect("an executor")
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(executor.run(async move {
        let _ = stopped.await;
    }));
    start_call(&s, &b, "s1", "tc1", "echo", json!({"say": "hi"})).await;
    start_call(&s, &b, "s1", "tc2", "no.such.tool", json!({})).await;
    let done = finished(&s, &b, "s1", 2).await;
    let by_id = |id: &str| {
        done.iter()
            .find(|e| e["toolCallId"] == id)
            .expect("finished")
            .clone()
    };
    assert_eq!(by_id("tc1")["outcome"], "success");
    assert_eq!(by_id("tc1")["response"], json!({"say": "hi"}));
    assert_eq!(by_id("tc2")["outcome"], "error");
    assert_eq!(by_id("tc2")["code"], "unknown_tool");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let _ = stop.send(());
    task.await.expect("joins").expect("stops cleanly");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_executor_never_reruns_an_accepted_token() {
    let s = Server::start_with_executors(settings()).await;
    let b = token("acme", &[Role::Reader, Role::Writer, Role::Backend]);
    session_for(&s, &b, "s1", "desk").await;
    let dir = std::env::temp_dir().join(format!("narad-exec-{}", uuid_like()));
    std::fs::create_dir_all(&dir).expect("a dir");
    let store = dir.join("tokens");
    let runs = Arc::new(AtomicU64::new(0));
    let build = |runs: Arc<AtomicU64>, hang: bool| {
        Executor::builder(vec![s.base.clone()], executor_jwt("acme"), "desk")
            .tool("slow", move |_args| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if hang {
                        // The process dies before this returns.
                        std::future::pending::<()>().await;
                    }
                    ToolResult::ok(json!("done"))
                }
            })
            .store(FileTokenStore::open(&store).expect("a store"))
            .build()
            .expect("an executor")
    };
    // First process: accepts the token, starts the tool, and is killed.
    let first = build(runs.clone(), true);
    let stats = first.stats();
    let first = tokio::spawn(first.run(std::future::pending()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stats.lease().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "never attached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start_call(&s, &b, "s1", "tc1", "slow", json!({})).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the tool never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.abort();
    let _ = first.await;
    // Its lease lapses: the run is paused for its executor.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !history(&s, &b, "s1")
        .await
        .iter()
        .any(|e| e["type"] == "run.paused")
    {
        assert!(tokio::time::Instant::now() < deadline, "never paused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = history(&s, &b, "s1").await;
    assert!(
        !events.iter().any(|e| e["type"] == "run.resumed"),
        "paused only once the executor died: {events:#?}"
    );
    // Second process on the same store: the token is known, so the tool
    // does not run again; the call is finished client_restarted under the
    // lease it was delivered with, and the run resumes.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn(build(runs.clone(), false).run(async move {
        let _ = stopped.await;
    }));
    let done = finished(&s, &b, "s1", 1).await;
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["outcome"], "error");
    assert_eq!(done[0]["code"], "client_restarted");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !history(&s, &b, "s1")
        .await
        .iter()
        .any(|e| e["type"] == "run.resumed")
    {
        assert!(tokio::time::Instant::now() < deadline, "never resumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    second.await.expect("joins").expect("stops cleanly");
    let _ = std::fs::remove_dir_all(dir);
}

/// A name unique to this test run.
fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos()
    )
}
