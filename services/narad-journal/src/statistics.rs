//! Statistics the journal keeps current itself on the tables it grows, so
//! that the hot statements keep their plans whatever the database's own
//! automatic `ANALYZE` does (`migrations/20261208000002_statistics_keeper.sql`).

use std::time::Duration;

use crate::{Journal, JournalError};

/// How often the server's sweeper asks [`Journal::keep_statistics`].
pub const STATISTICS_CHECK: Duration = Duration::from_secs(5);

/// A table changed by more than this many rows plus [`GROWN_FRACTION`] of
/// its rows since it was last analyzed is analyzed again (autovacuum's own
/// default is 50 rows plus a tenth).
pub const GROWN_ROWS: i64 = 500;

/// See [`GROWN_ROWS`].
pub const GROWN_FRACTION: f64 = 0.1;

impl Journal {
    /// Analyzes the tables that changed by more than [`GROWN_ROWS`] plus
    /// [`GROWN_FRACTION`] of their rows since they were last analyzed;
    /// answers their names.
    pub async fn keep_statistics(&self) -> Result<Vec<String>, JournalError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "select analyze_grown($1, $2)",
                &[&GROWN_ROWS, &GROWN_FRACTION],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
