-- Erasure: a session's content removed for good, in one transaction; a
-- tombstone without content says it was erased (history and streams answer
-- 410), and its eventIds stay taken, so that no replay of an old event can
-- bring any of it back. The journal's role still cannot delete events:
-- only these functions, owned by the migrating role, do.

create table erased_sessions (
  tenant_id   text        not null,
  session_id  text        not null,
  erased_at   timestamptz not null default now(),
  -- request (DELETE /v1/sessions/{id}), retention or tenant.
  reason      text        not null,
  primary key (tenant_id, session_id)
);

create table erased_event_ids (
  tenant_id  text not null,
  event_id   text not null,
  primary key (tenant_id, event_id)
);

alter table erased_sessions enable row level security;
alter table erased_sessions force row level security;
create policy tenant_isolation on erased_sessions
  using (tenant_id = current_setting('narad.tenant_id', true));
alter table erased_event_ids enable row level security;
alter table erased_event_ids force row level security;
create policy tenant_isolation on erased_event_ids
  using (tenant_id = current_setting('narad.tenant_id', true));
grant select on erased_sessions, erased_event_ids to narad_app;

-- Erases one session of one tenant: every row that holds its content,
-- and the audit entries that name it. Answers the number of events
-- erased, or null when the session does not exist.
create function erase_session(p_tenant text, p_session text, p_reason text)
returns bigint
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
declare
  erased bigint;
begin
  perform 1 from public.sessions
  where tenant_id = p_tenant and session_id = p_session for update;
  if not found then
    return null;
  end if;
  insert into public.erased_event_ids (tenant_id, event_id)
  select tenant_id, event_id from public.events
  where tenant_id = p_tenant and session_id = p_session
  on conflict do nothing;
  delete from public.events where tenant_id = p_tenant and session_id = p_session;
  get diagnostics erased = row_count;
  delete from public.outbox where tenant_id = p_tenant and session_id = p_session;
  delete from public.entities where tenant_id = p_tenant and session_id = p_session;
  delete from public.queued_starts where tenant_id = p_tenant and session_id = p_session;
  delete from public.pending_cancellations where tenant_id = p_tenant and session_id = p_session;
  delete from public.run_work where tenant_id = p_tenant and session_id = p_session;
  delete from public.client_calls where tenant_id = p_tenant and session_id = p_session;
  delete from public.executor_pauses where tenant_id = p_tenant and session_id = p_session;
  delete from public.interrupt_deadlines where tenant_id = p_tenant and session_id = p_session;
  delete from public.audit where tenant_id = p_tenant and session_id = p_session;
  delete from public.stream_tickets
  where tenant_id = p_tenant and stream = 'session:' || p_session;
  delete from public.sessions where tenant_id = p_tenant and session_id = p_session;
  insert into public.erased_sessions (tenant_id, session_id, reason)
  values (p_tenant, p_session, p_reason)
  on conflict (tenant_id, session_id) do update set erased_at = now(), reason = excluded.reason;
  return erased;
end
$$;

revoke all on function erase_session(text, text, text) from public;
grant execute on function erase_session(text, text, text) to narad_app;

-- A tenant's erasure, resumable: the row stays until every session is
-- erased and the tenant's own rows are gone.
create table tenant_erasures (
  tenant_id     text        primary key,
  requested_at  timestamptz not null default now(),
  requested_by  text        not null,
  sessions_erased bigint    not null default 0,
  finished_at   timestamptz
);
alter table tenant_erasures enable row level security;
create policy tenant_isolation on tenant_erasures
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, update on tenant_erasures to narad_app;

-- The erasures under way, across tenants (the sweeper's list).
create function tenant_erasures_pending()
returns table (tenant_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select e.tenant_id from public.tenant_erasures e
  where e.finished_at is null order by e.requested_at
$$;

revoke all on function tenant_erasures_pending() from public;
grant execute on function tenant_erasures_pending() to narad_app;

-- After every session of the tenant is erased: the rows a tenant holds
-- beside its sessions.
create function erase_tenant_rest(p_tenant text)
returns void
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
begin
  delete from public.executors where tenant_id = p_tenant;
  delete from public.extensions where tenant_id = p_tenant;
  delete from public.request_nonces where tenant_id = p_tenant;
  delete from public.stream_tickets where tenant_id = p_tenant;
  delete from public.audit where tenant_id = p_tenant;
  delete from public.tenant_limits where tenant_id = p_tenant;
  delete from public.tenant_buckets where tenant_id = p_tenant;
  delete from public.open_streams where tenant_id = p_tenant;
  delete from public.outbox where tenant_id = p_tenant;
  delete from public.outbox_horizons where tenant_id = p_tenant;
end
$$;

revoke all on function erase_tenant_rest(text) from public;
grant execute on function erase_tenant_rest(text) to narad_app;

-- The functions that read across tenants run as the tables' owner, whom
-- row-level security binds only when forced: sessions (session_tenants),
-- and the interrupt deadlines and tenant limits the expiry sweep reads
-- (interrupt_deadlines_due), are not forced, as events and the outbox are
-- not (the relay). The journal's role stays bound by every policy.
alter table sessions no force row level security;
alter table interrupt_deadlines no force row level security;
alter table tenant_limits no force row level security;

-- Sessions a retention policy of `p_days` would erase now: archived, or
-- idle (no event, no change) for longer.
create index sessions_archived on sessions (tenant_id, archived_at) where archived_at is not null;

create function retention_due(p_tenant text, p_days double precision, p_max int)
returns table (session_id text, archived_at timestamptz, last_activity timestamptz)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select s.session_id, s.archived_at, coalesce(l.at, s.created_at)
  from public.sessions s
  left join lateral (
    select e.recorded_at as at from public.events e
    where e.tenant_id = s.tenant_id and e.session_id = s.session_id
    order by e.session_sequence desc limit 1
  ) l on true
  where s.tenant_id = p_tenant
    and coalesce(s.archived_at, l.at, s.created_at) < now() - p_days * interval '1 day'
  order by coalesce(s.archived_at, l.at, s.created_at)
  limit p_max
$$;

revoke all on function retention_due(text, double precision, int) from public;
grant execute on function retention_due(text, double precision, int) to narad_app;

-- The tenants holding sessions (the retention sweep's list).
create function session_tenants()
returns table (tenant_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  with recursive t as (
    (select s.tenant_id from public.sessions s order by s.tenant_id limit 1)
    union all
    select (select s.tenant_id from public.sessions s where s.tenant_id > t.tenant_id
            order by s.tenant_id limit 1)
    from t where t.tenant_id is not null
  )
  select tenant_id from t where tenant_id is not null
$$;

revoke all on function session_tenants() from public;
grant execute on function session_tenants() to narad_app;
