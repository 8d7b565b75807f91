//! A tenant's own limits: overrides of the configured defaults, by name,
//! set by an admin of the operator organisation.

use serde_json::{Map, Value};

use crate::{Journal, JournalError, TenantId, in_tenant};

/// A tenant's overrides as stored.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoredLimits {
    /// Name → value (`null`: the limit is lifted for the tenant).
    pub overrides: Map<String, Value>,
    /// When they were last set (RFC 3339), if ever.
    pub updated_at: Option<String>,
    /// Who set them last.
    pub updated_by: Option<String>,
}

impl Journal {
    /// `tenant`'s overrides (none when never set).
    pub async fn tenant_limits(&self, tenant: &TenantId) -> Result<StoredLimits, JournalError> {
        let client = self.pool.get().await?;
        let row = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select limits, \
                   to_char(updated_at at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
                   updated_by from tenant_limits where tenant_id = $1",
                &[&tenant.as_str()],
            )
            .await?)
        })
        .await?;
        Ok(match row {
            None => StoredLimits::default(),
            Some(r) => StoredLimits {
                overrides: match r.get::<_, Value>(0) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                },
                updated_at: r.get(1),
                updated_by: r.get(2),
            },
        })
    }

    /// Replaces `tenant`'s overrides with `overrides` (checked by the
    /// caller), as `by`.
    pub async fn set_tenant_limits(
        &self,
        tenant: &TenantId,
        overrides: &Map<String, Value>,
        by: &str,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        let limits = Value::Object(overrides.clone());
        in_tenant(client, tenant, async |c| {
            c.execute(
                "insert into tenant_limits (tenant_id, limits, updated_by) values ($1, $2, $3) \
                 on conflict (tenant_id) do update \
                   set limits = excluded.limits, updated_at = now(), updated_by = excluded.updated_by",
                &[&tenant.as_str(), &limits, &by],
            )
            .await?;
            Ok(())
        })
        .await
    }
}
