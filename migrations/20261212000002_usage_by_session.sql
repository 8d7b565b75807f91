-- no-transaction
-- Usage per session (GET /v1/usage?by=session, for the console's sessions
-- list): a tenant's run terminals by session; partial, as
-- events_run_terminals_by_time.
create index concurrently if not exists events_run_terminals_by_session on events (tenant_id, session_id, recorded_at)
  where type in ('run.finished', 'run.error', 'run.cancelled');
