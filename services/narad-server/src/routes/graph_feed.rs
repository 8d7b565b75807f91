//! The graph records of one session stream (§9.7): every run journal's
//! graph, derived on the connection from exactly the authority it sends.
//!
//! The first record of a run journal a client receives is a
//! `graph.snapshot`: at attach for the journals already started before
//! the client's position (derived from history, which the client holds),
//! or when the journal's root run starts. Each later change follows the
//! authority event that made it, as a `graph.delta`, so that the client
//! holds the authority through a delta's cursor when the delta arrives.
//! Derivation is deterministic ([`narad_protocol::graph`]): every replica
//! and every connection computes the same revisions and bytes.

use std::collections::BTreeMap;

use axum::body::Bytes;
use narad_protocol::graph::{RunGraph, shapes_graph_type};
use narad_protocol::primitives::Timestamp;
use narad_protocol::{AuthorityEvent, Classified, Reader, WireObject};
use serde_json::Value;

/// The run graphs of one stream's session.
pub struct GraphFeed {
    session_id: String,
    /// By rootRunId; `true` once the client has the journal's snapshot.
    graphs: BTreeMap<String, (RunGraph, bool)>,
}

/// A hydrate frame (no id).
fn hydrate_frame(record: &Value) -> Bytes {
    Bytes::from(format!(
        "event: hydrate\ndata: {}\n\n",
        serde_json::to_string(record).expect("records serialise")
    ))
}

/// The authority event in `body`, when it can change a graph.
pub fn graph_event(body: &Value) -> Option<AuthorityEvent> {
    if !body["type"].as_str().is_some_and(shapes_graph_type) {
        return None;
    }
    match Reader::all_profiles().classify(body) {
        Ok(Classified::Accepted(object)) => match *object {
            WireObject::Authority(event) => Some(event),
            _ => None,
        },
        _ => None,
    }
}

impl GraphFeed {
    /// No graphs yet, for `session_id`.
    pub fn new(session_id: &str) -> GraphFeed {
        GraphFeed {
            session_id: session_id.to_owned(),
            graphs: BTreeMap::new(),
        }
    }

    fn graph(&mut self, event: &AuthorityEvent) -> Option<&mut (RunGraph, bool)> {
        let root = &event.envelope.run.as_ref()?.root_run_id;
        Some(
            self.graphs
                .entry(root.to_string())
                .or_insert_with(|| (RunGraph::new(root.clone()), false)),
        )
    }

    /// Folds an event the client already holds (before its position);
    /// nothing is sent for it.
    pub fn fold(&mut self, event: &AuthorityEvent) {
        if let Some((graph, _)) = self.graph(event) {
            graph.apply(event);
        }
    }

    /// The snapshots of the journals folded so far, for the attach.
    pub fn snapshots(&mut self) -> Vec<Bytes> {
        let now = Timestamp::now().as_str().to_owned();
        let session_id = self.session_id.clone();
        self.graphs
            .values_mut()
            .filter_map(|(graph, sent)| {
                let record = graph.snapshot(&session_id, &now)?;
                *sent = true;
                Some(hydrate_frame(&record))
            })
            .collect()
    }

    /// Applies an event being sent; the frame to send right after it: the
    /// journal's snapshot the first time, its delta afterwards.
    pub fn follow(&mut self, event: &AuthorityEvent) -> Option<Bytes> {
        let session_id = self.session_id.clone();
        let (graph, sent) = self.graph(event)?;
        let change = graph.apply(event)?;
        let now = Timestamp::now().as_str().to_owned();
        let record = if *sent {
            graph.delta(&session_id, &now, &change)
        } else {
            *sent = true;
            graph.snapshot(&session_id, &now)?
        };
        Some(hydrate_frame(&record))
    }
}
