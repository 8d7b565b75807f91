-- Extension names are a tenant's own: two organisations may register the
-- same publisher/name. A signed call names its organisation in
-- Narad-Extension (org/publisher/name), so its registration is read within
-- that tenant, under row-level security like every other table, and the
-- cross-tenant lookup is gone.
alter table extensions drop constraint extensions_pkey;
drop index extensions_by_tenant;
alter table extensions add primary key (tenant_id, publisher, name);
alter table extensions force row level security;
drop function extension_for_signature(text, text);
