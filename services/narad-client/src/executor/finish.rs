//! Sending finishes: `POST {base}/v1/executors/{id}/finish` with a
//! `client.tool.finish`, until the server gives a definite answer.
//!
//! A 2xx or 4xx answer is final for the token (it is marked so in the
//! store and never sent again); a 5xx, a 408, a 429 or no answer is
//! retried with a growing backoff, on the next replica, and at once after
//! every reconnect.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use narad_protocol::control::ClientToolFinish;
use narad_protocol::envelope::ControlEnvelope;
use narad_protocol::primitives::ExecutionToken;
use narad_protocol::{ControlBody, ControlMessage, WireObject};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store::{StoreError, TokenEntry, TokenStore};
use super::{ExecutorStats, Timings, blocking, bump};
use crate::urls::endpoint;

/// What the finisher is asked to do.
#[derive(Debug)]
pub(crate) enum FinishRequest {
    /// Send this token's finish (its result is stored).
    One(ExecutionToken),
    /// Send every stored result not yet final (after a (re)connect).
    AllPending,
    /// Answer once every request before this one was tried.
    Flush(oneshot::Sender<()>),
}

/// How the server answered a finish.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FinishAnswer {
    /// 2xx: the finish is recorded (`duplicate`: an identical one was
    /// recorded before).
    Accepted {
        /// An identical finish was accepted before.
        duplicate: bool,
        /// The tool.call.finished event, when the body names it.
        event_id: Option<String>,
    },
    /// 4xx: refused for good (a different finish recorded, the call
    /// closed, the token expired, unknown or not this lease's).
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error code (`NRD-…`), when the body has one.
        code: Option<String>,
        /// The error text, when the body has one.
        message: Option<String>,
    },
    /// No definite answer: try again later.
    Retry(String),
}

/// Classifies an answer by its status and body.
pub(crate) fn classify(status: u16, body: &[u8]) -> FinishAnswer {
    let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let text = |k: &str| json[k].as_str().map(str::to_owned);
    match status {
        200..=299 => FinishAnswer::Accepted {
            duplicate: json["duplicate"].as_bool().unwrap_or(false),
            event_id: text("eventId"),
        },
        // A timeout and a rate limit say nothing about the token.
        408 | 429 => FinishAnswer::Retry(format!("HTTP {status}")),
        400..=499 => FinishAnswer::Refused {
            status,
            code: text("code"),
            message: text("message"),
        },
        _ => FinishAnswer::Retry(format!("HTTP {status}")),
    }
}

/// The `client.tool.finish` of a stored result, under the lease its token
/// was delivered under; `None` when no result is stored.
pub(crate) fn finish_message(entry: &TokenEntry) -> Option<Value> {
    let result = entry.result.as_ref()?;
    let accepted = &entry.accepted;
    let finish = ClientToolFinish {
        execution_token: accepted.execution_token.clone(),
        outcome: result.outcome,
        response: result.response.clone(),
        code: result.code.clone(),
        message: result.message.clone(),
        client_executor_id: Some(accepted.client_executor_id.clone()),
        lease_id: Some(accepted.lease_id.clone()),
        tool_call_id: Some(accepted.tool_call_id.clone()),
    };
    let message = WireObject::Control(ControlMessage {
        envelope: ControlEnvelope::default(),
        body: ControlBody::ClientToolFinish(finish),
    });
    Some(message.to_json())
}

/// A token waiting for another attempt.
struct Retry {
    due: Instant,
    backoff: Duration,
}

/// Sends finishes, one at a time, and keeps those without a definite
/// answer for another attempt.
pub(crate) struct Finisher {
    http: reqwest::Client,
    bases: Vec<reqwest::Url>,
    jwt: String,
    store: Arc<dyn TokenStore>,
    stats: ExecutorStats,
    timings: Timings,
    replica: usize,
    retries: HashMap<ExecutionToken, Retry>,
}

impl Finisher {
    pub(crate) fn new(
        http: reqwest::Client,
        bases: Vec<reqwest::Url>,
        jwt: String,
        store: Arc<dyn TokenStore>,
        stats: ExecutorStats,
        timings: Timings,
    ) -> Finisher {
        Finisher {
            http,
            bases,
            jwt,
            store,
            stats,
            timings,
            replica: 0,
            retries: HashMap::new(),
        }
    }

    /// Serves requests until `stop`.
    pub(crate) async fn run(
        mut self,
        mut requests: UnboundedReceiver<FinishRequest>,
        stop: CancellationToken,
    ) {
        loop {
            let next_due = self.retries.values().map(|r| r.due).min();
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                request = requests.recv() => match request {
                    None => return,
                    Some(FinishRequest::One(token)) => {
                        let entry = self.load(move |s| s.get(&token)).await.flatten();
                        if let Some(entry) = entry {
                            self.send(entry).await;
                        }
                    }
                    Some(FinishRequest::AllPending) => {
                        let pending = self.load(|s| s.pending()).await.unwrap_or_default();
                        for entry in pending.into_iter().filter(|e| e.result.is_some()) {
                            self.send(entry).await;
                        }
                    }
                    Some(FinishRequest::Flush(done)) => {
                        let _ = done.send(());
                    }
                },
                () = sleep_until(next_due), if next_due.is_some() => {
                    let now = Instant::now();
                    let due: Vec<_> = self
                        .retries
                        .iter()
                        .filter(|(_, r)| r.due <= now)
                        .map(|(t, _)| t.clone())
                        .collect();
                    for token in due {
                        let t = token.clone();
                        let entry = self.load(move |s| s.get(&t)).await.flatten();
                        match entry {
                            Some(entry) => self.send(entry).await,
                            None => {
                                self.retries.remove(&token);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A store call off the async threads; `None` (logged) when it fails.
    async fn load<T: Send + 'static>(
        &self,
        read: impl FnOnce(&dyn TokenStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Option<T> {
        match blocking(&self.store, read).await {
            Ok(v) => Some(v),
            Err(e) => {
                bump(&self.stats.counters.store_errors);
                tracing::error!(error = %e, "token store call failed");
                None
            }
        }
    }

    /// Sends one token's finish and handles the answer.
    #[tracing::instrument(skip_all, fields(
        tool_call_id = %entry.accepted.tool_call_id,
        lease_id = %entry.accepted.lease_id,
    ))]
    async fn send(&mut self, entry: TokenEntry) {
        let token = entry.accepted.execution_token.clone();
        let Some(message) = finish_message(&entry).filter(|_| !entry.is_final) else {
            self.retries.remove(&token);
            return;
        };
        let counters = &self.stats.counters;
        bump(&counters.finishes_sent);
        let base = &self.bases[self.replica % self.bases.len()];
        let url = endpoint(
            base,
            &[
                "v1",
                "executors",
                entry.accepted.client_executor_id.as_str(),
                "finish",
            ],
        );
        let answer = match self
            .http
            .post(url)
            .bearer_auth(&self.jwt)
            .json(&message)
            .send()
            .await
        {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.bytes().await {
                    Ok(body) => classify(status, &body),
                    Err(e) => FinishAnswer::Retry(format!("reading the answer: {e}")),
                }
            }
            Err(e) => FinishAnswer::Retry(e.to_string()),
        };
        match answer {
            FinishAnswer::Retry(why) => {
                bump(&counters.finish_retries);
                self.replica += 1;
                let backoff = match self.retries.get(&token) {
                    Some(r) => (r.backoff * 2).min(self.timings.max_backoff),
                    None => self.timings.first_backoff,
                };
                tracing::warn!(%why, retry_in = ?backoff, "finish not answered; will retry");
                self.retries.insert(
                    token,
                    Retry {
                        due: Instant::now() + backoff,
                        backoff,
                    },
                );
                return;
            }
            FinishAnswer::Accepted {
                duplicate,
                event_id,
            } => {
                bump(&counters.finishes_accepted);
                if duplicate {
                    bump(&counters.finishes_duplicate);
                }
                tracing::info!(duplicate, event_id, "finish accepted");
            }
            FinishAnswer::Refused {
                status,
                code,
                message,
            } => {
                bump(&counters.finishes_refused);
                tracing::warn!(status, code, message, "finish refused for good");
            }
        }
        self.retries.remove(&token);
        let t = token.clone();
        if self.load(move |s| s.mark_final(&t)).await.is_none() {
            // Not marked: the next start resends it, and the server answers
            // a duplicate (or refuses it) again.
            tracing::warn!("could not mark the finish final");
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::ToolResult;
    use crate::executor::store::AcceptedToken;
    use narad_protocol::primitives::{ClientExecutorId, LeaseId, Timestamp, ToolCallId};
    use narad_protocol::{Classified, Reader};
    use serde_json::json;

    #[test]
    fn answers_are_final_or_retried() {
        let accepted =
            br#"{"toolCallId":"tc-1","eventId":"e1","sessionSequence":7,"duplicate":true}"#;
        assert_eq!(
            classify(200, accepted),
            FinishAnswer::Accepted {
                duplicate: true,
                event_id: Some("e1".into())
            }
        );
        let conflict = br#"{"code":"NRD-0404","title":"t","message":"a different finish"}"#;
        assert_eq!(
            classify(409, conflict),
            FinishAnswer::Refused {
                status: 409,
                code: Some("NRD-0404".into()),
                message: Some("a different finish".into())
            }
        );
        assert!(matches!(
            classify(410, b"{}"),
            FinishAnswer::Refused { status: 410, .. }
        ));
        assert!(matches!(
            classify(403, b"not json"),
            FinishAnswer::Refused { status: 403, .. }
        ));
        assert!(matches!(classify(503, b""), FinishAnswer::Retry(_)));
        assert!(matches!(classify(500, b"{}"), FinishAnswer::Retry(_)));
        assert!(matches!(classify(429, b"{}"), FinishAnswer::Retry(_)));
    }

    #[test]
    fn a_finish_names_the_lease_its_token_was_delivered_under() {
        let entry = TokenEntry {
            accepted: AcceptedToken {
                execution_token: ExecutionToken::new("tok").unwrap(),
                client_executor_id: ClientExecutorId::new("exec-1").unwrap(),
                lease_id: LeaseId::new("L1").unwrap(),
                tool_call_id: ToolCallId::new("tc-1").unwrap(),
                tool_name: "echo".into(),
                execution_token_expires_at: Timestamp::parse("2999-01-01T00:00:00Z").unwrap(),
            },
            result: Some(ToolResult::error("boom", "it broke").with_response(json!({"x": 1}))),
            is_final: false,
        };
        let message = finish_message(&entry).unwrap();
        assert_eq!(
            message,
            json!({
                "type": "client.tool.finish",
                "protocolVersion": "narad/v1",
                "executionToken": "tok",
                "outcome": "error",
                "response": {"x": 1},
                "code": "boom",
                "message": "it broke",
                "clientExecutorId": "exec-1",
                "leaseId": "L1",
                "toolCallId": "tc-1",
            })
        );
        // It is a valid narad/v1 control message.
        let classified = Reader::all_profiles().classify(&message).unwrap();
        assert!(matches!(classified, Classified::Accepted(_)));
        let without_result = TokenEntry {
            result: None,
            ..entry
        };
        assert_eq!(finish_message(&without_result), None);
    }
}
