-- An organisation whose erasure was asked for is closed for good: its
-- credentials are refused on every replica, and no session is created for
-- it (so that its erasure, which works through its sessions, finishes
-- whatever its clients do). Its id stays closed, as an erased session's
-- does.
--
-- Session creation takes this lock shared and then looks for an erasure;
-- an erasure request takes it exclusively to record itself: a session
-- being created while the erasure is asked for commits before the request
-- does (and the sweeper erases it), or sees the request and is refused.

-- The organisations whose erasure was asked for, across tenants (every
-- replica's list of closed organisations).
create function closed_tenants()
returns table (tenant_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select e.tenant_id from public.tenant_erasures e
$$;

revoke all on function closed_tenants() from public;
grant execute on function closed_tenants() to narad_app;
