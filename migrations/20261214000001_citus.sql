-- Past one Postgres: the same schema on a Citus cluster, distributed by
-- tenant (docs/scale-out.md).
--
-- 1. A distributed unique index must hold the distribution column: a
--    client call's token is unique within its tenant (it is a 256-bit
--    random value, and every lookup already names the tenant).
drop index client_calls_by_token;
create unique index client_calls_by_token on client_calls (tenant_id, token_sha256)
  where token_sha256 is not null;

-- 2. The tables that stay on the coordinator, with the reason: keyed by
--    something a request holds before it knows its tenant, or by no
--    tenant at all, small, and never joined with a tenant table.
create function narad_coordinator_tables() returns text[]
language sql immutable
as $$ select array[
  '_sqlx_migrations', -- the migrations applied
  'stream_clock',     -- one row: the offset of stream positions
  'replicas',         -- which replicas are alive (no tenant)
  'open_streams',     -- keyed by stream id; counted with replicas
  'stream_tickets'    -- looked up by the ticket's hash before its tenant is known
] $$;

-- 3. Distributes the schema when this database is a Citus coordinator;
--    does nothing on one Postgres. Idempotent: `narad migrate` runs it
--    after every migration, so a table a later migration adds is
--    distributed too. Every table with a `tenant_id` column but those
--    above is distributed by it, colocated with `sessions` (one tenant's
--    rows share one shard group, so every request-path transaction is a
--    single-shard one); a table with no tenant that is not listed above
--    stops the migration: it needs a decision, not a default.
create function narad_distribute() returns text[]
language plpgsql volatile set search_path = pg_catalog, public
as $$
declare
  t        text;
  done     text[] := '{}';
  unplaced text;
begin
  if not exists (select 1 from pg_extension where extname = 'citus') then
    return done;
  end if;
  select string_agg(c.relname, ', ') into unplaced
  from pg_class c
  where c.relnamespace = 'public'::regnamespace and c.relkind in ('r', 'p')
    and c.relname <> all (narad_coordinator_tables())
    and not exists (select 1 from pg_attribute a
                    where a.attrelid = c.oid and a.attname = 'tenant_id' and not a.attisdropped);
  if unplaced is not null then
    raise exception 'narad: tables with no tenant_id and no place on the cluster: %', unplaced
      using hint = 'add them to narad_coordinator_tables() or give them a tenant_id';
  end if;
  -- A coordinator reaches the workers as the role running the statement:
  -- narad's connections run as narad_app (`set role`), so it must be able
  -- to log in there (its authentication on the workers is the
  -- operator's: pg_dist_authinfo, a password file or certificates).
  alter role narad_app login;
  -- A timestamp as narad writes it (`rfc3339`: RFC 3339 in UTC, to the
  -- millisecond) has no locale-dependent field, so it is immutable;
  -- declared so, Citus lets a write's RETURNING use it (a coordinator
  -- refuses a stable function there, and to_char is one). Only here: on
  -- one Postgres a stable SQL function is inlined into its caller's plan,
  -- an immutable one whose body is not is called row by row.
  alter function rfc3339(timestamptz) immutable;
  -- Triggers on `events` and `blobs` write colocated rows of the same
  -- tenant (interrupt_deadlines, blob_chunks, blob_deletions): they run on
  -- the shard, beside the rows they read.
  perform set_config('citus.enable_unsafe_triggers', 'on', true);
  for t in
    select c.relname from pg_class c
    where c.relnamespace = 'public'::regnamespace and c.relkind in ('r', 'p')
      and c.relname <> all (narad_coordinator_tables())
      and not exists (select 1 from pg_dist_partition p where p.logicalrelid = c.oid)
    order by c.relname <> 'sessions', c.relname
  loop
    if t = 'sessions' then
      perform create_distributed_table('public.sessions', 'tenant_id');
    else
      perform create_distributed_table(format('public.%I', t), 'tenant_id',
                                       colocate_with => 'public.sessions');
    end if;
    done := done || t;
  end loop;
  return done;
end
$$;
revoke all on function narad_distribute() from public;
