//! Approval expiry (spec §7.6 `expiresAt`, §7.7): an open interrupt whose
//! deadline passed is resolved by the server with the decision `expired`,
//! exactly once — a person's resolution racing it either commits first
//! (and the expiry finds it decided) or finds the expiry recorded (and
//! gets the 409 with it). Like any resolution it marks the run's work item
//! ready, and the relay wakes waiting runtimes on every replica, so the
//! run's runtime (or backend) resumes or ends it as it owes. Runs in the
//! runtime sweeper's pass, on one replica at a time.

use std::time::Duration;

use narad_journal::{Journal, JournalError};
use narad_protocol::primitives::SessionId;

/// How many due interrupts of each kind one pass takes.
const EXPIRY_BATCH: i32 = 200;

/// Expires the interrupts due now (`expiresAt` passed, or none named and
/// `default_expiry` passed since the request); how many it expired.
pub async fn expire_due(
    journal: &Journal,
    default_expiry: Option<Duration>,
) -> Result<usize, JournalError> {
    let due = journal.interrupts_due(default_expiry, EXPIRY_BATCH).await?;
    let mut expired = 0;
    for item in &due {
        let Ok(session) = SessionId::new(item.session_id.as_str()) else {
            continue;
        };
        match journal
            .expire_interrupt(&item.tenant, &session, &item.interrupt_id)
            .await
        {
            Ok(Some(_)) => {
                expired += 1;
                metrics::counter!("narad_interrupts_expired_total").increment(1);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(
                tenant = %item.tenant, session = item.session_id, interrupt = item.interrupt_id,
                error = %e, "an interrupt could not be expired; the next pass retries it"
            ),
        }
    }
    Ok(expired)
}
