//! What this process knows of the sessions it appended to: each session's
//! stored state as its last append transaction left it, and the version of
//! its row that transaction saw or wrote.
//!
//! With it, the next append to such a session is decided without reading
//! the session again, and written in one round trip instead of two
//! ([`group`](crate::group)): `BEGIN`, the guard `append_guard` (the row
//! versions still the ones known, the eventIds free, no runtime's lease in
//! the way), the write, `COMMIT`. The guard is what makes a stale entry
//! harmless: any other writer of a session row makes a new row version, the
//! guard aborts the transaction, and the appends are written the
//! two-round-trip way, which reads everything afresh.
//!
//! Entries are taken out while a group runs and put back after it commits,
//! so a failed transaction leaves none behind. The map is bounded: past
//! [`CAPACITY`] sessions an arbitrary entry makes room, and a session whose
//! state holds a state or UI document (whose content has no size bound
//! but the event's) is not remembered: its appends take two round trips.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use narad_protocol::engine::EntityKey;
use narad_protocol::primitives::SessionId;
use serde_json::Value;

use crate::TenantId;

/// The most sessions remembered (about a kilobyte or two each).
pub(crate) const CAPACITY: usize = 4096;

/// One session as its last append transaction in this process left it.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    /// The stored `core`.
    pub core: Value,
    /// The stored `session_sequence`.
    pub sequence: i64,
    /// The stored entities among those read or written.
    pub entities: BTreeMap<EntityKey, Value>,
    /// The entity keys whose stored state is all in `entities`: read by
    /// key (present or absent) and kept since by this process's writes. For
    /// a run journal's key, its open runs (and their workflows) too.
    pub keys: BTreeSet<EntityKey>,
    /// The session row's version (its `xmin`) after that transaction.
    pub xmin: String,
}

/// The sessions this process knows, by tenant and session.
#[derive(Default)]
pub(crate) struct KnownSessions {
    map: Mutex<HashMap<(TenantId, SessionId), Known>>,
    one_trip: AtomicU64,
    fell_back: AtomicU64,
    /// Set on a distributed database: nothing is remembered there (the
    /// guard's row versions and locks were measured on one Postgres only).
    off: AtomicBool,
}

impl KnownSessions {
    /// Takes out the entries of `sessions`, when every one of them is
    /// known; none are taken otherwise.
    pub(crate) fn take_all(&self, sessions: &[(TenantId, SessionId)]) -> Option<Vec<Known>> {
        let mut map = self.map.lock().expect("the known sessions");
        if !sessions.iter().all(|k| map.contains_key(k)) {
            return None;
        }
        Some(
            sessions
                .iter()
                .map(|k| map.remove(k).expect("checked"))
                .collect(),
        )
    }

    /// Remembers `known` for each session, replacing what was known
    /// (except a session holding a document, which is forgotten).
    pub(crate) fn remember(
        &self,
        entries: impl IntoIterator<Item = ((TenantId, SessionId), Known)>,
    ) {
        if self.off.load(Ordering::Relaxed) {
            return;
        }
        let mut map = self.map.lock().expect("the known sessions");
        for (key, known) in entries {
            if known
                .entities
                .keys()
                .any(|k| matches!(k, EntityKey::Document(..)))
            {
                map.remove(&key);
                continue;
            }
            if map.len() >= CAPACITY
                && !map.contains_key(&key)
                && let Some(evicted) = map.keys().next().cloned()
            {
                map.remove(&evicted);
            }
            map.insert(key, known);
        }
    }

    /// Forgets every session and remembers none from now on: every
    /// append takes the two-round-trip way, which reads what it decides on.
    pub(crate) fn turn_off(&self) {
        self.off.store(true, Ordering::Relaxed);
        self.map.lock().expect("the known sessions").clear();
    }

    /// Counts a group sent in one round trip: committed, or fallen back.
    pub(crate) fn count(&self, committed: bool) {
        let (counter, outcome) = if committed {
            (&self.one_trip, "committed")
        } else {
            (&self.fell_back, "fell_back")
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("narad_append_one_trip_total", "outcome" => outcome).increment(1);
    }

    /// Groups committed in one round trip, and groups whose one round trip
    /// failed (then written in two).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.one_trip.load(Ordering::Relaxed),
            self.fell_back.load(Ordering::Relaxed),
        )
    }

    /// How many sessions are known (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().expect("the known sessions").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(n: i64) -> Known {
        Known {
            core: Value::Null,
            sequence: n,
            entities: BTreeMap::new(),
            keys: BTreeSet::new(),
            xmin: n.to_string(),
        }
    }

    fn key(s: &str) -> (TenantId, SessionId) {
        (
            TenantId::new("org-1").expect("valid"),
            SessionId::new(s).expect("valid"),
        )
    }

    #[test]
    fn takes_all_or_none_and_stays_bounded() {
        let k = KnownSessions::default();
        k.remember([(key("a"), known(1)), (key("b"), known(2))]);
        assert!(k.take_all(&[key("a"), key("c")]).is_none());
        assert_eq!(k.len(), 2, "nothing taken when one is unknown");
        let taken = k.take_all(&[key("b"), key("a")]).expect("both known");
        assert_eq!(taken.iter().map(|t| t.sequence).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(k.len(), 0, "taken out while their group runs");
        k.remember((0..CAPACITY + 10).map(|i| (key(&format!("s{i}")), known(i as i64))));
        assert_eq!(k.len(), CAPACITY);
    }

    #[test]
    fn a_session_holding_a_document_is_not_remembered() {
        let k = KnownSessions::default();
        k.remember([(key("a"), known(1))]);
        let mut with_document = known(2);
        with_document.entities.insert(
            EntityKey::Document(
                narad_protocol::engine::DocumentFamily::State,
                "run".to_owned(),
            ),
            serde_json::json!({"revision": 1, "state": {}}),
        );
        k.remember([(key("a"), with_document)]);
        assert!(
            k.take_all(&[key("a")]).is_none(),
            "forgotten, not kept stale"
        );
    }
}
