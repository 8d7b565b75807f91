//! The engine's state is derived: [`Journal::derived_state`] rebuilds it
//! from a session's events alone, and [`Journal::stored_state`] reads what
//! the appends wrote, so that the two can be compared (or the stored state
//! repaired with [`Journal::repair_state`]).

use std::collections::BTreeMap;

use narad_protocol::engine::{EntityKey, SessionCore, SessionState};
use narad_protocol::{Classified, Reader, WireObject};
use serde_json::Value;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// A session's engine state as the journal keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredState {
    /// The session core (sequence, slot).
    pub core: SessionCore,
    /// Every entity, by (kind, id).
    pub entities: BTreeMap<(String, String), Value>,
}

impl StoredState {
    fn of(state: &SessionState) -> Self {
        StoredState {
            core: state.core(),
            entities: state
                .entities()
                .into_iter()
                .map(|(k, v)| ((k.kind().to_owned(), k.id().to_owned()), v))
                .collect(),
        }
    }
}

impl Journal {
    /// Rebuilds a session's engine state from its events alone.
    pub async fn derived_state(
        &self,
        tenant: &TenantId,
        session_id: &str,
    ) -> Result<StoredState, JournalError> {
        let client = self.pool.get().await?;
        let rows = in_tenant(client, tenant, async |c| {
            Ok(c.query(
                "select body from events where tenant_id = $1 and session_id = $2 \
                 order by session_sequence",
                &[&tenant.as_str(), &session_id],
            )
            .await?)
        })
        .await?;
        let mut state = SessionState::new();
        for row in rows {
            let body: Value = row.get(0);
            let event = match Reader::all_profiles().classify(&body) {
                Ok(Classified::Accepted(o)) => match *o {
                    WireObject::Authority(e) => e,
                    _ => {
                        return Err(JournalError::Corrupt(
                            "a stored event is not authority".into(),
                        ));
                    }
                },
                other => return Err(JournalError::Corrupt(format!("stored event: {other:?}"))),
            };
            state
                .apply(&event)
                .map_err(|v| JournalError::Corrupt(format!("stored events break a rule: {v}")))?;
        }
        if state.session_id.is_none() {
            state.session_id = narad_protocol::primitives::SessionId::new(session_id).ok();
        }
        Ok(StoredState::of(&state))
    }

    /// Reads a session's stored engine state.
    pub async fn stored_state(
        &self,
        tenant: &TenantId,
        session_id: &str,
    ) -> Result<StoredState, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    "select core, session_sequence from sessions where tenant_id = $1 and session_id = $2",
                    &[&tenant.as_str(), &session_id],
                )
                .await?
                .ok_or_else(|| JournalError::SessionNotFound(session_id.to_owned()))?;
            let mut core: SessionCore = serde_json::from_value(row.get(0))
                .map_err(|e| JournalError::Corrupt(format!("session core: {e}")))?;
            core.session_sequence = row.get::<_, i64>(1) as u64;
            if core.session_id.is_none() {
                core.session_id = narad_protocol::primitives::SessionId::new(session_id).ok();
            }
            let entities = c
                .query(
                    "select kind, id, state from entities where tenant_id = $1 and session_id = $2",
                    &[&tenant.as_str(), &session_id],
                )
                .await?
                .into_iter()
                .map(|r| ((r.get::<_, String>(0), r.get::<_, String>(1)), r.get::<_, Value>(2)))
                .collect();
            Ok(StoredState { core, entities })
        })
        .await
    }

    /// Replaces a session's stored engine state with the one derived from
    /// its events. Returns whether anything differed.
    pub async fn repair_state(
        &self,
        tenant: &TenantId,
        session_id: &str,
    ) -> Result<bool, JournalError> {
        let derived = self.derived_state(tenant, session_id).await?;
        let stored = self.stored_state(tenant, session_id).await?;
        if derived == stored {
            return Ok(false);
        }
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            c.execute(
                "select 1 from sessions where tenant_id = $1 and session_id = $2 for update",
                &[&tenant.as_str(), &session_id],
            )
            .await?;
            c.execute(
                "delete from entities where tenant_id = $1 and session_id = $2",
                &[&tenant.as_str(), &session_id],
            )
            .await?;
            for ((kind, id), state) in &derived.entities {
                debug_assert!(EntityKey::from_parts(kind, id).is_some());
                c.execute(
                    "insert into entities (tenant_id, session_id, kind, id, state) values ($1, $2, $3, $4, $5)",
                    &[&tenant.as_str(), &session_id, kind, id, state],
                )
                .await?;
            }
            let core = serde_json::to_value(&derived.core).expect("serialises");
            c.execute(
                "update sessions set core = $3, session_sequence = $4 where tenant_id = $1 and session_id = $2",
                &[&tenant.as_str(), &session_id, &core, &(derived.core.session_sequence as i64)],
            )
            .await?;
            Ok(true)
        })
        .await
    }
}
