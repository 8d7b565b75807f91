-- Search (GET /v1/search): Postgres full-text search over what people said
-- and answered, with no second store.
--
-- What is searchable, and only it, goes into one GIN index on `events`,
-- partial on the three types that hold people's words: a person's message
-- (`message.user.recorded`), what an interrupt asks (`interrupt.requested`:
-- title, message) and how it was answered (`interrupt.resolved`: decision,
-- reason). Every other event (deltas, tool calls, state) pays only the
-- index's predicate on insert. Streamed assistant text is in deltas and is
-- not indexed.
--
-- Each indexed row's document holds, besides its words (English stemming,
-- stop words dropped), one lexeme naming its tenant and one naming its
-- actor (`nrdtenant<md5>`, `nrdactor<md5>`): a query ANDs its tenant's, so
-- the index answers with that tenant's rows only (GIN intersects the
-- posting lists) instead of every tenant's matches filtered afterwards,
-- and a filter by actor is one more lexeme.

-- The searchable words of an event, as JSON (strings, or an array of
-- strings): what to_tsvector and ts_headline read. Null for other types.
create function search_content(p_type text, p_body jsonb) returns jsonb
language sql immutable parallel safe
return case p_type
  when 'message.user.recorded' then
    case when pg_catalog.jsonb_typeof(p_body -> 'content') = 'array'
      then pg_catalog.jsonb_path_query_array(p_body -> 'content', '$[*].text')
      else p_body -> 'content' end
  when 'interrupt.requested' then
    pg_catalog.jsonb_path_query_array(p_body, '$.title')
      operator(pg_catalog.||) pg_catalog.jsonb_path_query_array(p_body, '$.message')
  when 'interrupt.resolved' then
    pg_catalog.jsonb_path_query_array(p_body, '$.decision')
      operator(pg_catalog.||) pg_catalog.jsonb_path_query_array(p_body, '$.reason')
  end;

-- The lexeme that names a tenant or an actor in search documents.
create function search_tag(p_kind text, p_name text) returns tsvector
language sql immutable parallel safe
return pg_catalog.to_tsvector('simple'::pg_catalog.regconfig,
  'nrd' operator(pg_catalog.||) p_kind operator(pg_catalog.||) pg_catalog.md5(p_name));

-- The same lexeme as a query.
create function search_tag_query(p_kind text, p_name text) returns tsquery
language sql immutable parallel safe
return pg_catalog.to_tsquery('simple'::pg_catalog.regconfig,
  'nrd' operator(pg_catalog.||) p_kind operator(pg_catalog.||) pg_catalog.md5(p_name));

-- An event's search document: its words, its tenant, its actor.
create function search_document(p_tenant text, p_type text, p_body jsonb) returns tsvector
language sql immutable parallel safe
return pg_catalog.to_tsvector('english'::pg_catalog.regconfig,
         coalesce(public.search_content(p_type, p_body), '""'::jsonb))
  operator(pg_catalog.||) public.search_tag('tenant', p_tenant)
  operator(pg_catalog.||) coalesce(public.search_tag('actor', p_body -> 'actor' ->> 'sub'), ''::tsvector);

-- A session title's search document: its words and its tenant.
create function search_title(p_tenant text, p_title text) returns tsvector
language sql immutable parallel safe
return pg_catalog.to_tsvector('english'::pg_catalog.regconfig, coalesce(p_title, ''))
  operator(pg_catalog.||) public.search_tag('tenant', p_tenant);

-- Both GIN indexes keep new entries in a pending list that every search
-- reads through; with the default limit (4 MB) a search of a rare word
-- spent 8-10 ms reading it. 256 kB keeps that under a millisecond and an
-- insert's share of the flushes small (measured on 50,000 messages: 66-71
-- µs per message with 4 MB, 78 with 256 kB, 110-125 with no pending list).
--
-- Titles change rarely and sit on the session row every append updates:
-- the update stays HOT (neither tenant_id nor title changes).
create index sessions_search on sessions using gin (search_title(tenant_id, title))
  with (gin_pending_list_limit = 256)
  where title is not null;

-- A redacted message is not found by the words it no longer shows (§9.4):
-- the search looks its redaction up here (few rows; other appends pay the
-- predicate only).
create index events_redactions on events (tenant_id, session_id, (body ->> 'messageId'))
  where type = 'message.redacted';

-- The index cannot serve narad_app's own query: row-level security
-- evaluates its tenant condition before any condition that is not
-- leakproof, and the text-search match (@@) is not, so Postgres scans
-- the tenant's rows and computes each document (measured: over 100,000
-- messages, seconds instead of milliseconds). The matching rows are read
-- by this function instead, as the tables' owner, confined to the tenant
-- the transaction is scoped to (`narad.tenant_id`, the setting the
-- policies read; none set: no rows). It returns positions only; the
-- caller reads everything else under row-level security. As for the
-- relay and erasure, the policies of `events` and `sessions` bind
-- narad_app and are not forced on their owner, which narad never connects
-- as (20261130000009_relay.sql, 20261202000006_erasure.sql).

create function search_hits(p_query tsquery, p_titles boolean)
returns table (session_id text, session_sequence bigint, at timestamptz, type text, message_id text)
language sql stable security definer set search_path = pg_catalog, public
as $$
  select e.session_id, e.session_sequence, e.recorded_at, e.type, e.body ->> 'messageId'
  from public.events e
  where e.tenant_id = current_setting('narad.tenant_id', true)
    and e.type in ('message.user.recorded', 'interrupt.requested', 'interrupt.resolved')
    and public.search_document(e.tenant_id, e.type, e.body) @@ p_query
  union all
  select s.session_id, null, s.created_at, null, null
  from public.sessions s
  where p_titles and s.tenant_id = current_setting('narad.tenant_id', true)
    and s.title is not null
    and public.search_title(s.tenant_id, s.title) @@ p_query
$$;

revoke all on function search_hits(tsquery, boolean) from public;
grant execute on function search_hits(tsquery, boolean) to narad_app;
