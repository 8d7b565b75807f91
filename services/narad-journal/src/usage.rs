//! Token usage over time: the `usage` run terminals carried (§7.5), summed
//! per day (in a time zone the reader names) or per session, and split by
//! the model each run named in its `run.started` `input.model`. Read by
//! the console's operations page and sessions list (`GET /v1/usage`),
//! which price it with the operator's price table.
//!
//! Every run terminal (`run.finished`, `run.error`, `run.cancelled`) of
//! every run, nested ones included, counts once: a runtime that reports a
//! parent's usage as the sum of its children's is counted twice, as the
//! console's session view counts it.

use std::collections::BTreeMap;

use serde::Serialize;
use tokio_postgres::error::SqlState;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// The most sessions one read of usage per session names.
pub const MAX_SESSIONS: usize = 100;

/// How usage is grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum UsageGrouping {
    /// By the day the terminal was recorded, in the query's time zone.
    Day,
    /// By session.
    Session,
}

impl UsageGrouping {
    /// The grouping named `name` (`day`, `session`).
    pub fn parse(name: &str) -> Option<UsageGrouping> {
        match name {
            "day" => Some(UsageGrouping::Day),
            "session" => Some(UsageGrouping::Session),
            _ => None,
        }
    }
}

/// A read of usage.
#[derive(Debug, Clone)]
pub struct UsageQuery {
    /// How to group.
    pub by: UsageGrouping,
    /// Terminals recorded at or after this time (microseconds since the epoch).
    pub since: i64,
    /// Terminals recorded before this time.
    pub until: i64,
    /// The time zone days are counted in: an IANA name (`Europe/Paris`) or
    /// `UTC`.
    pub zone: String,
    /// Only these sessions (at most [`MAX_SESSIONS`]); none: every session.
    pub sessions: Option<Vec<String>>,
}

/// The usage of one day or session and one model.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageBucket {
    /// The day (`YYYY-MM-DD`, in the query's zone) or the session id.
    pub key: String,
    /// The model its runs named (`input.model` of their `run.started`);
    /// absent for runs that named none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub model: Option<String>,
    /// The run terminals counted.
    pub runs: u64,
    /// Each usage counter summed (`inputTokens`, `outputTokens`, …).
    pub usage: BTreeMap<String, f64>,
}

/// The statement: terminals in the window, each with its run's model,
/// counted and summed per key and model in one pass (each terminal is one
/// row per counter; its first counter, or its lack of any, counts the
/// run: the protocol admits numbers alone in `usage`). A day is grouped as
/// a date and formatted once per group. `$4` the zone, checked once before
/// any row is read (a constant condition), so that a zone Postgres does
/// not know is refused even where nothing would be summed; `$5` the
/// sessions.
fn statement(by: UsageGrouping) -> String {
    let (key, shown) = match by {
        UsageGrouping::Day => (
            "(t.recorded_at at time zone $4)::date",
            "to_char(key, 'YYYY-MM-DD')",
        ),
        UsageGrouping::Session => ("t.session_id", "key"),
    };
    format!(
        "with terminals as ( \
           select {key} as key, m.model, t.body -> 'usage' as usage \
           from events t \
           left join lateral ( \
             select s.body -> 'input' ->> 'model' as model from events s \
             where s.tenant_id = t.tenant_id and s.session_id = t.session_id \
               and s.root_run_id = t.root_run_id and s.run_id = t.run_id and s.type = 'run.started' \
             order by s.run_sequence limit 1) m on true \
           where t.tenant_id = $1 and t.type in ('run.finished', 'run.error', 'run.cancelled') \
             and t.recorded_at >= timestamptz 'epoch' + $2::bigint * interval '1 microsecond' \
             and t.recorded_at < timestamptz 'epoch' + $3::bigint * interval '1 microsecond' \
             and ($5::text[] is null or t.session_id = any($5)) \
             and (now() at time zone $4::text) is not null) \
         select {shown}, model, sum(runs)::bigint, \
           coalesce(jsonb_object_agg(counter, total) filter (where counter is not null), '{{}}') \
         from ( \
           select t.key, t.model, u.key as counter, sum((u.value #>> '{{}}')::numeric) as total, \
             count(*) filter (where u.ordinality is null or u.ordinality = 1) as runs \
           from terminals t \
           left join lateral jsonb_each(case when jsonb_typeof(t.usage) = 'object' then t.usage end) \
             with ordinality u(key, value, ordinality) on jsonb_typeof(u.value) = 'number' \
           group by t.key, t.model, u.key) c \
         group by key, model \
         order by key, model nulls last"
    )
}

impl Journal {
    /// `tenant`'s usage in the query's window, grouped as it asks, ordered
    /// by key then model. A time zone Postgres does not know is a
    /// [`JournalError::InvalidParameter`] of `zone`.
    pub async fn usage(
        &self,
        tenant: &TenantId,
        query: &UsageQuery,
    ) -> Result<Vec<UsageBucket>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let stmt = c.prepare_cached(&statement(query.by)).await?;
            let rows = c
                .query(
                    &stmt,
                    &[
                        &tenant.as_str(),
                        &query.since,
                        &query.until,
                        &query.zone,
                        &query.sessions,
                    ],
                )
                .await
                .map_err(|e| match e.code() {
                    Some(&SqlState::INVALID_PARAMETER_VALUE) => JournalError::InvalidParameter {
                        parameter: "zone",
                        message: format!(
                            "{:?} is not a time zone: name one as the IANA database does (Europe/Paris), or UTC",
                            query.zone
                        ),
                    },
                    _ => e.into(),
                })?;
            rows.iter()
                .map(|r| {
                    let usage: serde_json::Value = r.get(3);
                    Ok(UsageBucket {
                        key: r.get(0),
                        model: r.get(1),
                        runs: r.get::<_, i64>(2).unsigned_abs(),
                        usage: serde_json::from_value(usage).map_err(|e| {
                            JournalError::Corrupt(format!("usage sums are not numbers: {e}"))
                        })?,
                    })
                })
                .collect()
        })
        .await
    }
}
