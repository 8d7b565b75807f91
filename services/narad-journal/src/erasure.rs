//! Erasure: a session's content removed for good in one transaction
//! (leaving a tombstone and its eventIds taken), a tenant's sessions in
//! bounded, resumable batches, and the sessions a retention policy makes
//! due.

use crate::sessions::record_watch;
use crate::{Journal, JournalError, TenantId, in_tenant};

/// The advisory lock of the erasure sweeper (one replica at a time).
const ERASURE_SWEEPER_LOCK: i64 = 0x6e61_7261_6400_0003;

/// Why a session was erased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErasureReason {
    /// `DELETE /v1/sessions/{id}`.
    Request,
    /// The tenant's retention policy.
    Retention,
    /// The tenant's erasure.
    Tenant,
}

impl ErasureReason {
    /// As stored and counted.
    pub fn as_str(self) -> &'static str {
        match self {
            ErasureReason::Request => "request",
            ErasureReason::Retention => "retention",
            ErasureReason::Tenant => "tenant",
        }
    }
}

/// A session a retention policy makes due.
#[derive(Debug, Clone, PartialEq)]
pub struct DueSession {
    /// The session.
    pub session_id: String,
    /// When it was archived, if it was (RFC 3339).
    pub archived_at: Option<String>,
    /// Its last event, or its creation (RFC 3339).
    pub last_activity_at: String,
}

/// Where a tenant's erasure stands.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantErasure {
    /// When it was asked for (RFC 3339).
    pub requested_at: String,
    /// Who asked.
    pub requested_by: String,
    /// Sessions erased so far.
    pub sessions_erased: u64,
    /// When it finished, if it has (RFC 3339).
    pub finished_at: Option<String>,
}

/// Whether `session` of `tenant` was erased, read in `c`'s transaction
/// (scoped to the tenant).
pub(crate) async fn was_erased(
    c: &deadpool_postgres::Client,
    tenant: &TenantId,
    session: &str,
) -> Result<bool, JournalError> {
    Ok(c.query_one(
        "select exists (select 1 from erased_sessions where tenant_id = $1 and session_id = $2)",
        &[&tenant.as_str(), &session],
    )
    .await?
    .get(0))
}

/// The advisory lock that orders session creation and tenant erasure
/// requests (see migration `20261206000001_closed_tenants.sql`): taken
/// shared by a creation, exclusively by an erasure request.
const TENANT_ERASURE_LOCK: &str = "hashtext('narad.tenant-erasure'), hashtext($1)";

/// Whether session `id` may be created for `tenant`, in `c`'s transaction
/// (scoped to the tenant): refused when the tenant's erasure was asked for
/// ([`JournalError::TenantClosed`]) or when the id named a session that
/// was erased ([`JournalError::SessionErased`]). Holds the erasure lock
/// shared until the transaction ends, so that an erasure asked for
/// meanwhile waits for this creation to commit, and then erases it.
pub(crate) async fn admit_session(
    c: &deadpool_postgres::Client,
    tenant: &TenantId,
    id: &str,
) -> Result<(), JournalError> {
    c.execute(
        &format!("select pg_advisory_xact_lock_shared({TENANT_ERASURE_LOCK})"),
        &[&tenant.as_str()],
    )
    .await?;
    let row = c
        .query_one(
            "select exists (select 1 from tenant_erasures where tenant_id = $1), \
                    exists (select 1 from erased_sessions where tenant_id = $1 and session_id = $2)",
            &[&tenant.as_str(), &id],
        )
        .await?;
    if row.get(0) {
        return Err(JournalError::TenantClosed(tenant.to_string()));
    }
    if row.get(1) {
        return Err(JournalError::SessionErased(id.to_owned()));
    }
    Ok(())
}

const RFC3339: &str = "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'";

impl Journal {
    /// Erases `session` of `tenant`: its events, outbox rows, entities,
    /// documents, queued starts, work items, client calls and the audit
    /// entries naming it, in one transaction; a `session.erased` notice
    /// (no content) goes to the tenant's streams. Answers the number of
    /// events erased. A session erased before is
    /// [`JournalError::SessionErased`].
    pub async fn erase_session(
        &self,
        tenant: &TenantId,
        session: &str,
        reason: ErasureReason,
    ) -> Result<u64, JournalError> {
        let client = self.pool.get().await?;
        let erased = in_tenant(client, tenant, async |c| {
            let n: Option<i64> = c
                .query_one(
                    "select erase_session($1, $2, $3)",
                    &[&tenant.as_str(), &session, &reason.as_str()],
                )
                .await?
                .get(0);
            let Some(n) = n else {
                return Err(JournalError::SessionNotFound(session.to_owned()));
            };
            record_watch(c, tenant, session, "session.erased", 0, Default::default()).await?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await?;
        self.catalogue_changed();
        Ok(erased)
    }

    /// Up to `max` sessions of `tenant` that a retention of `days` makes
    /// due now: archived, or without activity, for longer.
    pub async fn retention_due(
        &self,
        tenant: &TenantId,
        days: f64,
        max: i32,
    ) -> Result<Vec<DueSession>, JournalError> {
        let client = self.pool.get().await?;
        let rows = in_tenant(client, tenant, async |c| {
            Ok(c.query(
                &format!(
                    "select session_id, to_char(archived_at at time zone 'utc', {RFC3339}), \
                     to_char(last_activity at time zone 'utc', {RFC3339}) \
                     from retention_due($1, $2, $3)"
                ),
                &[&tenant.as_str(), &days, &max],
            )
            .await?)
        })
        .await?;
        Ok(rows
            .iter()
            .map(|r| DueSession {
                session_id: r.get(0),
                archived_at: r.get(1),
                last_activity_at: r.get(2),
            })
            .collect())
    }

    /// The tenants that hold sessions.
    pub async fn session_tenants(&self) -> Result<Vec<TenantId>, JournalError> {
        self.tenants_of("select tenant_id from session_tenants()")
            .await
    }

    /// Asks for `tenant`'s erasure (again, if it finished before): the
    /// sweeper erases its sessions in batches. From its commit no session
    /// is created for the tenant (see `admit_session`).
    pub async fn request_tenant_erasure(
        &self,
        tenant: &TenantId,
        by: &str,
    ) -> Result<TenantErasure, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            c.execute(
                &format!("select pg_advisory_xact_lock({TENANT_ERASURE_LOCK})"),
                &[&tenant.as_str()],
            )
            .await?;
            c.execute(
                "insert into tenant_erasures (tenant_id, requested_by) values ($1, $2) \
                 on conflict (tenant_id) do update set requested_at = now(), \
                   requested_by = excluded.requested_by, sessions_erased = 0, finished_at = null",
                &[&tenant.as_str(), &by],
            )
            .await?;
            Ok(())
        })
        .await?;
        self.tenant_erasure(tenant)
            .await?
            .ok_or_else(|| JournalError::Corrupt("a tenant erasure just asked for".into()))
    }

    /// Where `tenant`'s erasure stands, if one was asked for.
    pub async fn tenant_erasure(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<TenantErasure>, JournalError> {
        let client = self.pool.get().await?;
        let row = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                &format!(
                    "select to_char(requested_at at time zone 'utc', {RFC3339}), requested_by, \
                     sessions_erased, to_char(finished_at at time zone 'utc', {RFC3339}) \
                     from tenant_erasures where tenant_id = $1"
                ),
                &[&tenant.as_str()],
            )
            .await?)
        })
        .await?;
        Ok(row.map(|r| TenantErasure {
            requested_at: r.get(0),
            requested_by: r.get(1),
            sessions_erased: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            finished_at: r.get(3),
        }))
    }

    /// The tenants whose erasure was asked for, finished or not: closed
    /// for good.
    pub async fn closed_tenants(&self) -> Result<Vec<TenantId>, JournalError> {
        self.tenants_of("select tenant_id from closed_tenants()")
            .await
    }

    /// The tenants whose erasure has not finished.
    pub async fn tenant_erasures_pending(&self) -> Result<Vec<TenantId>, JournalError> {
        self.tenants_of("select tenant_id from tenant_erasures_pending()")
            .await
    }

    /// Erases up to `batch` of `tenant`'s sessions, each in its own
    /// transaction (a crash loses at most the one under way, which the
    /// next batch erases); when none is left, the tenant's other rows, and
    /// the erasure is finished. Answers the sessions erased and whether
    /// it finished.
    pub async fn erase_tenant_batch(
        &self,
        tenant: &TenantId,
        batch: i64,
    ) -> Result<(u64, bool), JournalError> {
        let client = self.pool.get().await?;
        let sessions: Vec<String> = in_tenant(client, tenant, async |c| {
            Ok(c.query(
                "select session_id from sessions where tenant_id = $1 \
                 order by created_at, session_id limit $2",
                &[&tenant.as_str(), &batch],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
        .await?;
        let mut erased = 0u64;
        for session in &sessions {
            match self
                .erase_session(tenant, session, ErasureReason::Tenant)
                .await
            {
                Ok(_) => erased += 1,
                // Erased meanwhile by another request.
                Err(JournalError::SessionNotFound(_) | JournalError::SessionErased(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let done = sessions.len() < usize::try_from(batch).unwrap_or(usize::MAX);
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            if done {
                c.execute("select erase_tenant_rest($1)", &[&tenant.as_str()])
                    .await?;
            }
            c.execute(
                "update tenant_erasures set sessions_erased = sessions_erased + $2, \
                   finished_at = case when $3 then now() end \
                 where tenant_id = $1",
                &[&tenant.as_str(), &(erased as i64), &done],
            )
            .await?;
            Ok(())
        })
        .await?;
        Ok((erased, done))
    }

    /// The tenant ids `query` answers in its first column.
    async fn tenants_of(&self, query: &str) -> Result<Vec<TenantId>, JournalError> {
        let client = self.pool.get().await?;
        let rows = client.query(query, &[]).await?;
        rows.iter()
            .map(|r| {
                TenantId::new(r.get::<_, String>(0))
                    .map_err(|e| JournalError::Corrupt(format!("tenant id: {e}")))
            })
            .collect()
    }

    /// Runs `body` if this process holds the erasure sweeper's advisory
    /// lock (one replica at a time); `None` when another holds it.
    pub async fn as_erasure_sweeper<T>(
        &self,
        body: impl AsyncFnOnce() -> T,
    ) -> Result<Option<T>, JournalError> {
        self.with_advisory_lock(ERASURE_SWEEPER_LOCK, body).await
    }
}
