-- Workflows asked to cancel while runs or interrupts of theirs were open
-- (cancel-workflow). The append that leaves such a workflow idle appends
-- workflow.cancelled in the same transaction.
create table pending_cancellations (
  tenant_id   text        not null,
  session_id  text        not null,
  workflow_id text        not null,
  reason      text,
  created_at  timestamptz not null default now(),
  primary key (tenant_id, session_id, workflow_id)
);

alter table pending_cancellations enable row level security;
alter table pending_cancellations force row level security;
create policy tenant_isolation on pending_cancellations
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, delete on pending_cancellations to narad_app;
