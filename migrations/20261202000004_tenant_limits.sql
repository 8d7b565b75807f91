-- A tenant's own limits: overrides of the configured defaults, by name,
-- set by an admin of the operator organisation (PUT
-- /v1/admin/tenants/{org}/limits). A name absent takes the default; a
-- name set to null lifts it for the tenant.
create table tenant_limits (
  tenant_id   text        primary key,
  limits      jsonb       not null default '{}',
  updated_at  timestamptz not null default now(),
  updated_by  text        not null
);

alter table tenant_limits enable row level security;
alter table tenant_limits force row level security;
create policy tenant_isolation on tenant_limits
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, update, delete on tenant_limits to narad_app;

-- The expiry sweep honours a tenant's own default expiry
-- (interruptDefaultExpirySeconds: a number of seconds, or null for none).
create or replace function interrupt_deadlines_due(default_seconds double precision, max_rows int)
returns table (tenant_id text, session_id text, interrupt_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  (select d.tenant_id, d.session_id, d.interrupt_id from public.interrupt_deadlines d
   where d.expires_at is not null and d.expires_at <= now()
   order by d.expires_at limit max_rows)
  union all
  (select d.tenant_id, d.session_id, d.interrupt_id from public.interrupt_deadlines d
   left join public.tenant_limits l on l.tenant_id = d.tenant_id
   where d.expires_at is null
     and d.requested_at <= now() - make_interval(secs => case
       when l.limits ? 'interruptDefaultExpirySeconds'
         then (l.limits ->> 'interruptDefaultExpirySeconds')::double precision
       else default_seconds end)
   order by d.requested_at limit max_rows)
$$;
