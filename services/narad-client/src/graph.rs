//! A client's view of a session's run graphs (§9.7), built from
//! `graph.snapshot` and `graph.delta` records.
//!
//! A snapshot replaces a journal's graph; a delta applies only to the
//! revision it names, and only once the client holds the authority
//! through its cursor. Anything else is a gap: the view stops applying
//! deltas to that journal until a snapshot arrives, and says so, so that
//! the stream is reopened (a stream sends snapshots when it attaches).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One run journal's graph as the client holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldGraph {
    /// Its revision.
    pub revision: u64,
    /// The run-tree sequence its records are derived through.
    pub cursor: u64,
    /// `{rootNodeId, nodes, edges}`.
    pub document: Value,
}

/// What became of a graph record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphUpdate {
    /// Applied.
    Applied,
    /// A delta the view already holds (an older revision): ignored.
    Stale,
    /// A delta that does not follow what the view holds, or is ahead of the
    /// authority held: the journal's graph waits for a snapshot.
    Gap {
        /// The run journal.
        root_run_id: String,
    },
    /// A record of a scope this view does not derive: `workflow` is
    /// reserved by §9.7 until orchestration support exists, and refused.
    Unsupported {
        /// The record's scope.
        scope: String,
    },
}

/// The run graphs of a session, by rootRunId.
#[derive(Debug, Clone, Default)]
pub struct GraphView {
    graphs: BTreeMap<String, HeldGraph>,
    /// Journals waiting for a snapshot after a gap.
    waiting: BTreeMap<String, ()>,
    /// The run-tree sequence of authority held, per journal.
    held: BTreeMap<String, u64>,
}

impl GraphView {
    /// An empty view.
    pub fn new() -> GraphView {
        GraphView::default()
    }

    /// Notes an authority event delivered to the client: the view then
    /// accepts records derived through it.
    pub fn held(&mut self, event: &Value) {
        if let (Some(root), Some(sequence)) =
            (event["rootRunId"].as_str(), event["sequence"].as_u64())
        {
            let at = self.held.entry(root.to_owned()).or_insert(0);
            *at = (*at).max(sequence);
        }
    }

    /// Notes that the client holds a journal's authority through
    /// `sequence` (a client that resumes with authority from before).
    pub fn hold_through(&mut self, root_run_id: &str, sequence: u64) {
        let at = self.held.entry(root_run_id.to_owned()).or_insert(0);
        *at = (*at).max(sequence);
    }

    /// Applies a `graph.snapshot` or `graph.delta` record.
    pub fn apply(&mut self, record: &Value) -> GraphUpdate {
        match record["scope"].as_str() {
            Some("run") => {}
            other => {
                return GraphUpdate::Unsupported {
                    scope: other.unwrap_or("(none)").to_owned(),
                };
            }
        }
        let Some(root) = record["rootRunId"].as_str().map(str::to_owned) else {
            return GraphUpdate::Stale;
        };
        let gap = |view: &mut GraphView| {
            view.waiting.insert(root.clone(), ());
            GraphUpdate::Gap {
                root_run_id: root.clone(),
            }
        };
        let cursor = record["sourceRunCursor"]["sequence"].as_u64().unwrap_or(0);
        let held = self.held.get(&root).copied().unwrap_or(0);
        match record["type"].as_str() {
            Some("graph.snapshot") => {
                let Some(revision) = record["revision"].as_u64() else {
                    return gap(self);
                };
                // A stream sends a snapshot only for authority the client
                // holds: at attach, for what precedes its position (which
                // a client resuming after a position holds from before).
                self.hold_through(&root, cursor);
                self.waiting.remove(&root);
                self.graphs.insert(
                    root,
                    HeldGraph {
                        revision,
                        cursor,
                        document: json!({"rootNodeId": record["rootNodeId"],
                            "nodes": record["nodes"], "edges": record["edges"]}),
                    },
                );
                GraphUpdate::Applied
            }
            Some("graph.delta") => {
                if self.waiting.contains_key(&root) {
                    return GraphUpdate::Gap { root_run_id: root };
                }
                let (Some(base), Some(revision)) =
                    (record["baseRevision"].as_u64(), record["revision"].as_u64())
                else {
                    return gap(self);
                };
                let Some(graph) = self.graphs.get_mut(&root) else {
                    return gap(self);
                };
                if revision <= graph.revision {
                    return GraphUpdate::Stale;
                }
                if base != graph.revision || revision != base + 1 || cursor > held {
                    return gap(self);
                }
                let Ok(patch) =
                    serde_json::from_value::<json_patch::Patch>(record["patch"].clone())
                else {
                    return gap(self);
                };
                let mut next = graph.document.clone();
                if json_patch::patch(&mut next, &patch).is_err() {
                    return gap(self);
                }
                graph.document = next;
                graph.revision = revision;
                graph.cursor = cursor;
                GraphUpdate::Applied
            }
            _ => GraphUpdate::Stale,
        }
    }

    /// A journal's graph, unless it waits for a snapshot.
    pub fn graph(&self, root_run_id: &str) -> Option<&HeldGraph> {
        if self.waiting.contains_key(root_run_id) {
            return None;
        }
        self.graphs.get(root_run_id)
    }

    /// The journals with a graph, in rootRunId order.
    pub fn roots(&self) -> impl Iterator<Item = &str> {
        self.graphs.keys().map(String::as_str)
    }

    /// Whether a journal waits for a snapshot after a gap.
    pub fn waiting(&self, root_run_id: &str) -> bool {
        self.waiting.contains_key(root_run_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(revision: u64, cursor: u64, nodes: Value) -> Value {
        json!({"type": "graph.snapshot", "scope": "run", "rootRunId": "r1", "revision": revision,
            "sourceRunCursor": {"sequence": cursor}, "rootNodeId": "run:r1",
            "nodes": nodes, "edges": []})
    }

    fn delta(base: u64, cursor: u64, patch: Value) -> Value {
        json!({"type": "graph.delta", "scope": "run", "rootRunId": "r1", "baseRevision": base,
            "revision": base + 1, "sourceRunCursor": {"sequence": cursor}, "patch": patch})
    }

    fn held(view: &mut GraphView, sequence: u64) {
        view.held(&json!({"rootRunId": "r1", "sequence": sequence}));
    }

    #[test]
    fn deltas_apply_in_order_and_a_gap_waits_for_a_snapshot() {
        let mut view = GraphView::new();
        held(&mut view, 1);
        assert_eq!(
            view.apply(&snapshot(1, 1, json!([{"id": "run:r1"}]))),
            GraphUpdate::Applied
        );
        held(&mut view, 2);
        let add = json!([{"op": "add", "path": "/nodes/1", "value": {"id": "tool.call:t"}}]);
        assert_eq!(view.apply(&delta(1, 2, add.clone())), GraphUpdate::Applied);
        assert_eq!(view.graph("r1").expect("a graph").revision, 2);
        // The same delta again: already held.
        assert_eq!(view.apply(&delta(1, 2, add)), GraphUpdate::Stale);
        // Revision 3 never came: 4 is a gap, and nothing applies until a
        // snapshot.
        held(&mut view, 5);
        let gap = view.apply(&delta(3, 5, json!([])));
        assert_eq!(
            gap,
            GraphUpdate::Gap {
                root_run_id: "r1".into()
            }
        );
        assert!(view.graph("r1").is_none());
        assert!(matches!(
            view.apply(&delta(4, 5, json!([]))),
            GraphUpdate::Gap { .. }
        ));
        assert_eq!(
            view.apply(&snapshot(
                4,
                5,
                json!([{"id": "run:r1"}, {"id": "tool.call:t"}])
            )),
            GraphUpdate::Applied
        );
        assert_eq!(view.graph("r1").expect("a graph").revision, 4);
    }

    #[test]
    fn a_delta_ahead_of_the_authority_held_is_a_gap() {
        let mut view = GraphView::new();
        held(&mut view, 1);
        view.apply(&snapshot(1, 1, json!([])));
        assert!(matches!(
            view.apply(&delta(1, 2, json!([]))),
            GraphUpdate::Gap { .. }
        ));
    }

    #[test]
    fn the_reserved_workflow_scope_is_refused() {
        let mut view = GraphView::new();
        let record = json!({"type": "graph.snapshot", "scope": "workflow", "workflowId": "w",
            "sourceWorkflowCursor": {"sequence": 1}, "revision": 1, "rootNodeId": "w",
            "nodes": [], "edges": []});
        assert_eq!(
            view.apply(&record),
            GraphUpdate::Unsupported {
                scope: "workflow".into()
            }
        );
        assert_eq!(view.roots().count(), 0);
    }

    #[test]
    fn a_patch_that_does_not_apply_is_a_gap() {
        let mut view = GraphView::new();
        held(&mut view, 2);
        view.apply(&snapshot(1, 1, json!([])));
        let bad = json!([{"op": "remove", "path": "/nodes/7"}]);
        assert!(matches!(
            view.apply(&delta(1, 2, bad)),
            GraphUpdate::Gap { .. }
        ));
    }
}
