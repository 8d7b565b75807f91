-- Attachment and artifact bytes (§9.5): events carry a reference
-- (`narad://blobs/{blobId}`), the bytes live here, in chunks of at most
-- 1 MiB, with the tenancy of the journal. A blob belongs to one session and
-- is erased with it.
create table blobs (
  tenant_id    text        not null,
  blob_id      text        not null,
  session_id   text        not null,
  name         text        not null,
  media_type   text        not null,
  size_bytes   bigint      not null default 0,
  -- SHA-256 of the bytes, once stored.
  sha256       bytea,
  -- uploading: bytes arriving; stored: complete and digested.
  state        text        not null default 'uploading'
                 check (state in ('uploading', 'stored')),
  created_at   timestamptz not null default now(),
  stored_at    timestamptz,
  primary key (tenant_id, blob_id)
);

create index blobs_by_session on blobs (tenant_id, session_id);
-- Uploads never finished, for the collector.
create index blobs_uploading on blobs (created_at) where state = 'uploading';

create table blob_chunks (
  tenant_id  text  not null,
  blob_id    text  not null,
  seq        int   not null,
  data       bytea not null,
  primary key (tenant_id, blob_id, seq)
);

-- Chunks are written once and read whole: no compression of bytes that are
-- mostly compressed already (images, PDFs, archives).
alter table blob_chunks alter column data set storage external;

alter table blobs enable row level security;
alter table blobs force row level security;
create policy tenant_isolation on blobs
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
alter table blob_chunks enable row level security;
alter table blob_chunks force row level security;
create policy tenant_isolation on blob_chunks
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, update, delete on blobs, blob_chunks to narad_app;

-- Erasing a session erases its blobs too.
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

-- Events that name a blob, found without reading a session's history.
create index events_blob_references on events (tenant_id, session_id, (body ->> 'uri'))
  where body ->> 'uri' like 'narad://blobs/%';
create index blobs_by_age on blobs (created_at);

-- Blobs older than `p_age_seconds` that no event names (uploads never
-- referenced, or never finished), across tenants: the collector's list.
create function blobs_unreferenced(p_age_seconds double precision, p_max int)
returns table (tenant_id text, blob_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select b.tenant_id, b.blob_id from public.blobs b
  where b.created_at < now() - make_interval(secs => p_age_seconds)
    and not exists (
      select 1 from public.events e
      where e.tenant_id = b.tenant_id and e.session_id = b.session_id
        and e.body ->> 'uri' like 'narad://blobs/%'
        and e.body ->> 'uri' = 'narad://blobs/' || b.blob_id)
  order by b.created_at
  limit p_max
$$;

revoke all on function blobs_unreferenced(double precision, int) from public;
grant execute on function blobs_unreferenced(double precision, int) to narad_app;

-- Read across tenants by the function above, as the table's owner.
alter table blobs no force row level security;
