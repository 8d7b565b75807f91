//! The fan-out hub: committed events reach every subscriber of their
//! session, on every replica.
//!
//! One relay per process reads committed events in relay order (see
//! `narad_journal::relay`), encodes each once as an SSE frame, and hands
//! the shared frame to the subscribers of its session. The relay wakes when
//! this process commits appends, when another replica's `NOTIFY` arrives
//! (sent after commits, never inside an append transaction), and every
//! [`POLL`] regardless, so that a lost notification only delays delivery.
//! Its position is a cursor, so a dropped LISTEN connection loses nothing:
//! the relay listens again and catches up from where it stood.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use narad_journal::{Journal, Relayed, TenantId};
use tokio::sync::{Notify, broadcast};

/// The longest a relay sleeps without a wake-up.
pub const POLL: Duration = Duration::from_millis(250);
/// Events a subscriber may fall behind before it must catch up from
/// history.
pub const SUBSCRIBER_BACKLOG: usize = 1024;
/// Events the relay reads at a time.
const RELAY_BATCH: u32 = 500;
/// Outbox rows retention deletes at a time.
const FORGET_BATCH: u32 = 5_000;
/// How often retention runs.
pub const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Deletes outbox rows older than `retention` (never events), in batches,
/// every [`RETENTION_EVERY`], until the process ends. Every replica may run
/// it: the deletes are idempotent.
pub async fn retain_outbox(journal: Journal, retention: Duration) {
    loop {
        loop {
            match journal.forget_outbox(retention, FORGET_BATCH).await {
                Ok(n) if n == u64::from(FORGET_BATCH) => continue,
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(rows = n, "outbox rows past retention deleted");
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outbox retention failed; retrying later");
                    break;
                }
            }
        }
        tokio::time::sleep(RETENTION_EVERY).await;
    }
}

/// One committed event, encoded once for every subscriber.
#[derive(Debug)]
pub struct Live {
    /// Its sessionSequence.
    pub session_sequence: u64,
    /// The SSE frame: `id: <eventId>` and `data: <event>`.
    pub frame: Bytes,
}

/// An SSE frame of an authority event.
pub fn frame(event_id: &str, body: &serde_json::Value) -> Bytes {
    let data = serde_json::to_string(body).expect("events serialise");
    // An id holding a line break would end the field early; such an id
    // travels without its `id:` line (the data still carries it).
    let id_line = if event_id.contains(['\n', '\r', '\0']) {
        String::new()
    } else {
        format!("id: {event_id}\n")
    };
    Bytes::from(format!("{id_line}data: {data}\n\n"))
}

type Key = (TenantId, String);

/// Subscribers by session, and the relay that feeds them.
pub struct Hub {
    journal: Journal,
    sessions: Mutex<HashMap<Key, broadcast::Sender<Arc<Live>>>>,
    wake: Notify,
    closing: tokio::sync::watch::Sender<bool>,
    slow_dropped: std::sync::atomic::AtomicU64,
}

impl Hub {
    /// A hub over `journal`; [`Hub::run`] starts its relay.
    pub fn new(journal: Journal) -> Arc<Hub> {
        Arc::new(Hub {
            journal,
            sessions: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            closing: tokio::sync::watch::channel(false).0,
            slow_dropped: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Counts a stream closed because its client did not keep up.
    pub fn dropped_slow_consumer(&self) {
        self.slow_dropped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Streams closed so far because their clients did not keep up.
    pub fn slow_consumers_dropped(&self) -> u64 {
        self.slow_dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Ends every stream at a frame boundary (the server is stopping):
    /// clients resume, on this replica or another, from their last id.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Completes once [`Hub::close`] was called.
    pub async fn closed(&self) {
        let mut rx = self.closing.subscribe();
        let _ = rx.wait_for(|closing| *closing).await;
    }

    /// Subscribes to a session's committed events from now on.
    pub fn subscribe(&self, tenant: &TenantId, session: &str) -> broadcast::Receiver<Arc<Live>> {
        let mut sessions = self.sessions.lock().expect("the subscribers");
        sessions
            .entry((tenant.clone(), session.to_owned()))
            .or_insert_with(|| broadcast::channel(SUBSCRIBER_BACKLOG).0)
            .subscribe()
    }

    /// Hands a batch of relayed events to their subscribers, under one
    /// lock; an event nobody subscribes to is never encoded.
    fn publish(&self, batch: Vec<Relayed>) {
        let mut sessions = self.sessions.lock().expect("the subscribers");
        for event in batch {
            let key = (event.tenant, event.session_id);
            let Some(sender) = sessions.get(&key) else {
                continue;
            };
            if sender.receiver_count() == 0 {
                sessions.remove(&key);
                continue;
            }
            let _ = sender.send(Arc::new(Live {
                session_sequence: event.session_sequence,
                frame: frame(&event.event_id, &event.body),
            }));
        }
    }

    /// Runs the relay, its listener and its notifier until the process ends.
    pub async fn run(self: Arc<Self>) {
        tokio::spawn(self.clone().listen());
        tokio::spawn(self.clone().announce());
        let mut cursor = loop {
            match self.journal.relay_start().await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(error = %e, "the relay cannot start yet");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        loop {
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
            }
            loop {
                match self.journal.relay_after(cursor, RELAY_BATCH).await {
                    Ok(batch) => {
                        let full = batch.len() == RELAY_BATCH as usize;
                        if let Some(last) = batch.last() {
                            cursor = last.cursor;
                        }
                        self.publish(batch);
                        if !full {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the relay cannot read; retrying");
                        break;
                    }
                }
            }
        }
    }

    /// Listens for other replicas' commits; listens again when the
    /// connection drops, then wakes the relay to catch up.
    async fn listen(self: Arc<Self>) {
        loop {
            match self.journal.listen_relays().await {
                Ok(mut listener) => {
                    self.wake.notify_one();
                    while listener.notified().await {
                        self.wake.notify_one();
                    }
                    tracing::warn!("the relay's LISTEN connection ended; listening again");
                }
                Err(e) => tracing::warn!(error = %e, "the relay cannot LISTEN yet"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// After this process commits appends: wakes the local relay at once,
    /// and the other replicas' with one NOTIFY per burst.
    async fn announce(self: Arc<Self>) {
        loop {
            self.journal.committed().await;
            self.wake.notify_one();
            if let Err(e) = self.journal.notify_relays().await {
                tracing::debug!(error = %e, "cannot notify other replicas");
            }
        }
    }
}
