-- The relay: every replica reads committed outbox rows, across tenants, in
-- (txid, position) order, taking only rows whose transaction is older than
-- every running one. Such rows are final: no transaction that could still
-- add a row below a relayed one is running. (Position order alone is not
-- enough: a transaction that began earlier can insert, and commit, a lower
-- position after a higher one was relayed.)
create index outbox_in_relay_order on outbox (txid, position);

-- The relay reads across tenants through this one function, which runs as
-- the tables' owner. Row-level security still binds narad_app on both
-- tables; it is no longer forced on their owner, which narad never
-- connects as (its pool switches every connection to narad_app).
alter table outbox no force row level security;
alter table events no force row level security;

create function relay_after(after_txid bigint, after_position bigint, max_rows int)
returns table (relay_txid bigint, relay_position bigint, tenant_id text, session_id text,
               session_sequence bigint, event_id text, body jsonb)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select o.txid::text::bigint, o.position, o.tenant_id, o.session_id, o.session_sequence,
         o.event_id, e.body
  from public.outbox o
  join public.events e
    on e.tenant_id = o.tenant_id and e.session_id = o.session_id
   and e.session_sequence = o.session_sequence
  where (o.txid, o.position) > (after_txid::text::xid8, after_position)
    and o.txid < pg_snapshot_xmin(pg_current_snapshot())
  order by o.txid, o.position
  limit max_rows
$$;

-- Where a relay starting now begins: after every row of a transaction
-- older than every running one.
create function relay_start()
returns bigint
language sql stable
as $$ select (pg_snapshot_xmin(pg_current_snapshot())::text::bigint) - 1 $$;

revoke all on function relay_after(bigint, bigint, int) from public;
grant execute on function relay_after(bigint, bigint, int) to narad_app;
grant execute on function relay_start() to narad_app;
