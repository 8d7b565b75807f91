-- Approval expiry (spec §7.6 expiresAt, §7.7 decision "expired"): every
-- open interrupt with the time it was requested and its deadline (none
-- when it names none: a configured default may then apply), kept by a
-- trigger on the journal itself, so that the expiry sweeper finds the due
-- ones by index and no append path can forget to record one.
create table interrupt_deadlines (
  tenant_id     text        not null,
  session_id    text        not null,
  interrupt_id  text        not null,
  requested_at  timestamptz not null,
  expires_at    timestamptz,
  primary key (tenant_id, session_id, interrupt_id)
);

create index interrupt_deadlines_due on interrupt_deadlines (expires_at)
  where expires_at is not null;
create index interrupt_deadlines_undated on interrupt_deadlines (requested_at)
  where expires_at is null;

alter table interrupt_deadlines enable row level security;
alter table interrupt_deadlines force row level security;
create policy tenant_isolation on interrupt_deadlines
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
grant select, insert, delete on interrupt_deadlines to narad_app;

-- An RFC 3339 time as the schema admits it; null for anything Postgres
-- reads otherwise (never an error that would refuse the append).
create function interrupt_deadline_of(t text) returns timestamptz
language plpgsql stable set search_path = pg_catalog
as $$
begin
  return t::timestamptz;
exception when others then
  return null;
end
$$;

create function interrupt_deadlines_track() returns trigger
language plpgsql set search_path = pg_catalog, public
as $$
begin
  if new.type = 'interrupt.requested' then
    insert into public.interrupt_deadlines
      values (new.tenant_id, new.session_id, new.body ->> 'interruptId', now(),
              public.interrupt_deadline_of(new.body ->> 'expiresAt'))
      on conflict do nothing;
  else
    delete from public.interrupt_deadlines
      where tenant_id = new.tenant_id and session_id = new.session_id
        and interrupt_id = new.body ->> 'interruptId';
  end if;
  return null;
end
$$;

create trigger events_interrupt_deadlines after insert on events
  for each row when (new.type in ('interrupt.requested', 'interrupt.resolved'))
  execute function interrupt_deadlines_track();

-- The interrupts already open when this migration runs.
insert into interrupt_deadlines
  select e.tenant_id, e.session_id, e.body ->> 'interruptId',
         e.recorded_at,
         interrupt_deadline_of(e.body ->> 'expiresAt')
  from entities i
  join events e on e.tenant_id = i.tenant_id and e.session_id = i.session_id
   and e.type = 'interrupt.requested' and e.body ->> 'interruptId' = i.id
  where i.kind = 'interrupt' and i.state ->> 'decision' is null
  on conflict do nothing;

-- What the expiry sweeper has to do now, across tenants: up to max_rows
-- interrupts past their deadline, and (when default_seconds is given) up
-- to max_rows with none that were requested longer ago than that.
create function interrupt_deadlines_due(default_seconds double precision, max_rows int)
returns table (tenant_id text, session_id text, interrupt_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  (select d.tenant_id, d.session_id, d.interrupt_id from public.interrupt_deadlines d
   where d.expires_at is not null and d.expires_at <= now()
   order by d.expires_at limit max_rows)
  union all
  (select d.tenant_id, d.session_id, d.interrupt_id from public.interrupt_deadlines d
   where default_seconds is not null and d.expires_at is null
     and d.requested_at <= now() - make_interval(secs => default_seconds)
   order by d.requested_at limit max_rows)
$$;

revoke all on function interrupt_deadlines_due(double precision, int) from public;
grant execute on function interrupt_deadlines_due(double precision, int) to narad_app;
