//! Attachment and artifact bytes (§9.5): a blob belongs to one session of
//! one tenant, is written in chunks of its store's chunk size (each stored
//! on its own, so that a slow upload holds no connection between chunks;
//! every chunk but the last is full), and becomes `stored` once complete
//! with its SHA-256. Where the chunks live: [`crate::blob_store`].

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::blob_store::BlobStore;
use crate::{Journal, JournalError, TenantId, in_tenant};

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
    /// Where its bytes are: `postgres` or `objects`.
    pub store: String,
    /// The size of its chunks (all but the last are full).
    pub chunk_bytes: u64,
}

impl BlobRecord {
    /// The chunk holding byte `offset`.
    pub fn chunk_of(&self, offset: u64) -> i32 {
        (offset / self.chunk_bytes) as i32
    }
}

const COLUMNS: &str = "blob_id, session_id, name, media_type, size_bytes, \
    encode(sha256, 'hex'), state = 'stored', \
    rfc3339(created_at), upload_length, \
    store, chunk_bytes";

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
        store: r.get(9),
        chunk_bytes: u64::try_from(r.get::<_, i32>(10)).unwrap_or(1),
    }
}

/// The most one read of a Postgres chunk fetches.
pub const READ_SLICE: u64 = 256 * 1024;

/// The reads that serve bytes `first..=last` of a blob: per chunk, its
/// range, cut into [`READ_SLICE`]s when `sliced`.
fn pieces(
    blob: &BlobRecord,
    first: u64,
    last: u64,
    sliced: bool,
) -> Vec<(i32, std::ops::Range<u64>)> {
    let chunk = blob.chunk_bytes;
    let mut out = Vec::new();
    for seq in blob.chunk_of(first)..=blob.chunk_of(last) {
        let start = u64::from(seq as u32) * chunk;
        let (lo, hi) = (first.saturating_sub(start), (last + 1 - start).min(chunk));
        let step = if sliced { READ_SLICE } else { hi - lo };
        let mut at = lo;
        while at < hi {
            out.push((seq, at..(at + step).min(hi)));
            at += step;
        }
    }
    out
}

/// An object store's failure, as the journal reports it.
fn unavailable(e: object_store::Error) -> JournalError {
    JournalError::BlobStore(e.to_string())
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
        let (store, chunk) = (self.blob_store.name(), self.blob_store.chunk_bytes() as i32);
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    &format!(
                        "insert into blobs (tenant_id, blob_id, session_id, name, media_type, \
                           upload_length, store, chunk_bytes) \
                         select $1, $2, $3, $4, $5, $6, $7, $8 from sessions \
                         where tenant_id = $1 and session_id = $3 returning {COLUMNS}"
                    ),
                    &[
                        &tenant.as_str(),
                        &blob_id,
                        &session,
                        &name,
                        &media_type,
                        &upload_length,
                        &store,
                        &chunk,
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
    /// the end of this chunk. NotFound when the blob was deleted meanwhile
    /// (its session erased, the upload discarded): nothing of it is kept.
    pub async fn put_blob_chunk(
        &self,
        tenant: &TenantId,
        blob: &BlobRecord,
        seq: i32,
        data: &[u8],
    ) -> Result<(), JournalError> {
        let size = i64::from(seq) * blob.chunk_bytes as i64 + data.len() as i64;
        let postgres = blob.store == BlobStore::Postgres.name();
        if !postgres {
            let objects = self.blob_store.objects()?;
            objects
                .put(tenant.as_str(), &blob.blob_id, seq, data)
                .await
                .map_err(unavailable)?;
        }
        let client = self.pool.get().await?;
        let blob_id = blob.blob_id.as_str();
        let updated = in_tenant(client, tenant, async |c| {
            // The size so far counts in the tenant's stored bytes at once;
            // the row stays locked until the chunk is in (a deletion of
            // the blob waits, and then deletes the chunk with it).
            let updated = c
                .execute(
                    "update blobs set size_bytes = $3 where tenant_id = $1 and blob_id = $2",
                    &[&tenant.as_str(), &blob_id, &size],
                )
                .await?;
            if postgres && updated > 0 {
                c.execute(
                    "insert into blob_chunks (tenant_id, blob_id, seq, data) \
                     values ($1, $2, $3, $4) \
                     on conflict (tenant_id, blob_id, seq) do update set data = excluded.data",
                    &[&tenant.as_str(), &blob_id, &seq, &data],
                )
                .await?;
            }
            Ok(updated)
        })
        .await?;
        if updated == 0 {
            if !postgres {
                // Deleted while this chunk was on its way: its objects were
                // queued for deletion before this one existed.
                self.blob_store
                    .objects()?
                    .delete_blob(tenant.as_str(), blob_id)
                    .await
                    .map_err(unavailable)?;
            }
            return Err(JournalError::NotFound(format!("blob {blob_id}")));
        }
        Ok(())
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

    /// Deletes a blob (an upload refused or abandoned); its bytes go with
    /// it (see [`crate::blob_store`]).
    pub async fn discard_blob(&self, tenant: &TenantId, blob_id: &str) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
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

    /// Chunk `seq` of a blob, if it was written.
    pub async fn blob_chunk(
        &self,
        tenant: &TenantId,
        blob: &BlobRecord,
        seq: i32,
    ) -> Result<Option<bytes::Bytes>, JournalError> {
        if blob.store != BlobStore::Postgres.name() {
            return self
                .blob_store
                .objects()?
                .get(tenant.as_str(), &blob.blob_id, seq)
                .await
                .map_err(unavailable);
        }
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "select data from blob_chunks where tenant_id = $1 and blob_id = $2 and seq = $3",
            )
            .await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(&stmt, &[&tenant.as_str(), &blob.blob_id, &seq])
                .await?;
            Ok(row.map(|r| bytes::Bytes::from(r.get::<_, Vec<u8>>(0))))
        })
        .await
    }

    /// The bytes `first..=last` of a blob: an object store's as they
    /// arrive, Postgres chunks in slices of [`READ_SLICE`] bytes.
    pub fn read_blob(
        &self,
        tenant: &TenantId,
        blob: &BlobRecord,
        first: u64,
        last: u64,
    ) -> BoxStream<'static, Result<bytes::Bytes, JournalError>> {
        let (journal, tenant, blob) = (self.clone(), tenant.clone(), blob.clone());
        let postgres = blob.store == BlobStore::Postgres.name();
        futures::stream::iter(pieces(&blob, first, last, postgres))
            .then(move |(seq, range)| {
                let (journal, tenant, blob) = (journal.clone(), tenant.clone(), blob.clone());
                async move {
                    if postgres {
                        let part = journal.blob_slice(&tenant, &blob, seq, range).await?;
                        return Ok(futures::stream::once(async move { Ok(part) }).boxed());
                    }
                    let objects = journal.blob_store.objects()?;
                    let part = objects
                        .get_range(tenant.as_str(), &blob.blob_id, seq, range)
                        .await
                        .map_err(unavailable)?;
                    Ok(part.map(|r| r.map_err(unavailable)).boxed())
                }
            })
            .map(
                |part: Result<
                    BoxStream<'static, Result<bytes::Bytes, JournalError>>,
                    JournalError,
                >| {
                    match part {
                        Ok(stream) => stream,
                        Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
                    }
                },
            )
            .flatten()
            .boxed()
    }

    /// The bytes `range` of a Postgres chunk: only those are read from
    /// its TOAST slices (the column is stored uncompressed), so a pooled
    /// connection's buffer stays the size of a slice.
    async fn blob_slice(
        &self,
        tenant: &TenantId,
        blob: &BlobRecord,
        seq: i32,
        range: std::ops::Range<u64>,
    ) -> Result<bytes::Bytes, JournalError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "select substring(data from $4 for $5) from blob_chunks \
                 where tenant_id = $1 and blob_id = $2 and seq = $3",
            )
            .await?;
        let (from, length) = (range.start as i32 + 1, (range.end - range.start) as i32);
        let row = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                &stmt,
                &[&tenant.as_str(), &blob.blob_id, &seq, &from, &length],
            )
            .await?)
        })
        .await?;
        let data: Vec<u8> = row
            .ok_or_else(|| {
                JournalError::Corrupt(format!("blob {} lacks chunk {seq}", blob.blob_id))
            })?
            .get(0);
        Ok(bytes::Bytes::from(data))
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

    /// Up to `max` uploads, across tenants, begun longer than `age` ago
    /// and never finished.
    pub async fn blobs_abandoned(
        &self,
        age: std::time::Duration,
        max: i32,
    ) -> Result<Vec<(TenantId, String)>, JournalError> {
        self.blobs_across_tenants("blobs_abandoned", age, max).await
    }

    /// Up to `max` blobs, across tenants, older than `age` that no event
    /// names: uploads never referenced or never finished.
    pub async fn blobs_unreferenced(
        &self,
        age: std::time::Duration,
        max: i32,
    ) -> Result<Vec<(TenantId, String)>, JournalError> {
        self.blobs_across_tenants("blobs_unreferenced", age, max)
            .await
    }

    /// What the collector's cross-tenant `function(age, max)` lists.
    async fn blobs_across_tenants(
        &self,
        function: &'static str,
        age: std::time::Duration,
        max: i32,
    ) -> Result<Vec<(TenantId, String)>, JournalError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                &format!("select tenant_id, blob_id from {function}($1, $2)"),
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

    /// The SHA-256 of a blob's `size` bytes, read back (a resumable
    /// upload's bytes arrive over several requests).
    pub async fn blob_sha256(
        &self,
        tenant: &TenantId,
        blob: &BlobRecord,
        size: u64,
    ) -> Result<Vec<u8>, JournalError> {
        use sha2::Digest;
        let mut digest = sha2::Sha256::new();
        if size > 0 {
            let mut bytes = self.read_blob(tenant, blob, 0, size - 1);
            while let Some(part) = bytes.next().await {
                digest.update(&part?);
            }
        }
        Ok(digest.finalize().to_vec())
    }

    /// Deletes the objects of up to `max` deleted blobs (see
    /// [`crate::blob_store`]): how many blobs' objects went.
    pub async fn delete_queued_objects(&self, max: i32) -> Result<usize, JournalError> {
        let client = self.pool.get().await?;
        let due = client
            .query(
                "select tenant_id, blob_id from blob_deletions_due($1)",
                &[&max],
            )
            .await?;
        drop(client);
        if due.is_empty() {
            return Ok(0);
        }
        let objects = self.blob_store.objects()?;
        for row in &due {
            let (tenant, blob_id): (String, String) = (row.get(0), row.get(1));
            objects
                .delete_blob(&tenant, &blob_id)
                .await
                .map_err(unavailable)?;
            let client = self.pool.get().await?;
            client
                .execute("select blob_deletion_done($1, $2)", &[&tenant, &blob_id])
                .await?;
        }
        Ok(due.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(chunk: u64) -> BlobRecord {
        BlobRecord {
            blob_id: "b".into(),
            session_id: "s".into(),
            name: "n".into(),
            media_type: "application/octet-stream".into(),
            size_bytes: 0,
            sha256: None,
            stored: true,
            created_at: String::new(),
            upload_length: None,
            store: "postgres".into(),
            chunk_bytes: chunk,
        }
    }

    /// The pieces cover exactly the bytes asked for, in order, none
    /// larger than a slice when sliced, none crossing a chunk.
    #[test]
    fn pieces_cover_the_range_exactly() {
        let mib = 1024 * 1024;
        for (chunk, first, last) in [
            (mib, 0, 3 * mib + 4320),
            (mib, mib - 5, mib + 9),
            (mib, 10, 10),
            (8 * mib, 3, 20 * mib),
        ] {
            for sliced in [true, false] {
                let b = blob(chunk);
                let ps = pieces(&b, first, last, sliced);
                let mut at = first;
                for (seq, r) in &ps {
                    assert_eq!(u64::from(*seq as u32) * chunk + r.start, at);
                    assert!(r.end <= chunk && r.start < r.end);
                    assert!(!sliced || r.end - r.start <= READ_SLICE);
                    at += r.end - r.start;
                }
                assert_eq!(at, last + 1, "{chunk} {first} {last} {sliced}");
            }
        }
    }
}
