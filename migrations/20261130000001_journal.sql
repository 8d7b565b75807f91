-- The narad journal: sessions, the append-only event log, the rule engine's
-- state as entity rows, and the delivery outbox.
--
-- Every table is keyed tenant first (so that it can be distributed by
-- tenant), and row-level security confines every query to the tenant set
-- in `narad.tenant_id` for the transaction. The journal runs its
-- transactions as the role `narad_app`, which owns nothing, so that a query
-- that forgets its tenant filter still sees one tenant's rows only; without
-- `narad.tenant_id` it sees none.

do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'narad_app') then
    create role narad_app nologin;
  end if;
end
$$;

-- The connecting user may take the role for its transactions.
do $$
begin
  execute format('grant narad_app to %I', current_user);
exception when others then
  -- Already a member, or a superuser who needs no grant.
  null;
end
$$;

create table sessions (
  tenant_id        text        not null,
  session_id       text        not null,
  title            text,
  metadata         jsonb,
  created_at       timestamptz not null default now(),
  archived_at      timestamptz,
  -- The last sessionSequence; the row is locked for every append.
  session_sequence bigint      not null default 0,
  -- The rule engine's session core: the active top-level slot.
  core             jsonb       not null default '{}',
  primary key (tenant_id, session_id)
);

create index sessions_by_creation on sessions (tenant_id, created_at, session_id);

create table events (
  tenant_id         text        not null,
  session_id        text        not null,
  session_sequence  bigint      not null,
  event_id          text        not null,
  type              text        not null,
  root_run_id       text,
  run_id            text,
  run_sequence      bigint,
  workflow_id       text,
  workflow_sequence bigint,
  -- The event exactly as delivered: the proposal with its sequences.
  body              jsonb       not null,
  -- SHA-256 of the proposal (the event without its sequences): a retry with
  -- the same body is idempotent, another body under the same id conflicts.
  proposal_sha256   bytea       not null,
  recorded_at       timestamptz not null default now(),
  constraint events_pkey primary key (tenant_id, session_id, session_sequence),
  constraint events_event_id_key unique (tenant_id, event_id)
);

create index events_by_run on events (tenant_id, session_id, root_run_id, run_sequence)
  where root_run_id is not null;
create index events_by_workflow on events (tenant_id, session_id, workflow_id, workflow_sequence)
  where workflow_id is not null;

-- The rule engine's state, one row per entity (run, run journal, workflow,
-- interrupt, tool call, message, document, ...). Derived from `events`
-- alone: narad can rebuild it.
create table entities (
  tenant_id   text  not null,
  session_id  text  not null,
  kind        text  not null,
  id          text  not null,
  state       jsonb not null,
  -- For loading the open runs of a run journal with each append.
  root_run_id text generated always as (state ->> 'rootRunId') stored,
  open        boolean generated always as (state ->> 'state' in ('running', 'paused')) stored,
  primary key (tenant_id, session_id, kind, id)
);

create index entities_open_runs on entities (tenant_id, session_id, root_run_id)
  where kind = 'run' and open;
-- Interrupts and tool calls are found by id across a tenant's sessions.
create index entities_by_id on entities (tenant_id, kind, id)
  where kind in ('interrupt', 'tool_call');

-- Delivery log: one row per committed event, in commit-safe order. Readers
-- take rows whose transaction is older than every running one
-- (pg_snapshot_xmin), so that a position once passed is never filled in.
create table outbox (
  position         bigint generated always as identity primary key,
  tenant_id        text        not null,
  session_id       text        not null,
  session_sequence bigint      not null,
  event_id         text        not null,
  txid             xid8        not null default pg_current_xact_id(),
  created_at       timestamptz not null default now()
);

create index outbox_by_tenant on outbox (tenant_id, position);

-- Row-level security: every table, forced even for its owner.
alter table sessions enable row level security;
alter table sessions force row level security;
alter table events enable row level security;
alter table events force row level security;
alter table entities enable row level security;
alter table entities force row level security;
alter table outbox enable row level security;
alter table outbox force row level security;

create policy tenant_isolation on sessions
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
create policy tenant_isolation on events
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
create policy tenant_isolation on entities
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
create policy tenant_isolation on outbox
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));

grant usage on schema public to narad_app;
grant select, insert, update on sessions to narad_app;
-- Entities are derived state: repair replaces them.
grant select, insert, update, delete on entities to narad_app;
grant select, insert on events to narad_app;
grant select, insert, delete on outbox to narad_app;
