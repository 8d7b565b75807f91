-- no-transaction
-- Usage over time (GET /v1/usage, narad-journal's usage.rs): a tenant's run
-- terminals by the time they were recorded, for usage per day. Partial, so
-- an append writes it once per run (its terminal) and no other event pays
-- more than the predicate; built without blocking appends on a database
-- that already holds a journal.
create index concurrently if not exists events_run_terminals_by_time on events (tenant_id, recorded_at)
  where type in ('run.finished', 'run.error', 'run.cancelled');
