//! The graph profile on the session stream (§9.7): snapshots and deltas
//! that a client can apply, equal to the graph rebuilt from the journal,
//! on any replica and from any position.

use std::time::Duration;

use narad_protocol::AuthorityEvent;
use narad_protocol::graph::{RunGraph, derive};
use narad_server::auth::Role;
use narad_tests::{Server, SseStream, authority, session_with_run, token, whole_history};
use serde_json::{Value, json};

async fn history(s: &Server, t: &str, session: &str) -> Vec<Value> {
    whole_history(s, t, session).await
}

fn ev(id: &str, ty: &str, run: &str, body: Value) -> Value {
    let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": id,
        "rootRunId": "r1", "runId": run});
    for (k, v) in body.as_object().expect("an object") {
        e[k] = v.clone();
    }
    e
}

async fn append(s: &Server, t: &str, events: Vec<Value>) {
    s.post("/v1/sessions/s1/events", t, &json!({ "events": events }))
        .await
        .expect(201);
}

/// A client's view of one run journal's graph, built from the records.
#[derive(Default)]
struct Client {
    revision: u64,
    cursor: u64,
    document: Option<Value>,
    snapshots: usize,
    deltas: usize,
    /// The run-tree sequence of r1 the client holds authority through.
    held: u64,
}

impl Client {
    /// Applies a graph record; panics on a gap or a misplaced record.
    fn apply(&mut self, record: &Value, held_through: u64) {
        assert!(record.get("sessionSequence").is_none());
        assert!(record.get("eventId").is_none());
        let cursor = record["sourceRunCursor"]["sequence"]
            .as_u64()
            .expect("a cursor");
        assert!(cursor >= self.cursor, "the cursor never regresses");
        assert!(
            cursor <= held_through,
            "a record arrives only after the authority through its cursor"
        );
        self.cursor = cursor;
        match record["type"].as_str() {
            Some("graph.snapshot") => {
                self.snapshots += 1;
                self.revision = record["revision"].as_u64().expect("a revision");
                self.document = Some(json!({"rootNodeId": record["rootNodeId"],
                    "nodes": record["nodes"], "edges": record["edges"]}));
            }
            Some("graph.delta") => {
                self.deltas += 1;
                assert_eq!(record["baseRevision"], self.revision, "contiguous");
                let patch: json_patch::Patch =
                    serde_json::from_value(record["patch"].clone()).expect("a patch");
                let doc = self.document.as_mut().expect("a snapshot came first");
                json_patch::patch(doc, &patch).expect("the delta applies");
                self.revision = record["revision"].as_u64().expect("a revision");
            }
            other => panic!("not a graph record: {other:?}"),
        }
    }
}

/// Reads a stream until sessionSequence `upto`, applying graph records;
/// the client state and the run-tree sequence held.
async fn read_until(stream: &mut SseStream, client: &mut Client, upto: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let frame = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("in time")
            .expect("open");
        match frame.event.as_deref() {
            Some("hydrate")
                if frame.data["type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("graph.")) =>
            {
                let held = client.held;
                client.apply(&frame.data, held);
            }
            None if frame.data.get("sessionSequence").is_some() => {
                if let Some(s) = frame.data["sequence"].as_u64() {
                    client.held = s;
                }
                if frame.data["sessionSequence"] == upto {
                    break;
                }
            }
            _ => {}
        }
    }
    // The records derived from the last event follow it.
    while let Ok(Some(frame)) =
        tokio::time::timeout(Duration::from_millis(300), stream.next()).await
    {
        if frame.event.as_deref() == Some("hydrate")
            && frame.data["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("graph."))
        {
            let held = client.held;
            client.apply(&frame.data, held);
        }
    }
}

fn rebuilt(events: &[Value]) -> RunGraph {
    derive(&authority(events))
        .into_iter()
        .find(|g| g.root_run_id().as_str() == "r1")
        .expect("r1's graph")
}

#[tokio::test]
async fn streams_carry_graph_records_equal_to_the_rebuilt_graph() {
    let a = Server::start().await;
    let b = a.replica().await;
    let t = token("acme", &Role::ALL);
    session_with_run(&a, &t, "s1", "r1", None).await;
    append(
        &a,
        &t,
        vec![
            ev("t1s", "tool.call.started", "r1", json!({"toolCallId": "t1", "toolName": "search", "executor": "backend", "args": {}})),
            ev("m1", "message.text.started", "r1", json!({"messageId": "m1", "role": "assistant", "messageScope": "run"})),
            ev("r2s", "run.started", "r2", json!({"parentRunId": "r1"})),
        ],
    )
    .await;
    // A fresh client on A; a client on B resuming after the tool call's
    // start (it holds sequences 1 and 2 of the journal).
    let mut fresh = a.stream("/v1/sessions/s1/stream", &t, &[]).await;
    let mut resumed = b
        .stream("/v1/sessions/s1/stream", &t, &[("last-event-id", "t1s")])
        .await;
    // Without the graph profile: no graph record at all.
    let mut plain = a
        .stream(
            "/v1/sessions/s1/stream?profiles=narad.core/v1,narad.conversation/v1",
            &t,
            &[],
        )
        .await;
    let mut c1 = Client::default();
    // It holds r1's sequences 1 and 2 from before.
    let mut c2 = Client {
        held: 2,
        ..Client::default()
    };
    read_until(&mut fresh, &mut c1, 4).await;
    read_until(&mut resumed, &mut c2, 4).await;
    // The resumed client's first record was a snapshot as of its position.
    assert_eq!(c2.snapshots, 1);
    // Live changes, on both replicas.
    append(
        &a,
        &t,
        vec![
            ev("t1f", "tool.call.finished", "r1", json!({"toolCallId": "t1", "outcome": "success", "response": 1})),
            ev("d1", "message.text.delta", "r1", json!({"messageId": "m1", "delta": "hi"})),
            ev("r2f", "run.finished", "r2", json!({})),
            ev("i1", "interrupt.requested", "r1", json!({"interruptId": "i1", "waitId": "w1", "kind": "approval", "actions": ["approve", "deny"]})),
            ev("p1", "run.paused", "r1", json!({"waitId": "w1", "reason": "approval", "resumeMode": "command", "interruptId": "i1"})),
        ],
    )
    .await;
    read_until(&mut fresh, &mut c1, 9).await;
    read_until(&mut resumed, &mut c2, 9).await;
    let journal = history(&a, &t, "s1").await;
    let expected = rebuilt(&journal);
    for c in [&c1, &c2] {
        assert_eq!(c.revision, expected.revision());
        assert_eq!(c.cursor, expected.cursor());
        assert_eq!(
            serde_jcs::to_vec(c.document.as_ref().expect("a graph")).expect("canonical"),
            expected.canonical_bytes(),
            "the client's graph is the graph rebuilt from the journal"
        );
    }
    assert_eq!(c1.snapshots, 1, "one snapshot, when r1 started");
    assert!(c1.deltas >= 6);
    let mut none = Client::default();
    read_until(&mut plain, &mut none, 9).await;
    assert_eq!(none.snapshots + none.deltas, 0);
}

/// Every graph record of a stream, applied per run journal, with each
/// snapshot kept as (rootRunId, cursor, canonical document bytes).
#[derive(Default)]
struct Recorder {
    graphs: std::collections::BTreeMap<String, Client>,
    snapshots: Vec<(String, u64, Vec<u8>)>,
    /// The run-tree sequence held, per root.
    held: std::collections::BTreeMap<String, u64>,
}

impl Recorder {
    async fn read_until(&mut self, stream: &mut SseStream, upto: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut reached = false;
        loop {
            let wait = if reached {
                tokio::time::Instant::now() + Duration::from_millis(300)
            } else {
                deadline
            };
            let Ok(frame) = tokio::time::timeout_at(wait, stream.next()).await else {
                assert!(reached, "no sessionSequence {upto} in time");
                return;
            };
            let frame = frame.expect("open");
            match frame.event.as_deref() {
                Some("hydrate")
                    if frame.data["type"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("graph.")) =>
                {
                    let root = frame.data["rootRunId"].as_str().expect("a root").to_owned();
                    let held = self.held.get(&root).copied().unwrap_or(0);
                    let client = self.graphs.entry(root.clone()).or_default();
                    client.apply(&frame.data, held);
                    if frame.data["type"] == "graph.snapshot" {
                        let doc = json!({"rootNodeId": frame.data["rootNodeId"],
                            "nodes": frame.data["nodes"], "edges": frame.data["edges"]});
                        self.snapshots.push((
                            root,
                            client.cursor,
                            serde_jcs::to_vec(&doc).expect("canonical"),
                        ));
                    }
                }
                None if frame.data.get("sessionSequence").is_some() => {
                    if let (Some(root), Some(seq)) = (
                        frame.data["rootRunId"].as_str(),
                        frame.data["sequence"].as_u64(),
                    ) {
                        self.held.insert(root.to_owned(), seq);
                    }
                    if frame.data["sessionSequence"] == upto {
                        reached = true;
                    }
                }
                _ => {}
            }
        }
    }
}

/// The graph of `root` rebuilt from the journal through run-tree
/// sequence `through`.
fn rebuilt_through(events: &[AuthorityEvent], root: &str, through: u64) -> RunGraph {
    let mut g =
        RunGraph::new(narad_protocol::primitives::RunId::new(root.to_owned()).expect("an id"));
    for e in events {
        if e.envelope
            .run
            .as_ref()
            .is_some_and(|r| r.root_run_id.as_str() == root && r.sequence.get() <= through)
        {
            g.apply(e);
        }
    }
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_snapshot_of_a_random_workload_is_the_rebuilt_graph_on_two_replicas() {
    // The workload binds runs to a client executor that never attaches: a
    // sweeper would pause those runs (§11.2) under the generator's feet.
    let quiet = || narad_server::executors::ExecutorSettings {
        sweep_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let a = Server::start_with_executors(quiet()).await;
    let b = a.replica_with_executors(quiet()).await;
    let t = token("acme", &Role::ALL);
    a.post("/v1/sessions", &t, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    // A long generated session: nested runs, tool calls, interrupts,
    // pauses, stops, workflows, messages.
    let choices: Vec<u8> = (0..1500u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let proposals: Vec<Value> = narad_protocol::testing::session_with_id("s1", &choices)
        .into_iter()
        .map(|mut e| {
            let o = e.as_object_mut().expect("an object");
            for f in ["sessionSequence", "sequence", "workflowSequence"] {
                o.remove(f);
            }
            e
        })
        .collect();
    let proposals = as_a_backend_writes(proposals);
    let total = proposals.len() as u64;
    assert!(total > 200, "a long workload: {total} events");
    let mut fresh_a = a.stream("/v1/sessions/s1/stream", &t, &[]).await;
    let mut fresh_b = b.stream("/v1/sessions/s1/stream", &t, &[]).await;
    let third = total / 3;
    for chunk in proposals[..third as usize].chunks(7) {
        append_to(&a, &t, chunk).await;
    }
    // A client attaching mid-way, on B: snapshots of every journal so far.
    let mut late_b = b
        .stream(
            &format!("/v1/sessions/s1/stream?afterSessionSequence={third}"),
            &t,
            &[],
        )
        .await;
    for chunk in proposals[third as usize..].chunks(11) {
        append_to(&b, &t, chunk).await;
    }
    let journal = authority(&history(&a, &t, "s1").await);
    let mut recorders = Vec::new();
    for (late, stream) in [
        (false, &mut fresh_a),
        (false, &mut fresh_b),
        (true, &mut late_b),
    ] {
        let mut r = Recorder::default();
        if late {
            // It holds what precedes its position.
            for e in &journal[..third as usize] {
                if let Some(run) = &e.envelope.run {
                    r.held
                        .insert(run.root_run_id.to_string(), run.sequence.get());
                }
            }
        }
        r.read_until(stream, total).await;
        recorders.push(r);
    }
    let finals: Vec<RunGraph> = derive(&journal);
    for r in &recorders {
        assert!(!r.snapshots.is_empty());
        for (root, cursor, bytes) in &r.snapshots {
            assert_eq!(
                bytes,
                &rebuilt_through(&journal, root, *cursor).canonical_bytes(),
                "the snapshot of {root} at cursor {cursor} is the rebuilt graph"
            );
        }
        for g in &finals {
            let client = &r.graphs[g.root_run_id().as_str()];
            assert_eq!(client.revision, g.revision());
            assert_eq!(
                serde_jcs::to_vec(client.document.as_ref().expect("a graph")).expect("canonical"),
                g.canonical_bytes()
            );
        }
    }
}

/// The generated events as a backend may append them (§7.7, §11.3): a
/// backend decides an interrupt only by its expiry, and finishes only the
/// tool calls it runs itself (a client call's result is its executor's,
/// its error closes the server's); the person's decisions become expiries
/// and the generator's client calls the backend's own.
fn as_a_backend_writes(mut events: Vec<Value>) -> Vec<Value> {
    for e in &mut events {
        match e["type"].as_str() {
            Some("tool.call.started") if e["executor"] == "client" => {
                e["executor"] = json!("backend");
            }
            Some("interrupt.resolved") => {
                e["decision"] = json!("expired");
                if let Some(members) = e.get_mut("members").and_then(Value::as_array_mut) {
                    for m in members {
                        m["decision"] = json!("expired");
                    }
                }
            }
            _ => {}
        }
    }
    events
}

async fn append_to(s: &Server, t: &str, events: &[Value]) {
    s.post("/v1/sessions/s1/events", t, &json!({ "events": events }))
        .await
        .expect(201);
}

#[tokio::test]
async fn documents_then_the_stream_from_their_cursor_miss_no_change() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    s.post("/v1/sessions", &t, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    let doc = |id: &str, ty: &str, body: Value| {
        let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": id});
        for (k, v) in body.as_object().expect("an object") {
            e[k] = v.clone();
        }
        e
    };
    append(
        &s,
        &t,
        vec![
            doc(
                "st1",
                "state.snapshot",
                json!({"scope": "session", "revision": 1, "state": {"todo": []}}),
            ),
            doc(
                "st2",
                "state.delta",
                json!({"scope": "session", "baseRevision": 1, "revision": 2,
                "patch": [{"op": "add", "path": "/todo/0", "value": "write tests"}]}),
            ),
            doc(
                "ui1",
                "ui.state.snapshot",
                json!({"scope": "panel", "revision": 1, "state": {"open": true}}),
            ),
        ],
    )
    .await;
    // A delta on a stale base is refused, with its rule, and changes nothing.
    let stale = s
        .post(
            "/v1/sessions/s1/events",
            &t,
            &json!({"events": [doc("st-bad", "state.delta", json!({"scope": "session",
                "baseRevision": 1, "revision": 2, "patch": []}))]}),
        )
        .await;
    assert_eq!(
        (stale.status, stale.body["rule"].as_str()),
        (409, Some("state.revision.base"))
    );
    let docs = s.get("/v1/sessions/s1/documents", &t).await;
    let docs = docs.expect(200).clone();
    assert_eq!(docs["coversThroughSessionSequence"], 3);
    assert_eq!(docs["state"][0]["scope"], "session");
    assert_eq!(docs["state"][0]["revision"], 2);
    assert_eq!(docs["state"][0]["state"], json!({"todo": ["write tests"]}));
    assert_eq!(docs["ui"][0]["state"], json!({"open": true}));
    // From the documents' cursor, the next change applies to what was read.
    let mut stream = s
        .stream("/v1/sessions/s1/stream?afterSessionSequence=3", &t, &[])
        .await;
    append(
        &s,
        &t,
        vec![doc(
            "st3",
            "state.delta",
            json!({"scope": "session", "baseRevision": 2, "revision": 3,
            "patch": [{"op": "add", "path": "/todo/1", "value": "ship"}]}),
        )],
    )
    .await;
    let got = stream.events_until(4, 10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["baseRevision"], docs["state"][0]["revision"]);
    let mut state = docs["state"][0]["state"].clone();
    let patch: json_patch::Patch =
        serde_json::from_value(got[0]["patch"].clone()).expect("a patch");
    json_patch::patch(&mut state, &patch).expect("applies");
    assert_eq!(state, json!({"todo": ["write tests", "ship"]}));
}
