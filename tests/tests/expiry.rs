//! Approval expiry (spec §7.6 `expiresAt`, §7.7): an open interrupt whose
//! deadline passes is resolved by the server with `decision: "expired"`,
//! exactly once, also against approvals racing it; interrupts that name no
//! deadline expire after the configured default; the resolution wakes a
//! runtime's run that waits on it.

use std::time::Duration;

use narad_server::auth::Role;
use narad_server::runtime::RuntimeSettings;
use narad_tests::run_event as event;
use narad_tests::*;
use serde_json::{Value, json};

/// An RFC 3339 time `ms` milliseconds from now.
fn in_ms(ms: i64) -> String {
    (chrono::Utc::now() + chrono::TimeDelta::milliseconds(ms))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A session whose run waits on interrupt `interrupt`, with `expires_at`
/// as its deadline when given.
async fn waiting(s: &Server, t: &str, session: &str, interrupt: &str, expires_at: Option<&str>) {
    let request = match expires_at {
        Some(at) => json!({ "expiresAt": at }),
        None => json!({}),
    };
    waiting_on_interrupt(s, t, session, json!({}), interrupt, request).await;
}

/// The `interrupt.resolved` events of a session.
async fn resolutions(s: &Server, t: &str, session: &str) -> Vec<Value> {
    let history = s
        .get(&format!("/v1/sessions/{session}/events?limit=1000"), t)
        .await;
    history.expect(200)["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "interrupt.resolved")
        .cloned()
        .collect()
}

/// Waits up to 15 s for the session to hold a resolution.
async fn resolved(s: &Server, t: &str, session: &str) -> Vec<Value> {
    for _ in 0..300 {
        let found = resolutions(s, t, session).await;
        if !found.is_empty() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("session {session}: no interrupt.resolved within 15 s");
}

#[tokio::test]
async fn an_interrupt_past_its_deadline_is_resolved_expired_once() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    waiting(&s, &t, "s-1", "i-1", Some(&in_ms(800))).await;
    // Another, due much later, is left alone.
    waiting(&s, &t, "s-2", "i-2", Some(&in_ms(3_600_000))).await;
    // Not before its time.
    assert!(resolutions(&s, &t, "s-1").await.is_empty());

    let found = resolved(&s, &t, "s-1").await;
    assert_eq!(found.len(), 1);
    let e = &found[0];
    assert_eq!(e["decision"], "expired");
    assert_eq!(e["interruptId"], "i-1");
    assert_eq!(e["waitId"], "w");
    assert_eq!(e["runId"], "s-1-r");
    assert!(e.get("actor").is_none(), "the server decided: {e}");

    // A decision after it is the conflict with the recorded decision.
    let late = s
        .post(
            "/v1/commands/resolve-interrupt",
            &t,
            &json!({"sessionId": "s-1", "interruptId": "i-1", "decision": "approve"}),
        )
        .await;
    let body = late.expect(409);
    assert_eq!(body["code"], "NRD-0205", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("expired"),
        "{body}"
    );

    // It left the inbox; the later one waits there still, and stays open.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(resolutions(&s, &t, "s-1").await.len(), 1);
    assert!(resolutions(&s, &t, "s-2").await.is_empty());
    let inbox = s.get("/v1/interrupts", &t).await;
    let ids: Vec<&str> = inbox.expect(200)["interrupts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["interruptId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["i-2"]);
}

#[tokio::test]
async fn expiry_racing_approvals_resolves_each_interrupt_exactly_once() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let n = 12;
    let due = in_ms(1500);
    for i in 0..n {
        waiting(&s, &t, &format!("r-{i}"), &format!("i-{i}"), Some(&due)).await;
    }
    // Approvals land around the deadline, some before, some after.
    let until = chrono::DateTime::parse_from_rfc3339(&due).unwrap();
    let wait = (until.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(wait.saturating_sub(Duration::from_millis(300))).await;
    let mut answers = Vec::new();
    for i in 0..n {
        answers.push(
            s.post(
                "/v1/commands/resolve-interrupt",
                &t,
                &json!({"sessionId": format!("r-{i}"), "interruptId": format!("i-{i}"), "decision": "approve"}),
            )
            .await,
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (mut approved, mut expired) = (0, 0);
    for (i, answer) in answers.iter().enumerate() {
        let found = resolutions(&s, &t, &format!("r-{i}")).await;
        assert_eq!(found.len(), 1, "interrupt i-{i}: {found:?}");
        match (answer.status, found[0]["decision"].as_str().unwrap()) {
            (200 | 201, "approve") => approved += 1,
            (409, "expired") => {
                assert!(answer.body["message"].as_str().unwrap().contains("expired"));
                expired += 1;
            }
            (status, decision) => {
                panic!("i-{i}: the command answered {status} but the journal holds {decision}")
            }
        }
    }
    assert_eq!(approved + expired, n);
}

#[tokio::test]
async fn interrupts_naming_no_deadline_expire_after_the_default() {
    let s = Server::start_with_runtime(RuntimeSettings {
        interrupt_default_expiry: Some(Duration::from_secs(1)),
        ..RuntimeSettings::default()
    })
    .await;
    let t = token("acme", &Role::ALL);
    waiting(&s, &t, "d-1", "i-1", None).await;
    // A named deadline wins over the default.
    waiting(&s, &t, "d-2", "i-2", Some(&in_ms(3_600_000))).await;
    let found = resolved(&s, &t, "d-1").await;
    assert_eq!(found[0]["decision"], "expired");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(resolutions(&s, &t, "d-2").await.is_empty());
}

#[tokio::test]
async fn an_expiry_wakes_the_runtime_run_that_waits_on_it() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    s.post("/v1/sessions", &t, &json!({"sessionId": "w-1"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/start-run",
        &t,
        &json!({"sessionId": "w-1", "runId": "w-1-r", "runtime": {}}),
    )
    .await
    .expect(201);
    let claim = s.post("/v1/runtime/claims", &t, &json!({})).await;
    let claimed = claim.expect(200).clone();
    let lease = claimed["lease"]["leaseId"].as_str().unwrap().to_owned();
    let answer = s
        .post_with(
            "/v1/sessions/w-1/events",
            &t,
            &json!({"events": [
                event("w-q", "interrupt.requested", "w-1-r",
                    json!({"interruptId": "i-w", "waitId": "w", "kind": "tool.approval",
                           "actions": ["approve", "deny"], "expiresAt": in_ms(1000)})),
                event("w-p", "run.paused", "w-1-r",
                    json!({"waitId": "w", "reason": "interrupt", "resumeMode": "command", "interruptId": "i-w"})),
            ]}),
            &[("narad-runtime-lease", lease.as_str())],
        )
        .await;
    answer.expect(201);
    // The runtime lets the run wait without it.
    let through = answer.body["events"][1]["sessionSequence"]
        .as_u64()
        .unwrap();
    let released = s
        .post(
            &format!("/v1/runtime/leases/{lease}/release"),
            &t,
            &json!({"handledThrough": through}),
        )
        .await;
    assert_eq!(released.expect(200)["released"], "idle");
    assert_eq!(
        s.post("/v1/runtime/claims", &t, &json!({})).await.status,
        204
    );
    // The expiry makes it claimable again, with the resolution to read.
    let again = s
        .post("/v1/runtime/claims", &t, &json!({"waitMs": 10000}))
        .await;
    let reclaimed = again.expect(200);
    assert_eq!(reclaimed["runId"], "w-1-r", "{reclaimed}");
    assert_eq!(reclaimed["reason"], "event", "{reclaimed}");
    let found = resolutions(&s, &t, "w-1").await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["decision"], "expired");
}
