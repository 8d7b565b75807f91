-- Where a blob's bytes live. `postgres`: rows of blob_chunks. `objects`:
-- an S3-compatible object store (NARAD_BLOB_STORE=s3://bucket/prefix), one
-- object per chunk at {prefix}/{tenant}/{blob}/{seq}. A blob keeps the store
-- and the chunk size it was written with, so a deployment that moves its
-- bytes to an object store still serves the blobs Postgres holds.
alter table blobs add column store text not null default 'postgres'
  check (store in ('postgres', 'objects'));
alter table blobs add column chunk_bytes int not null default 1048576
  check (chunk_bytes > 0);

-- A blob's bytes go with its row, whichever statement deletes it (an
-- erasure, a refused upload, the collector of unreferenced uploads): the
-- trigger below deletes its chunk rows, or queues its objects here, since
-- no transaction can delete objects; the erasure sweeper deletes them and
-- then the queue row. The trigger's own statement sees a chunk a
-- concurrent upload committed while the row's deletion waited for it.
create table blob_deletions (
  tenant_id  text        not null,
  blob_id    text        not null,
  queued_at  timestamptz not null default now(),
  primary key (tenant_id, blob_id)
);
alter table blob_deletions enable row level security;
create index blob_deletions_by_age on blob_deletions (queued_at);

create function blob_bytes_deleted() returns trigger
language plpgsql security definer set search_path = pg_catalog, public, pg_temp
as $$
begin
  if old.store = 'objects' then
    insert into public.blob_deletions (tenant_id, blob_id)
    values (old.tenant_id, old.blob_id)
    on conflict do nothing;
  else
    delete from public.blob_chunks
    where tenant_id = old.tenant_id and blob_id = old.blob_id;
  end if;
  return old;
end
$$;

create trigger blobs_bytes_deleted after delete on blobs
  for each row execute function blob_bytes_deleted();

-- The sweeper's list, oldest first, across tenants.
create function blob_deletions_due(p_max int)
returns table (tenant_id text, blob_id text)
language sql stable security definer set search_path = pg_catalog, public, pg_temp
as $$
  select d.tenant_id, d.blob_id from public.blob_deletions d
  order by d.queued_at limit p_max
$$;

-- A queued blob whose objects are gone.
create function blob_deletion_done(p_tenant text, p_blob text)
returns void
language sql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
  delete from public.blob_deletions where tenant_id = p_tenant and blob_id = p_blob
$$;

revoke all on function blob_bytes_deleted() from public;
revoke all on function blob_deletions_due(int) from public;
revoke all on function blob_deletion_done(text, text) from public;
grant execute on function blob_deletions_due(int) to narad_app;
grant execute on function blob_deletion_done(text, text) to narad_app;
