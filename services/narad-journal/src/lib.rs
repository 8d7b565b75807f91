//! The narad journal: Postgres migrations, the append transaction (tenant
//! scoping, session lock, deduplication, the rule engine, sequence
//! assignment, projections and outbox in one transaction), history reads,
//! executor leases and execution tokens.
//!
//! Empty for now: the wire model it stores lives in `narad-protocol`.
