//! The watch coalescer (§8): bursts of committed authority become at most
//! one watch event per scope per window.
//!
//! Scopes and revisions:
//! - `session.revision` per session: the highest sessionSequence covered;
//! - `run.revision` per run: the highest run-tree `sequence` among that
//!   run's events;
//! - `workflow.revision` per workflow: the highest workflowSequence;
//! - `workspace.revision` per tenant, when its catalogue of sessions
//!   changed (`session.created`, `session.archived`): the transaction id of
//!   the change, which grows in relay order.
//!
//! Every revision is a durable authority position, so it never regresses,
//! on any replica, across restarts; the eventId is derived from the scope
//! and the revision ([`WatchId`]), so replicas name the same notification
//! alike. Each watch event also records the authority it covers (its
//! sessionSequence and relay position): a stream delivers it only after
//! that authority, and a client resuming from its id resumes after it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use narad_journal::{RelayCursor, Relayed, TenantId};
use narad_protocol::primitives::Timestamp;
use narad_protocol::watch::WatchId;
use serde_json::{Value, json};
use tokio::time::Instant;

/// The default window: at most one watch event per scope this often.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(50);
/// Scopes whose last revision is remembered; past it the memory restarts
/// (harmless: revisions come from durable positions and only grow).
const REMEMBERED_SCOPES: usize = 65_536;

/// A watch scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Scope {
    Session(TenantId, String),
    Run(TenantId, String, String),
    Workflow(TenantId, String, String),
    Workspace(TenantId),
}

/// The greatest advance seen in a scope during the window.
#[derive(Debug, Clone)]
struct Advance {
    revision: u64,
    /// The sessionSequence of the authority covered (absent for the
    /// workspace).
    covers: Option<u64>,
    /// Where the covered row stands in relay order.
    cursor: RelayCursor,
    /// The session of the covered row.
    session_id: String,
    /// The run journal, for run scope.
    root_run_id: Option<String>,
}

/// A watch event ready to send.
#[derive(Debug, Clone)]
pub struct Watch {
    /// Its tenant.
    pub tenant: TenantId,
    /// The session it belongs to; `None` for workspace scope (tenant
    /// streams only).
    pub session_id: Option<String>,
    /// The sessionSequence of the authority it covers (0 for workspace).
    pub covers: u64,
    /// The relay position of the covered row.
    pub cursor: RelayCursor,
    /// The event.
    pub body: Value,
}

/// Coalesces the relay's events into watch events.
#[derive(Debug)]
pub struct Coalescer {
    window: Duration,
    pending: BTreeMap<Scope, Advance>,
    due: Option<Instant>,
    emitted: HashMap<Scope, u64>,
}

impl Coalescer {
    /// A coalescer emitting at most once per scope per `window`.
    pub fn new(window: Duration) -> Coalescer {
        Coalescer {
            window,
            pending: BTreeMap::new(),
            due: None,
            emitted: HashMap::new(),
        }
    }

    /// When the pending watch events are due, if any are.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Accounts for one relayed row.
    pub fn observe(&mut self, event: &Relayed, now: Instant) {
        let tenant = &event.tenant;
        let session = &event.session_id;
        let mut advance = |scope: Scope, revision: u64, covers: Option<u64>, root: Option<&str>| {
            let entry = self.pending.entry(scope).or_insert_with(|| Advance {
                revision,
                covers,
                cursor: event.cursor,
                session_id: session.clone(),
                root_run_id: root.map(str::to_owned),
            });
            if revision >= entry.revision {
                *entry = Advance {
                    revision,
                    covers,
                    cursor: event.cursor,
                    session_id: session.clone(),
                    root_run_id: root.map(str::to_owned),
                };
            }
        };
        if !event.authority {
            // A catalogue change of the tenant.
            advance(
                Scope::Workspace(tenant.clone()),
                event.cursor.txid as u64,
                None,
                None,
            );
        } else {
            let seq = event.session_sequence;
            advance(
                Scope::Session(tenant.clone(), session.clone()),
                seq,
                Some(seq),
                None,
            );
            let body = &event.body;
            if let (Some(run), Some(root), Some(sequence)) = (
                body["runId"].as_str(),
                body["rootRunId"].as_str(),
                body["sequence"].as_u64(),
            ) {
                advance(
                    Scope::Run(tenant.clone(), session.clone(), run.to_owned()),
                    sequence,
                    Some(seq),
                    Some(root),
                );
            }
            if let (Some(workflow), Some(sequence)) = (
                body["workflowId"].as_str(),
                body["workflowSequence"].as_u64(),
            ) {
                advance(
                    Scope::Workflow(tenant.clone(), session.clone(), workflow.to_owned()),
                    sequence,
                    Some(seq),
                    None,
                );
            }
        }
        if self.due.is_none() {
            self.due = Some(now + self.window);
        }
    }

    /// The watch events of the window that ended, in scope order; the
    /// window restarts with the next observed row.
    pub fn flush(&mut self) -> Vec<Watch> {
        self.due = None;
        if self.emitted.len() > REMEMBERED_SCOPES {
            self.emitted.clear();
        }
        let timestamp = Timestamp::now();
        let mut out = Vec::with_capacity(self.pending.len());
        // Emissions by type, counted once per flush.
        let mut emitted = [0u64; 4];
        for (scope, advance) in std::mem::take(&mut self.pending) {
            if self
                .emitted
                .get(&scope)
                .is_some_and(|&last| last >= advance.revision)
            {
                continue;
            }
            self.emitted.insert(scope.clone(), advance.revision);
            emitted[scope.index()] += 1;
            out.push(watch(scope, advance, &timestamp));
        }
        for (i, n) in emitted.into_iter().enumerate() {
            if n > 0 {
                crate::metrics::watch_emitted(Scope::TYPES[i], n);
            }
        }
        out
    }
}

impl Scope {
    /// The watch type of each scope, by [`Scope::index`].
    const TYPES: [&'static str; 4] = [
        "session.revision",
        "run.revision",
        "workflow.revision",
        "workspace.revision",
    ];

    fn index(&self) -> usize {
        match self {
            Scope::Session(..) => 0,
            Scope::Run(..) => 1,
            Scope::Workflow(..) => 2,
            Scope::Workspace(..) => 3,
        }
    }
}

fn watch(scope: Scope, a: Advance, timestamp: &Timestamp) -> Watch {
    let (tenant, type_name, session_id, scope_id) = match &scope {
        Scope::Session(t, s) => (t, "session.revision", Some(s.clone()), None),
        Scope::Run(t, s, r) => (t, "run.revision", Some(s.clone()), Some(r.clone())),
        Scope::Workflow(t, s, w) => (t, "workflow.revision", Some(s.clone()), Some(w.clone())),
        Scope::Workspace(t) => (t, "workspace.revision", None, None),
    };
    let event_id = WatchId {
        type_name: type_name.to_owned(),
        session_id: session_id.clone(),
        scope_id: scope_id.clone(),
        revision: a.revision,
        covers: a.covers,
        txid: None,
    }
    .encode();
    let mut body = json!({
        "protocolVersion": "narad/v1",
        "eventId": event_id,
        "type": type_name,
        "timestamp": timestamp,
        "revision": a.revision,
    });
    let covers = a.covers.unwrap_or(0);
    match &scope {
        Scope::Session(_, s) => {
            body["sessionId"] = json!(s);
            body["cursor"] = json!({"kind": "session", "sessionSequence": covers});
        }
        Scope::Run(_, s, r) => {
            let root = a.root_run_id.as_deref().unwrap_or(r);
            body["sessionId"] = json!(s);
            body["rootRunId"] = json!(root);
            body["runId"] = json!(r);
            body["cursor"] = json!({"kind": "run", "rootRunId": root, "sequence": a.revision});
        }
        Scope::Workflow(_, s, w) => {
            body["sessionId"] = json!(s);
            body["workflowId"] = json!(w);
            body["cursor"] =
                json!({"kind": "workflow", "workflowId": w, "workflowSequence": a.revision});
        }
        Scope::Workspace(t) => {
            body["workspaceId"] = json!(t.as_str());
        }
    }
    Watch {
        tenant: tenant.clone(),
        session_id: match scope {
            Scope::Workspace(_) => None,
            _ => Some(a.session_id),
        },
        covers,
        cursor: a.cursor,
        body,
    }
}

#[cfg(test)]
mod tests {
    use narad_protocol::classify::{Classified, Reader};

    use super::*;

    fn relayed(position: i64, session: &str, seq: u64, body: Value) -> Relayed {
        Relayed {
            cursor: RelayCursor {
                txid: 100 + position,
                position,
            },
            tenant: TenantId::new("t1").unwrap(),
            session_id: session.to_owned(),
            session_sequence: seq,
            event_id: format!("e{position}"),
            body,
            authority: true,
        }
    }

    fn run_event(position: i64, session: &str, seq: u64, run: &str, sequence: u64) -> Relayed {
        relayed(
            position,
            session,
            seq,
            json!({"runId": run, "rootRunId": "root", "sequence": sequence}),
        )
    }

    #[test]
    fn a_burst_becomes_one_watch_per_scope_at_its_highest_revision() {
        let mut c = Coalescer::new(DEFAULT_WINDOW);
        let now = Instant::now();
        assert_eq!(c.due(), None);
        for i in 1..=10 {
            c.observe(&run_event(i, "s1", i as u64, "root", i as u64), now);
        }
        c.observe(&relayed(11, "s2", 1, json!({})), now);
        assert_eq!(c.due(), Some(now + DEFAULT_WINDOW));
        let out = c.flush();
        let types: Vec<(&str, u64)> = out
            .iter()
            .map(|w| {
                (
                    w.body["type"].as_str().unwrap(),
                    w.body["revision"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            types,
            [
                ("session.revision", 10),
                ("session.revision", 1),
                ("run.revision", 10)
            ]
        );
        let s1 = &out[0];
        assert_eq!(s1.covers, 10);
        assert_eq!(s1.cursor.position, 10, "covers the last row of the burst");
        assert_eq!(c.due(), None, "nothing pending after a flush");
        assert!(c.flush().is_empty());
    }

    #[test]
    fn watch_events_are_valid_wire_objects_with_deterministic_ids() {
        let mut a = Coalescer::new(DEFAULT_WINDOW);
        let mut b = Coalescer::new(DEFAULT_WINDOW);
        let now = Instant::now();
        let mut workflow = run_event(1, "s1", 4, "r2", 3);
        workflow.body["workflowId"] = json!("w1");
        workflow.body["workflowSequence"] = json!(2);
        let mut created = relayed(2, "s3", 0, json!({}));
        created.authority = false;
        for e in [&workflow, &created] {
            a.observe(e, now);
            b.observe(e, now);
        }
        let (wa, wb) = (a.flush(), b.flush());
        assert_eq!(wa.len(), 4);
        let reader = Reader::all_profiles();
        for (x, y) in wa.iter().zip(&wb) {
            assert_eq!(
                x.body["eventId"], y.body["eventId"],
                "same scope and revision, same id"
            );
            match reader.classify(&x.body) {
                Ok(Classified::Accepted(_)) => {}
                other => panic!("{} is not a valid watch event: {other:?}", x.body),
            }
        }
        let workspace = wa
            .iter()
            .find(|w| w.body["type"] == "workspace.revision")
            .unwrap();
        assert_eq!(workspace.session_id, None);
        assert_eq!(workspace.body["revision"], 102);
    }

    #[test]
    fn revisions_never_regress_within_a_scope() {
        let mut c = Coalescer::new(DEFAULT_WINDOW);
        let now = Instant::now();
        c.observe(&run_event(1, "s1", 5, "root", 5), now);
        assert_eq!(c.flush().len(), 2);
        // A row that reaches the relay late with an older position.
        c.observe(&run_event(2, "s1", 4, "root", 4), now);
        assert!(c.flush().is_empty(), "an older revision is never emitted");
        c.observe(&run_event(3, "s1", 6, "root", 6), now);
        assert_eq!(c.flush().len(), 2);
    }
}
