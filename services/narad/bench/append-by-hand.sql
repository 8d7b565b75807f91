-- The append a user would write by hand, as one pgbench transaction (the
-- baseline of BENCHMARKS.md's "against the append by hand"): one statement
-- bumps the session's sequence, writes the event and its outbox row.
-- Run by append-by-hand.sh; `:sessions` is set by it (-D sessions=N).
\set s random(1, :sessions)
with bumped as (
  update hand_sessions set seq = seq + 1 where id = :s returning id, seq
), written as (
  insert into hand_events (session_id, seq, body)
  select id, seq, '{"protocolVersion": "narad/v1", "type": "message.text.delta", "rootRunId": "r0", "runId": "r0", "messageId": "m0", "delta": "the quick brown fox jumps over the lazy dog "}'::jsonb
  from bumped
  returning session_id, seq
)
insert into hand_outbox (session_id, seq) select session_id, seq from written;
