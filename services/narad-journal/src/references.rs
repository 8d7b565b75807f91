//! Events that name blobs (`narad://blobs/{id}`, §9.5): a batch may name
//! only blobs its tenant holds for the same session; an `attachment.added`
//! / `artifact.added` naming one is followed by the server's `*.ready`
//! (the bytes are there and match) or `*.failed` (their digest or size
//! differs from what the event declares, code `digest_mismatch` /
//! `size_mismatch`). An `*.added` may name a resumable upload still under
//! way: its outcome follows when the upload completes, or `*.failed` with
//! `upload_incomplete` when the collector gives the upload up. A `*.ready`
//! names stored bytes only.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{AppendOptions, BlobRecord, Journal, JournalError, TenantId};
use narad_protocol::primitives::SessionId;

/// The prefix of a reference to a blob narad holds.
pub const BLOB_REFERENCE: &str = "narad://blobs/";

/// The types that may carry a blob reference.
const CARRIERS: &[&str] = &[
    "attachment.added",
    "attachment.ready",
    "artifact.added",
    "artifact.ready",
];

/// A blob event `index` of a batch names, as held.
pub(crate) struct Held {
    index: usize,
    blob: BlobRecord,
}

/// The code of an added blob whose upload never finished.
pub const UPLOAD_INCOMPLETE: &str = "upload_incomplete";

impl Journal {
    /// The blobs a batch names, each held by `tenant`, stored, for
    /// `session`; another tenant's blob, another session's, or an upload
    /// under way is [`JournalError::ReferenceNotHeld`]. Reads nothing for a
    /// batch that names none.
    pub(crate) async fn check_references(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        proposals: &[Value],
    ) -> Result<Vec<Held>, JournalError> {
        let mut held = Vec::new();
        for (index, p) in proposals.iter().enumerate() {
            if !CARRIERS.iter().any(|t| p["type"] == *t) {
                continue;
            }
            let Some(blob_id) = p["uri"]
                .as_str()
                .and_then(|u| u.strip_prefix(BLOB_REFERENCE))
            else {
                continue;
            };
            let problem = match self.blob(tenant, blob_id).await? {
                None => "names a blob this organisation does not hold",
                Some(b) if b.session_id != session.as_str() => {
                    "names a blob of another session; upload it to this session"
                }
                Some(b)
                    if !b.stored && p["type"].as_str().is_some_and(|t| t.ends_with(".added")) =>
                {
                    // Settled when the upload completes (or is given up).
                    held.push(Held { index, blob: b });
                    continue;
                }
                Some(b) if !b.stored => "names a blob whose upload has not finished",
                Some(blob) => {
                    held.push(Held { index, blob });
                    continue;
                }
            };
            return Err(JournalError::ReferenceNotHeld {
                index,
                message: format!("{problem} ({BLOB_REFERENCE}{blob_id})"),
            });
        }
        Ok(held)
    }

    /// Appends, as the server, the `*.ready` (or `*.failed`) of each
    /// `*.added` of `proposals` that names a blob and whose outcome the
    /// batch does not itself carry. An upload still under way is read
    /// again: settled if it completed meanwhile, left to its completion
    /// otherwise. The outcomes' eventIds derive from the added event's, so
    /// settling twice (a retried batch, a completion racing this) appends
    /// once.
    pub(crate) async fn settle_references(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        proposals: &[Value],
        held: Vec<Held>,
    ) -> Result<(), JournalError> {
        for Held { index, blob } in held {
            let blob = if blob.stored {
                blob
            } else {
                match self.blob(tenant, &blob.blob_id).await? {
                    Some(now) if now.stored => now,
                    _ => continue,
                }
            };
            self.settle_added(tenant, session, &proposals[index], proposals, &blob, false)
                .await?;
        }
        Ok(())
    }

    /// Settles every `*.added` of `blob`'s session that names it: when its
    /// upload completed, or (`abandoned`) when the collector gives an
    /// unfinished upload up (`*.failed`, code [`UPLOAD_INCOMPLETE`]).
    pub async fn settle_blob(
        &self,
        tenant: &TenantId,
        blob: &BlobRecord,
        abandoned: bool,
    ) -> Result<(), JournalError> {
        let session = SessionId::new(blob.session_id.clone()).map_err(JournalError::Corrupt)?;
        let uri = format!("{BLOB_REFERENCE}{}", blob.blob_id);
        let client = self.pool.get().await?;
        let added: Vec<Value> = crate::in_tenant(client, tenant, async |c| {
            Ok(c.query(
                "select body from events where tenant_id = $1 and session_id = $2 \
                   and body ->> 'uri' like 'narad://blobs/%' and body ->> 'uri' = $3 \
                   and body ->> 'type' in ('attachment.added', 'artifact.added') \
                 order by session_sequence",
                &[&tenant.as_str(), &session.as_str(), &uri],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
        .await?;
        for event in &added {
            self.settle_added(tenant, &session, event, &[], blob, abandoned)
                .await?;
        }
        Ok(())
    }

    /// Appends the outcome of one `*.added` naming `blob`, unless `batch`
    /// carries it.
    async fn settle_added(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        added: &Value,
        batch: &[Value],
        blob: &BlobRecord,
        abandoned: bool,
    ) -> Result<(), JournalError> {
        let Some(kind) = added["type"]
            .as_str()
            .and_then(|t| t.strip_suffix(".added"))
        else {
            return Ok(());
        };
        let id_field = if kind == "attachment" {
            "attachmentId"
        } else {
            "artifactId"
        };
        let id = &added[id_field];
        let settled = batch.iter().any(|p| {
            p[id_field] == *id
                && (p["type"] == format!("{kind}.ready") || p["type"] == format!("{kind}.failed"))
        });
        if settled {
            return Ok(());
        }
        let digest = blob.sha256.clone().unwrap_or_default();
        let mismatch = if abandoned {
            Some((
                UPLOAD_INCOMPLETE,
                "the upload never finished: its bytes never arrived",
            ))
        } else if added["sha256"]
            .as_str()
            .is_some_and(|d| !d.eq_ignore_ascii_case(&digest))
        {
            Some((
                "digest_mismatch",
                "the bytes' SHA-256 differs from the event's sha256",
            ))
        } else if added["sizeBytes"]
            .as_u64()
            .is_some_and(|s| s != blob.size_bytes)
        {
            Some((
                "size_mismatch",
                "the bytes' size differs from the event's sizeBytes",
            ))
        } else {
            None
        };
        let added_id = added["eventId"].as_str().unwrap_or_default();
        let outcome = if mismatch.is_some() {
            "failed"
        } else {
            "ready"
        };
        let event_id = format!(
            "srv-{}",
            &hex::encode(Sha256::digest(format!("{added_id}\n{outcome}")))[..32]
        );
        let mut event = json!({
            "protocolVersion": "narad/v1",
            "type": format!("{kind}.{outcome}"),
            "eventId": event_id,
            id_field: id,
        });
        match mismatch {
            Some((code, message)) => {
                event["code"] = json!(code);
                event["message"] = json!(message);
            }
            None => event["uri"] = added["uri"].clone(),
        }
        // An artifact is a run's: its outcome goes to the same run.
        for field in ["rootRunId", "runId", "workflowId"] {
            if let Some(v) = added.get(field) {
                event[field] = v.clone();
            }
        }
        match Box::pin(self.append(tenant, session, &[event], AppendOptions::default())).await {
            Ok(_) => Ok(()),
            // Settled before, by this or another path, with the other
            // outcome (a completion raced the collector): the first stands.
            Err(JournalError::Rejected { violation, .. }) if violation.rule.starts_with(kind) => {
                tracing::info!(rule = %violation.rule, "an added blob was settled before");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl Journal {
    /// Adds a stored blob to its session as attachment `attachment_id` on
    /// behalf of a person: `attachment.added` (name, media type, size,
    /// digest and reference) with the caller as actor, then the server's
    /// `attachment.ready`. Answers what the `attachment.added` appended.
    pub async fn attach_blob(
        &self,
        auth: &crate::Authorized,
        blob: &crate::BlobRecord,
        attachment_id: &str,
    ) -> Result<crate::Appended, JournalError> {
        let event = json!({
            "protocolVersion": "narad/v1",
            "type": "attachment.added",
            "eventId": narad_protocol::primitives::EventId::new_v7(),
            "attachmentId": attachment_id,
            "name": blob.name,
            "mediaType": blob.media_type,
            "sizeBytes": blob.size_bytes,
            "sha256": blob.sha256,
            "uri": format!("{BLOB_REFERENCE}{}", blob.blob_id),
        });
        self.append(auth.tenant(), auth.session(), &[event], auth.options())
            .await
    }
}
