-- The one-round-trip append's guard.
--
-- A process that has just appended to a session knows its state as
-- stored (the session row, the entities its appends touch), and can decide
-- the next append to it without reading them again: it sends BEGIN, this
-- guard, the write and COMMIT in one round trip instead of two. The guard
-- makes that safe. In the append's own transaction it
--  - locks the sessions without waiting (a session locked by another
--    transaction fails the guard: the two-round-trip append skips it and
--    appends it alone) and finds each row version the process last saw
--    (its xmin): any other writer of a session row (an append of another
--    replica, a rebuild, an archive) made a new version, so what the
--    process knows is stale;
--  - finds none of the appends' eventIds stored or erased (a retry is
--    answered from the stored events by the two-round-trip append);
--  - for a backend's appends (no runtime lease), finds no run journal they
--    touch held by an agent runtime, and share-locks those work items until
--    the transaction ends (the fence);
-- and raises SQLSTATE NR001 otherwise (55P03 for a locked session), which aborts the transaction (its
-- pipelined write and COMMIT write nothing): the process then appends the
-- same requests the two-round-trip way. It returns the transaction's id as
-- a row version's xmin reads, for the process to remember.
--
-- The lookups are by key whatever the statistics say (events grows by
-- every event; see the eventId lookup of the two-round-trip append).
create function append_guard(p_tenant text, p_sessions text[], p_xmins text[],
                             p_event_ids text[], p_fenced_sessions text[], p_fenced_roots text[])
returns text
language plpgsql
set enable_seqscan = off
set enable_bitmapscan = off
set plan_cache_mode = force_generic_plan
as $$
declare
  seen int;
begin
  select count(*) into seen from (
    select 1 from sessions s
    join unnest(p_sessions, p_xmins) as g(session_id, xmin)
      on s.session_id = g.session_id and s.xmin = g.xmin::xid
    where s.tenant_id = p_tenant
    order by s.session_id
    for update of s nowait) as locked;
  if seen <> cardinality(p_sessions) then
    raise exception 'a session changed since this process last appended to it'
      using errcode = 'NR001';
  end if;
  if exists (select 1 from events where tenant_id = p_tenant and event_id = any(p_event_ids))
     or exists (select 1 from erased_event_ids
                where tenant_id = p_tenant and event_id = any(p_event_ids)) then
    raise exception 'an eventId of the appends is taken' using errcode = 'NR001';
  end if;
  if cardinality(p_fenced_roots) > 0 then
    perform 1 from run_work w
      join unnest(p_fenced_sessions, p_fenced_roots) as f(session_id, root_run_id)
        on w.session_id = f.session_id and w.root_run_id = f.root_run_id
      where w.tenant_id = p_tenant
      for share of w;
    if exists (select 1 from run_work w
               join unnest(p_fenced_sessions, p_fenced_roots) as f(session_id, root_run_id)
                 on w.session_id = f.session_id and w.root_run_id = f.root_run_id
               where w.tenant_id = p_tenant and w.state = 'claimed') then
      raise exception 'a run journal of the appends is held by an agent runtime'
        using errcode = 'NR001';
    end if;
  end if;
  return (pg_current_xact_id()::text::numeric % 4294967296)::text;
end
$$;
