//! The fan-out hub: committed events reach every subscriber of their
//! session and of their tenant, on every replica, with the watch events the
//! coalescer makes of them.
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
use narad_journal::{Journal, RelayCursor, Relayed, TenantId};
use narad_protocol::profile::Profile;
use narad_protocol::wire::WireType;
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

use crate::coalesce::Coalescer;

/// The longest a relay sleeps without a wake-up.
pub const POLL: Duration = Duration::from_millis(250);
/// Events a subscriber may fall behind before it must catch up from
/// history.
pub const SUBSCRIBER_BACKLOG: usize = 1024;
/// Events the relay reads at a time.
const RELAY_BATCH: u32 = 500;
/// Outbox rows retention deletes at a time.
const FORGET_BATCH: u32 = 5_000;
/// How often retention runs, at most (a short retention runs more often:
/// [`retention_period`]).
pub const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// The most not-yet-relayed rows a lag sample counts (`narad_outbox_lag_rows`
/// reads this value when the relay is at least this far behind): counting
/// reads each row's body, about 4 ms per 1,000 rows.
pub const LAG_COUNT_CAP: u32 = 1_000;

/// How often retention of `retention` runs: every [`RETENTION_EVERY`], or
/// twice within a shorter retention (at most once a second), so that a
/// row is forgotten at most half its retention late.
pub fn retention_period(retention: Duration) -> Duration {
    (retention / 2).clamp(Duration::from_secs(1), RETENTION_EVERY)
}

/// Deletes outbox rows older than `retention` (never events), in batches,
/// every [`retention_period`], until the process ends. Every replica may
/// run it: the deletes are idempotent.
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
        tokio::time::sleep(retention_period(retention)).await;
    }
}

/// What a live frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveKind {
    /// An authority event.
    Authority,
    /// A watch event the outbox carried (`session.created`,
    /// `session.archived`): a row of relay order like an authority event.
    StoredWatch,
    /// A watch event of the coalescer: it covers the authority at its
    /// cursor and is delivered only after it.
    Watch,
}

/// One committed event (or watch event), encoded once for every subscriber.
#[derive(Debug)]
pub struct Live {
    /// What it is.
    pub kind: LiveKind,
    /// Its relay position; for a coalesced watch event, the position of
    /// the authority it covers.
    pub cursor: RelayCursor,
    /// Its session (`None`: a workspace watch event).
    pub session_id: Option<String>,
    /// Its sessionSequence; for a watch event, that of the authority it
    /// covers.
    pub session_sequence: u64,
    /// The profile that defines its type, for negotiation (§2.1).
    pub profile: Profile,
    /// The SSE frame: `id: <eventId>` and `data: <event>`.
    pub frame: Bytes,
    /// The event, parsed once here, when it can change a run graph
    /// (§9.7): streams that negotiated the graph profile derive their
    /// deltas from it.
    pub graph_event: Option<Arc<narad_protocol::AuthorityEvent>>,
}

/// The type of the notice an erased session leaves on its tenant's
/// streams.
pub const ERASED: &str = "session.erased";

/// An SSE frame of an authority or watch event. The notice of an erased
/// session is a named `session-erased` frame: a reader that knows nothing
/// of erasure passes over it.
pub fn frame(event_id: &str, body: &serde_json::Value) -> Bytes {
    let data = serde_json::to_string(body).expect("events serialise");
    let name = if body["type"] == ERASED {
        "event: session-erased\n"
    } else {
        ""
    };
    // An id holding a line break would end the field early; such an id
    // travels without its `id:` line (the data still carries it).
    let id_line = if event_id.contains(['\n', '\r', '\0']) {
        String::new()
    } else {
        format!("id: {event_id}\n")
    };
    Bytes::from(format!("{name}{id_line}data: {data}\n\n"))
}

/// The profile that defines an event's type (core for unknown types).
pub fn profile_of(body: &serde_json::Value) -> Profile {
    body["type"]
        .as_str()
        .and_then(WireType::from_name)
        .map_or(Profile::Core, WireType::profile)
}

type SessionKey = (TenantId, String);
type Channel = broadcast::Sender<Arc<Live>>;

/// Whether a committed event may have made a run claimable (queued,
/// resumed, a resolution, a client tool's result) or asked one to stop:
/// the events that commands, executors and the server append to run
/// journals. Claim polls also look again every second, so a rarer case
/// is late by at most that.
fn wakes_runtimes(body: &serde_json::Value) -> bool {
    matches!(
        body["type"].as_str(),
        Some(
            "run.started"
                | "run.resumed"
                | "interrupt.resolved"
                | "run.stop.requested"
                | "tool.call.finished"
        )
    )
}

/// Subscribers by session and by tenant, and the relay that feeds them.
pub struct Hub {
    journal: Journal,
    sessions: Mutex<HashMap<SessionKey, Channel>>,
    tenants: Mutex<HashMap<TenantId, Channel>>,
    coalescer: Mutex<Coalescer>,
    wake: Notify,
    closing: tokio::sync::watch::Sender<bool>,
    /// Upgraded sockets open on this replica (executor channels): a
    /// stopping server waits for them, as the HTTP server does not.
    sockets: tokio::sync::watch::Sender<usize>,
    slow_dropped: std::sync::atomic::AtomicU64,
    listens: std::sync::atomic::AtomicU64,
    /// Where the relay stands (`None` until it has started): what its lag
    /// is measured from.
    relay_cursor: Mutex<Option<RelayCursor>>,
    client_calls: Wakeups,
    runtimes: Wakeups,
}

/// An open upgraded socket ([`Hub::socket_opened`]); closed when dropped.
pub struct SocketOpen(Arc<Hub>);

impl Drop for SocketOpen {
    fn drop(&mut self) {
        self.0.sockets.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Per-tenant wake-up signals: a receiver's value changes on each wake.
#[derive(Default)]
struct Wakeups(Mutex<HashMap<TenantId, tokio::sync::watch::Sender<u64>>>);

impl Wakeups {
    fn subscribe(&self, tenant: &TenantId) -> tokio::sync::watch::Receiver<u64> {
        let mut senders = self.0.lock().expect("the wake-ups");
        senders
            .entry(tenant.clone())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    fn wake(&self, tenant: &TenantId) {
        let mut senders = self.0.lock().expect("the wake-ups");
        if let Some(sender) = senders.get(tenant) {
            if sender.receiver_count() == 0 {
                senders.remove(tenant);
            } else {
                sender.send_modify(|n| *n += 1);
            }
        }
    }
}

impl Hub {
    /// A hub over `journal` whose coalescer emits at most one watch event
    /// per scope per `watch_window`; [`Hub::run`] starts its relay.
    pub fn new(journal: Journal, watch_window: Duration) -> Arc<Hub> {
        Arc::new(Hub {
            journal,
            sessions: Mutex::new(HashMap::new()),
            tenants: Mutex::new(HashMap::new()),
            coalescer: Mutex::new(Coalescer::new(watch_window)),
            wake: Notify::new(),
            closing: tokio::sync::watch::channel(false).0,
            sockets: tokio::sync::watch::channel(0).0,
            slow_dropped: std::sync::atomic::AtomicU64::new(0),
            listens: std::sync::atomic::AtomicU64::new(0),
            relay_cursor: Mutex::new(None),
            client_calls: Wakeups::default(),
            runtimes: Wakeups::default(),
        })
    }

    /// Counts a stream closed because its client did not keep up.
    pub fn dropped_slow_consumer(&self) {
        self.slow_dropped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::slow_consumer_dropped();
    }

    /// Where the relay stands: after the last row it read (`None` until
    /// it has started).
    pub fn relay_cursor(&self) -> Option<RelayCursor> {
        *self.relay_cursor.lock().expect("the relay cursor")
    }

    /// Measures how far the relay is behind and sets its gauges
    /// (`crate::gauges` asks every few seconds); `false` while the relay
    /// has not started (its lag is unknown).
    pub async fn record_lag(&self) -> bool {
        let Some(cursor) = self.relay_cursor() else {
            return false;
        };
        match self.journal.relay_backlog(cursor, LAG_COUNT_CAP).await {
            Ok(backlog) => crate::metrics::outbox_lag(backlog.rows, backlog.oldest_age),
            Err(e) => tracing::debug!(error = %e, "cannot measure the relay's lag"),
        }
        true
    }

    fn relay_at(&self, cursor: RelayCursor) {
        *self.relay_cursor.lock().expect("the relay cursor") = Some(cursor);
    }

    /// Streams closed so far because their clients did not keep up.
    pub fn slow_consumers_dropped(&self) -> u64 {
        self.slow_dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times the relay's LISTEN connection was established (more
    /// than once: it dropped and was re-established).
    pub fn listens(&self) -> u64 {
        self.listens.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Ends every stream at a frame boundary (the server is stopping):
    /// clients resume, on this replica or another, from their last id.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Whether [`Hub::close`] was called (the server is stopping).
    pub fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    /// Completes once [`Hub::close`] was called.
    pub async fn closed(&self) {
        let mut rx = self.closing.subscribe();
        let _ = rx.wait_for(|closing| *closing).await;
    }

    /// Counts an upgraded socket as open until the guard is dropped.
    pub fn socket_opened(self: &Arc<Self>) -> SocketOpen {
        self.sockets.send_modify(|n| *n += 1);
        SocketOpen(self.clone())
    }

    /// Completes once no upgraded socket is open on this replica.
    pub async fn sockets_closed(&self) {
        let mut rx = self.sockets.subscribe();
        let _ = rx.wait_for(|open| *open == 0).await;
    }

    /// Subscribes to a session's committed events (and its watch events)
    /// from now on.
    pub fn subscribe(&self, tenant: &TenantId, session: &str) -> broadcast::Receiver<Arc<Live>> {
        let mut sessions = self.sessions.lock().expect("the subscribers");
        sessions
            .entry((tenant.clone(), session.to_owned()))
            .or_insert_with(|| broadcast::channel(SUBSCRIBER_BACKLOG).0)
            .subscribe()
    }

    /// Subscribes to every committed event and watch event of a tenant
    /// from now on.
    pub fn subscribe_tenant(&self, tenant: &TenantId) -> broadcast::Receiver<Arc<Live>> {
        let mut tenants = self.tenants.lock().expect("the subscribers");
        tenants
            .entry(tenant.clone())
            .or_insert_with(|| broadcast::channel(SUBSCRIBER_BACKLOG).0)
            .subscribe()
    }

    /// Wakes (its value changes) whenever a tool call with
    /// `executor=client` of the tenant is committed: the executor channels
    /// of the tenant then look for calls to deliver.
    pub fn client_calls(&self, tenant: &TenantId) -> tokio::sync::watch::Receiver<u64> {
        self.client_calls.subscribe(tenant)
    }

    /// Wakes the tenant's executor channels and control polls on this
    /// replica: a client call was committed, or an executor attached (a
    /// poll under the lease it superseded then answers 409 at once).
    pub fn wake_executors(&self, tenant: &TenantId) {
        self.client_calls.wake(tenant);
    }

    /// Wakes (its value changes) whenever an event of a run journal of the
    /// tenant is committed, or a run is queued again: claim polls look for
    /// ready runs, control polls for stop requests.
    pub fn runtime_work(&self, tenant: &TenantId) -> tokio::sync::watch::Receiver<u64> {
        self.runtimes.subscribe(tenant)
    }

    /// Wakes the tenant's claim and control polls on this replica.
    pub fn wake_runtimes(&self, tenant: &TenantId) {
        self.runtimes.wake(tenant);
    }

    /// Hands a batch of relayed events to their subscribers; an event
    /// nobody subscribes to is neither encoded nor coalesced (watch events
    /// are live only: with no listener there is nothing to announce).
    fn publish(&self, batch: Vec<Relayed>) {
        let mut sessions = self.sessions.lock().expect("the subscribers");
        let mut tenants = self.tenants.lock().expect("the subscribers");
        let mut coalescer = self.coalescer.lock().expect("the coalescer");
        let now = Instant::now();
        for event in batch {
            if event.authority
                && event.body["type"] == "tool.call.started"
                && event.body["executor"] == "client"
            {
                self.wake_executors(&event.tenant);
            }
            if event.authority && wakes_runtimes(&event.body) {
                self.wake_runtimes(&event.tenant);
            }
            let listeners = Listeners::of(
                &mut sessions,
                &mut tenants,
                &event.tenant,
                Some(&event.session_id),
            );
            if listeners.is_empty() {
                continue;
            }
            coalescer.observe(&event, now);
            // An erased session's streams end after its notice: their
            // channel goes, and a reconnect is answered 410.
            let erased = (!event.authority && event.body["type"] == ERASED)
                .then(|| (event.tenant.clone(), event.session_id.clone()));
            if let Some(key) = &erased {
                sessions.remove(key);
            }
            listeners.send(Live {
                kind: if event.authority {
                    LiveKind::Authority
                } else {
                    LiveKind::StoredWatch
                },
                cursor: event.cursor,
                profile: profile_of(&event.body),
                frame: frame(&event.event_id, &event.body),
                graph_event: event
                    .authority
                    .then(|| crate::routes::graph_feed::graph_event(&event.body))
                    .flatten()
                    .map(Arc::new),
                session_id: Some(event.session_id),
                session_sequence: event.session_sequence,
            });
        }
    }

    /// Sends the coalescer's due watch events to their subscribers.
    fn publish_watch(&self) {
        let due = self.coalescer.lock().expect("the coalescer").flush();
        let mut sessions = self.sessions.lock().expect("the subscribers");
        let mut tenants = self.tenants.lock().expect("the subscribers");
        for watch in due {
            let listeners = Listeners::of(
                &mut sessions,
                &mut tenants,
                &watch.tenant,
                watch.session_id.as_deref(),
            );
            if listeners.is_empty() {
                continue;
            }
            let id = watch.body["eventId"].as_str().unwrap_or_default();
            listeners.send(Live {
                kind: LiveKind::Watch,
                cursor: watch.cursor,
                profile: profile_of(&watch.body),
                frame: frame(id, &watch.body),
                graph_event: None,
                session_id: watch.session_id,
                session_sequence: watch.covers,
            });
        }
    }

    /// Runs the relay, its listener, its notifier and the coalescer until
    /// the process ends.
    pub async fn run(self: Arc<Self>) {
        tokio::spawn(self.clone().listen());
        tokio::spawn(self.clone().announce());
        let mut cursor = loop {
            match self.journal.relay_start().await {
                Ok(c) => {
                    self.relay_at(c);
                    break c;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the relay cannot start yet");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        loop {
            let due = self.coalescer.lock().expect("the coalescer").due();
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                () = sleep_until(due) => {
                    self.publish_watch();
                    continue;
                }
            }
            loop {
                match self.journal.relay_after(cursor, RELAY_BATCH).await {
                    Ok(batch) => {
                        let full = batch.len() == RELAY_BATCH as usize;
                        if let Some(last) = batch.last() {
                            cursor = last.cursor;
                            self.relay_at(cursor);
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
                    self.listens
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // Catch up on what committed while nobody listened.
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

/// The channels of an event's session and tenant that anyone listens on.
struct Listeners {
    session: Option<Channel>,
    tenant: Option<Channel>,
}

impl Listeners {
    /// Looks both up; a channel nobody listens on any more is removed.
    fn of(
        sessions: &mut HashMap<SessionKey, Channel>,
        tenants: &mut HashMap<TenantId, Channel>,
        tenant: &TenantId,
        session: Option<&str>,
    ) -> Listeners {
        Listeners {
            session: session.and_then(|s| live_channel(sessions, (tenant.clone(), s.to_owned()))),
            tenant: live_channel(tenants, tenant.clone()),
        }
    }

    fn is_empty(&self) -> bool {
        self.session.is_none() && self.tenant.is_none()
    }

    /// Encoded once, shared by every receiver of both channels.
    fn send(self, live: Live) {
        let live = Arc::new(live);
        for sender in self.session.into_iter().chain(self.tenant) {
            let _ = sender.send(live.clone());
        }
    }
}

/// The channel of a key if anyone listens on it; a channel nobody listens
/// on any more is removed.
fn live_channel<K: std::hash::Hash + Eq>(
    channels: &mut HashMap<K, Channel>,
    key: K,
) -> Option<Channel> {
    let sender = channels.get(&key)?;
    if sender.receiver_count() == 0 {
        channels.remove(&key);
        return None;
    }
    Some(sender.clone())
}

/// Sleeps until `due`, or forever when nothing is due.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{RETENTION_EVERY, retention_period};

    #[test]
    fn a_short_retention_is_applied_within_half_of_it() {
        assert_eq!(
            retention_period(Duration::from_secs(86_400)),
            RETENTION_EVERY
        );
        assert_eq!(
            retention_period(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert_eq!(
            retention_period(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        assert_eq!(retention_period(Duration::ZERO), Duration::from_secs(1));
    }
}
