-- no-transaction
-- The search index on events (see 20261211000001_search.sql), built
-- without blocking appends on a database that already holds a journal.
create index concurrently if not exists events_search on events
  using gin (search_document(tenant_id, type, body))
  with (gin_pending_list_limit = 256)
  where type in ('message.user.recorded', 'interrupt.requested', 'interrupt.resolved');
