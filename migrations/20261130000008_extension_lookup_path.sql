-- The registration lookup runs as the table's owner: it names its table
-- with its schema and searches pg_temp last, so that no session's
-- temporary table can stand in for the registry.
create or replace function extension_for_signature(p_publisher text, p_name text)
returns table (tenant_id text, secret bytea, enabled boolean)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select e.tenant_id, e.secret, e.enabled from public.extensions e
  where e.publisher = p_publisher and e.name = p_name
$$;
