//! The audit log: every command and admin action of a tenant, with who did
//! it, its request id, its outcome and the events it appended, read back
//! page by page with filters (`GET /v1/audit`).

use serde::Serialize;
use serde_json::Value;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// One action to record.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// The session it acted on, when one.
    pub session_id: Option<String>,
    /// Who acted: `{kind, sub, extension?}`.
    pub actor: Value,
    /// The command (`resolve-interrupt`, …) or admin action (`create-session`, `register-extension`, …).
    pub action: String,
    /// The request's `x-request-id`.
    pub request_id: Option<String>,
    /// The HTTP status it was answered with.
    pub status: u16,
    /// The `NRD-` code of a refusal.
    pub code: Option<String>,
    /// The eventIds it appended, in order.
    pub event_ids: Vec<String>,
    /// Whether the answer was a replay: the kept answer of an earlier
    /// request with the same `Idempotency-Key` (nothing was done again).
    pub replayed: bool,
}

/// One recorded action.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Its place in the tenant's log (the `after` of the next page).
    pub position: i64,
    /// When it was recorded (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub at: String,
    /// The session it acted on, when one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub session_id: Option<String>,
    /// Who acted: `kind` (`user`, `extension`), `sub`, and `extension` for a signed call.
    #[schema(value_type = Object)]
    pub actor: Value,
    /// The command or admin action.
    pub action: String,
    /// The request's `x-request-id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub request_id: Option<String>,
    /// The HTTP status it was answered with.
    pub status: u16,
    /// The `NRD-` code of a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub code: Option<String>,
    /// The eventIds it appended, in order (for a replay: the ones the
    /// first request appended).
    pub event_ids: Vec<String>,
    /// Whether the answer was a replay of the first answer to its
    /// `Idempotency-Key`: the action was not done again.
    pub replayed: bool,
}

/// What to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only actions on this session.
    pub session_id: Option<String>,
    /// Only actions of this subject.
    pub sub: Option<String>,
    /// Only this command or admin action.
    pub action: Option<String>,
    /// Only actions recorded at or after this time (microseconds since
    /// the epoch).
    pub since: Option<i64>,
    /// Only actions recorded before this time (microseconds since the
    /// epoch).
    pub until: Option<i64>,
    /// Only after this position.
    pub after: Option<i64>,
}

impl Journal {
    /// Records one action of `tenant`.
    pub async fn record_audit(
        &self,
        tenant: &TenantId,
        record: &AuditRecord,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            c.execute(
                "insert into audit (tenant_id, session_id, actor, action, request_id, status, code, event_ids, replayed) \
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                &[
                    &tenant.as_str(),
                    &record.session_id,
                    &record.actor,
                    &record.action,
                    &record.request_id,
                    &i32::from(record.status),
                    &record.code,
                    &record.event_ids,
                    &record.replayed,
                ],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Up to `limit` recorded actions of `tenant` matching `filter`, oldest
    /// first.
    pub async fn audit_page(
        &self,
        tenant: &TenantId,
        filter: &AuditFilter,
        limit: u32,
    ) -> Result<Vec<AuditEntry>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let stmt = c
                .prepare_cached(
                    "select position, \
                       to_char(at at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
                       session_id, actor, action, request_id, status, code, event_ids, replayed \
                     from audit where tenant_id = $1 \
                       and ($2::text is null or session_id = $2) \
                       and ($3::text is null or actor ->> 'sub' = $3) \
                       and ($4::text is null or action = $4) \
                       and ($5::bigint is null or at >= timestamptz 'epoch' + $5 * interval '1 microsecond') \
                       and ($6::bigint is null or at < timestamptz 'epoch' + $6 * interval '1 microsecond') \
                       and ($7::bigint is null or position > $7) \
                     order by position limit $8",
                )
                .await?;
            let rows = c
                .query(
                    &stmt,
                    &[
                        &tenant.as_str(),
                        &filter.session_id,
                        &filter.sub,
                        &filter.action,
                        &filter.since,
                        &filter.until,
                        &filter.after,
                        &i64::from(limit),
                    ],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| AuditEntry {
                    position: r.get(0),
                    at: r.get(1),
                    session_id: r.get(2),
                    actor: r.get(3),
                    action: r.get(4),
                    request_id: r.get(5),
                    status: u16::try_from(r.get::<_, i32>(6)).unwrap_or_default(),
                    code: r.get(7),
                    event_ids: r.get(8),
                    replayed: r.get(9),
                })
                .collect())
        })
        .await
    }
}
