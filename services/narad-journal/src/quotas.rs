//! Per-tenant rate limits and quotas in the database, shared by every
//! replica: token buckets taken in chunks, the open streams of tenants
//! under a limit, and the replicas alive.

use crate::{Journal, JournalError, TenantId};

/// What a bucket gave: tokens, or how long until there are enough.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Taken {
    /// This many tokens were taken (at least the ones needed).
    Granted(f64),
    /// None were taken; the needed ones are there after this many seconds.
    Refused {
        /// Seconds until the bucket holds what was needed.
        wait_seconds: f64,
    },
}

/// A rate a bucket enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Tokens added per second.
    pub per_second: f64,
    /// The most the bucket holds.
    pub burst: f64,
}

impl Journal {
    /// Takes `need` tokens (and up to `want` when there are more) from
    /// `tenant`'s bucket `bucket`, refilled at `rate`.
    pub async fn take_tokens(
        &self,
        tenant: &TenantId,
        bucket: &str,
        rate: Rate,
        need: f64,
        want: f64,
    ) -> Result<Taken, JournalError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached("select granted, wait_seconds from take_tokens($1, $2, $3, $4, $5, $6)")
            .await?;
        let row = client
            .query_one(
                &stmt,
                &[
                    &tenant.as_str(),
                    &bucket,
                    &rate.per_second,
                    &rate.burst,
                    &need,
                    &want.max(need),
                ],
            )
            .await?;
        let granted: f64 = row.get(0);
        Ok(if granted > 0.0 {
            Taken::Granted(granted)
        } else {
            Taken::Refused {
                wait_seconds: row.get(1),
            }
        })
    }

    /// Registers stream `stream` of `tenant` on `replica` if the tenant has
    /// fewer than `max` open on replicas heard from within `alive_seconds`.
    pub async fn open_stream(
        &self,
        tenant: &TenantId,
        stream: &str,
        replica: &str,
        max: u64,
        alive_seconds: f64,
    ) -> Result<bool, JournalError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "select open_stream($1, $2, $3, $4, $5)",
                &[
                    &tenant.as_str(),
                    &stream,
                    &replica,
                    &i64::try_from(max).unwrap_or(i64::MAX),
                    &alive_seconds,
                ],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Forgets a stream [`Journal::open_stream`] registered.
    pub async fn close_stream(&self, stream: &str) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        client
            .execute("select close_stream($1)", &[&stream])
            .await?;
        Ok(())
    }

    /// Says `replica` is alive, and forgets the streams of replicas not
    /// heard from for `dead_seconds`.
    pub async fn replica_alive(
        &self,
        replica: &str,
        dead_seconds: f64,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        client
            .execute("select replica_alive($1, $2)", &[&replica, &dead_seconds])
            .await?;
        Ok(())
    }
}

/// Holds `tenant`'s per-tenant lock for `what` for the rest of the
/// transaction, then counts with `count` and answers `refused(max)` when
/// the count has reached `max`: two replicas cannot both take the last
/// place.
pub(crate) async fn within_quota(
    c: &deadpool_postgres::Client,
    tenant: &TenantId,
    what: &str,
    count: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    max: u64,
    refused: impl FnOnce(u64) -> JournalError,
) -> Result<(), JournalError> {
    c.execute(
        "select pg_advisory_xact_lock(hashtext($1), hashtext($2))",
        &[&format!("narad.{what}"), &tenant.as_str()],
    )
    .await?;
    let n: i64 = c.query_one(count, params).await?.get(0);
    if u64::try_from(n).unwrap_or(0) >= max {
        return Err(refused(max));
    }
    Ok(())
}
