-- When a chat front end last opened a stream on a session (`POST /v1/chat`,
-- its reconnect `GET /v1/chat/{sessionId}/stream`, `POST /v1/ag-ui`): a
-- front end whose stream broke off (the transport's abort: `useChat`'s
-- `stop()`, AG-UI's `abortRun()`) stops its run after a grace, unless a
-- front end came back to the session meanwhile, on any replica (a reload
-- with `resume: true`, a rejoin). One row per session, written only when a
-- front end opens a stream; erased with its session and its tenant.
create table front_end_returns (
  tenant_id   text        not null,
  session_id  text        not null,
  returned_at timestamptz not null default now(),
  primary key (tenant_id, session_id)
);

alter table front_end_returns enable row level security;
alter table front_end_returns force row level security;
create policy tenant_isolation on front_end_returns
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, update, delete on front_end_returns to narad_app;

-- A session's erasure takes its row with it.
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
  delete from public.front_end_returns where tenant_id = p_tenant and session_id = p_session;
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

-- A tenant's erasure takes every row of the tenant.
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
  delete from public.front_end_returns where tenant_id = p_tenant;
  delete from public.tenant_limits where tenant_id = p_tenant;
  delete from public.tenant_buckets where tenant_id = p_tenant;
  delete from public.open_streams where tenant_id = p_tenant;
  delete from public.outbox where tenant_id = p_tenant;
  delete from public.outbox_horizons where tenant_id = p_tenant;
end
$$;
