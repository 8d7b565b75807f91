//! The erasure sweeper: on one replica at a time, it works through the
//! tenant erasures asked for (a bounded batch of sessions each pass,
//! resumable after a crash), applies each organisation's retention
//! policy (`retentionDays`), collects blobs no event names, and deletes
//! the objects of deleted blobs from an object store.

use std::sync::Arc;
use std::time::Instant;

use narad_journal::{ErasureReason, Journal, JournalError};

use crate::hub::Hub;
use crate::quotas::{Limit, Quotas};
use crate::runtime::RuntimeSettings;

/// Sessions one pass erases per tenant erasure, each in its own
/// transaction.
pub const TENANT_BATCH: i64 = 100;

/// Sessions one retention pass erases per tenant, at most.
const RETENTION_BATCH: i32 = 100;

/// Runs until the hub closes: tenant erasures every sweep interval,
/// retention every retention interval.
pub async fn sweep(
    journal: Journal,
    hub: Arc<Hub>,
    quotas: Arc<Quotas>,
    settings: Arc<RuntimeSettings>,
) {
    let mut retained_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = hub.closed() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
        let retention_due = retained_at.is_none_or(|at| at.elapsed() >= settings.retention_sweep);
        let pass = journal
            .as_erasure_sweeper(async || {
                erase_tenants(&journal).await?;
                delete_objects(&journal).await?;
                if retention_due {
                    apply_retention(&journal, &quotas).await?;
                    collect_blobs(&journal, settings.blob_unreferenced_after).await?;
                    forget_idempotency_keys(&journal).await?;
                }
                Ok::<_, JournalError>(())
            })
            .await;
        match pass {
            Ok(Some(Err(e))) | Err(e) => {
                tracing::warn!(error = %e, "an erasure sweep failed; it runs again")
            }
            Ok(Some(Ok(()))) if retention_due => retained_at = Some(Instant::now()),
            Ok(_) => {}
        }
    }
}

/// Deletes the expired idempotency keys of every tenant.
pub async fn forget_idempotency_keys(journal: &Journal) -> Result<(), JournalError> {
    while journal.forget_idempotency_keys(FORGET_KEYS_BATCH).await? == i64::from(FORGET_KEYS_BATCH)
    {
    }
    Ok(())
}

/// How many expired idempotency keys one statement deletes.
const FORGET_KEYS_BATCH: i32 = 5_000;

/// One batch of every unfinished tenant erasure.
pub async fn erase_tenants(journal: &Journal) -> Result<(), JournalError> {
    for tenant in journal.tenant_erasures_pending().await? {
        let (erased, done) = journal.erase_tenant_batch(&tenant, TENANT_BATCH).await?;
        for _ in 0..erased {
            crate::metrics::session_erased(ErasureReason::Tenant);
        }
        if done {
            tracing::info!(tenant = %tenant, "a tenant's erasure finished");
        }
    }
    Ok(())
}

/// Deletes blobs no event has named for `after` (uploads never used), and
/// uploads unfinished for `after`, failing the events that named them.
pub async fn collect_blobs(
    journal: &Journal,
    after: std::time::Duration,
) -> Result<(), JournalError> {
    // Uploads never finished: the events that named them fail first.
    for (tenant, blob_id) in journal.blobs_abandoned(after, 500).await? {
        if let Some(blob) = journal.blob(&tenant, &blob_id).await?
            && let Err(e) = journal.settle_blob(&tenant, &blob, true).await
        {
            tracing::warn!(error = %e, blob = %blob_id,
                "cannot fail the events naming an abandoned upload; deleting it all the same");
        }
        journal.discard_blob(&tenant, &blob_id).await?;
        crate::metrics::blob_collected();
    }
    for (tenant, blob_id) in journal.blobs_unreferenced(after, 500).await? {
        journal.discard_blob(&tenant, &blob_id).await?;
        crate::metrics::blob_collected();
    }
    Ok(())
}

/// Deletes the objects of blobs deleted since the last pass (erased,
/// discarded, collected), a batch at a time.
pub async fn delete_objects(journal: &Journal) -> Result<(), JournalError> {
    let deleted = journal.delete_queued_objects(100).await?;
    if deleted > 0 {
        tracing::debug!(blobs = deleted, "deleted the objects of deleted blobs");
    }
    Ok(())
}

/// Erases the sessions each organisation's retention makes due.
pub async fn apply_retention(journal: &Journal, quotas: &Quotas) -> Result<(), JournalError> {
    for tenant in journal.session_tenants().await? {
        let Some(days) = quotas.effective(&tenant).await?.get(Limit::RetentionDays) else {
            continue;
        };
        for due in journal
            .retention_due(&tenant, days as f64, RETENTION_BATCH)
            .await?
        {
            match journal
                .erase_session(&tenant, &due.session_id, ErasureReason::Retention)
                .await
            {
                Ok(_) => crate::metrics::session_erased(ErasureReason::Retention),
                Err(JournalError::SessionNotFound(_) | JournalError::SessionErased(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
