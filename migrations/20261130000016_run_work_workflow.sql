-- The workflow a queued run belongs to, so that the runtime-lease fence
-- also covers the workflow-scoped events its holder appends (a workflow
-- interrupt, a workflow step), which carry no run position.
alter table run_work add column workflow_id text;
create index run_work_by_workflow on run_work (tenant_id, session_id, workflow_id)
  where workflow_id is not null;
