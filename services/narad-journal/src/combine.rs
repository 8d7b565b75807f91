//! Concurrent appends share transactions.
//!
//! A transaction's fixed costs (`BEGIN`, the tenant setting, the lock
//! statement, the lookups, the write statement, `COMMIT` and its WAL
//! flush) are most of an append's cost. So appends wait in one queue, and
//! at most `max_groups` workers each take everything waiting (up to a
//! bound) and run it as one [`group`](crate::group) transaction: each
//! request is still decided alone, and answered alone.
//!
//! - A session is in at most one of this process's groups at a time, so
//!   groups never wait on each other's session locks; requests for a busy
//!   session wait in the queue for the next group.
//! - A group skips sessions locked by any other transaction (another
//!   replica, a command), and appends their requests alone, each waiting
//!   for its own lock: one busy session never holds up the others.
//! - When a group's transaction fails as a whole (a database error, or an
//!   eventId appended concurrently elsewhere), each of its requests is
//!   appended alone, so that one request never fails another.
//! - Workers are spawned when requests wait and end when none do: an idle
//!   journal runs no task.
//! - On a distributed database (a Citus coordinator) a group holds one
//!   tenant's requests: every transaction stays on one shard group, so it
//!   commits on one worker in one phase, before the coordinator's own
//!   transaction ends (what the stream's horizon relies on). Which it is
//!   is asked once, by the first worker; until it is known, groups are
//!   per tenant (right on both).
//! - Every answer is counted in the process's metrics as it is sent, on
//!   whichever path (grouped, alone), whether or not its caller still
//!   waits: outcome, events written, time since submission, and the rule
//!   or error code of a refusal.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use narad_protocol::primitives::SessionId;
use tokio::sync::oneshot;

use crate::append::Appended;
use crate::group::{self, Locking, Outcome, Request};
use crate::known::KnownSessions;
use crate::{JournalError, TenantId};

/// The most requests one group takes.
const MAX_GROUP_REQUESTS: usize = 128;
/// The most events one group takes (a larger single request goes alone).
const MAX_GROUP_EVENTS: usize = 4096;

/// Where a request's answer goes. Sending it counts the append in the
/// process's metrics (see [`record`]), whether or not its caller still
/// waits.
struct Reply {
    sender: oneshot::Sender<Result<Appended, JournalError>>,
    submitted: std::time::Instant,
}

impl Reply {
    fn send(self, answer: Result<Appended, JournalError>) {
        record(&answer, self.submitted.elapsed());
        let _ = self.sender.send(answer);
    }
}

/// The append queue and its workers.
pub(crate) struct Combiner {
    pool: Pool,
    max_groups: usize,
    /// The statement that ends a group's transaction.
    commit: &'static str,
    queue: Mutex<Queue>,
    counters: Counters,
    /// Woken after every committed group.
    committed: tokio::sync::Notify,
    /// The sessions this process appended to, as it left them.
    known: KnownSessions,
    /// Whether the database is distributed (see the module's doc).
    distributed: tokio::sync::OnceCell<bool>,
}

/// Whether the database is a Citus coordinator.
const IS_DISTRIBUTED: &str = "select exists (select 1 from pg_extension where extname = 'citus')";

#[derive(Default)]
struct Counters {
    groups: AtomicU64,
    grouped: AtomicU64,
    failed_groups: AtomicU64,
    alone: AtomicU64,
}

/// Counters of the append path since the journal was connected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendStats {
    /// Combined transactions run (committed or not).
    pub groups: u64,
    /// Requests those transactions took.
    pub grouped: u64,
    /// Combined transactions that failed as a whole (the requests of those
    /// with more than one were then appended alone).
    pub failed_groups: u64,
    /// Requests appended alone: their session was locked by another
    /// transaction, or their group failed.
    pub alone: u64,
    /// Requests waiting for a group now.
    pub waiting: u64,
    /// Combined transactions committed in one round trip (their sessions
    /// known to this process).
    pub one_trip: u64,
    /// Combined transactions tried in one round trip whose guard (or any
    /// other failure) sent them the two-round-trip way.
    pub one_trip_fell_back: u64,
}

struct Waiting {
    request: Request,
    reply: Reply,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Waiting>,
    /// Sessions in a running group.
    in_flight: HashSet<(TenantId, SessionId)>,
    /// Workers running.
    running: usize,
}

impl Combiner {
    /// A combiner running at most `max_groups` transactions at a time.
    pub(crate) fn new(pool: Pool, max_groups: usize, notify_in_transaction: bool) -> Combiner {
        Combiner {
            pool,
            max_groups: max_groups.max(1),
            commit: if notify_in_transaction {
                group::NOTIFY_AND_COMMIT
            } else {
                "commit"
            },
            queue: Mutex::new(Queue::default()),
            counters: Counters::default(),
            committed: tokio::sync::Notify::new(),
            known: KnownSessions::default(),
            distributed: tokio::sync::OnceCell::new(),
        }
    }

    /// Completes after the next group of this process commits.
    pub(crate) async fn committed(&self) {
        self.committed.notified().await;
    }

    /// Says that something the relay reads committed outside an append
    /// group (a catalogue change), so that it is delivered at once rather
    /// than at the relay's next poll.
    pub(crate) fn announce(&self) {
        self.committed.notify_one();
    }

    /// The counters so far.
    pub(crate) fn stats(&self) -> AppendStats {
        let c = &self.counters;
        let (one_trip, one_trip_fell_back) = self.known.counts();
        AppendStats {
            groups: c.groups.load(Ordering::Relaxed),
            grouped: c.grouped.load(Ordering::Relaxed),
            failed_groups: c.failed_groups.load(Ordering::Relaxed),
            alone: c.alone.load(Ordering::Relaxed),
            waiting: self.queue.lock().expect("the append queue").pending.len() as u64,
            one_trip,
            one_trip_fell_back,
        }
    }

    /// Queues `request` and waits for its answer.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        request: Request,
    ) -> Result<Appended, JournalError> {
        let (sender, answer) = oneshot::channel();
        let reply = Reply {
            sender,
            submitted: std::time::Instant::now(),
        };
        let spawn = {
            let mut q = self.queue.lock().expect("the append queue");
            q.pending.push_back(Waiting { request, reply });
            let spawn = q.running < self.max_groups;
            if spawn {
                q.running += 1;
            }
            spawn
        };
        if spawn {
            tokio::spawn(self.clone().work());
        }
        answer.await.unwrap_or_else(|_| {
            Err(JournalError::Corrupt(
                "the append's transaction ended without an answer".to_owned(),
            ))
        })
    }

    /// A worker: runs groups until none is waiting. It takes a connection
    /// before its group, so that requests arriving meanwhile join it, and
    /// keeps it for the next group.
    async fn work(self: Arc<Self>) {
        let mut worker = Worker {
            combiner: &self,
            sessions: Vec::new(),
            exited: false,
        };
        let mut client = None;
        loop {
            if client.is_none() {
                client = self.connection().await;
            }
            if let Some(c) = &client {
                self.learn_topology(c).await;
            }
            let group = worker.take();
            if group.is_empty() {
                return;
            }
            match &client {
                Some(c) => {
                    if !self.run(c, group).await {
                        // The connection may be broken: take a fresh one.
                        client = None;
                    }
                }
                // Each request tries for a connection of its own, and
                // reports its own failure.
                None => {
                    for w in group {
                        self.alone(w.request, w.reply);
                    }
                }
            }
            worker.release();
        }
    }

    /// Asks the database, once, whether it is distributed; on one that is,
    /// appends are never sent the one-round-trip way.
    async fn learn_topology(&self, client: &deadpool_postgres::Client) {
        if self.distributed.initialized() {
            return;
        }
        let asked = self
            .distributed
            .get_or_try_init(|| async {
                client
                    .query_one(IS_DISTRIBUTED, &[])
                    .await
                    .map(|r| r.get::<_, bool>(0))
            })
            .await;
        match asked {
            Ok(true) => self.known.turn_off(),
            Ok(false) => {}
            Err(e) => tracing::debug!("cannot tell whether the database is distributed: {e}"),
        }
    }

    /// Whether the database is distributed, as far as known (a database not
    /// yet asked is taken to be: what it changes is right on both).
    fn is_distributed(&self) -> bool {
        self.distributed.get().copied().unwrap_or(true)
    }

    /// A connection for a worker.
    async fn connection(&self) -> Option<deadpool_postgres::Client> {
        match self.pool.get().await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("an append worker has no connection: {e}");
                None
            }
        }
    }

    /// Runs one group on `client` and answers each of its requests;
    /// `false` when its transaction failed.
    async fn run(
        self: &Arc<Self>,
        client: &deadpool_postgres::Client,
        group: Vec<Waiting>,
    ) -> bool {
        let (mut requests, replies): (Vec<Request>, Vec<Reply>) =
            group.into_iter().map(|w| (w.request, w.reply)).unzip();
        let c = &self.counters;
        c.groups.fetch_add(1, Ordering::Relaxed);
        c.grouped
            .fetch_add(requests.len() as u64, Ordering::Relaxed);
        match group::write(
            client,
            &mut requests,
            Locking::Skip,
            self.commit,
            &self.known,
            self.is_distributed(),
        )
        .await
        {
            Ok(outcomes) => {
                self.committed.notify_one();
                for ((request, reply), outcome) in requests.into_iter().zip(replies).zip(outcomes) {
                    match outcome {
                        Outcome::Done(answer) => {
                            reply.send(answer);
                        }
                        Outcome::Locked => self.alone(request, reply),
                    }
                }
                true
            }
            Err(e) => {
                c.failed_groups.fetch_add(1, Ordering::Relaxed);
                if requests.len() == 1 {
                    replies.into_iter().next().expect("one").send(Err(e));
                } else {
                    tracing::debug!(
                        requests = requests.len(),
                        "a combined append failed, appending each alone: {e}"
                    );
                    for (request, reply) in requests.into_iter().zip(replies) {
                        self.alone(request, reply);
                    }
                }
                false
            }
        }
    }

    /// Appends `request` in a transaction of its own that waits for its
    /// session's lock.
    fn alone(self: &Arc<Self>, request: Request, reply: Reply) {
        self.counters.alone.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let this = self.clone();
        tokio::spawn(async move {
            let mut requests = [request];
            let answer = match pool.get().await {
                Ok(client) => group::write(
                    &client,
                    &mut requests,
                    Locking::Wait,
                    this.commit,
                    &this.known,
                    this.is_distributed(),
                )
                .await
                .and_then(|outcomes| match outcomes.into_iter().next() {
                    Some(Outcome::Done(answer)) => answer,
                    _ => Err(JournalError::Corrupt(
                        "a waiting append came back unattempted".to_owned(),
                    )),
                }),
                Err(e) => Err(e.into()),
            };
            if answer.as_ref().is_ok_and(|a| !a.duplicate) {
                this.committed.notify_one();
            }
            reply.send(answer);
        });
    }
}

/// Records an answered append in the process's metrics: its outcome, the
/// events it wrote, how long it took, and why it was refused. Each is a
/// registry lookup of a static key and an atomic add (or a histogram
/// sample): no allocation, no lock held across appends.
fn record(answer: &Result<Appended, JournalError>, took: std::time::Duration) {
    metrics::histogram!("narad_append_duration_seconds").record(took);
    match answer {
        Ok(a) if a.duplicate => {
            metrics::counter!("narad_appends_total", "outcome" => "duplicate").increment(1);
        }
        Ok(a) => {
            metrics::counter!("narad_appends_total", "outcome" => "appended").increment(1);
            metrics::counter!("narad_appended_events_total").increment(a.events.len() as u64);
        }
        Err(e) => record_refusal(e),
    }
}

/// Counts an append that was refused (or failed) as `e` says: by rule id
/// for a rule violation, by error code otherwise. Both label sets are
/// bounded: the rules of `narad_protocol::rules`, the catalogued codes.
fn record_refusal(e: &JournalError) {
    let outcome = match e {
        JournalError::Database(_) | JournalError::Pool(_) | JournalError::Corrupt(_) => {
            metrics::counter!("narad_appends_total", "outcome" => "failed")
        }
        _ => metrics::counter!("narad_appends_total", "outcome" => "rejected"),
    };
    outcome.increment(1);
    match e {
        JournalError::Rejected { violation, .. } => {
            metrics::counter!("narad_append_rule_violations_total", "rule" => violation.rule)
                .increment(1);
        }
        other => {
            metrics::counter!("narad_append_refusals_total", "code" => other.code().code())
                .increment(1);
        }
    }
}

/// A running worker's hold on the queue: the sessions of its group.
/// Dropped (also on panic), it releases them and stops counting as running.
struct Worker<'a> {
    combiner: &'a Combiner,
    sessions: Vec<(TenantId, SessionId)>,
    exited: bool,
}

impl Worker<'_> {
    /// Takes the next group: waiting requests in arrival order, skipping
    /// those whose session is in another group and those reusing an
    /// eventId of the group (they go in a later one). An empty group means
    /// the worker has exited.
    fn take(&mut self) -> Vec<Waiting> {
        let mut q = self.combiner.queue.lock().expect("the append queue");
        let mut group = Vec::new();
        let mut events = 0;
        let mut event_ids = HashSet::new();
        let per_tenant = self.combiner.is_distributed();
        let mut i = 0;
        while i < q.pending.len() && group.len() < MAX_GROUP_REQUESTS {
            let r = &q.pending[i].request;
            let key = (r.tenant.clone(), r.session.clone());
            let fits = group.is_empty() || events + r.prepared.len() <= MAX_GROUP_EVENTS;
            let ids: Vec<(TenantId, String)> = r
                .prepared
                .iter()
                .map(|p| (r.tenant.clone(), p.event.envelope.event_id.to_string()))
                .collect();
            let fresh = ids.iter().all(|id| !event_ids.contains(id));
            let same_tenant = !per_tenant
                || group
                    .first()
                    .is_none_or(|w: &Waiting| w.request.tenant == r.tenant);
            if fits && fresh && same_tenant && !q.in_flight.contains(&key) {
                let w = q.pending.remove(i).expect("in range");
                events += w.request.prepared.len();
                event_ids.extend(ids);
                self.sessions.push(key);
                group.push(w);
            } else {
                i += 1;
            }
        }
        if group.is_empty() {
            q.running -= 1;
            self.exited = true;
        } else {
            q.in_flight.extend(self.sessions.iter().cloned());
        }
        group
    }

    /// Releases the sessions of the group just run.
    fn release(&mut self) {
        let mut q = self.combiner.queue.lock().expect("the append queue");
        for key in self.sessions.drain(..) {
            q.in_flight.remove(&key);
        }
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        // A panic mid-group: release its sessions and stop counting.
        let mut q = match self.combiner.queue.lock() {
            Ok(q) => q,
            Err(poisoned) => poisoned.into_inner(),
        };
        for key in self.sessions.drain(..) {
            q.in_flight.remove(&key);
        }
        q.running -= 1;
    }
}
