-- Starts of top-level runs waiting for their session's slot (start-run with
-- onConflict = enqueue or interrupt). The append that frees the slot turns
-- the first one into run.started in the same transaction.
create table queued_starts (
  tenant_id  text        not null,
  session_id text        not null,
  queue_id   text        not null,
  -- Interrupting starts go before enqueued ones; then first come first served.
  priority   smallint    not null default 1,
  position   bigint      generated always as identity,
  -- The run.started proposal to append when the slot frees.
  proposal   jsonb       not null,
  created_at timestamptz not null default now(),
  primary key (tenant_id, session_id, queue_id)
);

create index queued_starts_in_order on queued_starts (tenant_id, session_id, priority, position);

alter table queued_starts enable row level security;
alter table queued_starts force row level security;
create policy tenant_isolation on queued_starts
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, delete on queued_starts to narad_app;
