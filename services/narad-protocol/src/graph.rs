//! The run graph (`narad.graph/v1`, §9.7): a deterministic projection of
//! one run journal's authority into nodes and edges, with its revisions,
//! its source cursor, and RFC 6902 deltas between revisions.
//!
//! [`RunGraph`] folds the authority events of one root run journal, in
//! run-tree sequence order, into canonical graph state. The same ordered
//! authority always yields the same bytes ([`RunGraph::canonical_bytes`],
//! RFC 8785), the same revisions (one per event that changes the graph)
//! and the same deltas, on any replica, so that rebuilding from the
//! journal reproduces every snapshot ever sent. The model is documented in
//! `docs/graph.md`.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::authority::{Outcome, Patch};
use crate::primitives::RunId;
use crate::wire::{AuthorityBody, AuthorityEvent};

/// The graph payload schema this module derives (`graphSchemaVersion`).
pub const GRAPH_SCHEMA_VERSION: &str = "narad.graph/1";

/// The graph of one run journal as derived so far.
#[derive(Debug, Clone, PartialEq)]
pub struct RunGraph {
    root_run_id: RunId,
    /// The graph revision: 0 until the root run starts, then one more for
    /// every event that changes the graph.
    revision: u64,
    /// The run-tree sequence of the last event applied.
    cursor: u64,
    nodes: BTreeMap<String, Value>,
    edges: BTreeMap<String, Value>,
}

/// A change of the graph: the delta from the revision before.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphChange {
    /// The revision the patch applies to.
    pub base_revision: u64,
    /// The revision it makes.
    pub revision: u64,
    /// The run-tree sequence of the event that made it.
    pub cursor: u64,
    /// RFC 6902 operations from the base document to the new one.
    pub patch: Patch,
}

fn run_node(id: &RunId) -> String {
    format!("run:{id}")
}

fn edge_id(kind: &str, from: &str, to: &str) -> String {
    format!("{kind}:{from}->{to}")
}

/// The index `key` has (or would have) in the id-ordered array of `map`.
fn position(map: &BTreeMap<String, Value>, key: &str) -> usize {
    map.range::<str, _>((std::ops::Bound::Unbounded, std::ops::Bound::Excluded(key)))
        .count()
}

/// `token` escaped for a JSON Pointer (RFC 6901).
fn pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Puts `value` at `key` of `map` (the document's array `array`), writing
/// the operation: an add at its place in id order, a replace of a
/// different value, nothing for the same.
fn put(
    map: &mut BTreeMap<String, Value>,
    array: &str,
    key: String,
    value: Value,
    ops: &mut Vec<Value>,
) {
    let at = position(map, &key);
    match map.get(&key) {
        Some(old) if *old == value => return,
        Some(_) => {
            ops.push(json!({"op": "replace", "path": format!("/{array}/{at}"), "value": value}))
        }
        None => ops.push(json!({"op": "add", "path": format!("/{array}/{at}"), "value": value})),
    }
    map.insert(key, value);
}

impl RunGraph {
    /// An empty graph of the run journal `root_run_id`.
    pub fn new(root_run_id: RunId) -> RunGraph {
        RunGraph {
            root_run_id,
            revision: 0,
            cursor: 0,
            nodes: BTreeMap::new(),
            edges: BTreeMap::new(),
        }
    }

    /// The run journal.
    pub fn root_run_id(&self) -> &RunId {
        &self.root_run_id
    }

    /// The current graph revision (0: the root run has not started).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The run-tree sequence of the last event applied (0: none).
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Applies the next authority event. Events of other run journals, and
    /// events already applied (a sequence at or below the cursor), change
    /// nothing. Returns the delta when the graph changed.
    pub fn apply(&mut self, event: &AuthorityEvent) -> Option<GraphChange> {
        let run = event.envelope.run.as_ref()?;
        if run.root_run_id != self.root_run_id || run.sequence.get() <= self.cursor {
            return None;
        }
        self.cursor = run.sequence.get();
        if !shapes_graph(&event.body) {
            // Most events (message and reasoning deltas, progress) leave
            // the graph as it is: no document is built for them.
            return None;
        }
        // The patch is written as the graph changes, one operation per
        // node or edge touched: its cost and size do not grow with the
        // graph (diffing whole documents did, for every event).
        let mut ops = Vec::new();
        self.fold(&run.run_id, &event.body, &mut ops);
        if ops.is_empty() {
            return None;
        }
        let base_revision = self.revision;
        self.revision += 1;
        Some(GraphChange {
            base_revision,
            revision: self.revision,
            cursor: self.cursor,
            patch: serde_json::from_value(Value::Array(ops))
                .expect("the graph's operations are RFC 6902"),
        })
    }

    fn fold(&mut self, run_id: &RunId, body: &AuthorityBody, ops: &mut Vec<Value>) {
        use AuthorityBody as B;
        let me = run_node(run_id);
        match body {
            B::RunStarted(b) => {
                let mut node =
                    json!({"id": me, "kind": "run", "runId": run_id, "status": "running"});
                if let Some(p) = &b.parent_run_id {
                    node["parentRunId"] = json!(p);
                    let parent = run_node(p);
                    let id = edge_id("parent", &parent, &me);
                    let edge = json!({"id": id, "kind": "parent", "from": parent, "to": me});
                    put(&mut self.edges, "edges", id, edge, ops);
                }
                if let Some(c) = &b.client_executor_id {
                    node["clientExecutorId"] = json!(c);
                }
                put(&mut self.nodes, "nodes", me, node, ops);
            }
            B::RunPaused(b) => {
                self.set(&me, "status", json!("paused"), ops);
                self.set(&me, "pauseReason", json!(b.reason), ops);
            }
            B::RunResumed(_) => {
                self.set(&me, "status", json!("running"), ops);
                self.unset(&me, "pauseReason", ops);
            }
            B::RunStopRequested(b) => {
                self.set(
                    &run_node(&b.target_run_id),
                    "stopRequested",
                    json!(true),
                    ops,
                );
            }
            B::RunFinished(_) => self.set(&me, "status", json!("finished"), ops),
            B::RunError(_) => self.set(&me, "status", json!("error"), ops),
            B::RunCancelled(_) => self.set(&me, "status", json!("cancelled"), ops),
            B::ToolCallStarted(b) => {
                let id = format!("tool.call:{}", b.tool_call_id);
                let node = json!({"id": id, "kind": "tool.call", "toolCallId": b.tool_call_id,
                       "toolName": b.tool_name, "executor": b.executor, "status": "open"});
                put(&mut self.nodes, "nodes", id.clone(), node, ops);
                let edge = edge_id("tool.call", &me, &id);
                let value = json!({"id": edge, "kind": "tool.call", "from": me, "to": id});
                put(&mut self.edges, "edges", edge, value, ops);
            }
            B::ToolCallFinished(b) => {
                let outcome = match b.outcome {
                    Outcome::Success => "success",
                    Outcome::Error => "error",
                    Outcome::Cancelled => "cancelled",
                };
                self.set(
                    &format!("tool.call:{}", b.tool_call_id),
                    "status",
                    json!(outcome),
                    ops,
                );
            }
            B::InterruptRequested(b) => {
                let id = format!("interrupt:{}", b.interrupt_id);
                let node = json!({"id": id, "kind": "interrupt", "interruptId": b.interrupt_id,
                       "status": "open"});
                put(&mut self.nodes, "nodes", id.clone(), node, ops);
                let edge = edge_id("interrupt", &me, &id);
                let value = json!({"id": edge, "kind": "interrupt", "from": me, "to": id});
                put(&mut self.edges, "edges", edge, value, ops);
            }
            B::InterruptResolved(b) => {
                let id = format!("interrupt:{}", b.interrupt_id);
                self.set(&id, "status", json!("resolved"), ops);
                self.set(&id, "decision", json!(b.decision), ops);
            }
            _ => {}
        }
    }

    /// Sets `field` of `node` (when the node exists), writing the
    /// operation.
    fn set(&mut self, node: &str, field: &str, value: Value, ops: &mut Vec<Value>) {
        let at = position(&self.nodes, node);
        let Some(Value::Object(n)) = self.nodes.get_mut(node) else {
            return;
        };
        let path = format!("/nodes/{at}/{}", pointer_token(field));
        match n.get(field) {
            Some(old) if *old == value => return,
            Some(_) => ops.push(json!({"op": "replace", "path": path, "value": value})),
            None => ops.push(json!({"op": "add", "path": path, "value": value})),
        }
        n.insert(field.to_owned(), value);
    }

    /// Removes `field` of `node` (when it has one), writing the operation.
    fn unset(&mut self, node: &str, field: &str, ops: &mut Vec<Value>) {
        let at = position(&self.nodes, node);
        if let Some(Value::Object(n)) = self.nodes.get_mut(node)
            && n.remove(field).is_some()
        {
            let path = format!("/nodes/{at}/{}", pointer_token(field));
            ops.push(json!({"op": "remove", "path": path}));
        }
    }

    /// The graph document deltas apply to: `{rootNodeId, nodes, edges}`,
    /// nodes and edges each in id order.
    pub fn document(&self) -> Value {
        json!({
            "rootNodeId": run_node(&self.root_run_id),
            "nodes": self.nodes.values().collect::<Vec<_>>(),
            "edges": self.edges.values().collect::<Vec<_>>(),
        })
    }

    /// The document's canonical bytes (RFC 8785: sorted keys, no
    /// insignificant whitespace): equal on every replica for the same
    /// journal.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        serde_jcs::to_vec(&self.document()).expect("graph documents serialise")
    }

    fn scope(&self, session_id: &str) -> Map<String, Value> {
        let mut record = Map::new();
        record.insert("protocolVersion".into(), json!("narad/v1"));
        record.insert("sessionId".into(), json!(session_id));
        record.insert("scope".into(), json!("run"));
        record.insert("rootRunId".into(), json!(self.root_run_id));
        record.insert(
            "sourceRunCursor".into(),
            json!({"sequence": self.cursor, "rootRunId": self.root_run_id}),
        );
        record.insert("graphSchemaVersion".into(), json!(GRAPH_SCHEMA_VERSION));
        record
    }

    /// The `graph.snapshot` hydrate record of the current revision, or
    /// `None` before the root run started (there is no graph yet).
    pub fn snapshot(&self, session_id: &str, timestamp: &str) -> Option<Value> {
        if self.revision == 0 {
            return None;
        }
        let mut record = self.scope(session_id);
        record.insert("type".into(), json!("graph.snapshot"));
        record.insert("timestamp".into(), json!(timestamp));
        record.insert("revision".into(), json!(self.revision));
        let Value::Object(doc) = self.document() else {
            unreachable!("a graph document is an object")
        };
        record.extend(doc);
        Some(Value::Object(record))
    }

    /// The `graph.delta` hydrate record of `change` (the last change
    /// applied: its cursor is the graph's).
    pub fn delta(&self, session_id: &str, timestamp: &str, change: &GraphChange) -> Value {
        let mut record = self.scope(session_id);
        record.insert(
            "sourceRunCursor".into(),
            json!({"sequence": change.cursor, "rootRunId": self.root_run_id}),
        );
        record.insert("type".into(), json!("graph.delta"));
        record.insert("timestamp".into(), json!(timestamp));
        record.insert("baseRevision".into(), json!(change.base_revision));
        record.insert("revision".into(), json!(change.revision));
        record.insert(
            "patch".into(),
            serde_json::to_value(&change.patch).expect("patches serialise"),
        );
        Value::Object(record)
    }
}

/// Whether an event of the wire type named `type_name` can change a run
/// graph.
pub fn shapes_graph_type(type_name: &str) -> bool {
    matches!(
        type_name,
        "run.started"
            | "run.paused"
            | "run.resumed"
            | "run.stop.requested"
            | "run.finished"
            | "run.error"
            | "run.cancelled"
            | "tool.call.started"
            | "tool.call.finished"
            | "interrupt.requested"
            | "interrupt.resolved"
    )
}

/// Whether an event of this type can change a run graph.
fn shapes_graph(body: &AuthorityBody) -> bool {
    use AuthorityBody as B;
    matches!(
        body,
        B::RunStarted(_)
            | B::RunPaused(_)
            | B::RunResumed(_)
            | B::RunStopRequested(_)
            | B::RunFinished(_)
            | B::RunError(_)
            | B::RunCancelled(_)
            | B::ToolCallStarted(_)
            | B::ToolCallFinished(_)
            | B::InterruptRequested(_)
            | B::InterruptResolved(_)
    )
}

/// Derives every run journal's graph of a session from its ordered
/// authority: the root runs in the order they started.
pub fn derive(events: &[AuthorityEvent]) -> Vec<RunGraph> {
    let mut graphs: Vec<RunGraph> = Vec::new();
    for event in events {
        let Some(run) = &event.envelope.run else {
            continue;
        };
        let at = match graphs.iter().position(|g| g.root_run_id == run.root_run_id) {
            Some(at) => at,
            None => {
                graphs.push(RunGraph::new(run.root_run_id.clone()));
                graphs.len() - 1
            }
        };
        graphs[at].apply(event);
    }
    graphs
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{Classified, Reader, WireObject};

    fn authority(events: &[Value]) -> Vec<AuthorityEvent> {
        events
            .iter()
            .map(|e| match Reader::all_profiles().classify(e) {
                Ok(Classified::Accepted(o)) => match *o {
                    WireObject::Authority(a) => a,
                    other => panic!("not authority: {other:?}"),
                },
                other => panic!("not accepted: {other:?}"),
            })
            .collect()
    }

    fn ev(seq: u64, run: &str, ty: &str, body: Value) -> Value {
        let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": format!("e{seq}"),
            "timestamp": "2026-08-05T04:00:00Z", "sessionId": "s1", "sessionSequence": seq,
            "rootRunId": "r1", "runId": run, "sequence": seq});
        for (k, v) in body.as_object().expect("an object") {
            e[k] = v.clone();
        }
        e
    }

    #[test]
    fn a_run_tree_becomes_nodes_and_edges() {
        let events = authority(&[
            ev(1, "r1", "run.started", json!({})),
            ev(
                2,
                "r1",
                "message.text.started",
                json!({"messageId": "m", "role": "assistant", "messageScope": "run"}),
            ),
            ev(
                3,
                "r1",
                "tool.call.started",
                json!({"toolCallId": "t1", "toolName": "search", "executor": "backend", "args": {}}),
            ),
            ev(4, "r2", "run.started", json!({"parentRunId": "r1"})),
            ev(
                5,
                "r1",
                "tool.call.finished",
                json!({"toolCallId": "t1", "outcome": "success", "response": null}),
            ),
        ]);
        let mut g = RunGraph::new(RunId::new("r1".to_owned()).expect("an id"));
        let changes: Vec<_> = events.iter().map(|e| g.apply(e)).collect();
        // The message start changes no graph: no revision.
        assert!(changes[1].is_none());
        assert_eq!(g.revision(), 4);
        assert_eq!(g.cursor(), 5);
        let doc = g.document();
        let ids: Vec<&str> = doc["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| n["id"].as_str().expect("an id"))
            .collect();
        assert_eq!(ids, ["run:r1", "run:r2", "tool.call:t1"]);
        assert_eq!(doc["nodes"][2]["status"], "success");
        let edges: Vec<&str> = doc["edges"]
            .as_array()
            .expect("edges")
            .iter()
            .map(|n| n["id"].as_str().expect("an id"))
            .collect();
        assert_eq!(
            edges,
            ["parent:run:r1->run:r2", "tool.call:run:r1->tool.call:t1"]
        );
        let snapshot = g
            .snapshot("s1", "2026-08-05T04:00:00Z")
            .expect("a snapshot");
        assert_eq!(snapshot["revision"], 4);
        assert_eq!(snapshot["sourceRunCursor"]["sequence"], 5);
        assert_eq!(snapshot["rootNodeId"], "run:r1");
        assert!(snapshot.get("sessionSequence").is_none());
        // The record is a valid graph.snapshot.
        assert!(matches!(
            Reader::all_profiles().classify(&snapshot),
            Ok(Classified::Accepted(_))
        ));
        // Applying an event twice changes nothing.
        assert!(g.apply(&events[4]).is_none());
        assert_eq!(g.revision(), 4);
    }

    /// A delta is as large as what changed, not as the graph: in a run of
    /// many tool calls, each call's start is one node and one edge added
    /// at their places, its finish one field replaced (diffing the whole
    /// documents wrote a replace for every node after the new one).
    #[test]
    fn deltas_do_not_grow_with_the_graph() {
        let mut events = vec![ev(1, "r1", "run.started", json!({}))];
        // Ids that sort before the ones already there: every new node
        // lands in front of the others.
        for i in 0..200u64 {
            let call = format!("t{:03}", 999 - i);
            events.push(ev(
                2 + 2 * i,
                "r1",
                "tool.call.started",
                json!({
                "toolCallId": call, "toolName": "lookup", "executor": "backend", "args": {}}),
            ));
            events.push(ev(
                3 + 2 * i,
                "r1",
                "tool.call.finished",
                json!({
                "toolCallId": call, "outcome": "success", "response": {}}),
            ));
        }
        let events = authority(&events);
        let mut g = RunGraph::new(RunId::new("r1").expect("a run id"));
        let mut doc = g.document();
        for (i, event) in events.iter().enumerate() {
            let change = g.apply(event).expect("every event changes the graph");
            let ops = change.patch.0.len();
            let expected = match i {
                0 => 1,
                i if i % 2 == 1 => 2,
                _ => 1,
            };
            assert_eq!(ops, expected, "event {i}: {:?}", change.patch);
            json_patch::patch(&mut doc, &change.patch).expect("the delta applies");
        }
        assert_eq!(doc, g.document());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Same journal, same bytes, revisions and deltas; every delta takes
        /// the document before it to the one after; revisions are
        /// contiguous and cursors never regress.
        #[test]
        fn derivation_is_deterministic_and_deltas_replay(choices in proptest::collection::vec(any::<u8>(), 0..400)) {
            let events = authority(&crate::testing::session(&choices));
            let mut first: BTreeMap<String, (RunGraph, Value)> = BTreeMap::new();
            for event in &events {
                let Some(run) = &event.envelope.run else { continue };
                let (graph, doc) = first
                    .entry(run.root_run_id.to_string())
                    .or_insert_with(|| {
                        let g = RunGraph::new(run.root_run_id.clone());
                        let d = g.document();
                        (g, d)
                    });
                let cursor_before = graph.cursor();
                if let Some(change) = graph.apply(event) {
                    prop_assert_eq!(change.revision, change.base_revision + 1);
                    prop_assert!(change.cursor > cursor_before);
                    let delta = graph.delta("s", "2026-08-05T04:00:00Z", &change);
                    prop_assert!(matches!(Reader::all_profiles().classify(&delta), Ok(Classified::Accepted(_))));
                    json_patch::patch(doc, &change.patch).expect("the delta applies");
                    prop_assert_eq!(&*doc, &graph.document());
                }
            }
            let again = derive(&events);
            for g in &again {
                let (one, _) = &first[g.root_run_id().as_str()];
                prop_assert_eq!(one.canonical_bytes(), g.canonical_bytes());
                prop_assert_eq!(one.revision(), g.revision());
                prop_assert_eq!(one.cursor(), g.cursor());
            }
            prop_assert_eq!(again.len(), first.len());
        }
    }
}
