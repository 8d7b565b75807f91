//! The SDK's graph view against real servers: a follower from the start
//! and one resuming mid-way, on another replica, hold the graph rebuilt
//! from the journal.

use std::time::Duration;

use narad_client::{Client, Item};
use narad_protocol::graph::derive;
use narad_server::auth::Role;
use narad_tests::{Server, authority, session_with_run, token, whole_history};
use serde_json::{Value, json};

fn ev(id: &str, ty: &str, run: &str, body: Value) -> Value {
    let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": id,
        "rootRunId": "r1", "runId": run});
    for (k, v) in body.as_object().expect("an object") {
        e[k] = v.clone();
    }
    e
}

async fn until(follow: &mut narad_client::Follow, upto: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let item = tokio::time::timeout_at(deadline, follow.next())
            .await
            .expect("in time")
            .expect("goes on")
            .expect("an item");
        if let Item::Authority(e) = item
            && e["sessionSequence"] == upto
        {
            break;
        }
    }
    // The records derived from the last event follow it.
    while let Ok(Ok(Some(_))) =
        tokio::time::timeout(Duration::from_millis(300), follow.next()).await
    {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_hold_the_rebuilt_graph() {
    let a = Server::start().await;
    let b = a.replica().await;
    let t = token("acme", &Role::ALL);
    session_with_run(&a, &t, "s1", "r1", None).await;
    let append = |events: Vec<Value>| {
        let (a, t) = (&a, &t);
        async move {
            a.post("/v1/sessions/s1/events", t, &json!({ "events": events }))
                .await
                .expect(201);
        }
    };
    append(vec![
        ev(
            "t1",
            "tool.call.started",
            "r1",
            json!({"toolCallId": "t1", "toolName": "x", "executor": "backend", "args": {}}),
        ),
        ev("r2", "run.started", "r2", json!({"parentRunId": "r1"})),
    ])
    .await;
    let client = Client::new(vec![a.base.clone(), b.base.clone()], &t);
    let mut from_start = client.follow_session("s1");
    let resuming = Client::new(vec![b.base.clone()], &t);
    let mut resumed = resuming.follow_session_after("s1", 2);
    until(&mut from_start, 3).await;
    until(&mut resumed, 3).await;
    append(vec![
        ev(
            "t1f",
            "tool.call.finished",
            "r1",
            json!({"toolCallId": "t1", "outcome": "error", "response": null, "code": "boom"}),
        ),
        ev("r2f", "run.cancelled", "r2", json!({})),
    ])
    .await;
    until(&mut from_start, 5).await;
    until(&mut resumed, 5).await;
    let events = authority(&whole_history(&a, &t, "s1").await);
    let expected = derive(&events);
    let expected = expected
        .iter()
        .find(|g| g.root_run_id().as_str() == "r1")
        .expect("r1");
    for follow in [&from_start, &resumed] {
        let held = follow
            .graphs()
            .expect("a session follow")
            .graph("r1")
            .expect("r1's graph");
        assert_eq!(held.revision, expected.revision());
        assert_eq!(
            serde_jcs::to_vec(&held.document).expect("canonical"),
            expected.canonical_bytes()
        );
        assert_eq!(follow.graph_gaps(), 0);
    }
}
