//! Attachment and artifact bytes (§9.5) in Postgres: a blob belongs to one
//! session of one tenant, is written in chunks of at most [`CHUNK`] bytes
//! (each in its own transaction, so that a slow upload holds no connection
//! between chunks), and becomes `stored` once complete with its SHA-256.

use crate::{Journal, JournalError, TenantId, in_tenant};

/// The largest chunk stored in one row: an upload holds at most this much
/// in memory, and a download reads this much at a time.
pub const CHUNK: usize = 1024 * 1024;

/// A blob as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct BlobRecord {
    /// Its id (`narad://blobs/{blob_id}`).
    pub blob_id: String,
    /// The session it belongs to.
    pub session_id: String,
    /// The file name it was uploaded with.
    pub name: String,
    /// The media type it was declared with.
    pub media_type: String,
    /// Its size in bytes (so far, while uploading).
    pub size_bytes: u64,
    /// SHA-256 of its bytes, hex, once stored.
    pub sha256: Option<String>,
    /// Whether every byte is there.
    pub stored: bool,
    /// When the upload began (RFC 3339).
    pub created_at: String,
    /// The length a resumable upload announced.
    pub upload_length: Option<u64>,
}

const COLUMNS: &str = "blob_id, session_id, name, media_type, size_bytes, \
    encode(sha256, 'hex'), state = 'stored', \
    to_char(created_at at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), upload_length";

fn record(r: &tokio_postgres::Row) -> BlobRecord {
    BlobRecord {
        blob_id: r.get(0),
        session_id: r.get(1),
        name: r.get(2),
        media_type: r.get(3),
        size_bytes: u64::try_from(r.get::<_, i64>(4)).unwrap_or(0),
        sha256: r.get(5),
        stored: r.get(6),
        created_at: r.get(7),
        upload_length: r
            .get::<_, Option<i64>>(8)
            .and_then(|n| u64::try_from(n).ok()),
    }
}

impl Journal {
    /// Begins a blob of `session` (which must exist), of `upload_length`
    /// bytes when a resumable upload announced them: answers it, empty.
    pub async fn create_blob(
        &self,
        tenant: &TenantId,
        session: &str,
        name: &str,
        media_type: &str,
        upload_length: Option<u64>,
    ) -> Result<BlobRecord, JournalError> {
        let upload_length = upload_length.map(|n| n as i64);
        let blob_id = narad_protocol::primitives::EventId::new_v7().to_string();
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    &format!(
                        "insert into blobs (tenant_id, blob_id, session_id, name, media_type, \
                           upload_length) \
                         select $1, $2, $3, $4, $5, $6 from sessions \
                         where tenant_id = $1 and session_id = $3 returning {COLUMNS}"
                    ),
                    &[
                        &tenant.as_str(),
                        &blob_id,
                        &session,
                        &name,
                        &media_type,
                        &upload_length,
                    ],
                )
                .await?;
            match row {
                Some(row) => Ok(record(&row)),
                None => Err(JournalError::SessionNotFound(session.to_owned())),
            }
        })
        .await
    }

    /// Stores chunk `seq` of an uploading blob (replacing a shorter one
    /// a resumed upload tops up); the blob's size becomes the bytes up to
    /// the end of this chunk.
    pub async fn put_blob_chunk(
        &self,
        tenant: &TenantId,
        blob_id: &str,
        seq: i32,
        data: &[u8],
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        let size = i64::from(seq) * CHUNK as i64 + data.len() as i64;
        in_tenant(client, tenant, async |c| {
            c.execute(
                "insert into blob_chunks (tenant_id, blob_id, seq, data) values ($1, $2, $3, $4) \
                 on conflict (tenant_id, blob_id, seq) do update set data = excluded.data",
                &[&tenant.as_str(), &blob_id, &seq, &data],
            )
            .await?;
            // The size so far counts in the tenant's stored bytes at once.
            c.execute(
                "update blobs set size_bytes = $3 where tenant_id = $1 and blob_id = $2",
                &[&tenant.as_str(), &blob_id, &size],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Marks a blob stored, with its size and digest.
    pub async fn finish_blob(
        &self,
        tenant: &TenantId,
        blob_id: &str,
        size: u64,
        sha256: &[u8],
    ) -> Result<BlobRecord, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_one(
                    &format!(
                        "update blobs set state = 'stored', size_bytes = $3, sha256 = $4, \
                         stored_at = now() where tenant_id = $1 and blob_id = $2 \
                         returning {COLUMNS}"
                    ),
                    &[&tenant.as_str(), &blob_id, &(size as i64), &sha256],
                )
                .await?;
            Ok(record(&row))
        })
        .await
    }

    /// Deletes a blob and its chunks (an upload refused or abandoned).
    pub async fn discard_blob(&self, tenant: &TenantId, blob_id: &str) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            c.execute(
                "delete from blob_chunks where tenant_id = $1 and blob_id = $2",
                &[&tenant.as_str(), &blob_id],
            )
            .await?;
            c.execute(
                "delete from blobs where tenant_id = $1 and blob_id = $2",
                &[&tenant.as_str(), &blob_id],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// A blob of `tenant`, if it has one by that id.
    pub async fn blob(
        &self,
        tenant: &TenantId,
        blob_id: &str,
    ) -> Result<Option<BlobRecord>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    &format!("select {COLUMNS} from blobs where tenant_id = $1 and blob_id = $2"),
                    &[&tenant.as_str(), &blob_id],
                )
                .await?;
            Ok(row.as_ref().map(record))
        })
        .await
    }

    /// Chunk `seq` of a blob.
    pub async fn blob_chunk(
        &self,
        tenant: &TenantId,
        blob_id: &str,
        seq: i32,
    ) -> Result<Option<Vec<u8>>, JournalError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "select data from blob_chunks where tenant_id = $1 and blob_id = $2 and seq = $3",
            )
            .await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(&stmt, &[&tenant.as_str(), &blob_id, &seq])
                .await?;
            Ok(row.map(|r| r.get(0)))
        })
        .await
    }

    /// The bytes `tenant`'s blobs hold, uploads under way included.
    pub async fn stored_bytes(&self, tenant: &TenantId) -> Result<u64, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let n: i64 = c
                .query_one(
                    "select coalesce(sum(size_bytes), 0)::bigint from blobs where tenant_id = $1",
                    &[&tenant.as_str()],
                )
                .await?
                .get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    /// Up to `max` blobs, across tenants, older than `age` that no event
    /// names: uploads never referenced or never finished.
    pub async fn blobs_unreferenced(
        &self,
        age: std::time::Duration,
        max: i32,
    ) -> Result<Vec<(TenantId, String)>, JournalError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "select tenant_id, blob_id from blobs_unreferenced($1, $2)",
                &[&age.as_secs_f64(), &max],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let tenant = TenantId::new(r.get::<_, String>(0))
                    .map_err(|e| JournalError::Corrupt(format!("tenant id: {e}")))?;
                Ok((tenant, r.get(1)))
            })
            .collect()
    }

    /// The SHA-256 of a blob's `size` bytes, read back chunk by chunk (a
    /// resumable upload's bytes arrive over several requests).
    pub async fn blob_sha256(
        &self,
        tenant: &TenantId,
        blob_id: &str,
        size: u64,
    ) -> Result<Vec<u8>, JournalError> {
        use sha2::Digest;
        let mut digest = sha2::Sha256::new();
        let chunks = size.div_ceil(CHUNK as u64);
        for seq in 0..chunks {
            let data = self
                .blob_chunk(tenant, blob_id, seq as i32)
                .await?
                .ok_or_else(|| {
                    JournalError::Corrupt(format!("blob {blob_id} lacks chunk {seq}"))
                })?;
            digest.update(&data);
        }
        Ok(digest.finalize().to_vec())
    }
}
