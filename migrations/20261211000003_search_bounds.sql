-- A search document holds the first 100,000 characters of what it
-- indexes. Postgres refuses a text-search document over 1 MB, and the
-- document of a message of many distinct short words is larger than its
-- text (2.2 MB from 1.3 MB measured): without a bound, a person's message
-- of a megabyte (NARAD_MAX_BODY_BYTES' default) failed its append with a
-- 500. 100,000 characters make a document of at most about 600 kB
-- whatever the words; the whole message stays in the journal.
--
-- Also: the tenant's lexeme is ANDed by search_hits itself, from the
-- transaction's narad.tenant_id, so that the tenant a search reads comes
-- from one place.
--
-- Documents of the indexes change only for what passed the bound, which
-- 20261211000004/5 re-index.

-- What a document and a passage read of some searchable JSON: itself, or
-- when its text is longer than the bound, the start of that text.
create function search_bounded(p_content jsonb) returns jsonb
language sql immutable parallel safe
return case
  when pg_catalog.octet_length(p_content::text) <= 100000 then p_content
  else pg_catalog.to_jsonb(pg_catalog.left(p_content::text, 100000)) end;

create or replace function search_document(p_tenant text, p_type text, p_body jsonb) returns tsvector
language sql immutable parallel safe
return pg_catalog.to_tsvector('english'::pg_catalog.regconfig,
         coalesce(public.search_bounded(public.search_content(p_type, p_body)), '""'::jsonb))
  operator(pg_catalog.||) public.search_tag('tenant', p_tenant)
  operator(pg_catalog.||) coalesce(public.search_tag('actor', p_body -> 'actor' ->> 'sub'), ''::tsvector);

create or replace function search_title(p_tenant text, p_title text) returns tsvector
language sql immutable parallel safe
return pg_catalog.to_tsvector('english'::pg_catalog.regconfig, pg_catalog.left(coalesce(p_title, ''), 100000))
  operator(pg_catalog.||) public.search_tag('tenant', p_tenant);

create or replace function search_hits(p_query tsquery, p_titles boolean)
returns table (session_id text, session_sequence bigint, at timestamptz, type text, message_id text)
language sql stable security definer set search_path = pg_catalog, public
as $$
  select e.session_id, e.session_sequence, e.recorded_at, e.type, e.body ->> 'messageId'
  from public.events e
  where e.tenant_id = current_setting('narad.tenant_id', true)
    and e.type in ('message.user.recorded', 'interrupt.requested', 'interrupt.resolved')
    and public.search_document(e.tenant_id, e.type, e.body)
      @@ (p_query && public.search_tag_query('tenant', current_setting('narad.tenant_id', true)))
  union all
  select s.session_id, null, s.created_at, null, null
  from public.sessions s
  where p_titles and s.tenant_id = current_setting('narad.tenant_id', true)
    and s.title is not null
    and public.search_title(s.tenant_id, s.title)
      @@ (p_query && public.search_tag_query('tenant', current_setting('narad.tenant_id', true)))
$$;
