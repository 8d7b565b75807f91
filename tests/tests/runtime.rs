//! Agent runtimes end to end: the work queue, runtime leases and their
//! fence, orphan repair under both policies, stops that reach the holder or
//! are served by the server, and 1,000 runs through four runtimes. A real
//! server (two replicas where it matters), real Postgres.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use narad_protocol::engine::SessionState;
use narad_server::auth::Role;
use narad_tests::{
    RuntimeSettings, Scrape, Server, authority, claims, hs256, token, whole_history,
};
use serde_json::{Value, json};

/// Leases of 600 ms, swept every 100 ms: a runtime that stops
/// heartbeating is lost within a second.
fn quick() -> RuntimeSettings {
    RuntimeSettings {
        lease_ttl: Duration::from_millis(600),
        sweep_interval: Duration::from_millis(100),
        ..RuntimeSettings::default()
    }
}

/// Leases that do not lapse within a test.
fn patient() -> RuntimeSettings {
    RuntimeSettings {
        lease_ttl: Duration::from_secs(60),
        sweep_interval: Duration::from_millis(100),
        ..RuntimeSettings::default()
    }
}

fn backend(org: &str) -> String {
    token(
        org,
        &[Role::Reader, Role::Writer, Role::Backend, Role::Approver],
    )
}

fn event(kind: &str, root: &str, run: &str, fields: Value) -> Value {
    let mut e = json!({"protocolVersion": "narad/v1", "type": kind,
        "eventId": uuid::Uuid::now_v7().to_string(), "rootRunId": root, "runId": run});
    for (k, v) in fields.as_object().expect("an object") {
        e[k] = v.clone();
    }
    e
}

/// Creates a session and starts run `run` in it for the runtimes, with
/// `runtime`; with `Value::Null`, bare, for whatever backend drives it.
async fn queued_run(s: &Server, jwt: &str, session: &str, run: &str, runtime: Value) {
    s.post("/v1/sessions", jwt, &json!({ "sessionId": session }))
        .await
        .expect(201);
    let mut start = json!({"sessionId": session, "runId": run});
    if !runtime.is_null() {
        start["runtime"] = runtime;
    }
    s.post("/v1/commands/start-run", jwt, &start)
        .await
        .expect(201);
}

async fn claim(s: &Server, jwt: &str, body: Value) -> Option<Value> {
    let a = s.post("/v1/runtime/claims", jwt, &body).await;
    match a.status {
        200 => Some(a.body),
        204 => None,
        other => panic!("claim answered {other}: {}", a.body),
    }
}

async fn append(
    s: &Server,
    jwt: &str,
    session: &str,
    lease: Option<&str>,
    events: Vec<Value>,
) -> narad_tests::Answer {
    let headers: Vec<(&str, &str)> = lease
        .map(|l| ("Narad-Runtime-Lease", l))
        .into_iter()
        .collect();
    s.post_with(
        &format!("/v1/sessions/{session}/events"),
        jwt,
        &json!({ "events": events }),
        &headers,
    )
    .await
}

fn lease_of(claim: &Value) -> String {
    claim["lease"]["leaseId"]
        .as_str()
        .expect("a lease")
        .to_owned()
}

fn types(history: &[Value]) -> Vec<String> {
    history
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Applies a whole history to a fresh engine: every event must obey the
/// rules, in order.
fn obeys_the_rules(history: &[Value]) {
    let mut state = SessionState::new();
    for event in authority(history) {
        if let Err(v) = state.apply(&event) {
            panic!(
                "{} breaks {}: {}",
                event.body.wire_type().name(),
                v.rule,
                v.message
            );
        }
    }
}

/// Waits (up to 10 s) for run `run`'s terminal; its type.
async fn terminal_of(s: &Server, jwt: &str, session: &str, run: &str) -> String {
    for _ in 0..200 {
        let h = whole_history(s, jwt, session).await;
        if let Some(e) = h.iter().find(|e| {
            e["runId"] == run
                && matches!(
                    e["type"].as_str(),
                    Some("run.finished" | "run.error" | "run.cancelled")
                )
        }) {
            return e["type"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run} never ended");
}

/// Waits until the session's history holds an event of `kind`.
async fn history_with(s: &Server, jwt: &str, session: &str, kind: &str) -> Vec<Value> {
    for _ in 0..100 {
        let h = whole_history(s, jwt, session).await;
        if types(&h).iter().any(|t| t == kind) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no {kind} in session {session} after 10 s");
}

#[tokio::test]
async fn a_claim_hands_out_the_run_and_its_lease_fences_every_append() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({})).await;
    // A run started without `runtime` is its backend's, not the queue's.
    queued_run(&s, &jwt, "s2", "r2", Value::Null).await;

    let c = claim(&s, &jwt, json!({})).await.expect("the queued run");
    assert_eq!(c["runId"], "r1");
    assert_eq!(c["sessionId"], "s1");
    assert_eq!(c["reason"], "started");
    assert_eq!(c["cursor"], 0, "read from before run.started");
    assert_eq!(c["attempt"], 1);
    assert_eq!(c["queue"], "default");
    assert_eq!(c["onLost"], "retry");
    assert_eq!(c["maxAttempts"], 3);
    assert_eq!(c["stopRequested"], false);
    let lease = lease_of(&c);
    assert!(
        claim(&s, &jwt, json!({})).await.is_none(),
        "r1 is held; r2 is not queued"
    );

    let delta_start = |id: &str| {
        event(
            "message.text.started",
            "r1",
            "r1",
            json!({"messageId": id, "role": "assistant", "messageScope": "run"}),
        )
    };
    // Without the lease: refused, nothing written.
    let a = append(&s, &jwt, "s1", None, vec![delta_start("m1")]).await;
    assert_eq!((a.status, a.code()), (409, "NRD-0502"), "{}", a.body);
    // Under a lease that is not r1's: refused.
    let a = append(&s, &jwt, "s1", Some("not-a-lease"), vec![delta_start("m1")]).await;
    assert_eq!((a.status, a.code()), (409, "NRD-0501"), "{}", a.body);
    assert_eq!(types(&whole_history(&s, &jwt, "s1").await), ["run.started"]);
    // Under the lease: appended.
    append(&s, &jwt, "s1", Some(&lease), vec![delta_start("m1")])
        .await
        .expect(201);
    // A lease fences only its own journal: r2 is not held, so r2's
    // backend appends without one, and r1's lease cannot write to it.
    let r2 = |id: &str| {
        event(
            "message.text.started",
            "r2",
            "r2",
            json!({"messageId": id, "role": "assistant", "messageScope": "run"}),
        )
    };
    append(&s, &jwt, "s2", None, vec![r2("m2")])
        .await
        .expect(201);
    let a = append(&s, &jwt, "s2", Some(&lease), vec![r2("m3")]).await;
    assert_eq!(a.code(), "NRD-0501");

    // Heartbeat renews; the run ends under the lease; release says so.
    let hb = s
        .post(
            &format!("/v1/runtime/leases/{lease}/heartbeat"),
            &jwt,
            &json!({}),
        )
        .await;
    let hb = hb.expect(200);
    assert_eq!(
        (hb["runId"].as_str(), hb["stopRequested"].as_bool()),
        (Some("r1"), Some(false))
    );
    append(
        &s,
        &jwt,
        "s1",
        Some(&lease),
        vec![
            event(
                "message.text.completed",
                "r1",
                "r1",
                json!({"messageId": "m1"}),
            ),
            event("run.finished", "r1", "r1", json!({})),
        ],
    )
    .await
    .expect(201);
    let r = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &jwt,
            &json!({}),
        )
        .await;
    assert_eq!(r.expect(200)["released"], "ended");
    // A late heartbeat learns that the run ended.
    let a = s
        .post(
            &format!("/v1/runtime/leases/{lease}/heartbeat"),
            &jwt,
            &json!({}),
        )
        .await;
    assert_eq!(a.expect(200)["ended"], true);
    // Another tenant sees nothing of acme's queue.
    queued_run(&s, &jwt, "s3", "r3", json!({})).await;
    assert!(claim(&s, &backend("globex"), json!({})).await.is_none());
    s.stop().await;
}

#[tokio::test]
async fn bad_claims_and_runtime_settings_are_refused_with_clear_codes() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    let a = s
        .post("/v1/runtime/claims", &jwt, &json!({"waitMs": 30_001}))
        .await;
    assert_eq!((a.status, a.code()), (400, "NRD-0003"));
    let a = s
        .post("/v1/runtime/claims", &jwt, &json!({"queu": "x"}))
        .await;
    assert_eq!((a.status, a.code()), (400, "NRD-0003"));
    let reader = token("acme", &[Role::Reader]);
    let a = s.post("/v1/runtime/claims", &reader, &json!({})).await;
    assert_eq!((a.status, a.code()), (403, "NRD-0102"));
    s.post("/v1/sessions", &jwt, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    for bad in [
        json!({"maxAttempts": 0}),
        json!({"maxAttempts": 101}),
        json!({"onLost": "later"}),
        json!({"queue": ""}),
        json!({"priority": 1}),
    ] {
        let a = s
            .post(
                "/v1/commands/start-run",
                &jwt,
                &json!({"sessionId": "s1", "runId": "r1", "runtime": bad}),
            )
            .await;
        assert_eq!((a.status, a.code()), (400, "NRD-0003"), "{bad}: {}", a.body);
    }
    assert!(
        whole_history(&s, &jwt, "s1").await.is_empty(),
        "nothing written"
    );
    // A nested run belongs to its root's runtime.
    s.post(
        "/v1/commands/start-run",
        &jwt,
        &json!({"sessionId": "s1", "runId": "r1"}),
    )
    .await
    .expect(201);
    let a = s
        .post(
            "/v1/commands/start-run",
            &jwt,
            &json!({"sessionId": "s1", "runId": "c1", "parentRunId": "r1", "runtime": {}}),
        )
        .await;
    assert_eq!((a.status, a.code()), (400, "NRD-0003"), "{}", a.body);
    s.stop().await;
}

#[tokio::test]
async fn two_runtimes_never_hold_the_same_run_even_on_two_replicas() {
    let s = Server::start_with_runtime(patient()).await;
    let replica = s.replica_with_runtime(patient()).await;
    let jwt = backend("acme");
    for i in 0..30 {
        queued_run(&s, &jwt, &format!("s{i}"), &format!("r{i}"), json!({})).await;
    }
    let servers = [&s, &replica];
    let claimers = (0..8).map(|n| {
        let (server, jwt) = (servers[n % 2], jwt.clone());
        async move {
            let mut got = Vec::new();
            while let Some(c) = claim(server, &jwt, json!({"runtimeId": format!("rt{n}")})).await {
                got.push(c["runId"].as_str().expect("a run").to_owned());
            }
            got
        }
    });
    let all: Vec<String> = futures::future::join_all(claimers)
        .await
        .into_iter()
        .flatten()
        .collect();
    let distinct: BTreeSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 30, "every run claimed once: {all:?}");
    assert_eq!(distinct.len(), 30);
    replica.stop().await;
    s.stop().await;
}

#[tokio::test]
async fn queues_keep_runs_apart_and_a_waiting_claim_wakes_when_a_run_starts() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({"queue": "fast"})).await;
    queued_run(&s, &jwt, "s2", "r2", json!({"queue": "slow"})).await;
    let c = claim(&s, &jwt, json!({"queue": "slow"})).await.expect("r2");
    assert_eq!(
        (c["runId"].as_str(), c["queue"].as_str()),
        (Some("r2"), Some("slow"))
    );
    assert!(claim(&s, &jwt, json!({"queue": "slow"})).await.is_none());
    let c = claim(&s, &jwt, json!({"queue": "fast"})).await.expect("r1");
    assert_eq!(c["runId"], "r1");

    // A claim waiting on an empty queue gets the run started meanwhile
    // (through the other replica), well before its wait is over.
    let replica = s.replica_with_runtime(patient()).await;
    let waiting = {
        let (base, jwt) = (s.base.clone(), jwt.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let a = reqwest::Client::new()
                .post(format!("{base}/v1/runtime/claims"))
                .bearer_auth(&jwt)
                .json(&json!({"queue": "fast", "waitMs": 20_000}))
                .send()
                .await
                .expect("answers");
            (
                a.status().as_u16(),
                a.json::<Value>().await.ok(),
                started.elapsed(),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    queued_run(&replica, &jwt, "s3", "r3", json!({"queue": "fast"})).await;
    let (status, body, waited) = waiting.await.expect("the claim");
    assert_eq!(status, 200);
    assert_eq!(body.expect("a claim")["runId"], "r3");
    assert!(waited < Duration::from_secs(20), "woken, not timed out");
    replica.stop().await;
    s.stop().await;
}

#[tokio::test]
async fn a_lost_runtime_s_run_is_retried_by_another_and_the_zombie_cannot_write() {
    let s = Server::start_with_runtime(quick()).await;
    let jwt = backend("acme");
    queued_run(
        &s,
        &jwt,
        "s1",
        "r1",
        json!({"onLost": "retry", "maxAttempts": 2}),
    )
    .await;
    let a = claim(&s, &jwt, json!({"runtimeId": "a"}))
        .await
        .expect("r1");
    let lease_a = lease_of(&a);
    // Runtime a starts a backend tool call, then dies (no more heartbeats).
    append(
        &s,
        &jwt,
        "s1",
        Some(&lease_a),
        vec![event(
            "tool.call.started",
            "r1",
            "r1",
            json!({"toolCallId": "tc1", "toolName": "search", "executor": "backend", "args": {}}),
        )],
    )
    .await
    .expect(201);
    // Runtime b waits for work and gets r1 once a's lease lapses.
    let b = claim(&s, &jwt, json!({"runtimeId": "b", "waitMs": 10_000}))
        .await
        .expect("r1 again");
    assert_eq!(b["runId"], "r1");
    assert_eq!(b["reason"], "retry");
    assert_eq!(b["attempt"], 2);
    assert_eq!(b["cursor"], 0, "the new holder reads the whole run");
    let lease_b = lease_of(&b);
    assert_ne!(lease_a, lease_b);
    // The dangling call was closed before the hand-over.
    let h = whole_history(&s, &jwt, "s1").await;
    let finished = h
        .iter()
        .find(|e| e["type"] == "tool.call.finished")
        .expect("tc1 closed");
    assert_eq!(
        (finished["outcome"].as_str(), finished["code"].as_str()),
        (Some("cancelled"), Some("runtime_lost"))
    );
    // The zombie wakes up: its appends, heartbeats and release are refused.
    let zombie = append(
        &s,
        &jwt,
        "s1",
        Some(&lease_a),
        vec![event("run.finished", "r1", "r1", json!({}))],
    )
    .await;
    assert_eq!(
        (zombie.status, zombie.code()),
        (409, "NRD-0501"),
        "{}",
        zombie.body
    );
    let hb = s
        .post(
            &format!("/v1/runtime/leases/{lease_a}/heartbeat"),
            &jwt,
            &json!({}),
        )
        .await;
    assert_eq!(hb.code(), "NRD-0501");
    let rel = s
        .post(
            &format!("/v1/runtime/leases/{lease_a}/release"),
            &jwt,
            &json!({}),
        )
        .await;
    assert_eq!(rel.code(), "NRD-0501");
    // b finishes the run (heartbeating meanwhile would keep it; it is quick).
    append(
        &s,
        &jwt,
        "s1",
        Some(&lease_b),
        vec![event("run.finished", "r1", "r1", json!({}))],
    )
    .await
    .expect(201);
    let h = whole_history(&s, &jwt, "s1").await;
    assert_eq!(
        types(&h),
        [
            "run.started",
            "tool.call.started",
            "tool.call.finished",
            "run.finished"
        ]
    );
    obeys_the_rules(&h);
    s.stop().await;
}

#[tokio::test]
async fn the_fail_policy_closes_every_open_item_and_frees_the_session() {
    let s = Server::start_with_runtime(quick()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({"onLost": "fail"})).await;
    let a = claim(&s, &jwt, json!({})).await.expect("r1");
    let lease = lease_of(&a);
    // A child run with an open backend call, a client-free tree, and the
    // root paused on a blocking interrupt.
    append(&s, &jwt, "s1", Some(&lease), vec![
        event("run.started", "r1", "c1", json!({"parentRunId": "r1"})),
        event("tool.call.started", "r1", "c1",
            json!({"toolCallId": "tc1", "toolName": "search", "executor": "backend", "args": {"q": 1}})),
        event("interrupt.requested", "r1", "r1",
            json!({"interruptId": "i1", "waitId": "w1", "kind": "approval", "actions": ["approve", "deny"]})),
        event("run.paused", "r1", "r1",
            json!({"waitId": "w1", "interruptId": "i1", "reason": "narad.approval", "resumeMode": "command"})),
    ]).await.expect(201);
    // The runtime dies; the sweeper closes the run with ordinary events.
    let h = history_with(&s, &jwt, "s1", "run.error").await;
    let tail: Vec<(String, String)> = h[5..]
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["runId"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let pairs = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        tail,
        pairs(&[
            ("tool.call.finished", "c1"),
            ("run.error", "c1"),
            ("interrupt.resolved", "r1"),
            ("run.resumed", "r1"),
            ("run.error", "r1"),
        ])
    );
    let resolved = &h[7];
    assert_eq!(resolved["decision"], "expired");
    for e in h.iter().filter(|e| e["type"] == "run.error") {
        assert_eq!(e["code"], "runtime_lost");
    }
    obeys_the_rules(&h);
    // The slot is free: a new run starts without conflict.
    s.post(
        "/v1/commands/start-run",
        &jwt,
        &json!({"sessionId": "s1", "runId": "r2"}),
    )
    .await
    .expect(201);
    s.stop().await;
}

#[tokio::test]
async fn spent_attempts_close_the_run_under_the_retry_policy_too() {
    let s = Server::start_with_runtime(quick()).await;
    let jwt = backend("acme");
    queued_run(
        &s,
        &jwt,
        "s1",
        "r1",
        json!({"onLost": "retry", "maxAttempts": 1}),
    )
    .await;
    claim(&s, &jwt, json!({})).await.expect("r1");
    let h = history_with(&s, &jwt, "s1", "run.error").await;
    assert_eq!(types(&h), ["run.started", "run.error"]);
    assert_eq!(h[1]["code"], "runtime_lost");
    assert!(
        claim(&s, &jwt, json!({"waitMs": 500})).await.is_none(),
        "not queued again"
    );
    // The repair and the lapse are counted (the recorder is the process's,
    // shared by every test server in it: counts only grow).
    let scrape = Scrape::of(&s).await;
    let text = &scrape.text;
    let count = |name: &str| -> f64 {
        scrape
            .series
            .iter()
            .filter(|(k, _)| k.starts_with(name))
            .map(|(_, v)| v)
            .sum()
    };
    assert!(
        count("narad_runtime_repairs_total{reason=\"lost\"}") >= 1.0,
        "{text}"
    );
    assert!(count("narad_runtime_lease_expiries_total") >= 1.0, "{text}");
    assert!(count("narad_runtime_claims_total") >= 1.0, "{text}");
    assert!(text.contains("narad_runtime_claim_wait_seconds"), "{text}");
    s.stop().await;
}

#[tokio::test]
async fn a_stop_nobody_holds_is_served_by_the_server() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({})).await;
    s.post("/v1/commands/stop-run", &jwt, &json!({"runId": "r1"}))
        .await
        .expect(200);
    // Served in the command itself: no runtime held the run.
    let h = whole_history(&s, &jwt, "s1").await;
    assert_eq!(
        types(&h),
        ["run.started", "run.stop.requested", "run.cancelled"]
    );
    assert_eq!(h[2]["code"], "stopped_without_runtime");
    obeys_the_rules(&h);
    assert!(claim(&s, &jwt, json!({})).await.is_none());

    // A run its runtime released while it waits on an interrupt is closed
    // the same way, its interrupt and pause closed first.
    queued_run(&s, &jwt, "s2", "r2", json!({})).await;
    let c = claim(&s, &jwt, json!({})).await.expect("r2");
    let lease = lease_of(&c);
    let appended = append(&s, &jwt, "s2", Some(&lease), vec![
        event("interrupt.requested", "r2", "r2",
            json!({"interruptId": "i2", "waitId": "w2", "kind": "approval", "actions": ["approve"]})),
        event("run.paused", "r2", "r2",
            json!({"waitId": "w2", "interruptId": "i2", "reason": "narad.approval", "resumeMode": "command"})),
    ]).await;
    let through = appended.expect(201)["events"][1]["sessionSequence"]
        .as_u64()
        .unwrap();
    let r = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &jwt,
            &json!({"handledThrough": through}),
        )
        .await;
    assert_eq!(r.expect(200)["released"], "idle");
    s.post("/v1/commands/stop-run", &jwt, &json!({"runId": "r2"}))
        .await
        .expect(200);
    let h = whole_history(&s, &jwt, "s2").await;
    assert_eq!(
        types(&h),
        [
            "run.started",
            "interrupt.requested",
            "run.paused",
            "run.stop.requested",
            "interrupt.resolved",
            "run.resumed",
            "run.cancelled"
        ]
    );
    obeys_the_rules(&h);
    s.stop().await;
}

#[tokio::test]
async fn a_stop_a_sweep_took_first_is_closed_before_the_command_answers() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({})).await;
    // The interleaving CI met: a sweep took the unheld stop between the
    // command's append and its own closing, and had not written yet.
    let (admin, conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .expect("connects");
    tokio::spawn(conn);
    let n = admin
        .execute(
            "update run_work set state = 'closing', reason = 'stopped', stop_requested = true, \
             changed_at = now() where root_run_id = 'r1'",
            &[],
        )
        .await
        .expect("updates");
    assert_eq!(n, 1);
    s.post("/v1/commands/stop-run", &jwt, &json!({"runId": "r1"}))
        .await
        .expect(200);
    let h = whole_history(&s, &jwt, "s1").await;
    assert_eq!(
        types(&h),
        ["run.started", "run.stop.requested", "run.cancelled"]
    );
    assert_eq!(h[2]["code"], "stopped_without_runtime");
    obeys_the_rules(&h);
    s.stop().await;
}

#[tokio::test]
async fn a_stop_reaches_the_runtime_holding_the_run() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({})).await;
    let c = claim(&s, &jwt, json!({})).await.expect("r1");
    let lease = lease_of(&c);
    let polling = {
        let (base, jwt, lease) = (s.base.clone(), jwt.clone(), lease.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .get(format!(
                    "{base}/v1/runtime/leases/{lease}/controls?waitMs=20000"
                ))
                .bearer_auth(&jwt)
                .send()
                .await
                .expect("answers")
                .json::<Value>()
                .await
                .expect("json")
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.post("/v1/commands/stop-run", &jwt, &json!({"runId": "r1"}))
        .await
        .expect(200);
    let control = tokio::time::timeout(Duration::from_secs(10), polling)
        .await
        .expect("the poll answers on the stop")
        .expect("the poll");
    assert_eq!(control["stopRequested"], true);
    assert_eq!(control["runId"], "r1");
    let hb = s
        .post(
            &format!("/v1/runtime/leases/{lease}/heartbeat"),
            &jwt,
            &json!({}),
        )
        .await;
    assert_eq!(hb.expect(200)["stopRequested"], true);
    // The server left the run to its holder, which ends it.
    assert_eq!(
        types(&whole_history(&s, &jwt, "s1").await),
        ["run.started", "run.stop.requested"]
    );
    append(
        &s,
        &jwt,
        "s1",
        Some(&lease),
        vec![event("run.cancelled", "r1", "r1", json!({}))],
    )
    .await
    .expect(201);
    let r = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &jwt,
            &json!({}),
        )
        .await;
    assert_eq!(r.expect(200)["released"], "ended");
    s.stop().await;
}

#[tokio::test]
async fn a_released_run_is_queued_again_by_the_next_event_of_its_journal() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({})).await;
    let c = claim(&s, &jwt, json!({})).await.expect("r1");
    let lease = lease_of(&c);
    let ask = |n: u32| {
        vec![
            event(
                "interrupt.requested",
                "r1",
                "r1",
                json!({"interruptId": format!("i{n}"), "waitId": format!("w{n}"), "kind": "approval", "actions": ["approve"]}),
            ),
            event(
                "run.paused",
                "r1",
                "r1",
                json!({"waitId": format!("w{n}"), "interruptId": format!("i{n}"), "reason": "narad.approval", "resumeMode": "command"}),
            ),
        ]
    };
    let a = append(&s, &jwt, "s1", Some(&lease), ask(1)).await;
    let through = a.expect(201)["events"][1]["sessionSequence"]
        .as_u64()
        .unwrap();
    let r = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &jwt,
            &json!({"handledThrough": through}),
        )
        .await;
    assert_eq!(r.expect(200)["released"], "idle");
    assert!(
        claim(&s, &jwt, json!({})).await.is_none(),
        "waiting on a person"
    );
    // Released with its lease, the old lease fences nothing any more.
    let a = append(
        &s,
        &jwt,
        "s1",
        Some(&lease),
        vec![event("run.resumed", "r1", "r1", json!({"waitId": "w1"}))],
    )
    .await;
    assert_eq!(a.code(), "NRD-0501");

    // The resolution queues the run again; the claim says where to read.
    s.post(
        "/v1/commands/resolve-interrupt",
        &jwt,
        &json!({"interruptId": "i1", "decision": "approve"}),
    )
    .await
    .expect(200);
    let c = claim(&s, &jwt, json!({"waitMs": 5_000}))
        .await
        .expect("r1 again");
    assert_eq!(
        (
            c["reason"].as_str(),
            c["cursor"].as_u64(),
            c["attempt"].as_u64()
        ),
        (Some("event"), Some(through), Some(1))
    );
    let lease = lease_of(&c);

    // A release that missed an event is queued again at once.
    let a = append(&s, &jwt, "s1", Some(&lease), {
        let mut v = vec![event("run.resumed", "r1", "r1", json!({"waitId": "w1"}))];
        v.extend(ask(2));
        v
    })
    .await;
    let seen = a.expect(201)["events"][0]["sessionSequence"]
        .as_u64()
        .unwrap();
    let r = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &jwt,
            &json!({"handledThrough": seen}),
        )
        .await;
    assert_eq!(r.expect(200)["released"], "ready");
    let c = claim(&s, &jwt, json!({})).await.expect("r1 at once");
    assert_eq!(c["cursor"].as_u64(), Some(seen));
    s.stop().await;
}

#[tokio::test]
async fn a_queued_start_keeps_its_runtime_settings_until_it_takes_the_slot() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({})).await;
    let a = s
        .post(
            "/v1/commands/start-run",
            &jwt,
            &json!({"sessionId": "s1", "runId": "r2",
        "onConflict": "enqueue", "runtime": {"queue": "later", "onLost": "fail"}}),
        )
        .await;
    assert!(a.status == 201 || a.status == 202, "{}", a.body);
    assert!(
        claim(&s, &jwt, json!({"queue": "later"})).await.is_none(),
        "r2 waits for the slot"
    );
    let c = claim(&s, &jwt, json!({})).await.expect("r1");
    append(
        &s,
        &jwt,
        "s1",
        Some(&lease_of(&c)),
        vec![event("run.finished", "r1", "r1", json!({}))],
    )
    .await
    .expect(201);
    // r1's end started r2 in the same transaction, queued with its settings.
    let c = claim(&s, &jwt, json!({"queue": "later"}))
        .await
        .expect("r2");
    assert_eq!(
        (c["runId"].as_str(), c["onLost"].as_str()),
        (Some("r2"), Some("fail"))
    );
    s.stop().await;
}

#[tokio::test]
async fn a_thousand_runs_through_four_runtimes_each_end_exactly_once() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    // 100 sessions × 10 runs, queued behind each other in their session.
    let sessions = 100;
    let per_session = 10;
    futures::future::join_all((0..sessions).map(|i| {
        let (s, jwt) = (&s, &jwt);
        async move {
            let session = format!("s{i}");
            s.post("/v1/sessions", jwt, &json!({ "sessionId": session }))
                .await
                .expect(201);
            for j in 0..per_session {
                let a = s
                    .post(
                        "/v1/commands/start-run",
                        jwt,
                        &json!({"sessionId": session,
                    "runId": format!("r{i}-{j}"), "onConflict": "enqueue", "runtime": {}}),
                    )
                    .await;
                assert!(a.status == 201 || a.status == 202, "{}", a.body);
            }
        }
    }))
    .await;
    let held = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let runtimes = (0..4).map(|n| {
        let (s, jwt, held) = (&s, &jwt, held.clone());
        async move {
            loop {
                let Some(c) = claim(s, jwt, json!({"runtimeId": format!("rt{n}"), "waitMs": 2_000})).await else {
                    return;
                };
                let run = c["runId"].as_str().unwrap().to_owned();
                let session = c["sessionId"].as_str().unwrap().to_owned();
                *held.lock().unwrap().entry(run.clone()).or_default() += 1;
                let lease = lease_of(&c);
                append(s, jwt, &session, Some(&lease), vec![
                    event("message.text.started", &run, &run,
                        json!({"messageId": format!("m-{run}"), "role": "assistant", "messageScope": "run"})),
                    event("message.text.delta", &run, &run, json!({"messageId": format!("m-{run}"), "delta": "ok"})),
                    event("message.text.completed", &run, &run, json!({"messageId": format!("m-{run}")})),
                    event("run.finished", &run, &run, json!({})),
                ]).await.expect(201);
                let r = s.post(&format!("/v1/runtime/leases/{lease}/release"), jwt, &json!({})).await;
                assert_eq!(r.expect(200)["released"], "ended");
            }
        }
    });
    futures::future::join_all(runtimes).await;
    let held = held.lock().unwrap().clone();
    assert_eq!(
        held.len(),
        sessions * per_session,
        "every run was handed out"
    );
    assert!(held.values().all(|&n| n == 1), "each run held once");
    for i in 0..sessions {
        let h = whole_history(&s, &jwt, &format!("s{i}")).await;
        let mut ends: BTreeMap<String, usize> = BTreeMap::new();
        for e in &h {
            let t = e["type"].as_str().unwrap();
            if matches!(t, "run.finished" | "run.error" | "run.cancelled") {
                *ends
                    .entry(e["runId"].as_str().unwrap().to_owned())
                    .or_default() += 1;
            }
        }
        assert_eq!(ends.len(), per_session, "session s{i}: {ends:?}");
        assert!(
            ends.values().all(|&n| n == 1),
            "exactly one terminal per run in s{i}"
        );
        obeys_the_rules(&h);
    }
    s.stop().await;
}

#[tokio::test]
async fn a_token_limited_to_sessions_cannot_act_as_a_runtime() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "secret", "r1", json!({})).await;
    let mut limited = claims("acme", "narrow", &[Role::Backend, Role::Reader]);
    limited.sessions = Some(vec!["mine".into()]);
    let limited = hs256(&limited);
    let a = s.post("/v1/runtime/claims", &limited, &json!({})).await;
    assert_eq!((a.status, a.code()), (403, "NRD-0102"), "{}", a.body);
    // The run is still there for a runtime of the whole tenant.
    let c = claim(&s, &jwt, json!({})).await.expect("r1");
    let lease = lease_of(&c);
    for path in ["heartbeat", "release"] {
        let a = s
            .post(
                &format!("/v1/runtime/leases/{lease}/{path}"),
                &limited,
                &json!({}),
            )
            .await;
        assert_eq!(
            (a.status, a.code()),
            (403, "NRD-0102"),
            "{path}: {}",
            a.body
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn a_release_while_the_run_goes_on_must_say_what_it_handled() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({})).await;
    let c = claim(&s, &jwt, json!({})).await.expect("r1");
    let lease = lease_of(&c);
    let a = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &jwt,
            &json!({}),
        )
        .await;
    assert_eq!((a.status, a.code()), (400, "NRD-0003"), "{}", a.body);
    // Still held: the lease works.
    s.post(
        &format!("/v1/runtime/leases/{lease}/heartbeat"),
        &jwt,
        &json!({}),
    )
    .await
    .expect(200);
    s.stop().await;
}

#[tokio::test]
async fn a_stop_in_the_same_write_as_the_start_is_recorded_for_the_runtime() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    s.post("/v1/sessions", &jwt, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    // Concurrent appends share transactions: a start and a stop of the
    // same run may land in one write. Send them together, many times.
    for n in 0..20 {
        let run = format!("r{n}");
        let body = json!({"sessionId": "s1", "runId": run, "runtime": {}});
        let start = s.post("/v1/commands/start-run", &jwt, &body);
        let stop = append(
            &s,
            &jwt,
            "s1",
            None,
            vec![event(
                "run.stop.requested",
                &run,
                &run,
                json!({"targetRunId": run}),
            )],
        );
        let (started, _) = futures::join!(start, stop);
        started.expect(201);
        // Whether the stop landed with the start, after it, or was refused
        // before it (nothing to stop yet), the item agrees with the journal.
        let h = whole_history(&s, &jwt, "s1").await;
        let stopped = h
            .iter()
            .any(|e| e["type"] == "run.stop.requested" && e["runId"] == run.as_str());
        if stopped {
            // Nobody held it: the server serves the stop, whenever it
            // landed (the item records it even in the start's own write).
            assert_eq!(
                terminal_of(&s, &jwt, "s1", &run).await,
                "run.cancelled",
                "{n}"
            );
        } else {
            let c = claim(&s, &jwt, json!({})).await.expect("the run");
            assert_eq!(c["stopRequested"], false);
            append(
                &s,
                &jwt,
                "s1",
                Some(&lease_of(&c)),
                vec![event("run.finished", &run, &run, json!({}))],
            )
            .await
            .expect(201);
        }
    }
    obeys_the_rules(&whole_history(&s, &jwt, "s1").await);
    s.stop().await;
}

/// A workflow-owned run: `(workflow, run)` started for the runtimes.
async fn queued_workflow_run(s: &Server, jwt: &str, runtime: Value) {
    s.post("/v1/sessions", jwt, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    let w = s
        .post(
            "/v1/commands/start-workflow",
            jwt,
            &json!({"sessionId": "s1", "workflowId": "wf1"}),
        )
        .await;
    assert!(w.status < 300, "{}", w.body);
    s.post(
        "/v1/commands/start-run",
        jwt,
        &json!({"sessionId": "s1", "runId": "r1", "workflowId": "wf1", "runtime": runtime}),
    )
    .await
    .expect(201);
}

fn workflow_event(kind: &str, fields: Value) -> Value {
    let mut e = json!({"protocolVersion": "narad/v1", "type": kind,
        "eventId": uuid::Uuid::now_v7().to_string(), "workflowId": "wf1"});
    for (k, v) in fields.as_object().expect("an object") {
        e[k] = v.clone();
    }
    e
}

#[tokio::test]
async fn a_workflow_interrupt_s_resolution_queues_the_released_run_again() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    queued_workflow_run(&s, &jwt, json!({})).await;
    let c = claim(&s, &jwt, json!({})).await.expect("r1");
    let lease = lease_of(&c);
    let a = append(
        &s,
        &jwt,
        "s1",
        Some(&lease),
        vec![
            workflow_event(
                "interrupt.requested",
                json!({"interruptId": "i1", "waitId": "w1",
            "kind": "review", "actions": ["approve"], "scope": "workflow"}),
            ),
            workflow_event(
                "workflow.paused",
                json!({"waitId": "w1", "interruptId": "i1"}),
            ),
        ],
    )
    .await;
    let through = a.expect(201)["events"][1]["sessionSequence"]
        .as_u64()
        .unwrap();
    let r = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &jwt,
            &json!({"handledThrough": through}),
        )
        .await;
    assert_eq!(r.expect(200)["released"], "idle");
    s.post(
        "/v1/commands/resolve-interrupt",
        &jwt,
        &json!({"interruptId": "i1", "decision": "approve"}),
    )
    .await
    .expect(200);
    let c = claim(&s, &jwt, json!({"waitMs": 5_000}))
        .await
        .expect("r1 again");
    assert_eq!(
        (c["runId"].as_str(), c["reason"].as_str()),
        (Some("r1"), Some("event"))
    );
    s.stop().await;
}

#[tokio::test]
async fn a_repair_gives_a_workflow_its_owed_pause_before_closing_its_run() {
    let s = Server::start_with_runtime(quick()).await;
    let jwt = backend("acme");
    queued_workflow_run(&s, &jwt, json!({"onLost": "fail"})).await;
    let c = claim(&s, &jwt, json!({})).await.expect("r1");
    // The runtime asks the workflow's reviewer, then dies before the pause.
    append(
        &s,
        &jwt,
        "s1",
        Some(&lease_of(&c)),
        vec![workflow_event(
            "interrupt.requested",
            json!({"interruptId": "i1", "waitId": "w1",
            "kind": "review", "actions": ["approve"], "scope": "workflow"}),
        )],
    )
    .await
    .expect(201);
    assert_eq!(terminal_of(&s, &jwt, "s1", "r1").await, "run.error");
    let h = whole_history(&s, &jwt, "s1").await;
    let tail: Vec<String> = types(&h)
        .into_iter()
        .skip_while(|t| t != "interrupt.requested")
        .collect();
    assert_eq!(
        tail,
        ["interrupt.requested", "workflow.paused", "run.error"]
    );
    obeys_the_rules(&h);
    s.stop().await;
}

#[tokio::test]
async fn the_queue_depth_gauge_reads_zero_once_a_queue_drains() {
    let s = Server::start_with_runtime(patient()).await;
    let jwt = backend("acme");
    // The gauge counts every queue of every tenant by state (the recorder
    // is the process's: nextest runs each test in a process of its own).
    queued_run(&s, &jwt, "s1", "r1", json!({"queue": "drain-check"})).await;
    let ready = "narad_runtime_queue_depth{state=\"ready\"}";
    let claimed = "narad_runtime_queue_depth{state=\"claimed\"}";
    // Every replica samples the queues with its other gauges, every 5 s.
    let until = async |line: &str, value: f64| {
        for _ in 0..300 {
            if Scrape::of(&s).await.series.get(line) == Some(&value) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{line} never read {value}");
    };
    until(ready, 1.0).await;
    let c = claim(&s, &jwt, json!({"queue": "drain-check"}))
        .await
        .expect("r1");
    until(claimed, 1.0).await;
    append(
        &s,
        &jwt,
        "s1",
        Some(&lease_of(&c)),
        vec![event("run.finished", "r1", "r1", json!({}))],
    )
    .await
    .expect(201);
    until(claimed, 0.0).await;
    until(ready, 0.0).await;
    s.stop().await;
}

#[tokio::test]
async fn a_repair_whose_closer_died_is_taken_over_by_a_later_sweep() {
    let s = Server::start_with_runtime(RuntimeSettings {
        stall: Duration::from_millis(500),
        ..patient()
    })
    .await;
    let jwt = backend("acme");
    queued_run(&s, &jwt, "s1", "r1", json!({"onLost": "fail"})).await;
    claim(&s, &jwt, json!({})).await.expect("r1");
    // A closer took the item and died before writing anything.
    let (admin, conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .expect("connects");
    tokio::spawn(conn);
    let n = admin
        .execute(
            "update run_work set state = 'closing', reason = 'lost', lease_id = null, \
             lease_expires_at = null, changed_at = now() where root_run_id = 'r1'",
            &[],
        )
        .await
        .expect("updates");
    assert_eq!(n, 1);
    assert_eq!(terminal_of(&s, &jwt, "s1", "r1").await, "run.error");
    let h = whole_history(&s, &jwt, "s1").await;
    assert_eq!(types(&h), ["run.started", "run.error"]);
    assert_eq!(h[1]["code"], "runtime_lost");
    s.stop().await;
}

#[tokio::test]
async fn a_retry_cancels_the_lost_runtime_s_backend_calls_and_leaves_client_calls_open() {
    let s = Server::start_with_runtime(quick()).await;
    let jwt = backend("acme");
    s.post("/v1/sessions", &jwt, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-run",
        &jwt,
        &json!({"sessionId": "s1", "runId": "r1", "clientExecutorId": "desk-9", "runtime": {}}),
    )
    .await
    .expect(201);
    let a = claim(&s, &jwt, json!({})).await.expect("r1");
    append(&s, &jwt, "s1", Some(&lease_of(&a)), vec![
        event("tool.call.started", "r1", "r1",
            json!({"toolCallId": "backend-1", "toolName": "search", "executor": "backend", "args": {}})),
        event("tool.call.started", "r1", "r1",
            json!({"toolCallId": "client-1", "toolName": "clock.now", "executor": "client", "args": {}})),
    ])
    .await
    .expect(201);
    let b = claim(&s, &jwt, json!({"waitMs": 10_000}))
        .await
        .expect("r1 again");
    assert_eq!(b["reason"], "retry");
    let h = whole_history(&s, &jwt, "s1").await;
    let finished: Vec<&str> = h
        .iter()
        .filter(|e| e["type"] == "tool.call.finished")
        .map(|e| e["toolCallId"].as_str().unwrap())
        .collect();
    assert_eq!(
        finished,
        ["backend-1"],
        "the client call stays with its executor"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_fence_covers_the_workflow_events_of_a_held_run() {
    let s = Server::start_with_runtime(quick()).await;
    let jwt = backend("acme");
    queued_workflow_run(&s, &jwt, json!({"onLost": "retry", "maxAttempts": 2})).await;
    let a = claim(&s, &jwt, json!({})).await.expect("r1");
    let ask = |n: u32| {
        vec![workflow_event(
            "interrupt.requested",
            json!({"interruptId": format!("i{n}"), "waitId": format!("w{n}"),
                "kind": "review", "actions": ["approve"], "scope": "workflow"}),
        )]
    };
    // Held: a workflow event without the lease is refused.
    let no_lease = append(&s, &jwt, "s1", None, ask(1)).await;
    assert_eq!(
        (no_lease.status, no_lease.code()),
        (409, "NRD-0502"),
        "{}",
        no_lease.body
    );
    // The holder dies; another takes the run over.
    let b = claim(&s, &jwt, json!({"waitMs": 10_000}))
        .await
        .expect("r1 again");
    assert_eq!(b["reason"], "retry");
    // The zombie's workflow event is refused; the new holder's is taken.
    let zombie = append(&s, &jwt, "s1", Some(&lease_of(&a)), ask(1)).await;
    assert_eq!(
        (zombie.status, zombie.code()),
        (409, "NRD-0501"),
        "{}",
        zombie.body
    );
    append(&s, &jwt, "s1", Some(&lease_of(&b)), ask(2))
        .await
        .expect(201);
    s.stop().await;
}

/// §6.3: a run asked to stop ends; when its runtime is lost before ending
/// it, the server does not hand the run on but closes it cancelled.
#[tokio::test]
async fn a_stopped_run_whose_runtime_is_lost_is_cancelled_not_retried() {
    let s = Server::start_with_runtime(quick()).await;
    let jwt = backend("acme");
    queued_run(
        &s,
        &jwt,
        "s1",
        "r1",
        json!({"onLost": "retry", "maxAttempts": 3}),
    )
    .await;
    claim(&s, &jwt, json!({})).await.expect("r1");
    s.post("/v1/commands/stop-run", &jwt, &json!({"runId": "r1"}))
        .await
        .expect(200);
    // Held: the stop is the holder's to serve; the holder dies instead.
    assert_eq!(terminal_of(&s, &jwt, "s1", "r1").await, "run.cancelled");
    let h = whole_history(&s, &jwt, "s1").await;
    assert_eq!(
        types(&h),
        ["run.started", "run.stop.requested", "run.cancelled"]
    );
    assert!(claim(&s, &jwt, json!({})).await.is_none(), "not handed on");
    obeys_the_rules(&h);
    s.stop().await;
}

/// A run started with no runtime (the console's Start run, a bare
/// start-run) and asked to stop is closed by the server once its journal
/// stays silent for the stop grace: its open work closed first, then
/// `run.cancelled` with code `stop_unanswered`; the session is free again.
/// A backend that keeps writing, or answers the stop itself, is left to.
#[tokio::test]
async fn a_stopped_run_nothing_drives_is_closed_after_the_grace() {
    let s = Server::start_with_runtime(RuntimeSettings {
        stop_grace: Duration::from_secs(1),
        ..patient()
    })
    .await;
    let jwt = backend("acme");
    // Nothing drives r1; it had a backend tool call open.
    queued_run(&s, &jwt, "s1", "r1", Value::Null).await;
    append(
        &s,
        &jwt,
        "s1",
        None,
        vec![event(
            "tool.call.started",
            "r1",
            "r1",
            json!({"toolCallId": "t1", "toolName": "search", "executor": "backend", "args": {}}),
        )],
    )
    .await
    .expect(201);
    let stopped_at = std::time::Instant::now();
    s.post("/v1/commands/stop-run", &jwt, &json!({"runId": "r1"}))
        .await
        .expect(200);
    let h = history_with(&s, &jwt, "s1", "run.cancelled").await;
    assert!(
        stopped_at.elapsed() >= Duration::from_secs(1),
        "not before the grace"
    );
    assert_eq!(
        types(&h),
        [
            "run.started",
            "tool.call.started",
            "run.stop.requested",
            "tool.call.finished",
            "run.cancelled"
        ]
    );
    assert_eq!(h[3]["outcome"], "cancelled");
    assert_eq!(h[4]["code"], "stop_unanswered");
    obeys_the_rules(&h);
    // The session's slot is free: another run starts.
    s.post(
        "/v1/commands/start-run",
        &jwt,
        &json!({"sessionId": "s1", "runId": "r1b"}),
    )
    .await
    .expect(201);

    // A backend that keeps writing after the stop is not cut off; once it
    // answers the stop itself, the server writes nothing.
    s.post("/v1/sessions", &jwt, &json!({"sessionId": "s2"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-run",
        &jwt,
        &json!({"sessionId": "s2", "runId": "r2"}),
    )
    .await
    .expect(201);
    append(
        &s,
        &jwt,
        "s2",
        None,
        vec![event(
            "message.text.started",
            "r2",
            "r2",
            json!({"messageId": "m2", "role": "assistant", "messageScope": "run"}),
        )],
    )
    .await
    .expect(201);
    s.post("/v1/commands/stop-run", &jwt, &json!({"runId": "r2"}))
        .await
        .expect(200);
    for i in 0..8 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        append(
            &s,
            &jwt,
            "s2",
            None,
            vec![event(
                "message.text.delta",
                "r2",
                "r2",
                json!({"messageId": "m2", "delta": format!("part {i} ")}),
            )],
        )
        .await
        .expect(201);
    }
    append(
        &s,
        &jwt,
        "s2",
        None,
        vec![
            event(
                "message.text.completed",
                "r2",
                "r2",
                json!({"messageId": "m2"}),
            ),
            event("run.cancelled", "r2", "r2", json!({"code": "user_stop"})),
        ],
    )
    .await
    .expect(201);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let h = whole_history(&s, &jwt, "s2").await;
    let terminals: Vec<&Value> = h.iter().filter(|e| e["type"] == "run.cancelled").collect();
    assert_eq!(terminals.len(), 1, "{:?}", types(&h));
    assert_eq!(terminals[0]["code"], "user_stop");
    obeys_the_rules(&h);
    s.stop().await;
}
