-- Uploads never finished, across tenants, older than `p_age_seconds`: the
-- collector settles the events that named them (`*.failed`, code
-- upload_incomplete) and deletes them.
create function blobs_abandoned(p_age_seconds double precision, p_max int)
returns table (tenant_id text, blob_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select b.tenant_id, b.blob_id from public.blobs b
  where b.state = 'uploading'
    and b.created_at < now() - make_interval(secs => p_age_seconds)
  order by b.created_at
  limit p_max
$$;

revoke all on function blobs_abandoned(double precision, int) from public;
grant execute on function blobs_abandoned(double precision, int) to narad_app;
