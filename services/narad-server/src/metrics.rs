//! Prometheus metrics: one recorder per process, rendered at `/metrics`.
//!
//! Code records through the `metrics` facade (`metrics::counter!` and
//! friends); [`install`] sets the process's recorder once, and the route
//! renders what it holds. Without a recorder (a library user that never
//! installs one) recording costs nothing and `/metrics` is empty.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process's Prometheus recorder (once; later calls return
/// the same handle) and describes narad's metrics.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .install_recorder()
            .expect("no other metrics recorder is installed in this process");
        describe();
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

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "narad_runtime_queue_depth",
        "Work items of agent runtimes by queue and state (ready, claimed, idle, closing)"
    );
    describe_counter!(
        "narad_runtime_claims_total",
        "Runs handed to agent runtimes"
    );
    describe_histogram!(
        "narad_runtime_claim_wait_seconds",
        metrics::Unit::Seconds,
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
}
