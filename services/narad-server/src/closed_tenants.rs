//! Closed organisations: once an organisation's erasure is asked for
//! (`DELETE /v1/admin/tenants/{org}`), every credential of it (token,
//! stream ticket, extension signature) is refused with 410 `NRD-0210`, on
//! every replica, and for good.
//!
//! Each replica keeps the list in memory, so that the check costs a request
//! nothing but a lookup: the replica that takes the request closes the
//! organisation at once, the others within [`REFRESH`]. Session creation
//! checks the database itself, under a lock the erasure request also
//! takes, so no session is created for a closed organisation on any
//! replica, and its erasure always finishes.

use std::collections::HashSet;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use narad_journal::{Journal, JournalError, TenantId};

use crate::error::ApiResult;

/// How often a replica reads the list again: another replica's erasure
/// request closes an organisation here within this.
pub const REFRESH: Duration = Duration::from_secs(1);

/// The organisations closed by an erasure, as this replica knows them.
#[derive(Debug, Default)]
pub struct ClosedTenants {
    closed: RwLock<HashSet<String>>,
}

impl ClosedTenants {
    /// The list, read now and then every [`REFRESH`] until the returned
    /// value is dropped.
    pub async fn watch(journal: Journal) -> Arc<ClosedTenants> {
        let closed = Arc::new(ClosedTenants::default());
        closed.refresh(&journal).await;
        let weak: Weak<ClosedTenants> = Arc::downgrade(&closed);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                let Some(closed) = weak.upgrade() else { return };
                closed.refresh(&journal).await;
            }
        });
        closed
    }

    /// Reads the list again; on a failure, keeps what it had (and says so).
    async fn refresh(&self, journal: &Journal) {
        match journal.closed_tenants().await {
            // Closed for good: the list only grows (a read that began
            // before a local close committed takes nothing back).
            Ok(tenants) => self
                .closed
                .write()
                .expect("the closed list")
                .extend(tenants.iter().map(|t| t.to_string())),
            Err(e) => tracing::warn!(error = %e, "the list of erased organisations was not read"),
        }
    }

    /// Closes `tenant` here at once (its erasure was just asked for).
    pub fn close(&self, tenant: &TenantId) {
        self.closed
            .write()
            .expect("the closed list")
            .insert(tenant.to_string());
    }

    /// Refuses a credential of a closed organisation.
    pub fn admit(&self, tenant: &TenantId) -> ApiResult<()> {
        let closed = self.closed.read().expect("the closed list");
        if closed.is_empty() || !closed.contains(tenant.as_str()) {
            return Ok(());
        }
        Err(JournalError::TenantClosed(tenant.to_string()).into())
    }
}
