-- Client executors (§11): the current lease of every logical endpoint, the
-- client tool calls with their single-use execution tokens, and the runs
-- the server paused while their executor was away.

-- One row per endpoint: its current lease. Attaching replaces the lease
-- (the earlier one is superseded); a heartbeat under it moves its expiry.
create table executors (
  tenant_id         text        not null,
  executor_id       text        not null,
  lease_id          text        not null,
  lease_expires_at  timestamptz not null,
  attached_at       timestamptz not null default now(),
  primary key (tenant_id, executor_id)
);

-- One row per tool.call.started with executor=client, written in the
-- append transaction that records the start, so that no call is ever
-- without its delivery state. The token is stored as its SHA-256 only; it
-- is issued once (delivery), bound to the executor, the lease it was
-- delivered under, the call and its expiry, and never reissued: a
-- toolCallId is never reassigned (§11.3 rule 10).
create table client_calls (
  tenant_id         text        not null,
  session_id        text        not null,
  tool_call_id      text        not null,
  root_run_id       text        not null,
  run_id            text        not null,
  executor_id       text        not null,
  tool_name         text        not null,
  args              jsonb       not null,
  started_at        timestamptz not null default now(),
  token_sha256      bytea,
  lease_id          text,
  token_expires_at  timestamptz,
  -- tool.call.finished is in the journal (by a finish, expiry, stop, or
  -- the runtime itself).
  closed            boolean     not null default false,
  -- Taken back before delivery (the server is closing it undelivered):
  -- no token will be issued for it.
  withdrawn         boolean     not null default false,
  primary key (tenant_id, session_id, tool_call_id)
);

create unique index client_calls_by_token on client_calls (token_sha256)
  where token_sha256 is not null;
create index client_calls_undelivered on client_calls (tenant_id, executor_id)
  where token_sha256 is null and not closed;
create index client_calls_delivered_open on client_calls (token_expires_at)
  where token_sha256 is not null and not closed;
create index client_calls_waiting_since on client_calls (started_at)
  where token_sha256 is null and not closed;
-- The open calls of a run (is its executor needed?), and of every run (the
-- sweeper's look for absent executors): without it that look read the
-- whole table, closed rows included (1 M closed rows: 70 ms a sweep,
-- against 0.5 ms with it).
create index client_calls_open_by_run on client_calls (tenant_id, session_id, run_id)
  include (root_run_id, executor_id, started_at) where not closed;
-- Retention of closed calls.
create index client_calls_closed_since on client_calls (started_at) where closed;

-- A run the server paused because its executor was unavailable
-- (run.paused, reason client_executor_unavailable, resumeMode automatic);
-- the row goes when the server resumes it.
create table executor_pauses (
  tenant_id    text        not null,
  session_id   text        not null,
  run_id       text        not null,
  root_run_id  text        not null,
  executor_id  text        not null,
  wait_id      text        not null,
  paused_at    timestamptz not null default now(),
  primary key (tenant_id, session_id, run_id)
);
create index executor_pauses_by_executor on executor_pauses (tenant_id, executor_id);

alter table executors enable row level security;
alter table client_calls enable row level security;
alter table executor_pauses enable row level security;
create policy tenant_isolation on executors
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
create policy tenant_isolation on client_calls
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
create policy tenant_isolation on executor_pauses
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));

grant select, insert, update on executors to narad_app;
grant select, insert, update on client_calls to narad_app;
grant select, insert, update, delete on executor_pauses to narad_app;

-- As for the relay (migration 9): row-level security binds narad_app on
-- entities; it is no longer forced on their owner, as which the function
-- below reads a run's stop request across tenants.
alter table entities no force row level security;

-- The sweeper's one look across tenants: what is due now. Every action it
-- then takes runs scoped to the row's tenant, under row-level security.
--   kind 'expired'     a delivered call whose token lapsed without a finish;
--   kind 'undelivered' a call waiting for delivery longer than max_wait;
--   kind 'stopping'    a call waiting for delivery whose run was asked to stop;
--   kind 'away'        a running run with an open call whose executor's lease
--                      lapsed (or that never attached), not yet paused by us;
--   kind 'back'        a run we paused whose executor holds a live lease, or
--                      that no longer waits on it.
create function executor_work(max_wait_seconds double precision, max_rows int)
returns table (kind text, tenant_id text, session_id text, tool_call_id text,
               root_run_id text, run_id text, executor_id text, wait_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  (select 'expired', c.tenant_id, c.session_id, c.tool_call_id, c.root_run_id, c.run_id,
          c.executor_id, null::text
   from public.client_calls c
   where c.token_sha256 is not null and not c.closed and c.token_expires_at <= now()
   order by c.token_expires_at limit max_rows)
  union all
  (select 'undelivered', c.tenant_id, c.session_id, c.tool_call_id, c.root_run_id, c.run_id,
          c.executor_id, null::text
   from public.client_calls c
   where c.token_sha256 is null and not c.closed
     and c.started_at <= now() - make_interval(secs => max_wait_seconds)
   order by c.started_at limit max_rows)
  union all
  (select 'stopping', c.tenant_id, c.session_id, c.tool_call_id, c.root_run_id, c.run_id,
          c.executor_id, null::text
   from public.client_calls c
   join public.entities e
     on e.tenant_id = c.tenant_id and e.session_id = c.session_id and e.kind = 'run'
    and e.id = c.run_id
   where c.token_sha256 is null and not c.closed
     and coalesce((e.state ->> 'stopRequested')::boolean, false)
   order by c.started_at limit max_rows)
  union all
  -- Only runs that are running and not stopping: a run paused for another
  -- reason, or asked to stop, is left alone (and does not crowd out others).
  (select 'away', c.tenant_id, c.session_id, null::text, c.root_run_id, c.run_id,
          c.executor_id, null::text
   from public.client_calls c
   join public.entities e
     on e.tenant_id = c.tenant_id and e.session_id = c.session_id and e.kind = 'run'
    and e.id = c.run_id
   left join public.executors x
     on x.tenant_id = c.tenant_id and x.executor_id = c.executor_id
   where not c.closed and (x.lease_expires_at is null or x.lease_expires_at <= now())
     and e.state ->> 'state' = 'running'
     and not coalesce((e.state ->> 'stopRequested')::boolean, false)
     and not exists (select 1 from public.executor_pauses p
                     where p.tenant_id = c.tenant_id and p.session_id = c.session_id
                       and p.run_id = c.run_id)
   group by c.tenant_id, c.session_id, c.root_run_id, c.run_id, c.executor_id
   order by min(c.started_at) limit max_rows)
  union all
  -- A paused run resumes when its executor is back, or when nothing of it
  -- waits on the executor any more (its calls finished or closed).
  (select 'back', p.tenant_id, p.session_id, null::text, p.root_run_id, p.run_id,
          p.executor_id, p.wait_id
   from public.executor_pauses p
   left join public.executors x on x.tenant_id = p.tenant_id and x.executor_id = p.executor_id
   where x.lease_expires_at > now()
      or not exists (select 1 from public.client_calls c
                     where c.tenant_id = p.tenant_id and c.session_id = p.session_id
                       and c.run_id = p.run_id and not c.closed)
   order by p.paused_at limit max_rows)
$$;

revoke all on function executor_work(double precision, int) from public;
grant execute on function executor_work(double precision, int) to narad_app;

-- Deletes up to max_rows closed calls started more than older_than_seconds
-- ago (their args are protected data, and only a late duplicate finish
-- still asks for them); the journal keeps the calls for good.
create function client_calls_forget(older_than_seconds double precision, max_rows int)
returns bigint
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  with doomed as (
    select tenant_id, session_id, tool_call_id from public.client_calls
    where closed and started_at < now() - make_interval(secs => older_than_seconds)
    order by started_at limit max_rows
  ), gone as (
    delete from public.client_calls c using doomed d
    where c.tenant_id = d.tenant_id and c.session_id = d.session_id
      and c.tool_call_id = d.tool_call_id
    returning 1
  )
  select count(*) from gone
$$;

revoke all on function client_calls_forget(double precision, int) from public;
grant execute on function client_calls_forget(double precision, int) to narad_app;

-- Client calls already open when this migration runs get their delivery
-- state too.
insert into client_calls (tenant_id, session_id, tool_call_id, root_run_id, run_id, executor_id,
                          tool_name, args)
select s.tenant_id, s.session_id, s.body ->> 'toolCallId', s.root_run_id, s.run_id,
       r.body ->> 'clientExecutorId', s.body ->> 'toolName', s.body -> 'args'
from events s
join events r
  on r.tenant_id = s.tenant_id and r.session_id = s.session_id and r.type = 'run.started'
 and r.run_id = s.run_id
where s.type = 'tool.call.started' and s.body ->> 'executor' = 'client'
  and r.body ? 'clientExecutorId'
  and not exists (select 1 from events f
                  where f.tenant_id = s.tenant_id and f.session_id = s.session_id
                    and f.type = 'tool.call.finished'
                    and f.body ->> 'toolCallId' = s.body ->> 'toolCallId');

-- Times on the wire: RFC 3339 in UTC, milliseconds.
create function rfc3339(t timestamptz) returns text
language sql stable
as $$ select to_char(t at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') $$;
