-- Commands name runs and workflows by id alone (stop-run): find them across
-- a tenant's sessions as interrupts and tool calls already are.
drop index entities_by_id;
create index entities_by_id on entities (tenant_id, kind, id)
  where kind in ('interrupt', 'tool_call', 'run', 'workflow');
