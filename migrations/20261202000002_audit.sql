-- The audit log (GET /v1/audit): every command and admin action of a
-- tenant, who did it (sub, extension), its request id, its outcome and
-- the events it appended. Rows naming a session are kept as long as the
-- session's journal.
create table audit (
  tenant_id    text        not null,
  position     bigint      generated always as identity,
  at           timestamptz not null default now(),
  session_id   text,
  actor        jsonb       not null,
  action       text        not null,
  request_id   text,
  status       int         not null,
  code         text,
  event_ids    text[]      not null default '{}',
  primary key (tenant_id, position)
);

create index audit_by_session on audit (tenant_id, session_id, position);
create index audit_by_action on audit (tenant_id, action, position);

alter table audit enable row level security;
alter table audit force row level security;
create policy tenant_isolation on audit
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert on audit to narad_app;
