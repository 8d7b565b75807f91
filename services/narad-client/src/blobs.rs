//! Attachment and artifact bytes (§9.5): upload a blob to a session and
//! get its reference (`narad://blobs/{id}`) for `attachment.added` or
//! `artifact.added`; download one by reference, whole or a range.

use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, RANGE};
use serde_json::Value;

use crate::{Client, ClientError};

/// The prefix of a reference to a blob narad holds.
pub const BLOB_REFERENCE: &str = "narad://blobs/";

/// How long one call waits in all for `Retry-After` answers (429).
const RATE_LIMIT_BUDGET: Duration = Duration::from_secs(60);

impl Client {
    /// Uploads `bytes` as a blob of `session_id` named `name`, of
    /// `media_type`: answers the blob (`{blobId, uri, url, sizeBytes,
    /// sha256, ...}`); put its `uri` in the event that names it.
    pub async fn upload_blob(
        &self,
        session_id: &str,
        bytes: impl Into<reqwest::Body> + Clone,
        name: &str,
        media_type: &str,
    ) -> Result<Value, ClientError> {
        let response = self
            .blob_request(|base, http| {
                let mut url =
                    reqwest::Url::parse(&format!("{base}/v1/sessions/{session_id}/blobs"))
                        .unwrap_or_else(|_| reqwest::Url::parse("http://invalid/").expect("a URL"));
                url.query_pairs_mut().append_pair("name", name);
                http.post(url)
                    .header(CONTENT_TYPE, media_type)
                    .body(bytes.clone())
            })
            .await?;
        response
            .json()
            .await
            .map_err(|e| ClientError::Unavailable(format!("the upload's answer: {e}")))
    }

    /// Downloads a blob by its reference (`narad://blobs/{id}`) or id: the
    /// whole of it, or bytes `first..=last` of it.
    pub async fn download_blob(
        &self,
        reference: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Vec<u8>, ClientError> {
        let id = reference.strip_prefix(BLOB_REFERENCE).unwrap_or(reference);
        let response = self
            .blob_request(|base, http| {
                let request = http.get(format!("{base}/v1/blobs/{id}"));
                match range {
                    Some((first, last)) => request.header(RANGE, format!("bytes={first}-{last}")),
                    None => request,
                }
            })
            .await?;
        Ok(response
            .bytes()
            .await
            .map_err(|e| ClientError::Unavailable(format!("the download broke off: {e}")))?
            .to_vec())
    }

    /// Sends the request `build` makes to each replica in turn until one
    /// answers a success; 429 is retried after its `Retry-After` (within a
    /// minute in all), any other refusal is [`ClientError::Refused`].
    async fn blob_request(
        &self,
        build: impl Fn(&str, &reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let mut waited = Duration::ZERO;
        let mut last = String::from("no replica was tried");
        loop {
            let mut limited = None;
            for base in &self.bases {
                let sent = build(base, &self.http)
                    .bearer_auth(&self.token)
                    .send()
                    .await;
                let response = match sent {
                    Ok(r) => r,
                    Err(e) => {
                        last = format!("{base}: {e}");
                        continue;
                    }
                };
                let status = response.status().as_u16();
                if response.status().is_success() {
                    return Ok(response);
                }
                if status == 429 {
                    limited = Some(
                        crate::retry_after::retry_after(response.headers())
                            .unwrap_or(Duration::from_secs(1)),
                    );
                    break;
                }
                if matches!(status, 502..=504) {
                    last = format!("{base}: {status}");
                    continue;
                }
                let body = response.json().await.unwrap_or(Value::Null);
                return Err(ClientError::Refused { status, body });
            }
            match limited {
                Some(wait) if waited + wait <= RATE_LIMIT_BUDGET => {
                    tokio::time::sleep(wait).await;
                    waited += wait;
                }
                Some(_) => {
                    return Err(ClientError::Unavailable(
                        "the organisation's limit held for longer than a minute".into(),
                    ));
                }
                None => return Err(ClientError::Unavailable(last)),
            }
        }
    }
}
