-- Per-tenant rate limits and quotas, shared by every replica through the
-- database (narad has no other stateful dependency).

-- Token buckets: one row per tenant and rate (`events`, `commands`). A
-- replica takes tokens in small chunks and spends them locally, so the row
-- is touched once per chunk, not once per request.
create table tenant_buckets (
  tenant_id    text             not null,
  bucket       text             not null,
  tokens       double precision not null,
  refilled_at  timestamptz      not null,
  primary key (tenant_id, bucket)
);

-- Row-level security binds the journal's role; the functions below, run
-- as the table's owner across tenants, are not bound (no `force`).
alter table tenant_buckets enable row level security;
create policy tenant_isolation on tenant_buckets
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));

-- Takes tokens from a bucket refilled at `rate` per second up to `burst`.
-- `need` tokens must be there (at most `burst` of them: a batch larger
-- than the burst drains the bucket and leaves a debt, so the average rate
-- holds); up to `want` are taken when there are more. Answers the tokens
-- granted (0: refused) and, when refused, the seconds until `need` are.
create function take_tokens(p_tenant text, p_bucket text, p_rate double precision,
                            p_burst double precision, p_need double precision,
                            p_want double precision)
returns table (granted double precision, wait_seconds double precision)
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
declare
  available double precision;
  required  double precision := least(p_need, p_burst);
  taken     double precision;
begin
  insert into public.tenant_buckets as b (tenant_id, bucket, tokens, refilled_at)
  values (p_tenant, p_bucket, p_burst, clock_timestamp())
  on conflict (tenant_id, bucket) do update
    set tokens = least(p_burst, b.tokens
                   + p_rate * extract(epoch from clock_timestamp() - b.refilled_at)),
        refilled_at = clock_timestamp()
  returning b.tokens into available;
  if available < required then
    return query select 0::double precision, (required - available) / p_rate;
    return;
  end if;
  taken := greatest(p_need, least(p_want, available));
  update public.tenant_buckets set tokens = tokens - taken
  where tenant_id = p_tenant and bucket = p_bucket;
  return query select taken, 0::double precision;
end
$$;

revoke all on function take_tokens(text, text, double precision, double precision,
                                   double precision, double precision) from public;
grant execute on function take_tokens(text, text, double precision, double precision,
                                      double precision, double precision) to narad_app;

-- Replicas alive: each says so every few seconds. Open streams of a
-- replica not heard from count no more, and are deleted.
create table replicas (
  replica_id  text        primary key,
  seen_at     timestamptz not null default now()
);

-- The open streams of tenants under an open-stream limit, on every replica.
create table open_streams (
  stream_id   text        primary key,
  tenant_id   text        not null,
  replica_id  text        not null,
  opened_at   timestamptz not null default now()
);

create index open_streams_by_tenant on open_streams (tenant_id, replica_id);
-- Read and written only by the functions below.
alter table open_streams enable row level security;
create policy tenant_isolation on open_streams
  using (tenant_id = current_setting('narad.tenant_id', true));
create index open_streams_by_replica on open_streams (replica_id);

-- Registers a stream if the tenant has fewer than `p_max` open on live
-- replicas (serialised per tenant, so that two replicas cannot both take
-- the last place). Answers whether it was registered.
create function open_stream(p_tenant text, p_stream text, p_replica text, p_max bigint,
                            p_alive_seconds double precision)
returns boolean
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
declare
  open_now bigint;
begin
  perform pg_advisory_xact_lock(hashtext('narad.open_streams'), hashtext(p_tenant));
  insert into public.replicas (replica_id, seen_at) values (p_replica, now())
  on conflict (replica_id) do update set seen_at = now();
  select count(*) into open_now
  from public.open_streams s join public.replicas r using (replica_id)
  where s.tenant_id = p_tenant
    and r.seen_at > now() - make_interval(secs => p_alive_seconds);
  if open_now >= p_max then
    return false;
  end if;
  insert into public.open_streams (stream_id, tenant_id, replica_id)
  values (p_stream, p_tenant, p_replica);
  return true;
end
$$;

create function close_stream(p_stream text)
returns void
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  delete from public.open_streams where stream_id = p_stream
$$;

-- A replica says it is alive, and forgets the streams of replicas that
-- have not said so for `p_dead_seconds`.
create function replica_alive(p_replica text, p_dead_seconds double precision)
returns void
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
begin
  insert into public.replicas (replica_id, seen_at) values (p_replica, now())
  on conflict (replica_id) do update set seen_at = now();
  delete from public.open_streams s using public.replicas r
  where s.replica_id = r.replica_id
    and r.seen_at < now() - make_interval(secs => p_dead_seconds);
  delete from public.replicas
  where seen_at < now() - make_interval(secs => p_dead_seconds);
end
$$;

revoke all on function open_stream(text, text, text, bigint, double precision) from public;
revoke all on function close_stream(text) from public;
revoke all on function replica_alive(text, double precision) from public;
grant execute on function open_stream(text, text, text, bigint, double precision) to narad_app;
grant execute on function close_stream(text) to narad_app;
grant execute on function replica_alive(text, double precision) to narad_app;
