//! The gauges no event moves, sampled on every replica every
//! [`GAUGE_EVERY`]: each owner measures its own and pushes the values into
//! [`crate::metrics`] (a leaf): the database pool (here), the runtime
//! queues ([`crate::runtime`]) and the relay's lag
//! ([`Hub::record_lag`]).

use std::sync::Arc;
use std::time::Duration;

use narad_journal::Journal;

use crate::hub::Hub;

/// How often [`spawn`] samples.
pub const GAUGE_EVERY: Duration = Duration::from_secs(5);
/// How soon [`spawn`] samples again while the relay is starting.
const RELAY_STARTING: Duration = Duration::from_millis(100);

/// Starts the task that samples the gauges every [`GAUGE_EVERY`] (sooner
/// while the relay starts) and keeps the recorder's histograms drained; it
/// stops when the hub closes.
pub fn spawn(journal: Journal, hub: Arc<Hub>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let closed = hub.closed();
        tokio::pin!(closed);
        let mut next = Duration::ZERO;
        loop {
            tokio::select! {
                () = &mut closed => return,
                () = tokio::time::sleep(next) => {}
            }
            let pool = journal.pool().status();
            crate::metrics::db_pool(
                pool.size.saturating_sub(pool.available),
                pool.available,
                pool.max_size,
                pool.waiting,
            );
            crate::metrics::upkeep();
            crate::runtime::record_depth(&journal).await;
            next = if hub.record_lag().await {
                GAUGE_EVERY
            } else {
                RELAY_STARTING
            };
        }
    })
}
