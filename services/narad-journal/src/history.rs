//! History reads (§10.2): a session's authority in `sessionSequence`
//! order after a cursor, optionally narrowed to one run journal or one
//! workflow, a page at a time.
//!
//! Each cursor kind names a position in its own ordering; every position
//! corresponds to a range of session-sequence boundaries (after the last
//! event at or before it, before the first one after it). Cursors given
//! together must name overlapping ranges — the same position — or the
//! request is a cursor conflict.

use serde::Serialize;
use serde_json::Value;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// The page size when none is asked for.
pub const DEFAULT_LIMIT: u32 = 100;
/// The largest page.
pub const MAX_LIMIT: u32 = 1000;

/// A history request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Events after this sessionSequence.
    pub after_session_sequence: Option<u64>,
    /// Only this run journal's events.
    pub root_run_id: Option<String>,
    /// With `root_run_id`: events after this run-tree sequence.
    pub after_sequence: Option<u64>,
    /// Only this workflow's events.
    pub workflow_id: Option<String>,
    /// With `workflow_id`: events after this workflowSequence.
    pub after_workflow_sequence: Option<u64>,
    /// The page size, 1 to [`MAX_LIMIT`] (default [`DEFAULT_LIMIT`]).
    pub limit: Option<u32>,
}

/// One page of history.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPage {
    /// The events, in sessionSequence order, as delivered.
    #[schema(schema_with = crate::openapi::authority_events)]
    pub events: Vec<Value>,
    /// Where the next page starts, when more events remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::uint)]
    pub next_session_sequence: Option<u64>,
    /// The run-tree cursor of the next page, for a run-filtered read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::uint)]
    pub next_sequence: Option<u64>,
    /// The workflow cursor of the next page, for a workflow-filtered read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::uint)]
    pub next_workflow_sequence: Option<u64>,
}

/// The session-sequence boundaries a run or workflow cursor stands for:
/// after the last event at or before it, before the first one after it.
const RANGE_OF_RUN_CURSOR: &str = "select
   coalesce((select max(session_sequence) from events where tenant_id = $1 and session_id = $2
             and root_run_id = $3 and run_sequence <= $4), 0),
   (select min(session_sequence) from events where tenant_id = $1 and session_id = $2
             and root_run_id = $3 and run_sequence > $4)";
const RANGE_OF_WORKFLOW_CURSOR: &str = "select
   coalesce((select max(session_sequence) from events where tenant_id = $1 and session_id = $2
             and workflow_id = $3 and workflow_sequence <= $4), 0),
   (select min(session_sequence) from events where tenant_id = $1 and session_id = $2
             and workflow_id = $3 and workflow_sequence > $4)";
const PAGE: &str = "select body, session_sequence, run_sequence, workflow_sequence from events
   where tenant_id = $1 and session_id = $2 and session_sequence > $3
     and ($4::text is null or root_run_id = $4)
     and ($5::text is null or workflow_id = $5)
   order by session_sequence limit $6";

impl HistoryQuery {
    fn check(&self) -> Result<u32, JournalError> {
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(JournalError::InvalidParameter {
                parameter: "limit",
                message: format!("must be 1 to {MAX_LIMIT}, got {limit}"),
            });
        }
        if self.after_sequence.is_some() && self.root_run_id.is_none() {
            return Err(JournalError::InvalidParameter {
                parameter: "afterSequence",
                message: "a run-tree cursor needs rootRunId".to_owned(),
            });
        }
        if self.after_workflow_sequence.is_some() && self.workflow_id.is_none() {
            return Err(JournalError::InvalidParameter {
                parameter: "afterWorkflowSequence",
                message: "a workflow cursor needs workflowId".to_owned(),
            });
        }
        Ok(limit)
    }
}

impl Journal {
    /// Reads one page of a session's history.
    pub async fn history(
        &self,
        tenant: &TenantId,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<HistoryPage, JournalError> {
        let limit = query.check()?;
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let exists = c
                .query_opt(
                    "select 1 from sessions where tenant_id = $1 and session_id = $2",
                    &[&tenant.as_str(), &session_id],
                )
                .await?;
            if exists.is_none() {
                return Err(JournalError::SessionNotFound(session_id.to_owned()));
            }
            // Every cursor given narrows the boundary to a range [lo, hi).
            let mut lo = 0u64;
            let mut hi = u64::MAX;
            let mut named = Vec::new();
            if let Some(s) = query.after_session_sequence {
                lo = lo.max(s);
                hi = hi.min(s + 1);
                named.push(format!("afterSessionSequence={s}"));
            }
            for (sql, id, after, what) in [
                (
                    RANGE_OF_RUN_CURSOR,
                    &query.root_run_id,
                    query.after_sequence,
                    "afterSequence",
                ),
                (
                    RANGE_OF_WORKFLOW_CURSOR,
                    &query.workflow_id,
                    query.after_workflow_sequence,
                    "afterWorkflowSequence",
                ),
            ] {
                if let (Some(id), Some(after)) = (id, after) {
                    let stmt = c.prepare_cached(sql).await?;
                    let row = c
                        .query_one(&stmt, &[&tenant.as_str(), &session_id, id, &(after as i64)])
                        .await?;
                    lo = lo.max(row.get::<_, i64>(0) as u64);
                    hi = hi.min(row.get::<_, Option<i64>>(1).map_or(u64::MAX, |n| n as u64));
                    named.push(format!("{what}={after}"));
                }
            }
            if lo >= hi {
                return Err(JournalError::CursorConflict(format!(
                    "{} do not name one position in this session's history",
                    named.join(", ")
                )));
            }
            let stmt = c.prepare_cached(PAGE).await?;
            let rows = c
                .query(
                    &stmt,
                    &[
                        &tenant.as_str(),
                        &session_id,
                        &(lo as i64),
                        &query.root_run_id,
                        &query.workflow_id,
                        &(i64::from(limit) + 1),
                    ],
                )
                .await?;
            let more = rows.len() > limit as usize;
            let page = &rows[..rows.len().min(limit as usize)];
            let last = page.last();
            Ok(HistoryPage {
                events: page.iter().map(|r| r.get::<_, Value>(0)).collect(),
                next_session_sequence: more
                    .then(|| last.map(|r| r.get::<_, i64>(1) as u64))
                    .flatten(),
                next_sequence: (more && query.root_run_id.is_some())
                    .then(|| {
                        last.and_then(|r| r.get::<_, Option<i64>>(2))
                            .map(|n| n as u64)
                    })
                    .flatten(),
                next_workflow_sequence: (more && query.workflow_id.is_some())
                    .then(|| {
                        last.and_then(|r| r.get::<_, Option<i64>>(3))
                            .map(|n| n as u64)
                    })
                    .flatten(),
            })
        })
        .await
    }
}
