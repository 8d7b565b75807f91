//! The approvals inbox: a tenant's open interrupts (requested and not yet
//! resolved) across its sessions, oldest first, each with the
//! `interrupt.requested` event that asked for it.

use serde::Serialize;
use serde_json::Value;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// An interrupt waiting for a decision.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenInterrupt {
    /// The session it belongs to.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// The session's title, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub session_title: Option<String>,
    /// The interrupt.
    #[schema(schema_with = crate::openapi::id)]
    pub interrupt_id: String,
    /// When the journal recorded its request (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub requested_at: String,
    /// The `interrupt.requested` event: kind, actions, title, message, input.
    #[schema(schema_with = crate::openapi::interrupt_requested)]
    pub request: Value,
}

/// Where a page of open interrupts ends: pass it as `after` for the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterruptCursor {
    micros: i64,
    session_sequence: i64,
    session_id: String,
}

impl InterruptCursor {
    /// Reads a cursor given out by [`InterruptCursor::encode`].
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '.');
        let micros = parts.next()?.parse().ok()?;
        let session_sequence = parts.next()?.parse().ok()?;
        let session_id = parts.next().filter(|s| !s.is_empty())?.to_owned();
        Some(Self {
            micros,
            session_sequence,
            session_id,
        })
    }

    /// The opaque text form.
    pub fn encode(&self) -> String {
        format!(
            "{}.{}.{}",
            self.micros, self.session_sequence, self.session_id
        )
    }
}

impl Journal {
    /// Up to `limit` open interrupts of `tenant`, oldest request first,
    /// after `after`; with the cursor of the last one.
    pub async fn open_interrupts(
        &self,
        tenant: &TenantId,
        session: Option<&str>,
        after: Option<&InterruptCursor>,
        limit: u32,
    ) -> Result<Vec<(OpenInterrupt, InterruptCursor)>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let stmt = c
                .prepare_cached(
                    "select e.session_id, e.id, ev.body, \
                       to_char(ev.recorded_at at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
                       (extract(epoch from ev.recorded_at) * 1000000)::bigint as micros, ev.session_sequence, s.title \
                     from interrupt_deadlines d \
                     join entities e on e.tenant_id = d.tenant_id and e.session_id = d.session_id \
                       and e.kind = 'interrupt' and e.id = d.interrupt_id \
                     join sessions s on s.tenant_id = e.tenant_id and s.session_id = e.session_id \
                     join events ev on ev.tenant_id = e.tenant_id and ev.session_id = e.session_id \
                       and ev.type = 'interrupt.requested' and ev.body ->> 'interruptId' = e.id \
                     where d.tenant_id = $1 and e.state ->> 'decision' is null \
                       and ($6::text is null or d.session_id = $6) \
                       and ($2::bigint is null or \
                         ((extract(epoch from ev.recorded_at) * 1000000)::bigint, ev.session_id, ev.session_sequence) \
                           > ($2, $4, $3)) \
                     order by micros, ev.session_id, ev.session_sequence limit $5",
                )
                .await?;
            let rows = c
                .query(
                    &stmt,
                    &[
                        &tenant.as_str(),
                        &after.map(|a| a.micros),
                        &after.map(|a| a.session_sequence),
                        &after.map(|a| a.session_id.as_str()),
                        &i64::from(limit),
                        &session,
                    ],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|row| {
                    let session_id: String = row.get(0);
                    let cursor = InterruptCursor {
                        micros: row.get(4),
                        session_sequence: row.get(5),
                        session_id: session_id.clone(),
                    };
                    (
                        OpenInterrupt {
                            session_id,
                            session_title: row.get(6),
                            interrupt_id: row.get(1),
                            requested_at: row.get(3),
                            request: row.get(2),
                        },
                        cursor,
                    )
                })
                .collect())
        })
        .await
    }
}

/// An open interrupt past its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueInterrupt {
    /// Its tenant.
    pub tenant: TenantId,
    /// Its session.
    pub session_id: String,
    /// The interrupt.
    pub interrupt_id: String,
}

impl Journal {
    /// Up to `max` open interrupts past their `expiresAt`, across tenants,
    /// and (with `default_expiry`) up to `max` naming none that were
    /// requested longer ago than that.
    pub async fn interrupts_due(
        &self,
        default_expiry: Option<std::time::Duration>,
        max: i32,
    ) -> Result<Vec<DueInterrupt>, JournalError> {
        let client = self.pool.get().await?;
        let default_seconds = default_expiry.map(|d| d.as_secs_f64());
        let rows = client
            .query(
                "select tenant_id, session_id, interrupt_id from interrupt_deadlines_due($1, $2)",
                &[&default_seconds, &max],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DueInterrupt {
                    tenant: TenantId::new(r.get::<_, String>(0)).map_err(JournalError::Corrupt)?,
                    session_id: r.get(1),
                    interrupt_id: r.get(2),
                })
            })
            .collect()
    }
}
