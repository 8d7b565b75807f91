//! One tenant's committed events in relay order, for the tenant stream
//! (`GET /v1/events`): where an eventId stands in that order, what
//! retention already forgot, and the rows after a position.
//!
//! The order is the relay's, `(txid, position)`, restricted to the tenant
//! (and optionally one session), and only rows whose transaction is older
//! than every running one, so that a position once passed is never filled
//! in behind a reader.

use serde_json::Value;

use crate::relay::{RelayCursor, Relayed};
use crate::{Journal, JournalError, TenantId, in_tenant};

/// Where a tenant stream resumes after an eventId.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamPosition {
    /// The event's outbox row: resume after it.
    At(RelayCursor),
    /// The event is in the journal, but retention already forgot its
    /// outbox row: resume after the tenant's horizon, and say so.
    Forgotten,
    /// No event of the tenant has this id.
    Unknown,
}

/// The last row of a tenant that retention deleted: every later row of the
/// tenant is still in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Horizon {
    /// Its position in relay order.
    pub cursor: RelayCursor,
    /// Its eventId.
    pub event_id: String,
}

const EVENT_TXID: &str = "select txid::text::bigint, session_id, session_sequence from events \
    where tenant_id = $1 and event_id = $2";

const EVENT_TXID_AT: &str = "select txid::text::bigint, event_id from events \
    where tenant_id = $1 and session_id = $2 and session_sequence = $3";

const OUTBOX_ROW: &str = "select position from outbox \
    where tenant_id = $1 and txid = $2::text::xid8 and event_id = $3";

const HORIZON: &str = "select txid::text::bigint, position, event_id from outbox_horizons \
    where tenant_id = $1";

/// A page of the tenant's rows and, read in the same statement (so in the
/// same snapshot), the tenant's horizon: the first row says whether
/// retention forgot rows after the cursor before the page was read.
///
/// The body of an authority row is read by its primary key, per row (as
/// a join, a plan made on stale statistics scanned the session's events
/// for every row).
const TENANT_RELAY: &str = "
select true, h.txid::text::bigint, h.position, null, null, h.event_id, null, null
from outbox_horizons h where h.tenant_id = $1
union all
(select false, o.txid::text::bigint, o.position, o.session_id, o.session_sequence, o.event_id,
       coalesce(o.body, (select e.body from events e
                         where e.tenant_id = o.tenant_id and e.session_id = o.session_id
                           and e.session_sequence = o.session_sequence)),
       o.body is null
from outbox o
where o.tenant_id = $1 and ($2::text is null or o.session_id = $2)
  -- As one row comparison on the index's columns, so that the scan starts
  -- at the cursor instead of filtering the tenant's rows from the first.
  and (o.tenant_id, o.txid, o.position) > ($1, $3::text::xid8, $4)
  and o.txid < stream_horizon()
order by o.txid, o.position
limit $5)";

/// The tenant's rows after a cursor, and its horizon when they were read.
#[derive(Debug, Clone)]
pub struct RelayPage {
    /// The rows, in relay order.
    pub rows: Vec<Relayed>,
    /// The tenant's horizon in the same snapshot: when it is past the
    /// cursor, retention forgot rows between the cursor and the first row.
    pub horizon: Option<Horizon>,
}

impl Journal {
    /// Where an authority event (or a watch event the outbox carried)
    /// stands in its tenant's relay order. `txid` is given for a watch
    /// row, whose id is in no events row.
    pub async fn stream_position(
        &self,
        tenant: &TenantId,
        event_id: &str,
        watch_txid: Option<i64>,
    ) -> Result<StreamPosition, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let txid = match watch_txid {
                Some(txid) => txid,
                None => {
                    let Some(row) = c
                        .query_opt(EVENT_TXID, &[&tenant.as_str(), &event_id])
                        .await?
                    else {
                        return Ok(StreamPosition::Unknown);
                    };
                    match row.get::<_, Option<i64>>(0) {
                        Some(txid) => txid,
                        // Recorded before events kept their transaction,
                        // and its outbox row already gone.
                        None => return Ok(StreamPosition::Forgotten),
                    }
                }
            };
            outbox_position(c, tenant, txid, event_id).await
        })
        .await
    }

    /// Where the authority event at `session_sequence` of a session stands
    /// in its tenant's relay order (a watch event names the authority it
    /// covers this way).
    pub async fn stream_position_at(
        &self,
        tenant: &TenantId,
        session_id: &str,
        session_sequence: u64,
    ) -> Result<StreamPosition, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let Some(row) = c
                .query_opt(
                    EVENT_TXID_AT,
                    &[&tenant.as_str(), &session_id, &(session_sequence as i64)],
                )
                .await?
            else {
                return Ok(StreamPosition::Unknown);
            };
            let (txid, event_id): (Option<i64>, String) = (row.get(0), row.get(1));
            match txid {
                Some(txid) => outbox_position(c, tenant, txid, &event_id).await,
                None => Ok(StreamPosition::Forgotten),
            }
        })
        .await
    }

    /// The tenant's horizon: `None` while retention has forgotten nothing
    /// of the tenant.
    pub async fn horizon(&self, tenant: &TenantId) -> Result<Option<Horizon>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(HORIZON, &[&tenant.as_str()])
                .await?
                .map(|r| Horizon {
                    cursor: RelayCursor {
                        txid: r.get(0),
                        position: r.get(1),
                    },
                    event_id: r.get(2),
                }))
        })
        .await
    }

    /// The tenant's next committed rows after `cursor` (of one session,
    /// when given), at most `max`, in relay order, with the tenant's
    /// horizon as it was when they were read.
    pub async fn tenant_relay_after(
        &self,
        tenant: &TenantId,
        session_id: Option<&str>,
        cursor: RelayCursor,
        max: u32,
    ) -> Result<RelayPage, JournalError> {
        let client = self.pool.get().await?;
        let rows = in_tenant(client, tenant, async |c| {
            let stmt = c.prepare_cached(TENANT_RELAY).await?;
            Ok(c.query(
                &stmt,
                &[
                    &tenant.as_str(),
                    &session_id,
                    &cursor.txid.to_string(),
                    &cursor.position,
                    &i64::from(max),
                ],
            )
            .await?)
        })
        .await?;
        let mut page = RelayPage {
            rows: Vec::with_capacity(rows.len()),
            horizon: None,
        };
        for r in &rows {
            let cursor = RelayCursor {
                txid: r.get(1),
                position: r.get(2),
            };
            if r.get::<_, bool>(0) {
                page.horizon = Some(Horizon {
                    cursor,
                    event_id: r.get(5),
                });
                continue;
            }
            page.rows.push(Relayed {
                cursor,
                tenant: tenant.clone(),
                session_id: r.get(3),
                session_sequence: r.get::<_, i64>(4) as u64,
                event_id: r.get(5),
                body: r.get::<_, Value>(6),
                authority: r.get(7),
            });
        }
        Ok(page)
    }

    /// When the tenant's newest outbox row was recorded, in milliseconds
    /// since the epoch (`None`: the outbox holds nothing of the tenant).
    pub async fn newest_recorded_ms(&self, tenant: &TenantId) -> Result<Option<i64>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select (extract(epoch from created_at) * 1000)::bigint from outbox \
                 where tenant_id = $1 order by txid desc, position desc limit 1",
                &[&tenant.as_str()],
            )
            .await?
            .map(|r| r.get(0)))
        })
        .await
    }

    /// The newest transaction id a running or committed transaction may
    /// hold now: a position past it is from the future (another store).
    pub async fn current_txid(&self) -> Result<i64, JournalError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one("select xmax from stream_snapshot()", &[])
            .await?;
        Ok(row.get(0))
    }
}

async fn outbox_position(
    c: &deadpool_postgres::Client,
    tenant: &TenantId,
    txid: i64,
    event_id: &str,
) -> Result<StreamPosition, JournalError> {
    let row = c
        .query_opt(
            OUTBOX_ROW,
            &[&tenant.as_str(), &txid.to_string(), &event_id],
        )
        .await?;
    Ok(match row {
        Some(r) => StreamPosition::At(RelayCursor {
            txid,
            position: r.get(0),
        }),
        None => StreamPosition::Forgotten,
    })
}
