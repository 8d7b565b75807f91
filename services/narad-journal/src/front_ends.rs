//! When chat front ends come back to a session: a front end whose stream
//! broke off stops its run after a grace unless a front end opened a
//! stream on the session meanwhile, on any replica
//! (`migrations/20261208000001_front_end_returns.sql`).

use crate::{Journal, JournalError, TenantId, in_tenant_at_once};

impl Journal {
    /// Records that a chat front end opens a stream on `session` now; the
    /// time recorded, in microseconds since the epoch (the database's
    /// clock), for [`Journal::front_end_returned_since`].
    pub async fn front_end_returned(
        &self,
        tenant: &TenantId,
        session: &str,
    ) -> Result<i64, JournalError> {
        // Not waited onto disk: a return lost to a crash only lets a
        // stop that a later front end's return would have held go ahead.
        let rows = in_tenant_at_once(
            self.pool.get().await?,
            tenant,
            false,
            "insert into front_end_returns (tenant_id, session_id) values ($1, $2) \
             on conflict (tenant_id, session_id) do update set returned_at = now() \
             returning (extract(epoch from returned_at) * 1000000)::bigint",
            &[&tenant.as_str(), &session],
        )
        .await?;
        Ok(rows.first().map_or(0, |r| r.get(0)))
    }

    /// Whether a chat front end opened a stream on `session` after
    /// `since` (a time [`Journal::front_end_returned`] answered).
    pub async fn front_end_returned_since(
        &self,
        tenant: &TenantId,
        session: &str,
        since: i64,
    ) -> Result<bool, JournalError> {
        let rows = in_tenant_at_once(
            self.pool.get().await?,
            tenant,
            false,
            "select 1 from front_end_returns \
             where tenant_id = $1 and session_id = $2 \
               and (extract(epoch from returned_at) * 1000000)::bigint > $3",
            &[&tenant.as_str(), &session, &since],
        )
        .await?;
        Ok(!rows.is_empty())
    }
}
