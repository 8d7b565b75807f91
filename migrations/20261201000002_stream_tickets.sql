-- Stream tickets: short-lived credentials a browser page puts in a stream's
-- URL, because its EventSource cannot send an Authorization header. A
-- ticket is bound to the tenant, the subject, the roles and the sessions
-- its token had, and to the one stream it names; only its SHA-256 is kept.
create table stream_tickets (
  ticket_hash   bytea       primary key,
  tenant_id     text        not null,
  subject       text        not null,
  roles         text[]      not null,
  sessions      text[],
  -- `session:<id>` or `events` (the tenant stream).
  stream        text        not null,
  -- The last second (since the epoch) the issuing token is accepted: a
  -- stream opened with the ticket ends then.
  valid_until   bigint,
  expires_at    timestamptz not null,
  created_at    timestamptz not null default now()
);

create index stream_tickets_expiry on stream_tickets (tenant_id, expires_at);

alter table stream_tickets enable row level security;
create policy tenant_isolation on stream_tickets
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, delete on stream_tickets to narad_app;

-- A ticket names no tenant before it is read: this one function reads a
-- live ticket across tenants by its hash, as the table's owner (whom
-- row-level security does not bind).
create function stream_ticket(p_hash bytea)
returns table (tenant_id text, subject text, roles text[], sessions text[], stream text,
               valid_until bigint)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select t.tenant_id, t.subject, t.roles, t.sessions, t.stream, t.valid_until
  from public.stream_tickets t
  where t.ticket_hash = p_hash and t.expires_at > now()
$$;

revoke all on function stream_ticket(bytea) from public;
grant execute on function stream_ticket(bytea) to narad_app;
