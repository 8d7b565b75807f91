-- Outbox retention: rows older than the retention and already final for
-- every relay (their transaction is older than every running one) are
-- deleted in batches. The journal (`events`) is never touched.
create index outbox_by_age on outbox (created_at);

create function outbox_forget(older_than_seconds bigint, max_rows int)
returns bigint
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  with doomed as (
    select position from public.outbox
    where created_at < now() - make_interval(secs => older_than_seconds)
      and txid < pg_snapshot_xmin(pg_current_snapshot())
    order by created_at
    limit max_rows
  ), gone as (
    delete from public.outbox o using doomed where o.position = doomed.position
    returning 1
  )
  select count(*) from gone
$$;

revoke all on function outbox_forget(bigint, int) from public;
grant execute on function outbox_forget(bigint, int) to narad_app;
