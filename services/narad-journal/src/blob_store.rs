//! Where blob bytes live. Every blob's metadata (tenant, session, size,
//! digest, state) is a row of `blobs` in Postgres; its bytes are chunks,
//! either rows of `blob_chunks` ([`BlobStore::Postgres`], the default) or
//! objects of an S3-compatible store ([`BlobStore::Objects`],
//! `NARAD_BLOB_STORE=s3://bucket/prefix`), one object per chunk at
//! `{prefix}/{tenant}/{blob}/{seq}`. A blob records the store and chunk size
//! it was written with, so both kinds are read whatever the deployment
//! writes today.
//!
//! Objects cannot be deleted in a transaction: a deleted blob row queues
//! its objects (`blob_deletions`, filled by a trigger whichever statement
//! deletes the row) and [`crate::Journal::delete_queued_objects`] deletes
//! them afterwards.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// The chunk size of blobs written to Postgres: one row each.
pub const POSTGRES_CHUNK: usize = 1024 * 1024;

/// The chunk size of blobs written to an object store: one object each,
/// few enough requests for a large file, little enough memory per upload.
pub const OBJECT_CHUNK: usize = 8 * 1024 * 1024;

/// Where new blobs' bytes are written.
#[derive(Clone, Default)]
pub enum BlobStore {
    /// Rows of `blob_chunks`, in the journal's database.
    #[default]
    Postgres,
    /// Objects of an S3-compatible store.
    Objects(Objects),
}

impl std::fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobStore::Postgres => f.write_str("postgres"),
            BlobStore::Objects(o) => write!(f, "{}", o.url),
        }
    }
}

/// An S3-compatible bucket and the prefix narad's objects go under.
#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
}

impl BlobStore {
    /// The store `NARAD_BLOB_STORE` names: `postgres` (or nothing), or
    /// `s3://bucket/prefix` with the endpoint, region and credentials of
    /// the usual `AWS_*` variables (`AWS_ENDPOINT_URL`, `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
    /// …). An `http://` endpoint is allowed as written.
    pub fn from_url(url: &str) -> Result<BlobStore, String> {
        BlobStore::from_url_in(url, std::env::vars())
    }

    /// [`BlobStore::from_url`] with the `AWS_*` variables of `vars` rather
    /// than of the process's environment.
    pub fn from_url_in(
        url: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<BlobStore, String> {
        let url = url.trim();
        if url.is_empty() || url == "postgres" {
            return Ok(BlobStore::Postgres);
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(format!(
                "NARAD_BLOB_STORE={url}: name `postgres` or an S3-compatible bucket, \
                 s3://bucket/prefix"
            ));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!(
                "NARAD_BLOB_STORE={url}: name the bucket, s3://bucket/prefix"
            ));
        }
        let mut builder = object_store::aws::AmazonS3Builder::new().with_bucket_name(bucket);
        for (key, value) in vars {
            if !key.starts_with("AWS_") {
                continue;
            }
            if key.starts_with("AWS_ENDPOINT") && value.starts_with("http://") {
                builder = builder.with_allow_http(true);
            }
            if let Ok(config) = key.to_ascii_lowercase().parse() {
                builder = builder.with_config(config, value);
            }
        }
        let store = builder
            .build()
            .map_err(|e| format!("NARAD_BLOB_STORE={url}: {e}"))?;
        Ok(BlobStore::Objects(Objects {
            store: Arc::new(store),
            prefix: Path::from(prefix.trim_matches('/')),
            url: url.to_owned(),
        }))
    }

    /// The store's name in `blobs.store`.
    pub fn name(&self) -> &'static str {
        match self {
            BlobStore::Postgres => "postgres",
            BlobStore::Objects(_) => "objects",
        }
    }

    /// The chunk size of blobs written here.
    pub fn chunk_bytes(&self) -> usize {
        match self {
            BlobStore::Postgres => POSTGRES_CHUNK,
            BlobStore::Objects(_) => OBJECT_CHUNK,
        }
    }

    /// The object store, for a blob recorded as held in one.
    pub(crate) fn objects(&self) -> Result<&Objects, crate::JournalError> {
        match self {
            BlobStore::Objects(o) => Ok(o),
            // The deployment's configuration, not the data: the store is
            // unavailable to this replica (503) until it is named.
            BlobStore::Postgres => Err(crate::JournalError::BlobStore(
                "a blob's bytes are in an object store, and NARAD_BLOB_STORE names none: \
                 set it to the bucket they were written to"
                    .to_owned(),
            )),
        }
    }
}

impl Objects {
    /// The folder of one blob's chunk objects.
    fn folder(&self, tenant: &str, blob_id: &str) -> Path {
        self.prefix
            .parts()
            .chain([PathPart::from(tenant), PathPart::from(blob_id)])
            .collect()
    }

    /// The object of chunk `seq` of a blob.
    fn chunk(&self, tenant: &str, blob_id: &str, seq: i32) -> Path {
        self.folder(tenant, blob_id)
            .parts()
            .chain([PathPart::from(format!("{seq:08}"))])
            .collect()
    }

    /// Writes chunk `seq` (replacing a shorter one a resumed upload tops up).
    pub(crate) async fn put(
        &self,
        tenant: &str,
        blob_id: &str,
        seq: i32,
        data: &[u8],
    ) -> Result<(), object_store::Error> {
        let payload = PutPayload::from(bytes::Bytes::copy_from_slice(data));
        self.store
            .put(&self.chunk(tenant, blob_id, seq), payload)
            .await?;
        Ok(())
    }

    /// Chunk `seq`, if it was written.
    pub(crate) async fn get(
        &self,
        tenant: &str,
        blob_id: &str,
        seq: i32,
    ) -> Result<Option<bytes::Bytes>, object_store::Error> {
        match self.store.get(&self.chunk(tenant, blob_id, seq)).await {
            Ok(got) => Ok(Some(got.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The bytes `range` of chunk `seq`, as they arrive.
    pub(crate) async fn get_range(
        &self,
        tenant: &str,
        blob_id: &str,
        seq: i32,
        range: std::ops::Range<u64>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<bytes::Bytes, object_store::Error>>,
        object_store::Error,
    > {
        let options = object_store::GetOptions {
            range: Some(range.into()),
            ..Default::default()
        };
        let got = self
            .store
            .get_opts(&self.chunk(tenant, blob_id, seq), options)
            .await?;
        Ok(got.into_stream())
    }

    /// Deletes every object of a blob.
    pub(crate) async fn delete_blob(
        &self,
        tenant: &str,
        blob_id: &str,
    ) -> Result<(), object_store::Error> {
        let folder = self.folder(tenant, blob_id);
        let names = self
            .store
            .list(Some(&folder))
            .map_ok(|meta| meta.location)
            .boxed();
        let mut deleted = self.store.delete_stream(names);
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
