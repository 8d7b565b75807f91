//! Agent runtimes on the server: their timing settings and the sweeper
//! that repairs runs whose runtime was lost, serves stops nobody holds and
//! expires interrupts whose deadline passed ([`crate::expiry`]).
//!
//! The queue, leases and repairs live in Postgres
//! (`narad_journal::runtime`), so any replica hands out claims, renews
//! leases and fences appends; the sweeper runs on one replica at a time.

use std::sync::Arc;
use std::time::Duration;

use narad_journal::{Journal, JournalError, Repair, RuntimeDue, WorkDefaults};
use narad_protocol::commands::OnLost;

use crate::hub::Hub;

/// How runtimes are timed, and the defaults of a start-run's `runtime`.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// How long a runtime lease lives without a heartbeat.
    pub lease_ttl: Duration,
    /// How often the sweeper looks for lapsed leases and unheld stops.
    pub sweep_interval: Duration,
    /// A repair untouched this long (its replica died mid-way) is taken
    /// over by the next sweep.
    pub stall: Duration,
    /// The policy of runs that do not name one.
    pub defaults: WorkDefaults,
    /// How long an interrupt that names no `expiresAt` may wait for a
    /// decision; `None`: as long as it takes.
    pub interrupt_default_expiry: Option<Duration>,
    /// How often the erasure sweeper applies retention policies.
    pub retention_sweep: Duration,
    /// How long the journal of a run asked to stop that no runtime holds
    /// may stay silent before the server closes the run (`run.cancelled`,
    /// `stop_unanswered`): a backend driving it answers within this.
    pub stop_grace: Duration,
    /// How long an uploaded blob may go unreferenced by any event before
    /// the collector deletes it.
    pub blob_unreferenced_after: Duration,
    /// How long after a chat front end's stream broke off (the transport's
    /// abort) its run is asked to stop, unless a front end came back to
    /// the session meanwhile; `None`: a broken-off stream stops nothing.
    pub front_end_abort_grace: Option<Duration>,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings {
            lease_ttl: Duration::from_secs(30),
            sweep_interval: Duration::from_secs(1),
            stall: Duration::from_secs(30),
            defaults: WorkDefaults::default(),
            interrupt_default_expiry: None,
            retention_sweep: Duration::from_secs(300),
            stop_grace: Duration::from_secs(30),
            blob_unreferenced_after: Duration::from_secs(24 * 3600),
            front_end_abort_grace: Some(Duration::from_secs(5)),
        }
    }
}

impl RuntimeSettings {
    /// Checks that the settings make sense: durations positive, attempts
    /// in 1..=100.
    pub fn validate(&self) -> Result<(), String> {
        for (name, d) in [
            ("runtime lease lifetime", self.lease_ttl),
            ("runtime sweep interval", self.sweep_interval),
            ("runtime repair stall deadline", self.stall),
            ("retention sweep interval", self.retention_sweep),
            ("stop grace", self.stop_grace),
            ("unreferenced blob lifetime", self.blob_unreferenced_after),
        ] {
            if d.is_zero() {
                return Err(format!("the {name} must be more than 0 ms"));
            }
        }
        if self.interrupt_default_expiry.is_some_and(|d| d.is_zero()) {
            return Err("the default interrupt expiry must be more than 0 s".to_owned());
        }
        if !(1..=narad_protocol::primitives::Attempts::MAX).contains(&self.defaults.max_attempts) {
            return Err(format!(
                "the default runtime max attempts must be 1 to {}, not {}",
                narad_protocol::primitives::Attempts::MAX,
                self.defaults.max_attempts
            ));
        }
        Ok(())
    }

    /// The policy named `on_lost` (`retry` or `fail`).
    pub fn parse_on_lost(on_lost: &str) -> Result<OnLost, String> {
        match on_lost {
            "retry" => Ok(OnLost::Retry),
            "fail" => Ok(OnLost::Fail),
            other => Err(format!(
                "the runtime policy is retry or fail, not {other:?}"
            )),
        }
    }
}

/// How many due items of each kind one sweep takes.
const SWEEP_BATCH: i32 = 100;

/// How long an ended run's item is kept for late releases.
const DONE_RETENTION: Duration = Duration::from_secs(3600);

/// Runs the sweeper until the hub closes: every `sweep_interval`, on the
/// one replica holding the runtime sweeper's lock, repairs runs whose lease
/// lapsed (retry or close), closes runs asked to stop that no runtime
/// holds (queued ones at once, bare ones once their journal stayed silent
/// for `stop_grace`), and takes over repairs that stalled; every
/// [`narad_journal::STATISTICS_CHECK`], analyzes the tables that grew
/// ([`Journal::keep_statistics`]).
pub async fn sweep(journal: Journal, hub: Arc<Hub>, settings: Arc<RuntimeSettings>) {
    let mut statistics_checked = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = hub.closed() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
        let pass = journal
            .as_runtime_sweeper(async || {
                let done = sweep_once(&journal, &hub, &settings).await;
                if let Err(e) = journal.forget_run_work(DONE_RETENTION, 1000).await {
                    tracing::warn!(error = %e, "cannot forget ended work items yet");
                }
                if let Err(e) =
                    crate::expiry::expire_due(&journal, settings.interrupt_default_expiry).await
                {
                    tracing::warn!(error = %e, "an interrupt expiry pass failed; it runs again");
                }
                if statistics_checked.elapsed() >= narad_journal::STATISTICS_CHECK {
                    statistics_checked = tokio::time::Instant::now();
                    match journal.keep_statistics().await {
                        Ok(tables) if !tables.is_empty() => {
                            tracing::debug!(?tables, "analyzed the tables that grew");
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot keep statistics current now"),
                    }
                }
                done
            })
            .await;
        match pass {
            Ok(Some(Err(e))) | Err(e) => {
                tracing::warn!(error = %e, "a runtime sweep failed; it runs again")
            }
            Ok(_) => {}
        }
    }
}

/// One pass of the sweeper (whoever holds the lock); the number of runs
/// it repaired or closed.
pub async fn sweep_once(
    journal: &Journal,
    hub: &Hub,
    settings: &RuntimeSettings,
) -> Result<usize, JournalError> {
    let mut due = journal.runtime_work(settings.stall, SWEEP_BATCH).await?;
    due.extend(
        journal
            .undriven_stops(settings.stop_grace, SWEEP_BATCH)
            .await?,
    );
    let mut done = 0;
    for item in &due {
        match act(journal, item, settings).await {
            Ok(Repair::Nothing) => {}
            Ok(repair) => {
                done += 1;
                if repair == Repair::Retried {
                    hub.wake_runtimes(&item.tenant);
                }
            }
            Err(e) => tracing::warn!(
                tenant = %item.tenant, session = item.session_id, run = item.root_run_id,
                kind = item.kind, error = %e, "a runtime repair failed; the next sweep retries it"
            ),
        }
    }
    Ok(done)
}

async fn act(
    journal: &Journal,
    item: &RuntimeDue,
    settings: &RuntimeSettings,
) -> Result<Repair, JournalError> {
    let (tenant, session, root) = (&item.tenant, &item.session_id, &item.root_run_id);
    let repair = match item.kind.as_str() {
        "lapsed" => {
            let lease = item.lease_id.as_deref().unwrap_or_default();
            metrics::counter!("narad_runtime_lease_expiries_total").increment(1);
            journal.repair_lapsed(tenant, session, root, lease).await?
        }
        "stopped" => {
            if journal.stop_unheld(tenant, session, root).await? {
                Repair::Closed
            } else {
                Repair::Nothing
            }
        }
        "undriven" => {
            journal
                .close_undriven(tenant, session, root, settings.stop_grace)
                .await?
        }
        _ => journal.finish_closing(tenant, session, root).await?,
    };
    let outcome = match repair {
        Repair::Retried => "retried",
        Repair::Closed => "closed",
        Repair::Nothing => return Ok(repair),
    };
    tracing::info!(tenant = %tenant, session, run = root, kind = item.kind, outcome, "runtime repair");
    Ok(repair)
}

/// Counts the work items and sets the queue-depth gauge (every replica,
/// every few seconds, `crate::gauges`): one series per state, summed over
/// every tenant and queue. Queue names are the tenants' own choice and
/// never become label values.
pub(crate) async fn record_depth(journal: &Journal) {
    match journal.queue_depth().await {
        Ok(depth) => crate::metrics::runtime_queue_depth(|state| {
            depth
                .iter()
                .filter(|d| d.state == state)
                .map(|d| d.items)
                .sum()
        }),
        Err(e) => tracing::debug!(error = %e, "cannot count the runtime queues now"),
    }
}
