//! Registered extensions: callers that hold no person's token and sign
//! their requests with a secret narad minted for them (seed 004).
//!
//! A registration is `publisher/name`, unique across narad (a signed call
//! names it before any tenant is known), owned by one tenant. The secret
//! is shown once, when it is minted. Request ids of accepted calls are kept
//! in Postgres so that every replica refuses a replay.

use serde::Serialize;

use crate::{Journal, JournalError, TenantId, in_tenant};

/// Bytes of a minted secret.
pub const SECRET_BYTES: usize = 32;

/// A registration as listed (never with its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionRecord {
    /// Who publishes it.
    pub publisher: String,
    /// Its name.
    pub name: String,
    /// Whether its signed calls are accepted.
    pub enabled: bool,
    /// When it was registered (RFC 3339).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub created_at: String,
    /// The subject that registered it.
    pub created_by: String,
}

/// What a signed call's verification needs.
#[derive(Debug, Clone)]
pub struct SigningKey {
    /// The tenant the registration belongs to.
    pub tenant: TenantId,
    /// The HMAC secret.
    pub secret: Vec<u8>,
    /// Whether the registration is enabled.
    pub enabled: bool,
}

const COLUMNS: &str = "publisher, name, enabled, \
    rfc3339(created_at), created_by";

fn record(row: &tokio_postgres::Row) -> ExtensionRecord {
    ExtensionRecord {
        publisher: row.get(0),
        name: row.get(1),
        enabled: row.get(2),
        created_at: row.get(3),
        created_by: row.get(4),
    }
}

impl Journal {
    /// Registers `publisher/name` for `tenant` and mints its secret, which
    /// is returned this once (hex). A name the tenant registered already is
    /// [`JournalError::ExtensionExists`]; other tenants' names are theirs.
    pub async fn register_extension(
        &self,
        tenant: &TenantId,
        publisher: &str,
        name: &str,
        created_by: &str,
    ) -> Result<(ExtensionRecord, String), JournalError> {
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut secret)
            .map_err(|e| JournalError::Corrupt(format!("no randomness for a secret: {e}")))?;
        let client = self.pool.get().await?;
        let row = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                &format!(
                    "insert into extensions (publisher, name, tenant_id, secret, created_by) \
                     values ($1, $2, $3, $4, $5) on conflict do nothing returning {COLUMNS}"
                ),
                &[
                    &publisher,
                    &name,
                    &tenant.as_str(),
                    &&secret[..],
                    &created_by,
                ],
            )
            .await?)
        })
        .await?;
        match row {
            Some(row) => Ok((record(&row), hex::encode(secret))),
            None => Err(JournalError::ExtensionExists(format!("{publisher}/{name}"))),
        }
    }

    /// Enables or disables a registration of `tenant`.
    pub async fn set_extension_enabled(
        &self,
        tenant: &TenantId,
        publisher: &str,
        name: &str,
        enabled: bool,
    ) -> Result<ExtensionRecord, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    &format!(
                        "update extensions set enabled = $4 \
                         where tenant_id = $1 and publisher = $2 and name = $3 returning {COLUMNS}"
                    ),
                    &[&tenant.as_str(), &publisher, &name, &enabled],
                )
                .await?;
            row.map(|r| record(&r))
                .ok_or_else(|| JournalError::NotFound(format!("extension {publisher}/{name}")))
        })
        .await
    }

    /// The registrations of `tenant`.
    pub async fn extensions(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<ExtensionRecord>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            Ok(c.query(
                &format!(
                    "select {COLUMNS} from extensions where tenant_id = $1 order by publisher, name"
                ),
                &[&tenant.as_str()],
            )
            .await?
            .iter()
            .map(record)
            .collect())
        })
        .await
    }

    /// The signing key of `tenant`'s registration `publisher/name`, read
    /// within that tenant.
    pub async fn signing_key(
        &self,
        tenant: &TenantId,
        publisher: &str,
        name: &str,
    ) -> Result<Option<SigningKey>, JournalError> {
        let client = self.pool.get().await?;
        let row = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select secret, enabled from extensions \
                 where tenant_id = $1 and publisher = $2 and name = $3",
                &[&tenant.as_str(), &publisher, &name],
            )
            .await?)
        })
        .await?;
        Ok(row.map(|r| SigningKey {
            tenant: tenant.clone(),
            secret: r.get(0),
            enabled: r.get(1),
        }))
    }

    /// Records that `extension` used `request_id`: `false` when it had
    /// already used it (a replay). An id is kept for twice the window and
    /// five minutes more, so that clocks of replicas and database that
    /// differ by minutes cannot reopen it; older ids are forgotten as new
    /// ones arrive.
    pub async fn accept_request_id(
        &self,
        tenant: &TenantId,
        extension: &str,
        request_id: &str,
        window_seconds: u32,
    ) -> Result<bool, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let fresh = c
                .query_opt(
                    "with forgotten as (
                       delete from request_nonces
                       where tenant_id = $1 and extension = $2
                         and seen_at < now() - make_interval(secs => $4::int * 2 + 300)
                     )
                     insert into request_nonces (tenant_id, extension, request_id)
                     values ($1, $2, $3) on conflict do nothing returning 1",
                    &[
                        &tenant.as_str(),
                        &extension,
                        &request_id,
                        &(window_seconds as i32),
                    ],
                )
                .await?;
            Ok(fresh.is_some())
        })
        .await
    }
}
