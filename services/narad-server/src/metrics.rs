//! Prometheus metrics: one recorder per process, rendered at `/metrics`.
//!
//! Code records through the `metrics` facade (`metrics::counter!` and
//! friends); [`install`] sets the process's recorder once, and the route
//! renders what it holds. Without a recorder (a library user that never
//! installs one) recording costs nothing and `/metrics` is empty.
//!
//! Where each family is recorded:
//! - appends (`narad_appends_total`, `narad_appended_events_total`,
//!   `narad_append_duration_seconds`, `narad_append_rule_violations_total`,
//!   `narad_append_refusals_total`): the journal's combiner, which every
//!   append passes through (the HTTP route adds the refusals of batches
//!   the journal never queued);
//! - live delivery (`narad_streams_open`, `narad_stream_frames_total`,
//!   `narad_stream_slow_consumer_drops_total`): the session and tenant
//!   streams ([`crate::routes::sse`]) and executor sockets
//!   ([`crate::executors`]);
//! - the relay (`narad_outbox_lag_rows`, `narad_outbox_lag_seconds`), the
//!   database pool (`narad_db_pool_*`) and the runtime queues
//!   (`narad_runtime_queue_depth`): sampled by their owners every 5 s
//!   (`crate::gauges`) and set here ([`outbox_lag`], [`db_pool`],
//!   [`runtime_queue_depth`]);
//! - watch events (`narad_watch_events_total`): the coalescer;
//! - client executors (`narad_executor_leases_active`,
//!   `narad_executor_deliveries_total`,
//!   `narad_executor_token_expiries_total`): the executor channel, the
//!   journal's delivery and the sweeper.
//!
//! This module is a leaf: it knows no other module of the crate; owners
//! push their values into it.
//!
//! Labels are bounded and chosen by narad, never by a tenant: kinds,
//! outcomes, states, rule ids and error codes (each from a closed set);
//! never tenants, sessions, events, queue names or other strings a caller
//! sends.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Gauge, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The buckets of `narad_append_duration_seconds`: from a lone append on
/// an idle database (under a millisecond) to a batch of 1,000 events
/// queued behind others.
const APPEND_BUCKETS: [f64; 14] = [
    0.000_5, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0,
];

/// Installs the process's Prometheus recorder (once; later calls return
/// the same handle) and describes narad's metrics.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("narad_append_duration_seconds".to_owned()),
                &APPEND_BUCKETS,
            )
            .expect("buckets are given")
            .install_recorder()
            .expect("no other metrics recorder is installed in this process");
        describe();
        initialize();
        handle
    })
}

/// The text exposition of every metric recorded so far; empty without a
/// recorder.
pub fn render() -> String {
    HANDLE
        .get()
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}

/// What a long-lived connection serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// `GET /v1/sessions/{id}/stream`.
    Session,
    /// `GET /v1/events`.
    Tenant,
    /// An executor's WebSocket (`GET /v1/executors/{id}/connect`).
    Executor,
}

impl StreamKind {
    const ALL: [StreamKind; 3] = [
        StreamKind::Session,
        StreamKind::Tenant,
        StreamKind::Executor,
    ];

    /// The value of the `kind` label.
    pub fn label(self) -> &'static str {
        match self {
            StreamKind::Session => "session",
            StreamKind::Tenant => "tenant",
            StreamKind::Executor => "executor",
        }
    }

    /// The counter of frames sent on streams of this kind (a handle: an
    /// increment is one atomic add).
    pub fn frames(self) -> Counter {
        match self {
            StreamKind::Session => {
                metrics::counter!("narad_stream_frames_total", "kind" => "session")
            }
            StreamKind::Tenant => {
                metrics::counter!("narad_stream_frames_total", "kind" => "tenant")
            }
            StreamKind::Executor => {
                metrics::counter!("narad_stream_frames_total", "kind" => "executor")
            }
        }
    }

    fn open_gauge(self) -> Gauge {
        match self {
            StreamKind::Session => metrics::gauge!("narad_streams_open", "kind" => "session"),
            StreamKind::Tenant => metrics::gauge!("narad_streams_open", "kind" => "tenant"),
            StreamKind::Executor => metrics::gauge!("narad_streams_open", "kind" => "executor"),
        }
    }
}

/// One unit of a gauge held while the guard lives: counted up when made,
/// down when dropped, whichever way its holder ends (a return, an error,
/// a panic, a cancelled task).
#[must_use = "the gauge counts down when this is dropped"]
pub struct Held(Gauge);

impl Held {
    fn of(gauge: Gauge) -> Held {
        gauge.increment(1.0);
        Held(gauge)
    }

    /// An open stream of `kind` (`narad_streams_open`).
    pub fn stream(kind: StreamKind) -> Held {
        Held::of(kind.open_gauge())
    }

    /// An executor lease held by a socket of this replica
    /// (`narad_executor_leases_active`).
    pub fn executor_lease() -> Held {
        Held::of(metrics::gauge!("narad_executor_leases_active"))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Counts an append the HTTP route refused before the journal queued its
/// batch (the journal counts every other answer: appended, duplicate,
/// refused by a rule or for another reason, failed).
pub fn append_refused(code: narad_protocol::ErrorCode) {
    metrics::counter!("narad_appends_total", "outcome" => "rejected").increment(1);
    metrics::counter!("narad_append_refusals_total", "code" => code.code()).increment(1);
}

/// Counts a request a tenant limit refused (`limit`: its label, never
/// the tenant).
pub fn limit_refused(limit: &'static str) {
    metrics::counter!("narad_limit_refusals_total", "limit" => limit).increment(1);
}

/// Counts a request with an `Idempotency-Key`, by what became of it:
/// `first` (it ran), `replayed` (the first answer, again), `reused` (the
/// key was used with another request: 422), `in_flight` (the first had
/// not answered yet: 409).
pub fn idempotency_key(outcome: &'static str) {
    metrics::counter!("narad_idempotency_keys_total", "outcome" => outcome).increment(1);
}

/// Counts a blob the collector deleted: no event named it in time.
pub fn blob_collected() {
    metrics::counter!("narad_blobs_collected_total").increment(1);
}

/// Counts an erased session, by why.
pub fn session_erased(reason: narad_journal::ErasureReason) {
    metrics::counter!("narad_sessions_erased_total", "reason" => reason.as_str()).increment(1);
}

/// Counts a stream closed because its client did not keep up.
pub fn slow_consumer_dropped() {
    metrics::counter!("narad_stream_slow_consumer_drops_total").increment(1);
}

/// Counts a watch event the coalescer emitted.
pub fn watch_emitted(type_name: &str, n: u64) {
    let counter = match type_name {
        "session.revision" => {
            metrics::counter!("narad_watch_events_total", "type" => "session.revision")
        }
        "run.revision" => metrics::counter!("narad_watch_events_total", "type" => "run.revision"),
        "workflow.revision" => {
            metrics::counter!("narad_watch_events_total", "type" => "workflow.revision")
        }
        "workspace.revision" => {
            metrics::counter!("narad_watch_events_total", "type" => "workspace.revision")
        }
        _ => metrics::counter!("narad_watch_events_total", "type" => "other"),
    };
    counter.increment(n);
}

/// The states of `narad_runtime_queue_depth`, its one label.
const QUEUE_STATES: [&str; 4] = ["ready", "claimed", "idle", "closing"];

/// Sets `narad_runtime_queue_depth`: `items(state)` work items in each of
/// its states (a closed set: nothing else becomes a label value).
pub fn runtime_queue_depth(items: impl Fn(&str) -> i64) {
    for state in QUEUE_STATES {
        metrics::gauge!("narad_runtime_queue_depth", "state" => state).set(items(state) as f64);
    }
}

/// Sets the relay's lag: `rows` readable outbox rows it has not read yet,
/// the oldest of them written `oldest_age` ago.
pub fn outbox_lag(rows: u64, oldest_age: Option<Duration>) {
    metrics::gauge!("narad_outbox_lag_rows").set(rows as f64);
    metrics::gauge!("narad_outbox_lag_seconds").set(oldest_age.map_or(0.0, |a| a.as_secs_f64()));
}

/// Sets the database pool's gauges.
pub fn db_pool(in_use: usize, idle: usize, max: usize, waiting: usize) {
    metrics::gauge!("narad_db_pool_connections", "state" => "in_use").set(in_use as f64);
    metrics::gauge!("narad_db_pool_connections", "state" => "idle").set(idle as f64);
    metrics::gauge!("narad_db_pool_max_connections").set(max as f64);
    metrics::gauge!("narad_db_pool_waiting").set(waiting as f64);
}

/// Drains the histogram samples waiting in the recorder: without a scrape
/// they would pile up.
pub fn upkeep() {
    if let Some(handle) = HANDLE.get() {
        handle.run_upkeep();
    }
}

/// Registers the series that must read 0 before their first event, so
/// that every family is listed from the start and `rate()` sees the first
/// increment.
fn initialize() {
    for outcome in ["appended", "duplicate", "rejected", "failed"] {
        metrics::counter!("narad_appends_total", "outcome" => outcome).absolute(0);
    }
    metrics::counter!("narad_appended_events_total").absolute(0);
    for kind in StreamKind::ALL {
        kind.frames().absolute(0);
        kind.open_gauge().increment(0.0);
    }
    metrics::counter!("narad_stream_slow_consumer_drops_total").absolute(0);
    for limit in [
        "events_per_second",
        "commands_per_second",
        "open_streams",
        "attached_executors",
        "sessions",
        "stored_bytes",
        "blob_bytes",
    ] {
        metrics::counter!("narad_limit_refusals_total", "limit" => limit).absolute(0);
    }
    metrics::counter!("narad_blobs_collected_total").absolute(0);
    for reason in ["request", "retention", "tenant"] {
        metrics::counter!("narad_sessions_erased_total", "reason" => reason).absolute(0);
    }
    metrics::counter!("narad_executor_deliveries_total").absolute(0);
    metrics::counter!("narad_executor_token_expiries_total").absolute(0);
    metrics::gauge!("narad_executor_leases_active").increment(0.0);
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "narad_runtime_queue_depth",
        "Work items of agent runtimes by state (ready, claimed, idle, closing), over every tenant and queue"
    );
    describe_counter!(
        "narad_runtime_claims_total",
        "Runs handed to agent runtimes"
    );
    describe_histogram!(
        "narad_runtime_claim_wait_seconds",
        Unit::Seconds,
        "How long a run waited in its queue before a runtime claimed it"
    );
    describe_counter!(
        "narad_runtime_lease_expiries_total",
        "Runtime leases that lapsed without a heartbeat"
    );
    describe_counter!(
        "narad_runtime_repairs_total",
        "Runs the server repaired, by what for: retrying (retry policy: queued again), lost (fail policy or attempts spent: closed with run.error), stopped (a stop no runtime held: closed with run.cancelled)"
    );
    describe_counter!(
        "narad_idempotency_keys_total",
        "Requests with an Idempotency-Key, by outcome: first (it ran), replayed (the kept answer, again), reused (the key came with another request: 422), in_flight (the first had not answered: 409)"
    );
    describe_counter!(
        "narad_audit_write_failures_total",
        "Commands and admin actions that took effect but could not be recorded in the audit log (logged with their request id)"
    );
    describe_counter!(
        "narad_blobs_collected_total",
        "Uploaded blobs deleted because no event named them within NARAD_BLOB_UNREFERENCED_SECONDS"
    );
    describe_counter!(
        "narad_sessions_erased_total",
        "Sessions erased, by why: request (DELETE /v1/sessions/{id}), retention (the organisation's retention policy), tenant (the organisation's erasure)"
    );
    describe_counter!(
        "narad_limit_refusals_total",
        "Requests refused by a tenant limit, by limit (events_per_second, commands_per_second, open_streams, attached_executors, sessions): answered 429 with Retry-After"
    );
    describe_counter!(
        "narad_interrupts_expired_total",
        "Interrupts the server resolved with the decision expired: their expiresAt (or the default expiry) passed with no decision"
    );

    describe_counter!(
        "narad_appends_total",
        "Append requests answered, by outcome: appended, duplicate (an idempotent retry), rejected (refused for the client: a rule, a conflict, an invalid event), failed (the database failed)"
    );
    describe_counter!(
        "narad_appended_events_total",
        Unit::Count,
        "Events written by appended batches"
    );
    describe_histogram!(
        "narad_append_duration_seconds",
        Unit::Seconds,
        "How long an append took, from its submission to the journal's combiner to its answer (queueing included)"
    );
    describe_counter!(
        "narad_append_rule_violations_total",
        "Appends refused for breaking a protocol rule (NRD-0201), by rule id"
    );
    describe_counter!(
        "narad_append_refusals_total",
        "Appends refused or failed for other reasons than a rule, by error code (NRD-xxxx)"
    );
    describe_counter!(
        "narad_append_one_trip_total",
        "Append transactions tried in one round trip on sessions this replica knows, by outcome: committed, fell_back (a session changed elsewhere, an eventId was taken, a runtime holds the run, or a lock was held: written in two round trips)"
    );
    describe_gauge!(
        "narad_streams_open",
        Unit::Count,
        "Streams open on this replica, by kind: session, tenant, executor (WebSocket)"
    );
    describe_counter!(
        "narad_stream_frames_total",
        Unit::Count,
        "Frames handed to streams' connections, by kind (SSE events and records; executor control messages); keep-alives are not counted"
    );
    describe_counter!(
        "narad_stream_slow_consumer_drops_total",
        "Streams ended because their client fell further behind than the hub keeps"
    );
    describe_gauge!(
        "narad_outbox_lag_rows",
        Unit::Count,
        "Committed outbox rows the relay of this replica can read and has not yet read (sampled every 5 s; counts at most 1000)"
    );
    describe_gauge!(
        "narad_outbox_lag_seconds",
        Unit::Seconds,
        "Age of the oldest committed outbox row the relay of this replica has not yet read (sampled every 5 s; 0 when caught up)"
    );
    describe_counter!(
        "narad_watch_events_total",
        "Watch events the coalescer emitted, by type"
    );
    describe_gauge!(
        "narad_executor_leases_active",
        Unit::Count,
        "Client executor leases held by WebSocket channels on this replica (leases of the HTTP form are held by no replica and are not counted)"
    );
    describe_counter!(
        "narad_executor_deliveries_total",
        "Client tool calls handed to executors (each with its execution token), over sockets and polls"
    );
    describe_counter!(
        "narad_executor_token_expiries_total",
        "Client tool calls the sweeper closed as client_execution_expired (the token lapsed without a finish)"
    );
    describe_gauge!(
        "narad_db_pool_connections",
        Unit::Count,
        "Connections of the database pool, by state: in_use, idle"
    );
    describe_gauge!(
        "narad_db_pool_max_connections",
        Unit::Count,
        "The most connections the database pool opens"
    );
    describe_gauge!(
        "narad_db_pool_waiting",
        Unit::Count,
        "Tasks waiting for a connection of the database pool"
    );
}
