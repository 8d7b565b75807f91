-- Idempotency keys (the `Idempotency-Key` header of commands, session
-- creation, blob uploads and stream tickets): the first answer to a key,
-- kept per tenant with a fingerprint of the request that earned it, so
-- that a client which lost the answer can ask again and get the same one
-- instead of a second effect.
--
-- A row is written when a keyed request starts (`status` null: in flight,
-- held by its replica until `held_until`, which that replica pushes on
-- while the request runs), completed with the answer when it ends, and
-- deleted when it expires, when the answer was one that must not be kept
-- (a 5xx, a 429), or with its session or tenant.
create table idempotency_keys (
  tenant_id    text        not null,
  key          text        not null,
  fingerprint  bytea       not null,
  session_id   text,
  status       smallint,
  answer       bytea,
  content_type text,
  held_until   timestamptz not null,
  expires_at   timestamptz not null,
  created_at   timestamptz not null default now(),
  primary key (tenant_id, key)
);

create index idempotency_keys_by_session on idempotency_keys (tenant_id, session_id)
  where session_id is not null;
create index idempotency_keys_by_expiry on idempotency_keys (expires_at);

alter table idempotency_keys enable row level security;
alter table idempotency_keys force row level security;
create policy tenant_isolation on idempotency_keys
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, update, delete on idempotency_keys to narad_app;

-- The audit log tells a replayed answer from the request that earned it.
alter table audit add column replayed boolean not null default false;

-- Expired keys of every tenant, oldest first, at most `max_rows` at a time.
create function idempotency_keys_forget(max_rows int)
returns bigint
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
declare
  forgotten bigint;
begin
  delete from public.idempotency_keys k
  using (
    select tenant_id, key from public.idempotency_keys
    where expires_at < now()
    order by expires_at
    limit max_rows
  ) due
  where k.tenant_id = due.tenant_id and k.key = due.key;
  get diagnostics forgotten = row_count;
  return forgotten;
end
$$;
revoke all on function idempotency_keys_forget(int) from public;
grant execute on function idempotency_keys_forget(int) to narad_app;

-- A session's erasure takes its keys with it, as it takes its audit rows.
create or replace function erase_session(p_tenant text, p_session text, p_reason text)
returns bigint
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
declare
  erased bigint;
begin
  perform 1 from public.sessions
  where tenant_id = p_tenant and session_id = p_session for update;
  if not found then
    return null;
  end if;
  insert into public.erased_event_ids (tenant_id, event_id)
  select tenant_id, event_id from public.events
  where tenant_id = p_tenant and session_id = p_session
  on conflict do nothing;
  delete from public.events where tenant_id = p_tenant and session_id = p_session;
  get diagnostics erased = row_count;
  delete from public.outbox where tenant_id = p_tenant and session_id = p_session;
  delete from public.entities where tenant_id = p_tenant and session_id = p_session;
  delete from public.queued_starts where tenant_id = p_tenant and session_id = p_session;
  delete from public.pending_cancellations where tenant_id = p_tenant and session_id = p_session;
  delete from public.run_work where tenant_id = p_tenant and session_id = p_session;
  delete from public.client_calls where tenant_id = p_tenant and session_id = p_session;
  delete from public.executor_pauses where tenant_id = p_tenant and session_id = p_session;
  delete from public.interrupt_deadlines where tenant_id = p_tenant and session_id = p_session;
  delete from public.audit where tenant_id = p_tenant and session_id = p_session;
  delete from public.idempotency_keys where tenant_id = p_tenant and session_id = p_session;
  delete from public.stream_tickets
  where tenant_id = p_tenant and stream = 'session:' || p_session;
  delete from public.blob_chunks c using public.blobs b
  where b.tenant_id = p_tenant and b.session_id = p_session
    and c.tenant_id = b.tenant_id and c.blob_id = b.blob_id;
  delete from public.blobs where tenant_id = p_tenant and session_id = p_session;
  delete from public.sessions where tenant_id = p_tenant and session_id = p_session;
  insert into public.erased_sessions (tenant_id, session_id, reason)
  values (p_tenant, p_session, p_reason)
  on conflict (tenant_id, session_id) do update set erased_at = now(), reason = excluded.reason;
  return erased;
end
$$;

-- A tenant's erasure takes every key of the tenant.
create or replace function erase_tenant_rest(p_tenant text)
returns void
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
begin
  delete from public.executors where tenant_id = p_tenant;
  delete from public.extensions where tenant_id = p_tenant;
  delete from public.request_nonces where tenant_id = p_tenant;
  delete from public.stream_tickets where tenant_id = p_tenant;
  delete from public.audit where tenant_id = p_tenant;
  delete from public.idempotency_keys where tenant_id = p_tenant;
  delete from public.tenant_limits where tenant_id = p_tenant;
  delete from public.tenant_buckets where tenant_id = p_tenant;
  delete from public.open_streams where tenant_id = p_tenant;
  delete from public.outbox where tenant_id = p_tenant;
  delete from public.outbox_horizons where tenant_id = p_tenant;
end
$$;
