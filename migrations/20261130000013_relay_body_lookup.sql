-- The relay reads each authority row's body by its primary key, as a
-- subquery per row: as a join, a plan made on stale statistics scanned a
-- whole session's events for every outbox row (measured: 500 rows in
-- 37 ms against 1.5 ms).
create or replace function relay_after(after_txid bigint, after_position bigint, max_rows int)
returns table (relay_txid bigint, relay_position bigint, tenant_id text, session_id text,
               session_sequence bigint, event_id text, body jsonb, authority boolean)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select o.txid::text::bigint, o.position, o.tenant_id, o.session_id, o.session_sequence,
         o.event_id,
         coalesce(o.body, (select e.body from public.events e
                           where e.tenant_id = o.tenant_id and e.session_id = o.session_id
                             and e.session_sequence = o.session_sequence)),
         o.body is null
  from public.outbox o
  where (o.txid, o.position) > (after_txid::text::xid8, after_position)
    and o.txid < pg_snapshot_xmin(pg_current_snapshot())
  order by o.txid, o.position
  limit max_rows
$$;
