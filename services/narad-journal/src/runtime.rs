//! Agent runtimes: the durable work queue of run journals, runtime leases
//! and orphan repair.
//!
//! A top-level run started by `start-run` with `runtime` is a work item
//! (`run_work`), written in the transaction that appends its `run.started`
//! (or, for a queued start, in the one that gives it the slot). A runtime
//! claims it under a lease that it renews; every backend append to the
//! run's journal must then present that lease (the fence, checked in the
//! append transaction with the item row share-locked). A runtime may
//! release a run while it waits (an interrupt, a client tool): the next
//! event of its journal makes it claimable again. The root's terminal ends
//! the item.
//!
//! When a lease lapses the sweeper (one replica at a time) repairs the
//! run: under the retry policy it cancels the lost runtime's open backend
//! tool calls (`runtime_lost`) and queues the run again, up to
//! `maxAttempts` holders; under the fail policy, or when attempts are
//! spent, it closes every open item of the journal and ends the run with
//! `run.error` (`runtime_lost`). A stop with no runtime holding the run is
//! served by the server: the journal is closed with `run.cancelled`. Each
//! step is an ordinary batch the rule engine checks; the item's `closing`
//! state makes the server the only writer meanwhile, and a closer that
//! dies is taken over by a later sweep.

use std::time::Duration;

use narad_protocol::commands::{OnLost, RuntimeOrder};
use narad_protocol::engine::{EntityKey, SessionState};
use narad_protocol::primitives::{RunId, SessionId};
use narad_protocol::repair::{self, Closing};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{AppendOptions, Journal, JournalError, TenantId, in_tenant};

/// The advisory lock of the runtime sweeper.
const RUNTIME_SWEEPER_LOCK: i64 = 0x6e61_7261_6400_0002;

/// The code of the events that close or repair a lost runtime's run.
pub const RUNTIME_LOST: &str = "runtime_lost";

/// The code of `run.cancelled` when the server serves a stop itself.
pub const STOPPED_UNHELD: &str = "stopped_without_runtime";

/// The code of `run.cancelled` when the server closes a run asked to stop
/// that nothing drives (no runtime holds it, and its journal stayed silent
/// for the grace after the stop).
pub const STOP_UNANSWERED: &str = "stop_unanswered";

/// The default queue.
pub const DEFAULT_QUEUE: &str = "default";

/// A run's runtime settings, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkOrder {
    /// The queue.
    pub queue: String,
    /// What happens when the holder is lost.
    pub on_lost: OnLost,
    /// The most holders, counting the first.
    pub max_attempts: u32,
}

/// The defaults of the runtime settings a start-run leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkDefaults {
    /// The policy when a holder is lost.
    pub on_lost: OnLost,
    /// The most holders.
    pub max_attempts: u32,
}

impl Default for WorkDefaults {
    fn default() -> Self {
        WorkDefaults {
            on_lost: OnLost::Retry,
            max_attempts: 3,
        }
    }
}

impl WorkOrder {
    /// The settings of a start-run's `runtime`, defaults filled in.
    pub fn of(order: &RuntimeOrder, defaults: WorkDefaults) -> WorkOrder {
        WorkOrder {
            queue: order
                .queue
                .as_ref()
                .map_or(DEFAULT_QUEUE.to_owned(), |q| q.to_string()),
            on_lost: order.on_lost.unwrap_or(defaults.on_lost),
            max_attempts: order
                .max_attempts
                .map_or(defaults.max_attempts, |a| a.get()),
        }
    }
}

/// A run handed to a runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// The run (the root of its journal).
    #[schema(schema_with = crate::openapi::id)]
    pub run_id: String,
    /// Its session.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// The queue it came from.
    #[schema(schema_with = crate::openapi::id)]
    pub queue: String,
    /// Why it is ready: `started`, `event` (its journal moved while no
    /// runtime held it), `retry` (its previous holder was lost).
    pub reason: String,
    /// Read the session's history after this sessionSequence for what is
    /// new to this holder.
    #[schema(schema_with = crate::openapi::uint)]
    pub cursor: u64,
    /// This holder's number, from 1; above 1 after lost holders.
    pub attempt: u32,
    /// The most holders.
    pub max_attempts: u32,
    /// The policy when a holder is lost.
    #[schema(schema_with = crate::openapi::on_lost)]
    pub on_lost: OnLost,
    /// The run was asked to stop.
    pub stop_requested: bool,
    /// The lease: present it on every append (`Narad-Runtime-Lease`).
    pub lease: RuntimeLease,
}

/// A runtime lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeLease {
    /// The lease id.
    #[schema(schema_with = crate::openapi::id)]
    pub lease_id: String,
    /// When it lapses unless renewed (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub expires_at: String,
}

/// A lease's standing, as a heartbeat or a control poll reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseStanding {
    /// The run.
    #[schema(schema_with = crate::openapi::id)]
    pub run_id: String,
    /// Its session.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// When the lease lapses unless renewed.
    #[schema(schema_with = crate::openapi::timestamp)]
    pub expires_at: String,
    /// The run was asked to stop: close its work and end it.
    pub stop_requested: bool,
    /// The run has ended: nothing more to do (the lease renews nothing).
    pub ended: bool,
}

impl LeaseStanding {
    /// From a row of `root_run_id, session_id, expires_at, stop_requested`.
    fn of(row: &tokio_postgres::Row, ended: bool) -> LeaseStanding {
        LeaseStanding {
            run_id: row.get(0),
            session_id: row.get(1),
            expires_at: row.get(2),
            stop_requested: row.get(3),
            ended,
        }
    }
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Released {
    /// The run waits; the next event of its journal queues it again.
    Idle,
    /// Its journal moved after what the runtime handled: queued again now.
    Ready,
    /// The run has ended.
    Ended,
}

/// What the runtime sweeper found due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeDue {
    /// `lapsed`, `stopped` or `stalled`.
    pub kind: String,
    /// The tenant.
    pub tenant: TenantId,
    /// The session.
    pub session_id: String,
    /// The run journal.
    pub root_run_id: String,
    /// The lapsed lease (`lapsed`).
    pub lease_id: Option<String>,
}

/// What a repair did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// The run was queued again for another runtime.
    Retried,
    /// The run was closed (`run.error` or `run.cancelled`).
    Closed,
    /// Nothing was due any more (renewed, released, taken by another sweep).
    Nothing,
}

/// Work items in one state, summed over every tenant and queue: queue
/// names are the tenants' own, so the metrics never see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    /// ready, claimed, idle or closing.
    pub state: String,
    /// How many items.
    pub items: i64,
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn lease_not_current(lease_id: &str) -> JournalError {
    JournalError::RuntimeLeaseNotCurrent(format!(
        "runtime lease {lease_id} is not current: it lapsed, was released, or its run was \
         handed to another runtime; stop working on the run and claim again"
    ))
}

/// The standing of a lease whose run ended while it held it (a late
/// heartbeat or control poll learns that); otherwise the lease is not
/// current.
async fn ended_under(
    c: &deadpool_postgres::Client,
    tenant: &TenantId,
    lease_id: &str,
) -> Result<LeaseStanding, JournalError> {
    let row = c
        .query_opt(
            "select root_run_id, session_id, rfc3339(coalesce(lease_expires_at, now())), \
               stop_requested from run_work \
             where tenant_id = $1 and lease_id = $2 and state = 'done'",
            &[&tenant.as_str(), &lease_id],
        )
        .await?
        .ok_or_else(|| lease_not_current(lease_id))?;
    Ok(LeaseStanding::of(&row, true))
}

const CLAIM: &str = "
with next as (
  select session_id, root_run_id from run_work
  where tenant_id = $1 and state = 'ready' and ($2::text is null or queue = $2)
  order by ready_at limit 1 for update skip locked
)
update run_work w set state = 'claimed', lease_id = $5, runtime_id = $3,
  lease_expires_at = now() + make_interval(secs => $4), claimed_at = now(), changed_at = now()
from next
where w.tenant_id = $1 and w.session_id = next.session_id and w.root_run_id = next.root_run_id
returning w.session_id, w.root_run_id, w.queue, w.reason, w.cursor, w.lost, w.max_attempts,
  w.on_lost, w.stop_requested, w.lease_id, rfc3339(w.lease_expires_at),
  extract(epoch from w.claimed_at - w.ready_at)::float8";

impl Journal {
    /// Claims the oldest ready run of the tenant (of `queue`, when given)
    /// for `runtime_id`, under a new lease valid for `ttl`; `None` when
    /// nothing is ready. Also returns how long the run waited (seconds).
    pub async fn claim_run(
        &self,
        tenant: &TenantId,
        queue: Option<&str>,
        runtime_id: &str,
        ttl: Duration,
    ) -> Result<Option<(Claim, f64)>, JournalError> {
        let client = self.pool.get().await?;
        // Made here, not by the statement: Citus refuses a volatile
        // function in an update of a distributed table.
        let lease_id = uuid::Uuid::new_v4().to_string();
        in_tenant(client, tenant, async |c| {
            let Some(r) = c
                .query_opt(
                    CLAIM,
                    &[
                        &tenant.as_str(),
                        &queue,
                        &runtime_id,
                        &seconds(ttl),
                        &lease_id,
                    ],
                )
                .await?
            else {
                return Ok(None);
            };
            let on_lost = match r.get::<_, &str>(7) {
                "fail" => OnLost::Fail,
                _ => OnLost::Retry,
            };
            Ok(Some((
                Claim {
                    session_id: r.get(0),
                    run_id: r.get(1),
                    queue: r.get(2),
                    reason: r.get(3),
                    cursor: u64::try_from(r.get::<_, i64>(4)).unwrap_or(0),
                    attempt: u32::try_from(r.get::<_, i32>(5)).unwrap_or(0) + 1,
                    max_attempts: u32::try_from(r.get::<_, i32>(6)).unwrap_or(1),
                    on_lost,
                    stop_requested: r.get(8),
                    lease: RuntimeLease {
                        lease_id: r.get(9),
                        expires_at: r.get(10),
                    },
                },
                r.get(11),
            )))
        })
        .await
    }

    /// Renews a live runtime lease for `ttl` more; reports whether its run
    /// was asked to stop. A lease that lapsed or was released is
    /// [`JournalError::RuntimeLeaseNotCurrent`].
    pub async fn renew_runtime_lease(
        &self,
        tenant: &TenantId,
        lease_id: &str,
        ttl: Duration,
    ) -> Result<LeaseStanding, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    "update run_work set lease_expires_at = now() + make_interval(secs => $3) \
                     where tenant_id = $1 and lease_id = $2 and state = 'claimed' \
                       and lease_expires_at > now() \
                     returning root_run_id, session_id, rfc3339(lease_expires_at), stop_requested",
                    &[&tenant.as_str(), &lease_id, &seconds(ttl)],
                )
                .await?;
            match row {
                Some(row) => Ok(LeaseStanding::of(&row, false)),
                None => ended_under(c, tenant, lease_id).await,
            }
        })
        .await
    }

    /// A live lease's standing, without renewing it.
    pub async fn runtime_lease(
        &self,
        tenant: &TenantId,
        lease_id: &str,
    ) -> Result<LeaseStanding, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    "select root_run_id, session_id, rfc3339(lease_expires_at), stop_requested \
                     from run_work where tenant_id = $1 and lease_id = $2 and state = 'claimed' \
                       and lease_expires_at > now()",
                    &[&tenant.as_str(), &lease_id],
                )
                .await?;
            match row {
                Some(row) => Ok(LeaseStanding::of(&row, false)),
                None => ended_under(c, tenant, lease_id).await,
            }
        })
        .await
    }

    /// Gives a run back. `handled_through` is the last sessionSequence
    /// through which the runtime read or wrote every event of the run's
    /// journal, required while the run goes on: should its journal hold a
    /// later event, the run is queued again at once; otherwise it waits
    /// idle until its journal moves. Releasing a run that ended is
    /// [`Released::Ended`].
    pub async fn release_run(
        &self,
        tenant: &TenantId,
        lease_id: &str,
        handled_through: Option<u64>,
    ) -> Result<Released, JournalError> {
        let client = self.pool.get().await?;
        let t = tenant.as_str();
        in_tenant(client, tenant, async |c| {
            let item = c
                .query_opt(
                    "select session_id, root_run_id from run_work \
                     where tenant_id = $1 and lease_id = $2",
                    &[&t, &lease_id],
                )
                .await?
                .ok_or_else(|| lease_not_current(lease_id))?;
            let (session, root): (String, String) = (item.get(0), item.get(1));
            // The session lock orders the release against appends: an
            // event committed before it is seen below, one after it finds
            // the item idle and wakes it.
            let sequence: i64 = c
                .query_one(
                    "select session_sequence from sessions \
                     where tenant_id = $1 and session_id = $2 for update",
                    &[&t, &session],
                )
                .await?
                .get(0);
            let state: Option<String> = c
                .query_opt(
                    "select state from run_work where tenant_id = $1 and session_id = $2 \
                     and root_run_id = $3 and lease_id = $4",
                    &[&t, &session, &root, &lease_id],
                )
                .await?
                .map(|r| r.get(0));
            match state.as_deref() {
                Some("done") => return Ok(Released::Ended),
                Some("claimed") => {}
                _ => return Err(lease_not_current(lease_id)),
            }
            let Some(through) = handled_through else {
                return Err(JournalError::InvalidBody {
                    pointer: "/handledThrough",
                    message: format!(
                        "required while run {root} goes on: the last sessionSequence through \
                         which the runtime read or wrote every event of the run's journal"
                    ),
                });
            };
            let through = i64::try_from(through).unwrap_or(i64::MAX).min(sequence);
            // Events after `through`: of the run's journal, or of its
            // workflow (workflow-scoped events carry no run position).
            let row = c
                .query_opt(
                    "update run_work w set lease_id = null, runtime_id = null, \
                       lease_expires_at = null, changed_at = now(), cursor = $4, \
                       state = case when exists (select 1 from events e where e.tenant_id = $1 \
                         and e.session_id = w.session_id and e.session_sequence > $4 \
                         and (e.root_run_id = w.root_run_id or (e.root_run_id is null \
                           and e.workflow_id = (select r.state ->> 'workflowId' from entities r \
                             where r.tenant_id = $1 and r.session_id = w.session_id \
                               and r.kind = 'run' and r.id = w.root_run_id)))) \
                         then 'ready' else 'idle' end, \
                       reason = 'event', ready_at = now() \
                     where tenant_id = $1 and session_id = $2 and root_run_id = $3 \
                       and lease_id = $5 and state = 'claimed' and lease_expires_at > now() \
                     returning state",
                    &[&t, &session, &root, &through, &lease_id],
                )
                .await?
                .ok_or_else(|| lease_not_current(lease_id))?;
            Ok(if row.get::<_, &str>(0) == "ready" {
                Released::Ready
            } else {
                Released::Idle
            })
        })
        .await
    }

    /// Serves a stop of run journal `root` that no runtime holds: closes
    /// the journal with `run.cancelled`. Whether it did.
    ///
    /// A stop a sweep has already taken is finished here too (closing is
    /// safe to repeat), so the journal is closed when the command answers
    /// whichever of the two took the item first.
    pub async fn stop_unheld(
        &self,
        tenant: &TenantId,
        session: &str,
        root: &str,
    ) -> Result<bool, JournalError> {
        let taken = self
            .take_for_closing(
                tenant,
                "update run_work set state = 'closing', reason = 'stopped', changed_at = now() \
                 where tenant_id = $1 and session_id = $2 and root_run_id = $3 \
                   and ((stop_requested and state in ('ready', 'idle')) \
                     or (state = 'closing' and reason = 'stopped')) returning reason",
                &[&session, &root],
            )
            .await?;
        if taken.is_none() {
            return Ok(false);
        }
        Ok(self.finish_closing(tenant, session, root).await? == Repair::Closed)
    }

    /// Repairs the run of a lapsed lease (see the module doc).
    pub async fn repair_lapsed(
        &self,
        tenant: &TenantId,
        session: &str,
        root: &str,
        lease_id: &str,
    ) -> Result<Repair, JournalError> {
        let taken = self
            .take_for_closing(
                tenant,
                "update run_work set state = 'closing', lease_id = null, runtime_id = null, \
                   lease_expires_at = null, changed_at = now(), lost = lost + 1, \
                   reason = case when stop_requested then 'stopped' \
                     when on_lost = 'retry' and lost + 1 < max_attempts then 'retrying' \
                     else 'lost' end \
                 where tenant_id = $1 and session_id = $2 and root_run_id = $3 \
                   and lease_id = $4 and state = 'claimed' and lease_expires_at <= now() \
                 returning reason",
                &[&session, &root, &lease_id],
            )
            .await?;
        if taken.is_none() {
            return Ok(Repair::Nothing);
        }
        self.finish_closing(tenant, session, root).await
    }

    /// Marks an item `closing` with `sql` (parameters after the tenant);
    /// the reason it is closed for, if it was taken.
    async fn take_for_closing(
        &self,
        tenant: &TenantId,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<String>, JournalError> {
        let client = self.pool.get().await?;
        let t = tenant.as_str();
        let mut all: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&t];
        all.extend_from_slice(params);
        in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(sql, &all).await?.map(|r| r.get(0)))
        })
        .await
    }

    /// Completes a `closing` item as its reason says: `retrying` cancels
    /// the lost holder's backend calls and queues the run again; `lost`
    /// and `stopped` close the journal. Safe to repeat: every step reads
    /// the journal as it is now.
    pub async fn finish_closing(
        &self,
        tenant: &TenantId,
        session: &str,
        root: &str,
    ) -> Result<Repair, JournalError> {
        let client = self.pool.get().await?;
        let t = tenant.as_str();
        let reason: Option<String> = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "update run_work set changed_at = now() where tenant_id = $1 and session_id = $2 \
                 and root_run_id = $3 and state = 'closing' returning reason",
                &[&t, &session, &root],
            )
            .await?
            .map(|r| r.get(0)))
        })
        .await?;
        let Some(reason) = reason else {
            return Ok(Repair::Nothing);
        };
        let session_id = SessionId::new(session).map_err(JournalError::Corrupt)?;
        let root_id = RunId::new(root).map_err(JournalError::Corrupt)?;
        let closing = match reason.as_str() {
            "stopped" => Closing::Cancelled {
                code: STOPPED_UNHELD.to_owned(),
                message: "the run was stopped while no runtime held it".to_owned(),
            },
            _ => Closing::Error {
                code: RUNTIME_LOST.to_owned(),
                message: "the agent runtime running this run was lost".to_owned(),
            },
        };
        // A few tries: a concurrent append (an executor's finish, a
        // resolution) may change the journal between the read and the
        // append, and the engine then refuses the batch as a whole.
        let mut last = None;
        for _ in 0..5 {
            let state = self.journal_state(tenant, &session_id, &root_id).await?;
            let events = if reason == "retrying" {
                repair::cancel_backend_calls(&state, &root_id, &closing)
            } else {
                repair::close_journal(&state, &root_id, &closing)
            };
            if !events.is_empty() {
                let closing = AppendOptions {
                    fence: crate::Fence::Closing,
                    ..AppendOptions::default()
                };
                match self.append(tenant, &session_id, &events, closing).await {
                    Ok(_) => {}
                    Err(e @ JournalError::RuntimeLeaseNotCurrent(_)) => {
                        tracing::info!(tenant = %tenant, session, root, "{e}");
                        return Ok(Repair::Nothing);
                    }
                    Err(e @ JournalError::Rejected { .. }) => {
                        tracing::warn!(tenant = %tenant, session, root, "repair refused, retrying: {e}");
                        last = Some(e);
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            // The label comes from a closed set, never from the row as is.
            let label = match reason.as_str() {
                "retrying" => "retrying",
                "lost" => "lost",
                "stopped" => "stopped",
                _ => "other",
            };
            metrics::counter!("narad_runtime_repairs_total", "reason" => label).increment(1);
            let client = self.pool.get().await?;
            return in_tenant(client, tenant, async |c| {
                if reason == "retrying" {
                    c.execute(
                        "update run_work set state = 'ready', reason = 'retry', ready_at = now(), \
                           changed_at = now() \
                         where tenant_id = $1 and session_id = $2 and root_run_id = $3 \
                           and state = 'closing'",
                        &[&t, &session, &root],
                    )
                    .await?;
                    Ok(Repair::Retried)
                } else {
                    // The root's terminal marked it done; a journal that
                    // had ended before is marked here.
                    c.execute(
                        "update run_work set state = 'done', changed_at = now() \
                         where tenant_id = $1 and session_id = $2 and root_run_id = $3 \
                           and state = 'closing'",
                        &[&t, &session, &root],
                    )
                    .await?;
                    Ok(Repair::Closed)
                }
            })
            .await;
        }
        Err(last.expect("a refusal was recorded"))
    }

    /// The engine's state of one run journal: its runs (open ones, and the
    /// root), its ordering state, its workflow, and the open interrupts and
    /// tool calls of its open runs.
    async fn journal_state(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        root: &RunId,
    ) -> Result<SessionState, JournalError> {
        let client = self.pool.get().await?;
        let (t, s, r) = (tenant.as_str(), session.as_str(), root.as_str());
        let rows = in_tenant(client, tenant, async |c| {
            let mut rows = c
                .query(
                    "select kind, id, state from entities where tenant_id = $1 and session_id = $2 \
                     and ((kind = 'run' and root_run_id = $3 and (open or id = $3)) \
                       or (kind = 'run_journal' and id = $3) \
                       or (kind = 'workflow' and id = (select r.state ->> 'workflowId' \
                         from entities r where r.tenant_id = $1 and r.session_id = $2 \
                           and r.kind = 'run' and r.id = $3)))",
                    &[&t, &s, &r],
                )
                .await?;
            let mut wanted_kinds = Vec::new();
            let mut wanted_ids = Vec::new();
            for row in &rows {
                if row.get::<_, &str>(0) != "run" {
                    continue;
                }
                let state: Value = row.get(2);
                for call in state["openToolCalls"].as_array().into_iter().flatten() {
                    wanted_kinds.push("tool_call");
                    wanted_ids.push(call.as_str().unwrap_or_default().to_owned());
                }
                for interrupt in state["openInterrupts"].as_object().into_iter().flatten() {
                    wanted_kinds.push("interrupt");
                    wanted_ids.push(interrupt.0.clone());
                }
            }
            if !wanted_ids.is_empty() {
                rows.extend(
                    c.query(
                        "select e.kind, e.id, e.state from entities e \
                         join unnest($3::text[], $4::text[]) as w(kind, id) \
                           on e.kind = w.kind and e.id = w.id \
                         where e.tenant_id = $1 and e.session_id = $2",
                        &[&t, &s, &wanted_kinds, &wanted_ids],
                    )
                    .await?,
                );
            }
            Ok(rows)
        })
        .await?;
        let mut state = SessionState::new();
        for row in rows {
            let (kind, id): (&str, &str) = (row.get(0), row.get(1));
            let key = EntityKey::from_parts(kind, id)
                .ok_or_else(|| JournalError::Corrupt(format!("entity kind {kind}")))?;
            state
                .load_entity(key, row.get(2))
                .map_err(|e| JournalError::Corrupt(format!("entity {kind} {id}: {e}")))?;
        }
        Ok(state)
    }

    /// What the runtime sweeper has to do now, across tenants: up to
    /// `max` items of each kind. A `closing` item untouched for `stall` is
    /// due again.
    pub async fn runtime_work(
        &self,
        stall: Duration,
        max: i32,
    ) -> Result<Vec<RuntimeDue>, JournalError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "select kind, tenant_id, session_id, root_run_id, lease_id from runtime_work($1, $2)",
                &[&seconds(stall), &max],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(RuntimeDue {
                    kind: r.get(0),
                    tenant: TenantId::new(r.get::<_, String>(1)).map_err(JournalError::Corrupt)?,
                    session_id: r.get(2),
                    root_run_id: r.get(3),
                    lease_id: r.get(4),
                })
            })
            .collect()
    }

    /// Top-level runs asked to stop that nothing drives, across tenants (up
    /// to `max`): no runtime's work item holds them, and their journal has
    /// taken no event for `grace`. Each is due as kind `undriven`.
    pub async fn undriven_stops(
        &self,
        grace: Duration,
        max: i32,
    ) -> Result<Vec<RuntimeDue>, JournalError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "select tenant_id, session_id, root_run_id from undriven_stops($1, $2)",
                &[&seconds(grace), &max],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(RuntimeDue {
                    kind: "undriven".to_owned(),
                    tenant: TenantId::new(r.get::<_, String>(0)).map_err(JournalError::Corrupt)?,
                    session_id: r.get(1),
                    root_run_id: r.get(2),
                    lease_id: None,
                })
            })
            .collect()
    }

    /// Closes run journal `root`, asked to stop and driven by nothing (see
    /// [`Journal::undriven_stops`]): its open work is closed and the run
    /// ends with `run.cancelled` ([`STOP_UNANSWERED`]), written by the
    /// server. Nothing is written when the journal took an event within
    /// `grace`, or when anything is appended to the session meanwhile (a
    /// backend that answers the stop wins).
    pub async fn close_undriven(
        &self,
        tenant: &TenantId,
        session: &str,
        root: &str,
        grace: Duration,
    ) -> Result<Repair, JournalError> {
        let session_id = SessionId::new(session).map_err(JournalError::Corrupt)?;
        let root_id = RunId::new(root).map_err(JournalError::Corrupt)?;
        let at = self.session(tenant, session).await?.session_sequence;
        let client = self.pool.get().await?;
        let t = tenant.as_str();
        let silent: bool = in_tenant(client, tenant, async |c| {
            Ok(c.query_one(
                "select coalesce(max(recorded_at) < now() - $4 * interval '1 second', false) \
                 from events where tenant_id = $1 and session_id = $2 and root_run_id = $3",
                &[&t, &session, &root, &seconds(grace)],
            )
            .await?
            .get(0))
        })
        .await?;
        if !silent {
            return Ok(Repair::Nothing);
        }
        let state = self.journal_state(tenant, &session_id, &root_id).await?;
        let closing = Closing::Cancelled {
            code: STOP_UNANSWERED.to_owned(),
            message: format!(
                "the run was asked to stop and nothing drove it for {} s after; the server \
                 closed it",
                grace.as_secs()
            ),
        };
        let events = repair::close_journal(&state, &root_id, &closing);
        if events.is_empty() {
            return Ok(Repair::Nothing);
        }
        let options = AppendOptions {
            expected_session_sequence: Some(at),
            ..AppendOptions::default()
        };
        match self.append(tenant, &session_id, &events, options).await {
            Ok(_) => {
                metrics::counter!("narad_runtime_repairs_total", "reason" => "undriven")
                    .increment(1);
                Ok(Repair::Closed)
            }
            // The journal moved (a backend answered the stop, or anything
            // else was appended): the next sweep looks again.
            Err(JournalError::SequenceMismatch { .. } | JournalError::Rejected { .. }) => {
                Ok(Repair::Nothing)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes up to `max` items whose run ended more than `older_than`
    /// ago; the number deleted.
    pub async fn forget_run_work(
        &self,
        older_than: Duration,
        max: i32,
    ) -> Result<i64, JournalError> {
        self.forget("select run_work_forget($1, $2)", older_than, max)
            .await
    }

    /// Items by state, over every tenant and queue (ended ones left out).
    pub async fn queue_depth(&self) -> Result<Vec<QueueDepth>, JournalError> {
        let client = self.pool.get().await?;
        Ok(client
            .query(
                "select state, sum(items)::bigint from runtime_queue_depth() group by state",
                &[],
            )
            .await?
            .iter()
            .map(|r| QueueDepth {
                state: r.get(0),
                items: r.get(1),
            })
            .collect())
    }

    /// Runs `body` if this process holds the runtime sweeper's advisory
    /// lock (one replica at a time); `None` when another holds it.
    pub async fn as_runtime_sweeper<T>(
        &self,
        body: impl AsyncFnOnce() -> T,
    ) -> Result<Option<T>, JournalError> {
        self.with_advisory_lock(RUNTIME_SWEEPER_LOCK, body).await
    }
}
