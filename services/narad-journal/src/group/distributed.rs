//! The group's write on a distributed database (a Citus coordinator).
//!
//! The same statement as [`WRITE`](super::WRITE), with the same 49
//! parameters, but every insert is a `values` list (row `i` reads element
//! `i` of each array parameter) instead of a `select … from unnest(…)`.
//! Citus routes a statement whose inserts are `values` lists and whose
//! updates name the tenant to the one worker holding that tenant's shard
//! group, and evaluates the rows' defaults on the coordinator: the stream
//! position (`stream_xid()`, the coordinator's transaction id plus the
//! stream clock) and the outbox's `position`. An `insert … select`, by
//! contrast, is pulled through the coordinator and copied into the shards
//! with `COPY`, which row-level security refuses, and its defaults would be
//! the worker's.
//!
//! The text depends on how many rows each insert has, so one statement is
//! prepared per shape (per connection), with the parameters' types of the
//! statement on one Postgres (an insert left out names none of its
//! parameters, whose types would be unknown).

/// How many rows each insert of a write has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    pub events: usize,
    pub entities: usize,
    pub client_calls: usize,
    pub pauses: usize,
    pub work: usize,
}

impl Shape {
    /// The shape of a tenant's write.
    pub(super) fn of(rows: &super::WriteRows<'_>) -> Shape {
        Shape {
            events: rows.session_id.len(),
            entities: rows.entity_session.len(),
            client_calls: rows.client.session.len(),
            pauses: rows.client.paused_session.len(),
            work: rows.work.added_session.len(),
        }
    }
}

/// One `values` list of `rows` rows: `$1` (the tenant) first, then each of
/// `columns` (an array parameter with its type, or a constant) at row `i`.
fn values(rows: usize, columns: &[&str]) -> String {
    let mut sql = String::from("values ");
    for i in 1..=rows {
        if i > 1 {
            sql.push_str(", ");
        }
        sql.push_str("($1");
        for c in columns {
            sql.push_str(", ");
            if let Some(param) = c.strip_prefix('$') {
                sql.push_str(&format!("(${param})[{i}]"));
            } else {
                sql.push_str(c);
            }
        }
        sql.push(')');
    }
    sql
}

/// The write statement for `shape`: an insert with no rows is left out.
pub(super) fn write_statement(shape: Shape) -> String {
    let mut ctes: Vec<String> = Vec::new();
    if shape.events > 0 {
        const EVENT_COLUMNS: [&str; 11] = [
            "$2::text[]",
            "$3::bigint[]",
            "$4::text[]",
            "$5::text[]",
            "$6::text[]",
            "$7::text[]",
            "$8::bigint[]",
            "$9::text[]",
            "$10::bigint[]",
            "$11::jsonb[]",
            "$12::bytea[]",
        ];
        ctes.push(format!(
            "inserted as (insert into events (tenant_id, session_id, session_sequence, event_id, \
             type, root_run_id, run_id, run_sequence, workflow_id, workflow_sequence, body, \
             proposal_sha256) {})",
            values(shape.events, &EVENT_COLUMNS)
        ));
        ctes.push(format!(
            "outboxed as (insert into outbox (tenant_id, session_id, session_sequence, event_id) {})",
            values(shape.events, &EVENT_COLUMNS[..3])
        ));
    }
    if shape.entities > 0 {
        ctes.push(format!(
            "upserted as (insert into entities (tenant_id, session_id, kind, id, state) {} \
             on conflict (tenant_id, session_id, kind, id) do update set state = excluded.state)",
            values(
                shape.entities,
                &["$13::text[]", "$14::text[]", "$15::text[]", "$16::jsonb[]"]
            )
        ));
    }
    if shape.client_calls > 0 {
        ctes.push(format!(
            "client_started as (insert into client_calls (tenant_id, session_id, tool_call_id, \
             root_run_id, run_id, executor_id, tool_name, args, closed) {})",
            values(
                shape.client_calls,
                &[
                    "$20::text[]",
                    "$21::text[]",
                    "$22::text[]",
                    "$23::text[]",
                    "$24::text[]",
                    "$25::text[]",
                    "$26::jsonb[]",
                    "$27::bool[]",
                ]
            )
        ));
    }
    if shape.pauses > 0 {
        ctes.push(format!(
            "executor_paused as (insert into executor_pauses (tenant_id, session_id, run_id, \
             root_run_id, executor_id, wait_id) {} \
             on conflict (tenant_id, session_id, run_id) do update \
             set wait_id = excluded.wait_id, executor_id = excluded.executor_id, \
             paused_at = excluded.paused_at)",
            values(
                shape.pauses,
                &[
                    "$30::text[]",
                    "$31::text[]",
                    "$32::text[]",
                    "$33::text[]",
                    "$34::text[]",
                ]
            )
        ));
    }
    if shape.work > 0 {
        ctes.push(format!(
            "work_added as (insert into run_work (tenant_id, session_id, root_run_id, queue, \
             state, reason, on_lost, max_attempts, cursor, stop_requested, workflow_id) {} \
             on conflict do nothing)",
            values(
                shape.work,
                &[
                    "$37::text[]",
                    "$38::text[]",
                    "$39::text[]",
                    "'ready'",
                    "'started'",
                    "$40::text[]",
                    "$41::int[]",
                    "$42::bigint[]",
                    "$48::bool[]",
                    "$49::text[]",
                ]
            )
        ));
    }
    ctes.push(super::WRITE_CHANGES.to_owned());
    format!("with {}{}", ctes.join(",\n"), super::WRITE_SESSIONS)
}
