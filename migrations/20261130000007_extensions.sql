-- Registered extensions (seed 004): a publisher/name, unique across narad
-- because a signed request names it before any tenant is known, and the
-- HMAC secret it signs with.
create table extensions (
  publisher   text        not null,
  name        text        not null,
  tenant_id   text        not null,
  secret      bytea       not null,
  enabled     boolean     not null default true,
  created_at  timestamptz not null default now(),
  created_by  text        not null,
  primary key (publisher, name)
);

create index extensions_by_tenant on extensions (tenant_id, publisher, name);

-- Request ids of accepted signed calls, kept past the 60 s window so that
-- every replica refuses a replay.
create table request_nonces (
  tenant_id   text        not null,
  extension   text        not null,
  request_id  text        not null,
  seen_at     timestamptz not null default now(),
  primary key (tenant_id, extension, request_id)
);

-- Row-level security binds narad_app; it is not forced on the owner, so
-- that the one function below can read a registration across tenants.
alter table extensions enable row level security;
alter table request_nonces enable row level security;
alter table request_nonces force row level security;

create policy tenant_isolation on extensions
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));
create policy tenant_isolation on request_nonces
  using (tenant_id = current_setting('narad.tenant_id', true))
  with check (tenant_id = current_setting('narad.tenant_id', true));

grant select, insert, update on extensions to narad_app;
grant select, insert, delete on request_nonces to narad_app;

-- A signed request names its extension, not its tenant: this one function
-- reads a registration across tenants, and only the fields verification
-- needs. It runs as the table's owner, whom row-level security does not bind.
create function extension_for_signature(p_publisher text, p_name text)
returns table (tenant_id text, secret bytea, enabled boolean)
language sql stable security definer set search_path = public
as $$
  select tenant_id, secret, enabled from extensions
  where publisher = p_publisher and name = p_name
$$;

revoke all on function extension_for_signature(text, text) from public;
grant execute on function extension_for_signature(text, text) to narad_app;
