//! What runs on a tenant's behalf right now: its client executors with
//! their leases, its runtime work queues and the runs runtimes hold. Read
//! by the console's operations page (`GET /v1/operations`).

use serde::Serialize;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// The longest list of held runs one read returns.
pub const MAX_CLAIMS: i64 = 500;

/// A client executor endpoint and its current lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorStanding {
    /// The endpoint (`clientExecutorId`).
    #[schema(schema_with = crate::openapi::id)]
    pub client_executor_id: String,
    /// Its current lease.
    #[schema(schema_with = crate::openapi::id)]
    pub lease_id: String,
    /// When that lease was granted (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub attached_at: String,
    /// When it lapses without a heartbeat (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub lease_expires_at: String,
    /// Whether the lease is live now.
    pub live: bool,
    /// Client calls bound to it and not closed: waiting for delivery.
    pub waiting_calls: u64,
    /// Client calls delivered to it (a token issued) and not closed.
    pub running_calls: u64,
}

/// One runtime work queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStanding {
    /// The queue.
    pub queue: String,
    /// Runs ready for a runtime to claim.
    pub ready: u64,
    /// Runs a runtime holds.
    pub claimed: u64,
    /// Runs given back, waiting for something new (a resolution, a tool result).
    pub idle: u64,
    /// Runs being closed by the server (a lost runtime, a stop).
    pub closing: u64,
    /// When the longest-waiting ready run became ready (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, format = DateTime)]
    pub oldest_ready_at: Option<String>,
}

/// A run a runtime holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStanding {
    /// The session.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// The run (a root run).
    #[schema(schema_with = crate::openapi::id)]
    pub run_id: String,
    /// Its queue.
    pub queue: String,
    /// The runtime that holds it, when it named itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub runtime_id: Option<String>,
    /// When it was claimed (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub claimed_at: String,
    /// When the lease lapses without a heartbeat (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub lease_expires_at: String,
    /// Which holder this is: 1 for the first, more after lost runtimes.
    pub attempt: u32,
    /// Whether the run was asked to stop.
    pub stop_requested: bool,
}

/// A tenant's executors, queues and held runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operations {
    /// Every client executor endpoint that ever attached, by id.
    pub executors: Vec<ExecutorStanding>,
    /// Every queue with unfinished work, by name.
    pub queues: Vec<QueueStanding>,
    /// The held runs, the longest held first (at most 500).
    pub claims: Vec<ClaimStanding>,
}

impl Journal {
    /// What runs on `tenant`'s behalf now.
    pub async fn operations(&self, tenant: &TenantId) -> Result<Operations, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let executors = c
                .query(
                    "select x.executor_id, x.lease_id, \
                           rfc3339(x.attached_at), \
                           rfc3339(x.lease_expires_at), \
                           x.lease_expires_at > now(), \
                           (select count(*) from client_calls k where k.tenant_id = x.tenant_id \
                              and k.executor_id = x.executor_id and not k.closed and k.token_sha256 is null), \
                           (select count(*) from client_calls k where k.tenant_id = x.tenant_id \
                              and k.executor_id = x.executor_id and not k.closed and k.token_sha256 is not null) \
                         from executors x where x.tenant_id = $1 order by x.executor_id",
                    &[&tenant.as_str()],
                )
                .await?
                .iter()
                .map(|r| ExecutorStanding {
                    client_executor_id: r.get(0),
                    lease_id: r.get(1),
                    attached_at: r.get(2),
                    lease_expires_at: r.get(3),
                    live: r.get(4),
                    waiting_calls: r.get::<_, i64>(5).unsigned_abs(),
                    running_calls: r.get::<_, i64>(6).unsigned_abs(),
                })
                .collect();
            let queues = c
                .query(
                    "select queue, \
                           count(*) filter (where state = 'ready'), count(*) filter (where state = 'claimed'), \
                           count(*) filter (where state = 'idle'), count(*) filter (where state = 'closing'), \
                           rfc3339(min(ready_at) filter (where state = 'ready')) \
                         from run_work where tenant_id = $1 and state <> 'done' group by queue order by queue",
                    &[&tenant.as_str()],
                )
                .await?
                .iter()
                .map(|r| QueueStanding {
                    queue: r.get(0),
                    ready: r.get::<_, i64>(1).unsigned_abs(),
                    claimed: r.get::<_, i64>(2).unsigned_abs(),
                    idle: r.get::<_, i64>(3).unsigned_abs(),
                    closing: r.get::<_, i64>(4).unsigned_abs(),
                    oldest_ready_at: r.get(5),
                })
                .collect();
            let claims = c
                .query(
                    "select session_id, root_run_id, queue, runtime_id, \
                           rfc3339(claimed_at), \
                           rfc3339(lease_expires_at), lost + 1, stop_requested \
                         from run_work where tenant_id = $1 and state = 'claimed' \
                         order by claimed_at limit $2",
                    &[&tenant.as_str(), &MAX_CLAIMS],
                )
                .await?
                .iter()
                .map(|r| ClaimStanding {
                    session_id: r.get(0),
                    run_id: r.get(1),
                    queue: r.get(2),
                    runtime_id: r.get(3),
                    claimed_at: r.get(4),
                    lease_expires_at: r.get(5),
                    attempt: r.get::<_, i32>(6).unsigned_abs(),
                    stop_requested: r.get(7),
                })
                .collect();
            Ok(Operations {
                executors,
                queues,
                claims,
            })
        })
        .await
    }
}
