-- The approvals inbox (GET /v1/interrupts): a tenant's open interrupts,
-- and the interrupt.requested event of each, found without a scan.
create index entities_open_interrupts on entities (tenant_id)
  where kind = 'interrupt' and state ->> 'decision' is null;
create index events_interrupt_requests on events (tenant_id, session_id, (body ->> 'interruptId'))
  where type = 'interrupt.requested';
