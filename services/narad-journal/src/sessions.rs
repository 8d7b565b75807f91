//! Sessions: create, read, list.

use narad_protocol::engine::SessionCore;
use narad_protocol::primitives::{JsonObject, SessionId};
use serde::Serialize;
use serde_json::Value;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// What a new session is created with.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    /// The id; narad issues a UUIDv7 when absent.
    pub session_id: Option<SessionId>,
    /// A title.
    pub title: Option<String>,
    /// Metadata.
    pub metadata: Option<JsonObject>,
}

impl From<narad_protocol::commands::CreateSession> for NewSession {
    fn from(cmd: narad_protocol::commands::CreateSession) -> NewSession {
        NewSession {
            session_id: cmd.session_id,
            title: cmd.title,
            metadata: cmd.metadata,
        }
    }
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    /// The session.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// Its title.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub title: Option<String>,
    /// Its metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::metadata)]
    pub metadata: Option<Value>,
    /// When it was created (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub created_at: String,
    /// When it was archived, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::timestamp)]
    pub archived_at: Option<String>,
    /// The last sessionSequence (0: no authority yet).
    #[schema(schema_with = crate::openapi::uint)]
    pub session_sequence: u64,
    /// The active top-level execution.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::active_execution)]
    pub active_execution: Option<Value>,
}

/// A session's state and UI documents (§9.6), current through a
/// sessionSequence.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionDocuments {
    /// The session.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// The documents hold every change through this sessionSequence:
    /// stream with `afterSessionSequence` set to it and none is missed.
    #[schema(schema_with = crate::openapi::uint)]
    pub covers_through_session_sequence: i64,
    /// The state documents (`state.snapshot`, `state.delta`), by scope.
    pub state: Vec<Document>,
    /// The UI documents (`ui.state.snapshot`, `ui.state.delta`), by scope.
    pub ui: Vec<Document>,
}

/// One document: its scope, revision and value.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Document {
    /// The document's scope.
    #[schema(schema_with = crate::openapi::id)]
    pub scope: Value,
    /// Its revision (0 for the first snapshot).
    #[schema(schema_with = crate::openapi::uint)]
    pub revision: Value,
    /// The document (any JSON).
    pub state: Value,
}

pub(crate) const SESSION_COLUMNS: &str = "session_id, title, metadata, \
    rfc3339(created_at), \
    rfc3339(archived_at), \
    session_sequence, core";

pub(crate) fn record(row: &tokio_postgres::Row) -> Result<SessionRecord, JournalError> {
    let core: Value = row.get(6);
    let core: SessionCore = serde_json::from_value(core)
        .map_err(|e| JournalError::Corrupt(format!("session core: {e}")))?;
    Ok(SessionRecord {
        session_id: row.get(0),
        title: row.get(1),
        metadata: row.get(2),
        created_at: row.get(3),
        archived_at: row.get(4),
        session_sequence: row.get::<_, i64>(5) as u64,
        active_execution: core
            .slot
            .map(|s| serde_json::to_value(s).expect("serialises")),
    })
}

impl Journal {
    /// Creates a session. An id that exists already is refused
    /// ([`JournalError::SessionExists`]).
    pub async fn create_session(
        &self,
        tenant: &TenantId,
        new: NewSession,
    ) -> Result<SessionRecord, JournalError> {
        self.create_session_within(tenant, new, None).await
    }

    /// Creates a session if `tenant` holds fewer than `max` (when given):
    /// at the limit, [`JournalError::LimitReached`] and nothing written.
    pub async fn create_session_within(
        &self,
        tenant: &TenantId,
        new: NewSession,
        max: Option<u64>,
    ) -> Result<SessionRecord, JournalError> {
        let id = new
            .session_id
            .map(|s| s.as_str().to_owned())
            .unwrap_or_else(|| narad_protocol::primitives::EventId::new_v7().to_string());
        let metadata = new.metadata.map(Value::Object);
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            crate::erasure::admit_session(c, tenant, &id).await?;
            if let Some(max) = max {
                crate::quotas::within_quota(
                    c,
                    tenant,
                    "sessions",
                    "select count(*) from sessions where tenant_id = $1",
                    &[&tenant.as_str()],
                    max,
                    |max| JournalError::LimitReached {
                        code: narad_protocol::ErrorCode::SessionLimitReached,
                        message: format!(
                            "this organisation holds {max} sessions, its limit; erase sessions it \
                             no longer needs (DELETE /v1/sessions/{{id}}) or ask the operator for \
                             a higher limit"
                        ),
                    },
                )
                .await?;
            }
            let stmt = c
                .prepare_cached(&format!(
                    "insert into sessions (tenant_id, session_id, title, metadata) \
                     values ($1, $2, $3, $4) on conflict do nothing returning {SESSION_COLUMNS}"
                ))
                .await?;
            let Some(row) = c
                .query_opt(&stmt, &[&tenant.as_str(), &id, &new.title, &metadata])
                .await?
            else {
                return Err(JournalError::SessionExists(id.clone()));
            };
            let created = record(&row)?;
            let mut fields = serde_json::Map::new();
            if let Some(title) = &created.title {
                fields.insert("title".into(), Value::from(title.as_str()));
            }
            if let Some(metadata) = &created.metadata {
                fields.insert("metadata".into(), metadata.clone());
            }
            record_watch(c, tenant, &id, "session.created", 0, fields).await?;
            Ok(created)
        })
        .await
        .inspect(|_| self.catalogue_changed())
    }

    /// Wakes the relays after a catalogue change ([`record_watch`])
    /// committed: it reaches tenant streams at once, not at the next poll.
    pub(crate) fn catalogue_changed(&self) {
        self.combiner.announce();
    }

    /// Reads a session.
    pub async fn session(
        &self,
        tenant: &TenantId,
        session_id: &str,
    ) -> Result<SessionRecord, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let stmt = c
                .prepare_cached(&format!(
                    "select {SESSION_COLUMNS} from sessions where tenant_id = $1 and session_id = $2"
                ))
                .await?;
            match c.query_opt(&stmt, &[&tenant.as_str(), &session_id]).await? {
                Some(row) => record(&row),
                None => Err(JournalError::SessionNotFound(session_id.to_owned())),
            }
        })
        .await
    }

    /// A session's state and UI documents (§9.6) as the journal holds them,
    /// with the sessionSequence they are current through (read in one
    /// snapshot): `{sessionId, coversThroughSessionSequence, state: [{scope,
    /// revision, state}], ui: [...]}`. A client that reads them and then
    /// streams from `coversThroughSessionSequence` misses no change.
    pub async fn documents(
        &self,
        tenant: &TenantId,
        session_id: &str,
    ) -> Result<SessionDocuments, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            // One statement: the documents and the sequence they are
            // current through come from one snapshot.
            let Some(row) = c
                .query_opt(
                    "select s.session_sequence, \
                       (select coalesce(jsonb_agg(jsonb_build_array(e.kind, e.id, e.state) \
                                                  order by e.kind, e.id), '[]') \
                        from entities e where e.tenant_id = $1 and e.session_id = $2 \
                          and e.kind in ('document.state', 'document.ui')) \
                     from sessions s where s.tenant_id = $1 and s.session_id = $2",
                    &[&tenant.as_str(), &session_id],
                )
                .await?
            else {
                return Err(JournalError::SessionNotFound(session_id.to_owned()));
            };
            let mut state = Vec::new();
            let mut ui = Vec::new();
            for e in row
                .get::<_, serde_json::Value>(1)
                .as_array()
                .into_iter()
                .flatten()
            {
                let doc = &e[2];
                let entry = Document {
                    scope: e[1].clone(),
                    revision: doc["revision"].clone(),
                    state: doc["state"].clone(),
                };
                match e[0].as_str() {
                    Some("document.state") => state.push(entry),
                    _ => ui.push(entry),
                }
            }
            Ok(SessionDocuments {
                session_id: session_id.to_owned(),
                covers_through_session_sequence: row.get::<_, i64>(0),
                state,
                ui,
            })
        })
        .await
    }

    /// Lists a tenant's sessions oldest first, `limit` at a time, after the
    /// session id `after` (a cursor from the previous page).
    pub async fn sessions(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<SessionRecord>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let stmt = c
                .prepare_cached(&format!(
                    "select {SESSION_COLUMNS} from sessions \
                     where tenant_id = $1 and ($2::text is null or (created_at, session_id) > \
                       (select created_at, session_id from sessions where tenant_id = $1 and session_id = $2)) \
                     order by created_at, session_id limit $3"
                ))
                .await?;
            c.query(&stmt, &[&tenant.as_str(), &after, &i64::from(limit)])
                .await?
                .iter()
                .map(record)
                .collect()
        })
        .await
    }
}

/// Records a watch event that is a fact of its own (`session.created`,
/// `session.archived`) in the outbox, in the caller's transaction, so that
/// every replica's tenant stream delivers it. Its revision is the session's
/// sequence when it happened; its eventId names the transaction, so that a
/// stream can resume after it.
pub(crate) async fn record_watch(
    c: &deadpool_postgres::Client,
    tenant: &TenantId,
    session_id: &str,
    type_name: &str,
    revision: u64,
    fields: serde_json::Map<String, Value>,
) -> Result<(), JournalError> {
    let txid: i64 = c
        .query_one("select stream_xid()::text::bigint", &[])
        .await?
        .get(0);
    let event_id = narad_protocol::watch::WatchId {
        type_name: type_name.to_owned(),
        session_id: Some(session_id.to_owned()),
        scope_id: None,
        revision,
        covers: Some(revision),
        txid: Some(txid),
    }
    .encode();
    let mut body = serde_json::json!({
        "protocolVersion": "narad/v1",
        "eventId": event_id,
        "type": type_name,
        "timestamp": narad_protocol::primitives::Timestamp::now(),
        "revision": revision,
        "workspaceId": tenant.as_str(),
        "sessionId": session_id,
    });
    body.as_object_mut().expect("an object").extend(fields);
    c.execute(
        "insert into outbox (tenant_id, session_id, session_sequence, event_id, body) \
         values ($1, $2, $3, $4, $5)",
        &[
            &tenant.as_str(),
            &session_id,
            &(revision as i64),
            &event_id,
            &body,
        ],
    )
    .await?;
    Ok(())
}
