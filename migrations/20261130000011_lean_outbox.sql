-- Fewer index insertions per appended event: the outbox kept four indexes
-- (position, tenant, relay order, age); every reader now goes through the
-- relay order, once across tenants and once within one.
--
-- * position stays an identity column (unique by construction) without an
--   index of its own: nothing looks a row up by position alone.
-- * the tenant stream reads one tenant's rows in relay order.
-- * retention walks the relay order from its start (transaction ids grow
--   with time) instead of an index on created_at.
alter table outbox drop constraint outbox_pkey;
drop index outbox_by_age;
drop index outbox_by_tenant;
create index outbox_by_tenant_in_relay_order on outbox (tenant_id, txid, position);

-- Deletes, of the first `max_rows` final rows in relay order, those older
-- than the retention. A batch that deletes fewer than `max_rows` tells the
-- caller that the rest is younger (or not yet final).
create or replace function outbox_forget(older_than_seconds bigint, max_rows int)
returns bigint
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  with head as (
    select txid, position, created_at from public.outbox
    where txid < pg_snapshot_xmin(pg_current_snapshot())
    order by txid, position
    limit max_rows
  ), gone as (
    delete from public.outbox o using head
    where o.txid = head.txid and o.position = head.position
      and head.created_at < now() - make_interval(secs => older_than_seconds)
    returning 1
  )
  select count(*) from gone
$$;
