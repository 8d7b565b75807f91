-- Runs asked to stop that nothing drives: a top-level run that no agent
-- runtime's work item holds (started bare, with no runtime and no queue),
-- open with stopRequested, whose run journal has taken no event for the
-- grace (in seconds) since. The runtime sweeper closes each with
-- run.cancelled (code stop_unanswered): a backend that drives the run
-- answers its stop within the grace, and one that does not has left it to
-- the server (§6.3: the run eventually emits a terminal; §6.2: who closes
-- it when its worker is unavailable is the implementation's choice).
create function undriven_stops(p_grace_seconds double precision, p_max int)
returns table (tenant_id text, session_id text, root_run_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select e.tenant_id, e.session_id, e.id
  from public.entities e
  where e.kind = 'run' and e.open and e.root_run_id = e.id
    and (e.state ->> 'stopRequested')::boolean
    and not exists (
      select 1 from public.run_work w
      where w.tenant_id = e.tenant_id and w.session_id = e.session_id
        and w.root_run_id = e.id and w.state <> 'done')
    and (select max(v.recorded_at) from public.events v
         where v.tenant_id = e.tenant_id and v.session_id = e.session_id
           and v.root_run_id = e.id)
        < now() - p_grace_seconds * interval '1 second'
  limit p_max
$$;

revoke all on function undriven_stops(double precision, int) from public;
grant execute on function undriven_stops(double precision, int) to narad_app;
