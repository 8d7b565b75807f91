-- Agent runtimes: the durable work queue of run journals and the runtime
-- leases that fence their appends.
--
-- One row per run journal (root run) started by start-run with `runtime`,
-- written in the transaction that appends its run.started and deleted in
-- the transaction that appends the root's terminal. States:
--   ready    waiting for a runtime to claim it;
--   claimed  held by a runtime under lease_id until lease_expires_at;
--   idle     released by its runtime while the run waits (an interrupt, a
--            client tool); the next event of its journal makes it ready;
--   closing  the server is closing the run itself (`reason` says how:
--            retrying, lost, stopped), or repairing it before a retry;
--   done     the root run ended; kept a while so that a late release or
--            heartbeat learns that, then forgotten.
create table run_work (
  tenant_id         text        not null,
  session_id        text        not null,
  root_run_id       text        not null,
  queue             text        not null,
  state             text        not null check (state in ('ready', 'claimed', 'idle', 'closing', 'done')),
  -- ready: why (started, event, retry); closing: what for (retrying, lost,
  -- stopped).
  reason            text        not null,
  on_lost           text        not null check (on_lost in ('retry', 'fail')),
  max_attempts      int         not null check (max_attempts >= 1),
  -- Leases lost so far (retry policy: at most max_attempts - 1 retries).
  lost              int         not null default 0,
  lease_id          text,
  runtime_id        text,
  lease_expires_at  timestamptz,
  -- The session sequence a new holder reads history after.
  cursor            bigint      not null,
  -- The root run was asked to stop (run.stop.requested targeting it).
  stop_requested    boolean     not null default false,
  ready_at          timestamptz not null default now(),
  claimed_at        timestamptz,
  -- When the state last changed (a closing row older than a deadline is
  -- taken over by the next sweep).
  changed_at        timestamptz not null default now(),
  created_at        timestamptz not null default now(),
  primary key (tenant_id, session_id, root_run_id)
);

-- Claims: the oldest ready item of a tenant's queue, or of any queue.
create index run_work_ready on run_work (tenant_id, queue, ready_at) where state = 'ready';
create index run_work_ready_any on run_work (tenant_id, ready_at) where state = 'ready';
create index run_work_done on run_work (changed_at) where state = 'done';
-- The sweeper: lapsed leases, stalled closings, stops nobody holds.
create index run_work_leases on run_work (lease_expires_at) where state = 'claimed';
create index run_work_unheld_stops on run_work (changed_at)
  where stop_requested and state in ('ready', 'idle');
create index run_work_closing on run_work (changed_at) where state = 'closing';
create unique index run_work_by_lease on run_work (tenant_id, lease_id) where lease_id is not null;

-- The runtime settings of a queued start, applied when it takes the slot.
alter table queued_starts add column work jsonb;

alter table run_work enable row level security;
create policy tenant_isolation on run_work
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, update, delete on run_work to narad_app;

-- The runtime sweeper's one look across tenants: what is due now. Every
-- action it then takes runs scoped to the row's tenant.
--   kind 'lapsed'   a claimed item whose lease expired;
--   kind 'stopped'  an item nobody holds whose root run was asked to stop;
--   kind 'stalled'  a closing item untouched for stall_seconds (its closer
--                   died); the sweep closes it again.
create function runtime_work(stall_seconds double precision, max_rows int)
returns table (kind text, tenant_id text, session_id text, root_run_id text, lease_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  (select 'lapsed', w.tenant_id, w.session_id, w.root_run_id, w.lease_id
   from public.run_work w
   where w.state = 'claimed' and w.lease_expires_at <= now()
   order by w.lease_expires_at limit max_rows)
  union all
  (select 'stopped', w.tenant_id, w.session_id, w.root_run_id, null::text
   from public.run_work w
   where w.stop_requested and w.state in ('ready', 'idle')
   order by w.changed_at limit max_rows)
  union all
  (select 'stalled', w.tenant_id, w.session_id, w.root_run_id, null::text
   from public.run_work w
   where w.state = 'closing'
     and w.changed_at <= now() - make_interval(secs => stall_seconds)
   order by w.changed_at limit max_rows)
$$;

revoke all on function runtime_work(double precision, int) from public;
grant execute on function runtime_work(double precision, int) to narad_app;

-- Forgets up to max_rows items whose run ended more than older_than_seconds ago.
create function run_work_forget(older_than_seconds double precision, max_rows int)
returns bigint
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  with gone as (
    delete from public.run_work w
    where (w.tenant_id, w.session_id, w.root_run_id) in (
      select d.tenant_id, d.session_id, d.root_run_id from public.run_work d
      where d.state = 'done' and d.changed_at <= now() - make_interval(secs => older_than_seconds)
      order by d.changed_at limit max_rows)
    returning 1)
  select count(*) from gone
$$;

revoke all on function run_work_forget(double precision, int) from public;
grant execute on function run_work_forget(double precision, int) to narad_app;

-- Queue depth by tenant and queue, for the metrics.
create function runtime_queue_depth()
returns table (tenant_id text, queue text, state text, items bigint)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select w.tenant_id, w.queue, w.state, count(*) from public.run_work w
  where w.state <> 'done'
  group by w.tenant_id, w.queue, w.state
$$;

revoke all on function runtime_queue_depth() from public;
grant execute on function runtime_queue_depth() to narad_app;
