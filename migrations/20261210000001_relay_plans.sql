-- The relay's read keeps its plan.
--
-- relay_after was a SQL function with SECURITY DEFINER (it reads every
-- tenant's outbox rows through row-level security): such a function is
-- never inlined, and a SQL function parses, analyzes and plans its body
-- at every call. Every relay wake-up (one per committed append at one
-- writer) paid 458 µs of Postgres time, 218 of them planning, for a read
-- that finds one row in 35 µs. A PL/pgSQL body keeps the prepared
-- statement of its query for the connection's life, and its plan is made
-- once (a generic plan: left to choose, Postgres still planned it at every
-- call); the statement is the same.
create or replace function relay_after(after_txid bigint, after_position bigint, max_rows int)
returns table (relay_txid bigint, relay_position bigint, tenant_id text, session_id text,
               session_sequence bigint, event_id text, body jsonb, authority boolean)
language plpgsql stable security definer
set search_path = pg_catalog, public, pg_temp
set plan_cache_mode = force_generic_plan
as $$
#variable_conflict use_column
begin
  return query
  select o.txid::text::bigint, o.position, o.tenant_id, o.session_id, o.session_sequence,
         o.event_id,
         coalesce(o.body, (select e.body from public.events e
                           where e.tenant_id = o.tenant_id and e.session_id = o.session_id
                             and e.session_sequence = o.session_sequence)),
         o.body is null
  from public.outbox o
  where (o.txid, o.position) > (after_txid::text::xid8, after_position)
    and o.txid < public.stream_horizon()
  order by o.txid, o.position
  limit max_rows;
end
$$;
