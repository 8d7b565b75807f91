-- The tenant stream (`GET /v1/events`): a tenant's committed events in
-- relay order, resumable from an eventId, with what retention forgot
-- named instead of silently skipped.

-- Each event records the transaction that appended it, so that an eventId
-- resolves to its outbox row through the (tenant, txid, position) index.
alter table events add column txid xid8;
alter table events alter column txid set default pg_current_xact_id();
update events e set txid = o.txid
  from outbox o
  where o.tenant_id = e.tenant_id and o.session_id = e.session_id
    and o.session_sequence = e.session_sequence;

-- Watch events that are facts of their own (session.created,
-- session.archived) travel through the outbox too, so that every replica
-- delivers them; such rows carry their body, authority rows do not.
alter table outbox add column body jsonb;

-- Per tenant, the last row retention deleted (in relay order). Retention
-- deletes a prefix of the relay order, so every row of the tenant after
-- this one is still there.
create table outbox_horizons (
  tenant_id    text        primary key,
  txid         xid8        not null,
  position     bigint      not null,
  event_id     text        not null,
  forgotten_at timestamptz not null default now()
);
alter table outbox_horizons enable row level security;
create policy tenant_isolation on outbox_horizons
  using (tenant_id = current_setting('narad.tenant_id', true));
grant select on outbox_horizons to narad_app;

-- Retention deletes the longest prefix, in relay order, of the first
-- `max_rows` final rows whose rows are all older than the retention, and
-- moves each tenant's horizon to its last deleted row.
create or replace function outbox_forget(older_than_seconds bigint, max_rows int)
returns bigint
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  with head as (
    select txid, position, tenant_id, event_id,
           bool_and(created_at < now() - make_interval(secs => older_than_seconds))
             over (order by txid, position) as expired
    from (select * from public.outbox
          where txid < pg_snapshot_xmin(pg_current_snapshot())
          order by txid, position
          limit max_rows) first_rows
  ), gone as (
    delete from public.outbox o using head
    where head.expired and o.txid = head.txid and o.position = head.position
    returning o.tenant_id, o.txid, o.position, o.event_id
  ), last_per_tenant as (
    select distinct on (tenant_id) tenant_id, txid, position, event_id
    from gone order by tenant_id, txid desc, position desc
  ), moved as (
    insert into public.outbox_horizons as h (tenant_id, txid, position, event_id)
    select tenant_id, txid, position, event_id from last_per_tenant
    on conflict (tenant_id) do update
      set txid = excluded.txid, position = excluded.position,
          event_id = excluded.event_id, forgotten_at = now()
      where (h.txid, h.position) < (excluded.txid, excluded.position)
  )
  select count(*) from gone
$$;

-- The relay reads watch rows' own bodies.
drop function relay_after(bigint, bigint, int);
create function relay_after(after_txid bigint, after_position bigint, max_rows int)
returns table (relay_txid bigint, relay_position bigint, tenant_id text, session_id text,
               session_sequence bigint, event_id text, body jsonb, authority boolean)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select o.txid::text::bigint, o.position, o.tenant_id, o.session_id, o.session_sequence,
         o.event_id, coalesce(o.body, e.body), o.body is null
  from public.outbox o
  left join public.events e
    on o.body is null and e.tenant_id = o.tenant_id and e.session_id = o.session_id
   and e.session_sequence = o.session_sequence
  where (o.txid, o.position) > (after_txid::text::xid8, after_position)
    and o.txid < pg_snapshot_xmin(pg_current_snapshot())
  order by o.txid, o.position
  limit max_rows
$$;
revoke all on function relay_after(bigint, bigint, int) from public;
grant execute on function relay_after(bigint, bigint, int) to narad_app;
