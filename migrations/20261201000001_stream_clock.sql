-- Stream positions that survive a move to another cluster.
--
-- The relay order is (txid, position), where txid came straight from
-- pg_current_xact_id(). A logical dump restored into a new cluster (a move
-- to another server, a major-version upgrade) keeps the stored txids, while
-- the new cluster's own counter starts far lower: new rows then sorted
-- before old ones, old cursors saw nothing, and once the counter passed
-- the old values, old rows came back as new.
--
-- Now every stored txid is a *stream clock* reading: the transaction id plus
-- an offset kept in this database. Each connection of narad's pool attaches
-- to the clock when it opens (`stream_clock_attach()`): when the newest
-- stored reading is not below what the cluster's transactions would read,
-- the database was moved, and the offset grows so that every transaction
-- from now on reads above everything stored. Readings therefore only grow,
-- across moves too, and every cursor, eventId and watch id issued before a
-- move keeps its place. In a database that never moved the offset is 0 and
-- readings are plain transaction ids.
--
-- The offset travels in the connection's setting `narad.xid_offset` (set by
-- the attach), so that the hot insert path reads no table; a connection that
-- never attached cannot write a stream row at all (the setting is missing),
-- rather than write one in the wrong place.

create table stream_clock (
  one        boolean primary key default true check (one),
  xid_offset bigint  not null default 0 check (xid_offset >= 0)
);
insert into stream_clock default values;

-- The reading of the current transaction.
create function stream_xid() returns xid8
language sql volatile
as $$ select (pg_current_xact_id()::text::bigint
              + current_setting('narad.xid_offset')::bigint)::text::xid8 $$;

-- Rows whose reading is below this are final: their transactions are older
-- than every running one (and rows written before a move are older than
-- any transaction of the new cluster).
create function stream_horizon() returns xid8
language sql stable
as $$ select (pg_snapshot_xmin(pg_current_snapshot())::text::bigint
              + current_setting('narad.xid_offset')::bigint)::text::xid8 $$;

-- The current snapshot in clock readings: what had committed (below xmin,
-- or below xmax and not running) when it was taken.
create function stream_snapshot(out xmin bigint, out xmax bigint, out running bigint[])
language sql stable
as $$
  select pg_snapshot_xmin(s)::text::bigint + o, pg_snapshot_xmax(s)::text::bigint + o,
         array(select x::text::bigint + o from pg_snapshot_xip(s) as x)
  from pg_current_snapshot() as s,
       (select current_setting('narad.xid_offset')::bigint as o) as clock
$$;

-- Attaches this connection to the clock, moving the clock first when the
-- database was moved; returns the offset.
create function stream_clock_attach() returns bigint
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
declare
  newest  bigint;
  oldest  bigint;
  next_id bigint;
  shift   bigint;
begin
  -- One attach at a time decides whether the clock moves.
  perform pg_advisory_xact_lock(hashtext('narad.stream_clock'));
  select xid_offset into shift from stream_clock;
  -- The newest stored reading and the snapshot's bounds in ONE statement,
  -- so in one snapshot: every row it sees was written by a transaction
  -- below that snapshot's xmax. (Read in two statements, a transaction
  -- committing in between looked like a move, and moved the clock of one
  -- connection only: its rows then sorted ahead of everyone else's.)
  select greatest(
           (select txid::text::bigint from outbox order by txid desc, position desc limit 1),
           (select max(txid::text::bigint) from outbox_horizons)),
         pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
         pg_snapshot_xmax(pg_current_snapshot())::text::bigint
    into newest, oldest, next_id;
  -- Every transaction this cluster ever ran reads below next_id + shift: a
  -- stored reading at or past it was written by another cluster. From now
  -- on even the oldest running transaction reads above it.
  if newest is not null and newest >= next_id + shift then
    shift := newest - oldest + 1;
    update stream_clock set xid_offset = shift;
    raise log 'narad: the stored stream positions are ahead of this cluster''s transactions '
              '(a move or restore); stream clock offset is now %', shift;
  end if;
  perform set_config('narad.xid_offset', shift::text, false);
  return shift;
end
$$;
revoke all on function stream_clock_attach() from public;
grant execute on function stream_clock_attach() to narad_app;
grant execute on function stream_xid() to narad_app;
grant execute on function stream_horizon() to narad_app;
grant execute on function stream_snapshot() to narad_app;

alter table events alter column txid set default stream_xid();
alter table outbox alter column txid set default stream_xid();

-- Where a relay starting now begins.
create or replace function relay_start()
returns bigint
language sql stable
as $$ select stream_horizon()::text::bigint - 1 $$;

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
    and o.txid < public.stream_horizon()
  order by o.txid, o.position
  limit max_rows
$$;

create or replace function outbox_forget(older_than_seconds bigint, max_rows int)
returns bigint
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  with head as (
    select txid, position, tenant_id, event_id,
           bool_and(created_at < now() - make_interval(secs => older_than_seconds))
             over (order by txid, position) as expired
    from (select * from public.outbox
          where txid < public.stream_horizon()
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
