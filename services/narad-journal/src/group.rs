//! One append transaction for a group of append requests, possibly of many
//! sessions and tenants.
//!
//! Two pipelined round trips, whatever the group's size: (1) `BEGIN`, then
//! per tenant the tenant setting, the session rows locked in a fixed order,
//! the entities the requests can touch and the eventId lookup; (2) per
//! tenant one statement writing events, outbox rows, changed entities and
//! session cores, then `COMMIT`. Between them the rule engine decides each
//! request alone, on its session's state as the requests before it in the
//! group left it: a refused request leaves that state as it found it and
//! writes nothing, and never fails another.
//!
//! Rare steps add a round trip inside the transaction: a workflow whose
//! cancellation waited for it to go idle, and a queued start taking a freed
//! slot.
//!
//! A group whose sessions this process appended to last, and whose requests
//! touch only what it read of them then, takes one round trip instead
//! ([`one_trip`]): decided on what the process knows
//! ([`known`](crate::known)), and written behind a guard that finds that
//! knowledge current.

use std::collections::{BTreeMap, BTreeSet};

use deadpool_postgres::Client;
use narad_protocol::authority::Executor;
use narad_protocol::engine::{
    EntityKey, SessionCore, SessionState, Status, WorkflowState, referenced_keys,
};
use narad_protocol::envelope::WorkflowPosition;
use narad_protocol::primitives::{Sequence, SessionId};
use narad_protocol::wire::AuthorityBody;
use serde_json::{Value, json};
use tokio_postgres::Row;

use crate::append::{AppendOptions, Appended, AppendedEvent, Fence, Prepared, prepare};
use crate::executors::EXECUTOR_UNAVAILABLE;
use crate::known::{Known, KnownSessions};
use crate::runtime::WorkOrder;
use crate::{BEGIN_SCOPED, JournalError, TenantId, scope as scope_sql};

mod distributed;
mod one_trip;

/// One caller's append: a prepared batch for one session.
#[derive(Debug)]
pub(crate) struct Request {
    /// The tenant.
    pub tenant: TenantId,
    /// The session.
    pub session: SessionId,
    /// The batch, in order.
    pub prepared: Vec<Prepared>,
    /// The caller's options.
    pub options: AppendOptions,
}

/// What became of one request of a committed group.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Decided: appended, an idempotent retry, or refused.
    Done(Result<Appended, JournalError>),
    /// Its session's row was locked by another transaction (with
    /// [`Locking::Skip`]); the request was not attempted.
    Locked,
}

/// How a group takes its session locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locking {
    /// Wait for each lock (in a fixed order, so that groups never deadlock).
    Wait,
    /// Skip sessions locked by another transaction: their requests come
    /// back [`Outcome::Locked`], so that one busy session never holds up
    /// the others.
    Skip,
}

/// Around the eventId lookup of round trip 1: plans that find rows by key
/// only. `events` grows by every event, and a prepared statement keeps the
/// plan made when it was nearly empty (reading the whole table is cheapest
/// then) until its next `ANALYZE`: at one writer that plan's lookup took
/// 370 µs per append after 8 s, 8.5 µs as an index lookup (BENCHMARKS.md).
/// Only this lookup is pinned: pinning the whole group's plans also priced
/// out the hashed joins over a few sessions' entities and cost 10% of
/// Postgres's time at 32 writers. Its plan is also made once (a generic
/// plan): left to choose, Postgres planned it anew for every group (116 µs
/// of a lone append's Postgres time).
const KEY_LOOKUPS: &str = "set local enable_seqscan = off; set local enable_bitmapscan = off; \
    set local plan_cache_mode = force_generic_plan";
/// [`KEY_LOOKUPS`] on a distributed database: a Citus coordinator cannot
/// make a generic plan of the lookup (a `union all` over two tables whose
/// shard is known only from its parameters), so it is planned each time;
/// the key-only settings go with the transaction to the worker.
const KEY_LOOKUPS_DISTRIBUTED: &str =
    "set local enable_seqscan = off; set local enable_bitmapscan = off";
/// Ends [`KEY_LOOKUPS`] for the rest of the transaction.
const ANY_PLANS: &str = "reset enable_seqscan; reset enable_bitmapscan; reset plan_cache_mode";

/// The sessions locked, with the row version read (`xmin`) and the
/// transaction's id (the version its write makes): what the process then
/// knows of them ([`known`](crate::known)).
const LOCK_WAIT: &str = "select session_id, core, session_sequence, xmin::text, \
    pg_current_xact_id()::text from sessions \
    where tenant_id = $1 and session_id = any($2::text[]) order by session_id for update";

const LOCK_SKIP: &str = "select session_id, core, session_sequence, xmin::text, \
    pg_current_xact_id()::text from sessions \
    where tenant_id = $1 and session_id = any($2::text[]) order by session_id for update skip locked";

/// The one-round-trip append's guard (migration `append_guard`): raises
/// [`GUARD_FAILED`] unless every session row is the version known, no
/// eventId is taken and no runtime holds a fenced run journal; returns the
/// transaction's id as an `xmin`.
const GUARD: &str =
    "select append_guard($1, $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])";

/// The SQLSTATE of a failed guard.
const GUARD_FAILED: &str = "NR001";

/// Loads the entities the requests can touch: those their events name, the
/// open runs of the run journals they name, and the workflows of those runs.
const LOAD_ENTITIES: &str = "
with wanted as (select * from unnest($2::text[], $3::text[], $4::text[]) as w(session_id, kind, id)),
direct as (
  select e.session_id, e.kind, e.id, e.state from entities e join wanted w
    on e.session_id = w.session_id and e.kind = w.kind and e.id = w.id
  where e.tenant_id = $1
),
roots as (select * from unnest($5::text[], $6::text[]) as r(session_id, root_run_id)),
open_runs as (
  select e.session_id, e.kind, e.id, e.state from entities e join roots r
    on e.session_id = r.session_id and e.root_run_id = r.root_run_id
  where e.tenant_id = $1 and e.kind = 'run' and e.open
),
runs as (select * from direct where kind = 'run' union all select * from open_runs),
run_workflows as (
  select distinct session_id, state ->> 'workflowId' as id from runs where state ? 'workflowId'
),
their_workflows as (
  select e.session_id, e.kind, e.id, e.state from entities e join run_workflows w
    on e.session_id = w.session_id and e.id = w.id
  where e.tenant_id = $1 and e.kind = 'workflow'
)
select session_id, kind, id, state from direct
union select session_id, kind, id, state from open_runs
union select session_id, kind, id, state from their_workflows";

/// The batch's eventIds already taken: stored, or of an erased session
/// (a row no retry matches: an erased session's ids stay refused).
const FIND_EVENT_IDS: &str = "select event_id, session_id, session_sequence, run_sequence, \
    workflow_sequence, proposal_sha256 from events where tenant_id = $1 and event_id = any($2::text[]) \
    union all select event_id, '', 0, null, null, '\\x'::bytea from erased_event_ids \
    where tenant_id = $1 and event_id = any($2::text[])";

/// Takes the first queued start of a session out of the queue, with the
/// entities its run.started names (the run and its journal, should they
/// exist, and its workflow).
const TAKE_QUEUE_HEAD: &str = "
with head as (
  select queue_id, proposal, work from queued_starts
  where tenant_id = $1 and session_id = $2 order by priority, position limit 1
), taken as (
  delete from queued_starts q using head
  where q.tenant_id = $1 and q.session_id = $2 and q.queue_id = head.queue_id
)
select head.queue_id, head.proposal,
  (select coalesce(jsonb_agg(jsonb_build_array(e.kind, e.id, e.state)), '[]') from entities e
   where e.tenant_id = $1 and e.session_id = $2
     and ((e.kind in ('run', 'run_journal') and e.id = head.proposal ->> 'runId')
       or (e.kind = 'workflow' and e.id = head.proposal ->> 'workflowId'))),
  head.work
from head";

/// The work items of the run journals a backend's batches touch, locked
/// against a lease change until the transaction ends (the fence).
const LOAD_WORK: &str = "select w.session_id, w.root_run_id, w.state, w.lease_id, \
    w.lease_expires_at > clock_timestamp(), w.workflow_id from run_work w \
    join (select * from unnest($2::text[], $3::text[]) \
          union \
          select x.session_id, x.root_run_id from run_work x \
          join unnest($4::text[], $5::text[]) as f(session_id, workflow_id) \
            on x.tenant_id = $1 and x.session_id = f.session_id \
           and x.workflow_id = f.workflow_id) as r(session_id, root_run_id) \
      on w.session_id = r.session_id and w.root_run_id = r.root_run_id \
    where w.tenant_id = $1 for share of w";

/// Takes the pending cancellations of the workflows named.
const TAKE_CANCELLATIONS: &str = "delete from pending_cancellations \
    where tenant_id = $1 and session_id = $2 and workflow_id = any($3::text[]) \
    returning workflow_id, reason";

/// Round trip 2, per tenant, in one statement: the events, their outbox
/// rows, the changed entities, the delivery state of client tool calls
/// (started, closed) and of runs paused for an absent executor (paused,
/// resumed), the work queue of agent runtimes (runs queued, journals that
/// an event wakes or asks to stop, runs ended), and the sessions' cores.
/// The inserts of [`WRITE`] (`select … from unnest(…)` of array parameters).
const WRITE_INSERTS: &str = "
inserted as (
  insert into events (tenant_id, session_id, session_sequence, event_id, type, root_run_id, run_id,
                      run_sequence, workflow_id, workflow_sequence, body, proposal_sha256)
  select $1, * from unnest($2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                           $8::bigint[], $9::text[], $10::bigint[], $11::jsonb[], $12::bytea[])
  returning session_id, session_sequence, event_id
),
outboxed as (
  insert into outbox (tenant_id, session_id, session_sequence, event_id)
  select $1, session_id, session_sequence, event_id from inserted
),
upserted as (
  insert into entities (tenant_id, session_id, kind, id, state)
  select $1, * from unnest($13::text[], $14::text[], $15::text[], $16::jsonb[])
  on conflict (tenant_id, session_id, kind, id) do update set state = excluded.state
),
client_started as (
  insert into client_calls (tenant_id, session_id, tool_call_id, root_run_id, run_id, executor_id,
                            tool_name, args, closed)
  select $1, * from unnest($20::text[], $21::text[], $22::text[], $23::text[], $24::text[],
                           $25::text[], $26::jsonb[], $27::bool[])
),
executor_paused as (
  insert into executor_pauses (tenant_id, session_id, run_id, root_run_id, executor_id, wait_id)
  select $1, * from unnest($30::text[], $31::text[], $32::text[], $33::text[], $34::text[])
  on conflict (tenant_id, session_id, run_id) do update
    set wait_id = excluded.wait_id, executor_id = excluded.executor_id, paused_at = excluded.paused_at
),
work_added as (
  insert into run_work (tenant_id, session_id, root_run_id, queue, state, reason, on_lost,
                        max_attempts, cursor, stop_requested, workflow_id)
  select $1, a.session_id, a.root_run_id, a.queue, 'ready', 'started', a.on_lost, a.max_attempts,
         a.cursor, a.stop, a.workflow_id
  from unnest($37::text[], $38::text[], $39::text[], $40::text[], $41::int[], $42::bigint[],
              $48::bool[], $49::text[])
    as a(session_id, root_run_id, queue, on_lost, max_attempts, cursor, stop, workflow_id)
  on conflict do nothing
)";

/// The updates and deletes of a group's write, as common table
/// expressions (the same on one Postgres and on a distributed database).
const WRITE_CHANGES: &str = "
client_closed as (
  update client_calls c set closed = true
  from unnest($28::text[], $29::text[]) as f(session_id, tool_call_id)
  where c.tenant_id = $1 and c.session_id = f.session_id and c.tool_call_id = f.tool_call_id
),
executor_resumed as (
  delete from executor_pauses p
  using unnest($35::text[], $36::text[]) as r(session_id, run_id)
  where p.tenant_id = $1 and p.session_id = r.session_id and p.run_id = r.run_id
),
work_woken as (
  update run_work w set
    stop_requested = w.stop_requested or t.stop,
    state = 'ready', reason = 'event', ready_at = now(), changed_at = now()
  from unnest($43::text[], $44::text[], $45::bool[]) as t(session_id, root_run_id, stop)
  where w.tenant_id = $1 and w.session_id = t.session_id and w.root_run_id = t.root_run_id
    and w.state = 'idle'
),
work_stopped as (
  update run_work w set stop_requested = true, changed_at = now()
  from unnest($43::text[], $44::text[], $45::bool[]) as t(session_id, root_run_id, stop)
  where w.tenant_id = $1 and w.session_id = t.session_id and w.root_run_id = t.root_run_id
    and w.state <> 'idle' and t.stop and not w.stop_requested
),
work_done as (
  update run_work w set state = 'done', changed_at = now()
  from unnest($46::text[], $47::text[]) as d(session_id, root_run_id)
  where w.tenant_id = $1 and w.session_id = d.session_id and w.root_run_id = d.root_run_id
)";

/// The last statement of a group's write: the sessions' sequences and cores.
const WRITE_SESSIONS: &str = "
update sessions s set session_sequence = u.last, core = u.core
from unnest($17::text[], $18::bigint[], $19::jsonb[]) as u(session_id, last, core)
where s.tenant_id = $1 and s.session_id = u.session_id";

/// A group's write for one tenant, one statement: [`WRITE_INSERTS`],
/// [`WRITE_CHANGES`], [`WRITE_SESSIONS`].
static WRITE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("with {WRITE_INSERTS},{WRITE_CHANGES}{WRITE_SESSIONS}"));

/// Ends a group's transaction with a NOTIFY of the relays: how appends
/// would wake relays if the notification were part of the transaction
/// (measured against one NOTIFY per burst after commits; BENCHMARKS.md).
pub(crate) const NOTIFY_AND_COMMIT: &str = "notify narad_outbox; commit";

/// A statement parameter.
type Param<'a> = dyn tokio_postgres::types::ToSql + Sync + 'a;

/// What round trip 1 read for one tenant.
struct TenantRead {
    locked: Vec<Row>,
    entities: Vec<Row>,
    existing: Vec<Row>,
    work: Vec<Row>,
}

/// Runs `requests` as one transaction and commits it. An `Err` means the
/// transaction as a whole failed and nothing of it was written (it was
/// rolled back); with more than one request the caller retries each alone.
///
/// A group that skips locked sessions ([`Locking::Skip`]) whose sessions
/// this process knows is first tried in one round trip
/// ([`one_trip`]); when that cannot decide or its guard fails, it runs the
/// two-round-trip way.
pub(crate) async fn write(
    client: &Client,
    requests: &mut [Request],
    locking: Locking,
    commit: &str,
    known: &KnownSessions,
    distributed: bool,
) -> Result<Vec<Outcome>, JournalError> {
    if locking == Locking::Skip
        && let Some(outcomes) = one_trip::write(client, requests, commit, known).await
    {
        return Ok(outcomes);
    }
    let result = run(client, requests, locking, commit, known, distributed).await;
    if result.is_err() {
        // The transaction may be open or already ended; either way the
        // connection goes back to the pool outside one.
        let _ = client.batch_execute("rollback").await;
    }
    result
}

async fn run(
    client: &Client,
    requests: &mut [Request],
    locking: Locking,
    commit: &str,
    known: &KnownSessions,
    distributed: bool,
) -> Result<Vec<Outcome>, JournalError> {
    let (lock, load, find, write) = futures::try_join!(
        client.prepare_cached(match locking {
            Locking::Wait => LOCK_WAIT,
            Locking::Skip => LOCK_SKIP,
        }),
        client.prepare_cached(LOAD_ENTITIES),
        client.prepare_cached(FIND_EVENT_IDS),
        client.prepare_cached(&WRITE),
    )?;
    let fenced = requests.iter().any(|r| r.options.fence != Fence::Server);
    let load_work = if fenced {
        Some(client.prepare_cached(LOAD_WORK).await?)
    } else {
        None
    };

    // Requests in lock order: by tenant, then session, then arrival.
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| {
        (&requests[a].tenant, &requests[a].session, a).cmp(&(
            &requests[b].tenant,
            &requests[b].session,
            b,
        ))
    });
    let mut tenants: BTreeMap<TenantId, Vec<usize>> = BTreeMap::new();
    for &i in &order {
        tenants
            .entry(requests[i].tenant.clone())
            .or_default()
            .push(i);
    }

    // Round trip 1: begin, then per tenant scope, lock, read.
    let reads = tenants.iter().map(|(tenant, members)| {
        let lookup = Lookup::of(members.iter().map(|&i| &requests[i]));
        let tenant_fenced = members
            .iter()
            .any(|&i| requests[i].options.fence != Fence::Server);
        let load_work = load_work.as_ref().filter(|_| tenant_fenced);
        let (lock, load, find) = (&lock, &load, &find);
        let set = scope_sql(tenant);
        async move {
            let t = tenant.as_str();
            let lock_params: [&Param<'_>; 2] = [&t, &lookup.sessions];
            let load_params: [&Param<'_>; 6] = [
                &t,
                &lookup.want_sessions,
                &lookup.want_kinds,
                &lookup.want_ids,
                &lookup.root_sessions,
                &lookup.roots,
            ];
            let find_params: [&Param<'_>; 2] = [&t, &lookup.event_ids];
            let work_params: [&Param<'_>; 5] = [
                &t,
                &lookup.root_sessions,
                &lookup.roots,
                &lookup.workflow_sessions,
                &lookup.workflows,
            ];
            // Polled in order on their first poll, so sent in this order.
            let (_, locked, entities, _, existing, _, work) = futures::try_join!(
                client.batch_execute(&set),
                client.query(lock, &lock_params),
                client.query(load, &load_params),
                client.batch_execute(if distributed {
                    KEY_LOOKUPS_DISTRIBUTED
                } else {
                    KEY_LOOKUPS
                }),
                client.query(find, &find_params),
                client.batch_execute(ANY_PLANS),
                async {
                    match load_work {
                        Some(w) => client.query(w, &work_params).await,
                        None => Ok(Vec::new()),
                    }
                },
            )?;
            Ok::<_, tokio_postgres::Error>(TenantRead {
                locked,
                entities,
                existing,
                work,
            })
        }
    });
    let (_, reads) = futures::try_join!(
        client.batch_execute(BEGIN_SCOPED),
        futures::future::try_join_all(reads)
    )?;

    // The engine decides each request on its session's state.
    let mut outcomes: Vec<Option<Outcome>> = requests.iter().map(|_| None).collect();
    // Round trip 1 left the transaction scoped to its last tenant.
    let mut scoped: Option<TenantId> = tenants.keys().next_back().cloned();
    let mut writes: Vec<(TenantId, Vec<SessionWrite>)> = Vec::new();
    let mut knowns = Vec::new();
    for ((tenant, members), read) in tenants.iter().zip(reads) {
        let existing: BTreeMap<&str, &Row> = read
            .existing
            .iter()
            .map(|r| (r.get::<_, &str>(0), r))
            .collect();
        let mut entities: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
        for row in &read.entities {
            entities.entry(row.get(0)).or_default().push(row);
        }
        let locked: BTreeMap<&str, &Row> = read
            .locked
            .iter()
            .map(|r| (r.get::<_, &str>(0), r))
            .collect();
        let mut work: BTreeMap<&str, BTreeMap<String, Held>> = BTreeMap::new();
        for row in &read.work {
            work.entry(row.get(0))
                .or_default()
                .insert(row.get(1), Held::of(row));
        }
        let mut session_writes = Vec::new();
        let mut start = 0;
        while start < members.len() {
            let session = requests[members[start]].session.clone();
            let end = members[start..]
                .iter()
                .position(|&i| requests[i].session != session)
                .map_or(members.len(), |n| start + n);
            let group = &members[start..end];
            start = end;
            let Some(row) = locked.get(session.as_str()) else {
                for &i in group {
                    outcomes[i] = Some(match locking {
                        Locking::Skip => Outcome::Locked,
                        Locking::Wait => {
                            Outcome::Done(Err(JournalError::SessionNotFound(session.to_string())))
                        }
                    });
                }
                continue;
            };
            let mut session_state = SessionWork::load(
                session.clone(),
                row,
                entities.get(session.as_str()).map_or(&[][..], |v| &v[..]),
                work.remove(session.as_str()).unwrap_or_default(),
                coverage(group.iter().map(|&i| &requests[i])),
            )?;
            for &i in group {
                let request = &mut requests[i];
                let outcome = if request_ids_exist(request, &existing) {
                    duplicate(&request.prepared, session.as_str(), &existing)
                } else {
                    session_state
                        .decide(Some((client, tenant, &mut scoped)), request)
                        .await?
                        .expect("decided in a transaction")
                };
                outcomes[i] = Some(Outcome::Done(outcome));
            }
            let (write, now_known) = session_state.into_write();
            knowns.push(((tenant.clone(), session.clone()), now_known));
            if let Some(w) = write {
                session_writes.push(w);
            }
        }
        if !session_writes.is_empty() {
            writes.push((tenant.clone(), session_writes));
        }
    }

    // Round trip 2: per tenant scope and write, then commit.
    let single = requests.len() == 1;
    let first_needs_scope = writes.first().map(|(t, _)| t) != scoped.as_ref();
    // On a distributed database each tenant's write is shaped by its rows:
    // prepared here, before the pipeline (which must send every write
    // before the commit).
    let mut shaped = Vec::new();
    if distributed {
        for (_, sessions) in &writes {
            let text =
                distributed::write_statement(distributed::Shape::of(&WriteRows::of(sessions)));
            shaped.push(client.prepare_typed_cached(&text, write.params()).await?);
        }
    }
    let statements = writes.iter().enumerate().map(|(n, (tenant, sessions))| {
        let write = shaped.get(n).unwrap_or(&write);
        let rescope = n > 0 || first_needs_scope;
        async move {
            futures::try_join!(
                async {
                    if rescope {
                        client.batch_execute(&scope_sql(tenant)).await?;
                    }
                    Ok(())
                },
                write_sessions(client, write, tenant, sessions),
            )?;
            Ok::<_, tokio_postgres::Error>(())
        }
    });
    futures::try_join!(
        futures::future::try_join_all(statements),
        client.batch_execute(commit),
    )
    .map_err(|e| {
        if single {
            event_id_conflict(e, &requests[0].prepared)
        } else {
            JournalError::Database(e)
        }
    })?;
    known.remember(knowns);
    Ok(outcomes
        .into_iter()
        .map(|o| o.expect("every request has an outcome"))
        .collect())
}

/// Round trip 2's statement for one tenant: writes `sessions`.
async fn write_sessions(
    client: &Client,
    write: &tokio_postgres::Statement,
    tenant: &TenantId,
    sessions: &[SessionWrite],
) -> Result<u64, tokio_postgres::Error> {
    let t = tenant.as_str();
    let rows = WriteRows::of(sessions);
    let write_params: [&Param<'_>; 49] = [
        &t,
        &rows.session_id,
        &rows.session_sequence,
        &rows.event_id,
        &rows.type_name,
        &rows.root_run_id,
        &rows.run_id,
        &rows.run_sequence,
        &rows.workflow_id,
        &rows.workflow_sequence,
        &rows.body,
        &rows.sha256,
        &rows.entity_session,
        &rows.entity_kind,
        &rows.entity_id,
        &rows.entity_state,
        &rows.core_session,
        &rows.core_last,
        &rows.core,
        &rows.client.session,
        &rows.client.tool_call_id,
        &rows.client.root_run_id,
        &rows.client.run_id,
        &rows.client.executor_id,
        &rows.client.tool_name,
        &rows.client.args,
        &rows.client.closed,
        &rows.client.closed_session,
        &rows.client.closed_tool_call_id,
        &rows.client.paused_session,
        &rows.client.paused_run_id,
        &rows.client.paused_root_run_id,
        &rows.client.paused_executor_id,
        &rows.client.paused_wait_id,
        &rows.client.resumed_session,
        &rows.client.resumed_run_id,
        &rows.work.added_session,
        &rows.work.added_root,
        &rows.work.added_queue,
        &rows.work.added_on_lost,
        &rows.work.added_max_attempts,
        &rows.work.added_cursor,
        &rows.work.touched_session,
        &rows.work.touched_root,
        &rows.work.touched_stop,
        &rows.work.done_session,
        &rows.work.done_root,
        &rows.work.added_stop,
        &rows.work.added_workflow,
    ];
    client.execute(write, &write_params).await
}

/// The keys round trip 1 reads for one tenant's requests.
struct Lookup {
    sessions: Vec<String>,
    /// The workflows of the requests' workflow-scoped events (the fence).
    workflow_sessions: Vec<String>,
    workflows: Vec<String>,
    want_sessions: Vec<String>,
    want_kinds: Vec<&'static str>,
    want_ids: Vec<String>,
    root_sessions: Vec<String>,
    roots: Vec<String>,
    event_ids: Vec<String>,
}

impl Lookup {
    fn of<'a>(requests: impl Iterator<Item = &'a Request>) -> Lookup {
        let mut sessions = BTreeSet::new();
        let mut keys = BTreeSet::new();
        let mut roots = BTreeSet::new();
        let mut event_ids = Vec::new();
        let mut workflows = BTreeSet::new();
        for r in requests {
            let s = r.session.as_str();
            sessions.insert(s.to_owned());
            for p in &r.prepared {
                if p.event.envelope.run.is_none()
                    && let Some(w) = &p.event.envelope.workflow
                {
                    workflows.insert((s.to_owned(), w.workflow_id.to_string()));
                }
                event_ids.push(p.event.envelope.event_id.to_string());
                for key in referenced_keys(&p.event) {
                    if let EntityKey::RunJournal(root) = &key {
                        roots.insert((s.to_owned(), root.as_str().to_owned()));
                    }
                    keys.insert((s.to_owned(), key));
                }
            }
        }
        let (want_sessions, rest): (Vec<_>, Vec<_>) = keys.into_iter().unzip();
        let (root_sessions, roots) = roots.into_iter().unzip();
        let (workflow_sessions, workflows) = workflows.into_iter().unzip();
        Lookup {
            sessions: sessions.into_iter().collect(),
            workflow_sessions,
            workflows,
            want_sessions,
            want_kinds: rest.iter().map(EntityKey::kind).collect(),
            want_ids: rest.iter().map(|k| k.id().to_owned()).collect(),
            root_sessions,
            roots,
            event_ids,
        }
    }
}

/// One session's state while its requests are decided, and what they
/// accepted.
struct SessionWork {
    session: SessionId,
    state: SessionState,
    /// The entities as stored, to write only those that changed.
    before: BTreeMap<EntityKey, Value>,
    /// The accepted events, in order.
    accepted: Vec<Prepared>,
    /// The work items of the run journals a backend's batches touch, by
    /// rootRunId (loaded only for fenced requests).
    held: BTreeMap<String, Held>,
    /// Top-level runs the accepted requests started for the work queue:
    /// rootRunId, order, cursor, workflow.
    queued: Vec<(String, WorkOrder, i64, Option<String>)>,
    /// What the state holds whole: the keys read (see [`coverage`]).
    keys: BTreeSet<EntityKey>,
    /// The session row's version as read, and the one this transaction's
    /// write makes.
    xmin: String,
    xact: String,
}

/// A run journal's work item as the fence sees it.
#[derive(Debug)]
struct Held {
    state: String,
    lease_id: Option<String>,
    live: bool,
    workflow_id: Option<String>,
}

impl Held {
    fn of(row: &Row) -> Held {
        Held {
            state: row.get(2),
            lease_id: row.get(3),
            live: row.get::<_, Option<bool>>(4).unwrap_or(false),
            workflow_id: row.get(5),
        }
    }
}

/// How a write touched one run journal.
#[derive(Debug, Default, Clone, Copy)]
struct Touched {
    /// An event asked the root run to stop.
    stop: bool,
    /// The root run ended.
    ended: bool,
}

/// What one session's accepted requests write.
struct SessionWrite {
    session: SessionId,
    events: Vec<Prepared>,
    changed: Vec<(EntityKey, Value)>,
    last: i64,
    core: Value,
    /// The client executor of every run that an accepted event names and
    /// that has one.
    client_executors: BTreeMap<String, String>,
    /// The tool calls finished by an accepted event whose executor is the
    /// client.
    client_calls: BTreeSet<String>,
    /// Runs queued for runtimes: rootRunId, order, cursor, workflow.
    queued: Vec<(String, WorkOrder, i64, Option<String>)>,
    /// Run journals the accepted events touched, by rootRunId.
    journals: BTreeMap<String, Touched>,
}

impl SessionWork {
    /// The session as round trip 1 read it: its locked row (session id,
    /// core, sequence, xmin, transaction id) and entities.
    fn load(
        session_id: SessionId,
        session: &Row,
        entities: &[&Row],
        held: BTreeMap<String, Held>,
        keys: BTreeSet<EntityKey>,
    ) -> Result<SessionWork, JournalError> {
        let mut stored = BTreeMap::new();
        for row in entities {
            let (kind, id): (&str, &str) = (row.get(1), row.get(2));
            let key = EntityKey::from_parts(kind, id)
                .ok_or_else(|| JournalError::Corrupt(format!("entity kind {kind}")))?;
            stored.insert(key, row.get::<_, Value>(3));
        }
        let known = Known {
            core: session.get(1),
            sequence: session.get(2),
            entities: stored,
            keys,
            xmin: session.get::<_, &str>(3).to_owned(),
        };
        let xact = session.get::<_, &str>(4).parse::<u64>().map_err(|e| {
            JournalError::Corrupt(format!("transaction id {}: {e}", session.get::<_, &str>(4)))
        })?;
        let mut work = SessionWork::known(session_id, known, held)?;
        // A row version's xmin is the low 32 bits of its writer's id.
        work.xact = (xact & 0xffff_ffff).to_string();
        Ok(work)
    }

    /// The session as this process knows it stored.
    fn known(
        session_id: SessionId,
        known: Known,
        held: BTreeMap<String, Held>,
    ) -> Result<SessionWork, JournalError> {
        let mut core: SessionCore = serde_json::from_value(known.core)
            .map_err(|e| JournalError::Corrupt(format!("session {session_id} core: {e}")))?;
        // The column is the authority on the session's sequence.
        core.session_sequence = known.sequence as u64;
        let mut state = SessionState::from_core(core);
        for (key, value) in &known.entities {
            state.load_entity(key.clone(), value.clone()).map_err(|e| {
                JournalError::Corrupt(format!("entity {} {}: {e}", key.kind(), key.id()))
            })?;
        }
        Ok(SessionWork {
            session: session_id,
            state,
            before: known.entities,
            accepted: Vec::new(),
            held,
            queued: Vec::new(),
            keys: known.keys,
            xact: known.xmin.clone(),
            xmin: known.xmin,
        })
    }

    /// Decides one request: `Ok(Some(Ok(_)))` accepted (its events join the
    /// session's write), `Ok(Some(Err(_)))` refused with the state
    /// unchanged; `Err` a database failure of the whole transaction.
    /// Without `db` (an open transaction to read in), `Ok(None)` when the
    /// request needs one: it let a workflow go idle (its pending
    /// cancellation is read) or freed the run slot (the queue is read).
    async fn decide(
        &mut self,
        db: Option<(&Client, &TenantId, &mut Option<TenantId>)>,
        request: &mut Request,
    ) -> Result<Option<Result<Appended, JournalError>>, JournalError> {
        if let Some(expected) = request.options.expected_session_sequence
            && expected != self.state.session_sequence
        {
            return Ok(Some(Err(JournalError::SequenceMismatch {
                expected,
                actual: self.state.session_sequence,
            })));
        }
        if let Err(e) = self.fence(request) {
            return Ok(Some(Err(e)));
        }
        let saved = self.state.clone();
        let mut slot_freed = false;
        let issuer = &request.options.issuer;
        for (index, p) in request.prepared.iter_mut().enumerate() {
            assign(&self.state, p);
            // The lifecycle rules, then who may write it, on the state the
            // event left (the tool call's executor, the interrupt's actions).
            let verdict = self.state.apply(&p.event).and_then(|applied| {
                self.state.check_issuer(&p.event, issuer)?;
                Ok(applied)
            });
            match verdict {
                Ok(applied) => slot_freed |= applied.slot_freed,
                Err(violation) => {
                    self.state = saved;
                    return Ok(Some(Err(JournalError::Rejected { index, violation })));
                }
            }
        }
        let mut extra = Vec::new();
        // A workflow asked to cancel that this batch left idle is cancelled
        // in this same transaction.
        let idle: Vec<String> = self
            .state
            .workflows
            .iter()
            .filter(|(id, w)| is_idle(w) && saved.workflows.get(*id).is_some_and(|b| !is_idle(b)))
            .map(|(id, _)| id.to_string())
            .collect();
        let needs_database = !idle.is_empty() || (slot_freed && self.state.slot.is_none());
        let Some((client, tenant, scoped)) = db.filter(|_| needs_database) else {
            if needs_database {
                self.state = saved;
                return Ok(None);
            }
            return Ok(Some(self.accept(request, Vec::new(), slot_freed, None)));
        };
        if !idle.is_empty() {
            let take = client.prepare_cached(TAKE_CANCELLATIONS).await?;
            scope(client, tenant, scoped).await?;
            let (t, s) = (tenant.as_str(), self.session.as_str());
            for row in client.query(&take, &[&t, &s, &idle]).await? {
                let (workflow_id, reason): (String, Option<String>) = (row.get(0), row.get(1));
                let proposal = crate::commands::cancelled_proposal(&workflow_id, reason.as_deref());
                let index = request.prepared.len() + extra.len();
                match prepare(index, &proposal, &self.session) {
                    Ok(mut p) => {
                        assign(&self.state, &mut p);
                        match self.state.apply(&p.event) {
                            Ok(a) => {
                                slot_freed |= a.slot_freed;
                                extra.push(p);
                            }
                            Err(v) => {
                                tracing::warn!(
                                    workflow_id,
                                    "a pending cancellation cannot apply: {v}"
                                )
                            }
                        }
                    }
                    Err(e) => tracing::warn!(workflow_id, "a pending cancellation is invalid: {e}"),
                }
            }
        }
        // The slot freed: the first queued start becomes run.started in
        // this same transaction.
        let mut dequeued = None;
        if slot_freed && self.state.slot.is_none() {
            let take = client.prepare_cached(TAKE_QUEUE_HEAD).await?;
            scope(client, tenant, scoped).await?;
            let (t, s) = (tenant.as_str(), self.session.as_str());
            if let Some(row) = client.query_opt(&take, &[&t, &s]).await? {
                let queue_id: String = row.get(0);
                let proposal: Value = row.get(1);
                self.load_more(row.get(2))?;
                let order = row.get::<_, Option<Value>>(3).and_then(|w| {
                    serde_json::from_value::<WorkOrder>(w)
                        .inspect_err(|e| {
                            tracing::error!(queue_id, "a queued start's runtime settings are unreadable; it starts without them: {e}")
                        })
                        .ok()
                });
                let index = request.prepared.len() + extra.len();
                match prepare(index, &proposal, &self.session) {
                    Ok(mut p) => {
                        assign(&self.state, &mut p);
                        match self.state.apply(&p.event) {
                            Ok(_) => {
                                if let Some(order) = order {
                                    self.queue_started(&p, &order);
                                }
                                extra.push(p)
                            }
                            Err(v) => tracing::warn!(
                                queue_id,
                                rule = v.rule,
                                "a queued start can no longer start and is dropped: {v}"
                            ),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(queue_id, "a queued start is invalid and is dropped: {e}")
                    }
                }
                dequeued = Some(queue_id);
            }
        }
        Ok(Some(self.accept(request, extra, slot_freed, dequeued)))
    }

    /// Takes an accepted request's events (and the `extra` events it led
    /// to) into the session's write.
    fn accept(
        &mut self,
        request: &Request,
        extra: Vec<Prepared>,
        slot_freed: bool,
        dequeued: Option<String>,
    ) -> Result<Appended, JournalError> {
        if let Some(order) = &request.options.work {
            for p in &request.prepared {
                self.queue_started(p, order);
            }
        }
        let events = request
            .prepared
            .iter()
            .chain(&extra)
            .map(|p| appended(&p.event))
            .collect();
        self.accepted.extend(request.prepared.iter().cloned());
        self.accepted.extend(extra);
        Ok(Appended {
            events,
            duplicate: false,
            slot_freed,
            dequeued,
        })
    }

    /// Queues the run `p` starts for the runtimes, when it is top-level.
    fn queue_started(&mut self, p: &Prepared, order: &WorkOrder) {
        if let AuthorityBody::RunStarted(b) = &p.event.body
            && b.parent_run_id.is_none()
            && let Some(run) = &p.event.envelope.run
        {
            let cursor = p.event.envelope.session_sequence.get() as i64 - 1;
            let workflow = p
                .event
                .envelope
                .workflow
                .as_ref()
                .map(|w| w.workflow_id.to_string());
            self.queued
                .push((run.root_run_id.to_string(), order.clone(), cursor, workflow));
        }
    }

    /// The runtime-lease fence: a backend's batch touching a run journal a
    /// runtime holds must carry that runtime's current lease, and a lease
    /// given must be current for every run journal the batch touches.
    fn fence(&self, request: &Request) -> Result<(), JournalError> {
        let mut roots: BTreeSet<&str> = request
            .prepared
            .iter()
            .filter_map(|p| p.event.envelope.run.as_ref())
            .map(|r| r.root_run_id.as_str())
            .collect();
        // A workflow-scoped event touches the journals of its workflow's
        // queued runs.
        for p in &request.prepared {
            if p.event.envelope.run.is_none()
                && let Some(w) = &p.event.envelope.workflow
            {
                roots.extend(
                    self.held
                        .iter()
                        .filter(|(_, h)| h.workflow_id.as_deref() == Some(w.workflow_id.as_str()))
                        .map(|(root, _)| root.as_str()),
                );
            }
        }
        let lease = match &request.options.fence {
            Fence::Server => return Ok(()),
            Fence::Closing => {
                // Only the server's repair of a closing item writes: a
                // closer that was overtaken (the run queued again, taken
                // by a runtime) writes nothing.
                return match roots
                    .iter()
                    .find(|r| self.held.get(**r).is_none_or(|h| h.state != "closing"))
                {
                    Some(root) => Err(JournalError::RuntimeLeaseNotCurrent(format!(
                        "the repair of run {root} was overtaken; nothing was written"
                    ))),
                    None => Ok(()),
                };
            }
            Fence::Backend { lease } => lease,
        };
        for root in roots {
            let held = self.held.get(root);
            match (held, lease) {
                (None, None) => {}
                (Some(h), None) if h.state != "claimed" => {}
                (Some(_), None) => {
                    return Err(JournalError::RuntimeLeaseRequired(format!(
                        "run {root} is held by an agent runtime: append under its lease \
                         (header Narad-Runtime-Lease), or stop the run"
                    )));
                }
                (Some(h), Some(l))
                    if h.state == "claimed" && h.live && h.lease_id.as_deref() == Some(l) => {}
                (_, Some(l)) => {
                    return Err(JournalError::RuntimeLeaseNotCurrent(format!(
                        "runtime lease {l} is not the current lease of run {root} (it lapsed, \
                         was released, or the run was handed to another runtime or closed); \
                         nothing was written: stop working on this run"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Loads entities read mid-transaction, `[[kind, id, state], …]`,
    /// unless the state already holds them (as stored or as changed by an
    /// earlier request of the group).
    fn load_more(&mut self, entities: Value) -> Result<(), JournalError> {
        let Value::Array(entities) = entities else {
            return Ok(());
        };
        let held: BTreeSet<EntityKey> = self.state.entities().into_iter().map(|(k, _)| k).collect();
        for e in entities {
            let (kind, id) = (e[0].as_str().unwrap_or(""), e[1].as_str().unwrap_or(""));
            let Some(key) = EntityKey::from_parts(kind, id) else {
                continue;
            };
            if held.contains(&key) {
                continue;
            }
            self.before.insert(key.clone(), e[2].clone());
            self.state
                .load_entity(key, e[2].clone())
                .map_err(|err| JournalError::Corrupt(format!("entity {kind} {id}: {err}")))?;
        }
        Ok(())
    }

    /// The session's write, when any request was accepted, and what the
    /// process knows of the session once the transaction commits.
    fn into_write(self) -> (Option<SessionWrite>, Known) {
        let all = self.state.entities();
        let core = serde_json::to_value(self.state.core()).expect("serialises");
        let known = Known {
            core: core.clone(),
            sequence: self.state.session_sequence as i64,
            entities: all.iter().cloned().collect(),
            keys: self.keys,
            xmin: if self.accepted.is_empty() {
                self.xmin
            } else {
                self.xact
            },
        };
        if self.accepted.is_empty() {
            return (None, known);
        }
        let changed = all
            .into_iter()
            .filter(|(k, v)| self.before.get(k) != Some(v))
            .collect();
        let mut client_executors = BTreeMap::new();
        let mut client_calls = BTreeSet::new();
        let mut journals: BTreeMap<String, Touched> = BTreeMap::new();
        for p in &self.accepted {
            // A workflow-scoped event (a workflow interrupt resolved, the
            // workflow resumed) moves the journal of the workflow's active
            // top-level run (its nested runs share that journal): idle, it
            // is queued again.
            if p.event.envelope.run.is_none()
                && let Some(w) = &p.event.envelope.workflow
                && let Some(root) = self
                    .state
                    .workflows
                    .get(&w.workflow_id)
                    .and_then(|wf| wf.active_top_level_run.as_ref())
            {
                journals.entry(root.to_string()).or_default();
            }
            if let Some(run) = &p.event.envelope.run {
                let root = run.root_run_id.as_str();
                let entry = journals.entry(root.to_owned()).or_default();
                if let AuthorityBody::RunStopRequested(b) = &p.event.body
                    && b.target_run_id.as_str() == root
                {
                    entry.stop = true;
                }
                entry.ended = self
                    .state
                    .runs
                    .get(&run.root_run_id)
                    .is_some_and(|r| r.status.is_terminal());
            }
            if let Some(run) = &p.event.envelope.run
                && let Some(executor) = self
                    .state
                    .runs
                    .get(&run.run_id)
                    .and_then(|r| r.client_executor_id.as_ref())
            {
                client_executors.insert(run.run_id.to_string(), executor.to_string());
            }
            if let AuthorityBody::ToolCallFinished(b) = &p.event.body
                && self
                    .state
                    .tool_calls
                    .get(&b.tool_call_id)
                    .is_some_and(|c| c.executor == Executor::Client)
            {
                client_calls.insert(b.tool_call_id.to_string());
            }
        }
        let write = SessionWrite {
            session: self.session,
            events: self.accepted,
            changed,
            last: self.state.session_sequence as i64,
            core,
            client_executors,
            client_calls,
            queued: self.queued,
            journals,
        };
        (Some(write), known)
    }
}

/// Sets the transaction's tenant to `tenant` unless it already is.
async fn scope(
    client: &Client,
    tenant: &TenantId,
    scoped: &mut Option<TenantId>,
) -> Result<(), JournalError> {
    if scoped.as_ref() != Some(tenant) {
        client.batch_execute(&scope_sql(tenant)).await?;
        *scoped = Some(tenant.clone());
    }
    Ok(())
}

/// A workflow with no open run, interrupt or pause: one that a pending
/// cancellation may end.
fn is_idle(w: &WorkflowState) -> bool {
    matches!(w.status, Status::Running) && w.open_runs.is_empty() && w.open_interrupts.is_empty()
}

/// Replaces the placeholder sequences with the next ones of the state,
/// and fills the workflow position of a workflow-owned run's event.
fn assign(state: &SessionState, p: &mut Prepared) {
    let env = &mut p.event.envelope;
    if env.workflow.is_none()
        && let Some(run) = &env.run
    {
        let owner = match &p.event.body {
            AuthorityBody::RunStarted(b) => b.parent_run_id.as_ref(),
            _ => Some(&run.run_id),
        };
        if let Some(w) = owner
            .and_then(|r| state.runs.get(r))
            .and_then(|r| r.workflow_id.clone())
        {
            p.body["workflowId"] = json!(w);
            env.workflow = Some(WorkflowPosition {
                workflow_id: w,
                workflow_sequence: Sequence::FIRST,
            });
        }
    }
    let seq = state.next_session_sequence();
    env.session_sequence = Sequence::new(seq).expect("in range");
    p.body["sessionSequence"] = json!(seq);
    if let Some(run) = &mut env.run {
        let n = state.next_run_sequence(&run.root_run_id);
        run.sequence = Sequence::new(n).expect("in range");
        p.body["sequence"] = json!(n);
    }
    if let Some(w) = &mut env.workflow {
        let n = state.next_workflow_sequence(&w.workflow_id);
        w.workflow_sequence = Sequence::new(n).expect("in range");
        p.body["workflowSequence"] = json!(n);
    }
}

fn appended(e: &narad_protocol::AuthorityEvent) -> AppendedEvent {
    AppendedEvent {
        event_id: e.envelope.event_id.to_string(),
        session_sequence: e.envelope.session_sequence.get(),
        sequence: e.envelope.run.as_ref().map(|r| r.sequence.get()),
        workflow_sequence: e
            .envelope
            .workflow
            .as_ref()
            .map(|w| w.workflow_sequence.get()),
    }
}

/// The entity keys whose stored state the requests' reads bring whole
/// (for a run journal's key, with its open runs: [`LOAD_ENTITIES`]).
fn coverage<'a>(requests: impl Iterator<Item = &'a Request>) -> BTreeSet<EntityKey> {
    requests
        .flat_map(|r| &r.prepared)
        .flat_map(|p| referenced_keys(&p.event))
        .collect()
}

/// Whether any eventId of the request is stored already.
fn request_ids_exist(request: &Request, existing: &BTreeMap<&str, &Row>) -> bool {
    !existing.is_empty()
        && request
            .prepared
            .iter()
            .any(|p| existing.contains_key(p.event.envelope.event_id.as_str()))
}

/// A retried batch: the stored sequences when every event was appended
/// before, to this session, with the same body; a conflict otherwise.
fn duplicate(
    prepared: &[Prepared],
    session_id: &str,
    stored: &BTreeMap<&str, &Row>,
) -> Result<Appended, JournalError> {
    let same = |p: &Prepared| {
        stored
            .get(p.event.envelope.event_id.as_str())
            .filter(|r| {
                r.get::<_, &str>(1) == session_id && r.get::<_, &[u8]>(5) == p.sha256.as_slice()
            })
            .copied()
    };
    let mut events = Vec::with_capacity(prepared.len());
    for p in prepared {
        let Some(row) = same(p) else {
            // Name a stored id that differs; when every stored one matches,
            // the batch is only partly a retry: name its first new event.
            let event_id = prepared
                .iter()
                .find(|q| {
                    stored.contains_key(q.event.envelope.event_id.as_str()) && same(q).is_none()
                })
                .unwrap_or(p)
                .event
                .envelope
                .event_id
                .to_string();
            return Err(JournalError::EventIdConflict { event_id });
        };
        events.push(AppendedEvent {
            event_id: p.event.envelope.event_id.to_string(),
            session_sequence: row.get::<_, i64>(2) as u64,
            sequence: row.get::<_, Option<i64>>(3).map(|n| n as u64),
            workflow_sequence: row.get::<_, Option<i64>>(4).map(|n| n as u64),
        });
    }
    Ok(Appended {
        events,
        duplicate: true,
        slot_freed: false,
        dequeued: None,
    })
}

/// A unique violation on the event id, which a concurrent append to
/// another session can cause, is a conflict; anything else a database error.
fn event_id_conflict(e: tokio_postgres::Error, prepared: &[Prepared]) -> JournalError {
    let on_event_id = e
        .as_db_error()
        .and_then(|d| d.constraint())
        .is_some_and(|c| c == "events_event_id_key");
    if on_event_id {
        JournalError::EventIdConflict {
            event_id: prepared
                .first()
                .map(|p| p.event.envelope.event_id.to_string())
                .unwrap_or_default(),
        }
    } else {
        JournalError::Database(e)
    }
}

/// One tenant's write as the columns of one statement's `unnest`s.
struct WriteRows<'a> {
    session_id: Vec<&'a str>,
    session_sequence: Vec<i64>,
    event_id: Vec<&'a str>,
    type_name: Vec<&'static str>,
    root_run_id: Vec<Option<&'a str>>,
    run_id: Vec<Option<&'a str>>,
    run_sequence: Vec<Option<i64>>,
    workflow_id: Vec<Option<&'a str>>,
    workflow_sequence: Vec<Option<i64>>,
    body: Vec<&'a Value>,
    sha256: Vec<&'a [u8]>,
    entity_session: Vec<&'a str>,
    entity_kind: Vec<&'static str>,
    entity_id: Vec<&'a str>,
    entity_state: Vec<&'a Value>,
    core_session: Vec<&'a str>,
    core_last: Vec<i64>,
    core: Vec<&'a Value>,
    client: ClientRows<'a>,
    work: WorkRows<'a>,
}

impl<'a> WriteRows<'a> {
    fn of(sessions: &'a [SessionWrite]) -> Self {
        let events = || {
            sessions
                .iter()
                .flat_map(|s| s.events.iter().map(move |p| (s.session.as_str(), p)))
        };
        let env = |p: &'a Prepared| &p.event.envelope;
        let changed = || {
            sessions
                .iter()
                .flat_map(|s| s.changed.iter().map(move |c| (s.session.as_str(), c)))
        };
        WriteRows {
            session_id: events().map(|(s, _)| s).collect(),
            session_sequence: events()
                .map(|(_, p)| env(p).session_sequence.get() as i64)
                .collect(),
            event_id: events().map(|(_, p)| env(p).event_id.as_str()).collect(),
            type_name: events()
                .map(|(_, p)| p.event.body.wire_type().name())
                .collect(),
            root_run_id: events()
                .map(|(_, p)| env(p).run.as_ref().map(|r| r.root_run_id.as_str()))
                .collect(),
            run_id: events()
                .map(|(_, p)| env(p).run.as_ref().map(|r| r.run_id.as_str()))
                .collect(),
            run_sequence: events()
                .map(|(_, p)| env(p).run.as_ref().map(|r| r.sequence.get() as i64))
                .collect(),
            workflow_id: events()
                .map(|(_, p)| env(p).workflow.as_ref().map(|w| w.workflow_id.as_str()))
                .collect(),
            workflow_sequence: events()
                .map(|(_, p)| {
                    env(p)
                        .workflow
                        .as_ref()
                        .map(|w| w.workflow_sequence.get() as i64)
                })
                .collect(),
            body: events().map(|(_, p)| &p.body).collect(),
            sha256: events().map(|(_, p)| p.sha256.as_slice()).collect(),
            entity_session: changed().map(|(s, _)| s).collect(),
            entity_kind: changed().map(|(_, (k, _))| k.kind()).collect(),
            entity_id: changed().map(|(_, (k, _))| k.id()).collect(),
            entity_state: changed().map(|(_, (_, v))| v).collect(),
            core_session: sessions.iter().map(|s| s.session.as_str()).collect(),
            core_last: sessions.iter().map(|s| s.last).collect(),
            core: sessions.iter().map(|s| &s.core).collect(),
            client: ClientRows::of(sessions),
            work: WorkRows::of(sessions),
        }
    }
}

/// The client-executor bookkeeping of one tenant's write (§11): a
/// `client_calls` row for every tool call started with `executor=client`,
/// the call closed by its `tool.call.finished`, and the runs paused for an
/// absent executor (`run.paused` with reason `client_executor_unavailable`)
/// or resumed. Derived from the accepted events, in their transaction.
#[derive(Default)]
struct ClientRows<'a> {
    session: Vec<&'a str>,
    tool_call_id: Vec<&'a str>,
    root_run_id: Vec<&'a str>,
    run_id: Vec<&'a str>,
    executor_id: Vec<&'a str>,
    tool_name: Vec<&'a str>,
    args: Vec<&'a Value>,
    closed: Vec<bool>,
    closed_session: Vec<&'a str>,
    closed_tool_call_id: Vec<&'a str>,
    paused_session: Vec<&'a str>,
    paused_run_id: Vec<&'a str>,
    paused_root_run_id: Vec<&'a str>,
    paused_executor_id: Vec<&'a str>,
    paused_wait_id: Vec<&'a str>,
    resumed_session: Vec<&'a str>,
    resumed_run_id: Vec<&'a str>,
}

impl<'a> ClientRows<'a> {
    fn of(sessions: &'a [SessionWrite]) -> Self {
        let mut rows = ClientRows::default();
        for s in sessions {
            let session = s.session.as_str();
            let finished: BTreeSet<&str> = s
                .events
                .iter()
                .filter_map(|p| match &p.event.body {
                    AuthorityBody::ToolCallFinished(b) => Some(b.tool_call_id.as_str()),
                    _ => None,
                })
                .collect();
            let mut started = BTreeSet::new();
            // Per run, the last pause for an absent executor (Some) or
            // resume (None) of the write: a run is either paused or
            // resumed by one statement, never both.
            let mut pauses: BTreeMap<&str, Option<(&str, &str, &str)>> = BTreeMap::new();
            for p in &s.events {
                let Some(run) = p.event.envelope.run.as_ref() else {
                    continue;
                };
                let executor = || {
                    s.client_executors
                        .get(run.run_id.as_str())
                        .map(String::as_str)
                };
                match &p.event.body {
                    AuthorityBody::ToolCallStarted(b) if b.executor == Executor::Client => {
                        let Some(executor_id) = executor() else {
                            continue;
                        };
                        let id = b.tool_call_id.as_str();
                        started.insert(id);
                        rows.session.push(session);
                        rows.tool_call_id.push(id);
                        rows.root_run_id.push(run.root_run_id.as_str());
                        rows.run_id.push(run.run_id.as_str());
                        rows.executor_id.push(executor_id);
                        rows.tool_name.push(b.tool_name.as_str());
                        rows.args.push(&p.body["args"]);
                        rows.closed.push(finished.contains(id));
                    }
                    AuthorityBody::ToolCallFinished(b)
                        if !started.contains(b.tool_call_id.as_str())
                            && s.client_calls.contains(b.tool_call_id.as_str()) =>
                    {
                        rows.closed_session.push(session);
                        rows.closed_tool_call_id.push(b.tool_call_id.as_str());
                    }
                    AuthorityBody::RunPaused(b) if b.reason.as_str() == EXECUTOR_UNAVAILABLE => {
                        if let Some(executor_id) = executor() {
                            pauses.insert(
                                run.run_id.as_str(),
                                Some((run.root_run_id.as_str(), executor_id, b.wait_id.as_str())),
                            );
                        }
                    }
                    AuthorityBody::RunResumed(_) => {
                        pauses.insert(run.run_id.as_str(), None);
                    }
                    _ => {}
                }
            }
            for (run_id, pause) in pauses {
                match pause {
                    Some((root_run_id, executor_id, wait_id)) => {
                        rows.paused_session.push(session);
                        rows.paused_run_id.push(run_id);
                        rows.paused_root_run_id.push(root_run_id);
                        rows.paused_executor_id.push(executor_id);
                        rows.paused_wait_id.push(wait_id);
                    }
                    None => {
                        rows.resumed_session.push(session);
                        rows.resumed_run_id.push(run_id);
                    }
                }
            }
        }
        rows
    }
}

/// The work-queue bookkeeping of one tenant's write: runs queued for the
/// runtimes, run journals an event wakes (an idle item becomes ready) or
/// asks to stop, and run journals whose root ended. A journal queued by
/// this write is only queued; one that ended is only ended.
#[derive(Default)]
struct WorkRows<'a> {
    added_session: Vec<&'a str>,
    added_root: Vec<&'a str>,
    added_queue: Vec<&'a str>,
    added_on_lost: Vec<&'static str>,
    added_max_attempts: Vec<i32>,
    added_cursor: Vec<i64>,
    added_stop: Vec<bool>,
    added_workflow: Vec<Option<&'a str>>,
    touched_session: Vec<&'a str>,
    touched_root: Vec<&'a str>,
    touched_stop: Vec<bool>,
    done_session: Vec<&'a str>,
    done_root: Vec<&'a str>,
}

impl<'a> WorkRows<'a> {
    fn of(sessions: &'a [SessionWrite]) -> Self {
        let mut rows = WorkRows::default();
        for s in sessions {
            let session = s.session.as_str();
            let mut queued = BTreeSet::new();
            for (root, order, cursor, workflow) in &s.queued {
                if s.journals.get(root).is_some_and(|j| j.ended) {
                    continue;
                }
                queued.insert(root.as_str());
                rows.added_session.push(session);
                rows.added_root.push(root);
                rows.added_queue.push(&order.queue);
                rows.added_on_lost.push(order.on_lost.as_str());
                rows.added_max_attempts
                    .push(i32::try_from(order.max_attempts).unwrap_or(i32::MAX));
                rows.added_cursor.push(*cursor);
                // A stop appended in the same write as the start.
                rows.added_stop
                    .push(s.journals.get(root).is_some_and(|j| j.stop));
                rows.added_workflow.push(workflow.as_deref());
            }
            for (root, &Touched { stop, ended }) in &s.journals {
                if ended {
                    rows.done_session.push(session);
                    rows.done_root.push(root);
                } else if !queued.contains(root.as_str()) {
                    rows.touched_session.push(session);
                    rows.touched_root.push(root);
                    rows.touched_stop.push(stop);
                }
            }
        }
        rows
    }
}
