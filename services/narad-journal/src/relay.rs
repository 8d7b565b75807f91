//! Reading committed events in relay order, for live delivery.
//!
//! Each append writes an outbox row in its transaction. A relay reads them,
//! across tenants, in `(txid, position)` order, and only rows whose
//! transaction is older than every running one: those are final, so a
//! relay that has passed a row never finds a new one behind it.

use futures::StreamExt;
use serde_json::Value;

use crate::{Journal, JournalError, TenantId};

/// A relay's position: the last `(txid, position)` it consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RelayCursor {
    /// The stream clock reading of the last row consumed: its
    /// transaction's id plus the database's clock offset, which grows
    /// when the database moves to another cluster, so that readings only
    /// grow.
    pub txid: i64,
    /// Its outbox position.
    pub position: i64,
}

/// The transactions committed at one moment (a Postgres snapshot): what
/// a stream that goes live at that moment leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachSnapshot {
    xmin: i64,
    xmax: i64,
    running: Vec<i64>,
}

impl AttachSnapshot {
    /// The relay position from which rows may still be unseen by it.
    pub fn cursor(&self) -> RelayCursor {
        RelayCursor {
            txid: self.xmin - 1,
            position: i64::MAX,
        }
    }

    /// Whether the transaction `txid` had committed (or ended) when the
    /// snapshot was taken.
    pub fn saw(&self, txid: i64) -> bool {
        txid < self.xmin || (txid < self.xmax && !self.running.contains(&txid))
    }
}

/// One committed event, as the relay reads it.
#[derive(Debug, Clone)]
pub struct Relayed {
    /// Where the relay stands after this event.
    pub cursor: RelayCursor,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its session.
    pub session_id: String,
    /// Its sessionSequence.
    pub session_sequence: u64,
    /// Its eventId.
    pub event_id: String,
    /// The event as delivered.
    pub body: Value,
    /// An authority event (`false`: a watch event the outbox carried, such
    /// as `session.created`, whose sessionSequence is the session's
    /// position when it was recorded).
    pub authority: bool,
}

/// The name of the channel that wakes relays (`NOTIFY narad_outbox`,
/// sent after commits, never inside an append transaction).
pub const RELAY_CHANNEL: &str = "narad_outbox";

/// The `application_name` of a relay's LISTEN connection (as
/// `pg_stat_activity` shows it).
pub const LISTENER_APPLICATION_NAME: &str = "narad relay listener";

impl Journal {
    /// Where a relay starting now begins: after every event committed by a
    /// transaction older than every running one.
    pub async fn relay_start(&self) -> Result<RelayCursor, JournalError> {
        let client = self.pool.get().await?;
        let row = client.query_one("select relay_start()", &[]).await?;
        Ok(RelayCursor {
            txid: row.get(0),
            position: i64::MAX,
        })
    }

    /// What had committed when a stream attached "live from now": a row
    /// the relay delivers later belongs to the stream only when this
    /// snapshot does not see it. Take it after subscribing to the hub, so
    /// that every row it does not see is published after the subscription.
    pub async fn attach_snapshot(&self) -> Result<AttachSnapshot, JournalError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one("select xmin, xmax, running from stream_snapshot()", &[])
            .await?;
        Ok(AttachSnapshot {
            xmin: row.get(0),
            xmax: row.get(1),
            running: row.get(2),
        })
    }

    /// The next committed events after `cursor`, at most `max` of them, in
    /// relay order.
    pub async fn relay_after(
        &self,
        cursor: RelayCursor,
        max: u32,
    ) -> Result<Vec<Relayed>, JournalError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "select relay_txid, relay_position, tenant_id, session_id, session_sequence, \
                 event_id, body, authority from relay_after($1, $2, $3)",
            )
            .await?;
        let rows = client
            .query(&stmt, &[&cursor.txid, &cursor.position, &(max as i32)])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Relayed {
                    cursor: RelayCursor {
                        txid: r.get(0),
                        position: r.get(1),
                    },
                    tenant: TenantId::new(r.get::<_, String>(2)).map_err(JournalError::Corrupt)?,
                    session_id: r.get(3),
                    session_sequence: r.get::<_, i64>(4) as u64,
                    event_id: r.get(5),
                    body: r.get(6),
                    authority: r.get(7),
                })
            })
            .collect()
    }

    /// Deletes up to `max` outbox rows older than `older_than` that every
    /// relay has passed; returns how many. Events stay in the journal.
    pub async fn forget_outbox(
        &self,
        older_than: std::time::Duration,
        max: u32,
    ) -> Result<u64, JournalError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "select outbox_forget($1, $2)",
                &[&(older_than.as_secs() as i64), &(max as i32)],
            )
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Completes after a group of appends of this process commits: the
    /// local relay's fast wake-up.
    pub async fn committed(&self) {
        self.combiner.committed().await;
    }

    /// Wakes every other relay listening on the database: a `NOTIFY`
    /// outside any append transaction, named by this journal (its own
    /// listener skips it), committed without waiting for its WAL flush (a
    /// notification is delivered at commit, and one lost in a crash of
    /// Postgres is lost with every listening connection anyway).
    pub async fn notify_relays(&self) -> Result<(), JournalError> {
        // Closed rather than pooled should it fail or be dropped midway:
        // it may be inside the transaction.
        let mut held = crate::Abandoned(Some(self.pool.get().await?));
        let client = held.0.as_ref().expect("held");
        client
            .batch_execute(&format!(
                "begin; set local synchronous_commit = off; \
                 notify {RELAY_CHANNEL}, '{}'; commit",
                self.origin
            ))
            .await?;
        drop(held.0.take());
        Ok(())
    }
}

/// A connection that listens on [`RELAY_CHANNEL`].
pub struct RelayListener {
    _client: tokio_postgres::Client,
    notifications: tokio::sync::mpsc::UnboundedReceiver<()>,
}

impl RelayListener {
    /// Waits for the next notification; `false` once the connection has
    /// ended (listen again, then catch up).
    pub async fn notified(&mut self) -> bool {
        self.notifications.recv().await.is_some()
    }
}

impl Journal {
    /// Opens a connection of its own (not the pool's: its notifications
    /// must reach this listener) listening on [`RELAY_CHANNEL`], told of
    /// every notification but this journal's own.
    pub async fn listen_relays(&self) -> Result<RelayListener, JournalError> {
        let origin = self.origin.clone();
        let mut config = (*self.config).clone();
        config.application_name(LISTENER_APPLICATION_NAME);
        let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
        let (tx, notifications) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notification(n))
                        if n.payload() != &*origin =>
                    {
                        if tx.send(()).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        client
            .batch_execute(&format!("listen {RELAY_CHANNEL}"))
            .await?;
        Ok(RelayListener {
            _client: client,
            notifications,
        })
    }

    /// The sessionSequence of `event_id` in a session, if it is there.
    pub async fn event_sequence(
        &self,
        tenant: &TenantId,
        session_id: &str,
        event_id: &str,
    ) -> Result<Option<u64>, JournalError> {
        let client = self.pool.get().await?;
        crate::in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select session_sequence from events \
                 where tenant_id = $1 and event_id = $2 and session_id = $3",
                &[&tenant.as_str(), &event_id, &session_id],
            )
            .await?
            .map(|r| r.get::<_, i64>(0) as u64))
        })
        .await
    }
}
