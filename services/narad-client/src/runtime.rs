//! An agent runtime: claims the runs queued for agent runtimes (a
//! `start-run` with `runtime`), runs a [`RunHandler`] on each under a
//! renewed lease, and gives the run back when the handler returns.
//!
//! The loop ([`Runtime::run`]):
//! - claims with a long poll (`POST /v1/runtime/claims`), only while one of
//!   its concurrency slots is free, so that it never holds a run it cannot
//!   start;
//! - for each claim, renews the lease every heartbeat interval and
//!   long-polls the run's controls, so that a stop reaches the handler
//!   within about a second ([`RunContext::stop_requested`]) and a lost
//!   lease ends the handler at once ([`RunContext::lost`]);
//! - calls the handler with a [`RunContext`]: the claim, the session's
//!   history, and appends under the lease (`Narad-Runtime-Lease`);
//! - when the handler returns `Ok`, releases the lease with
//!   `handledThrough`, the last sessionSequence up to which the context
//!   read or wrote every event of the run's journal. The run then waits
//!   until its journal moves past that (an interrupt resolved, a client
//!   tool finished), and is claimed again with that cursor; or it is over.
//!
//! A handler that fails, panics, loses its lease, or is still running when
//! the shutdown grace ends is not released: its lease lapses and the server
//! applies the run's `onLost` policy (another attempt, with the lost
//! holder's backend tool calls cancelled, or `run.error` with code
//! `runtime_lost`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), narad_client::runtime::RuntimeError> {
//! use narad_client::runtime::{RunContext, RunHandler, Runtime, RuntimeError};
//! use serde_json::json;
//!
//! struct Greeter;
//!
//! impl RunHandler for Greeter {
//!     async fn handle(&self, ctx: RunContext) -> Result<(), RuntimeError> {
//!         let _new = ctx.history().await?; // what happened since the last holder
//!         let message = format!("m-{}", ctx.run_id());
//!         ctx.append(vec![
//!             ctx.event("message.text.started",
//!                 json!({"messageId": message, "role": "assistant", "messageScope": "run"})),
//!             ctx.event("message.text.delta", json!({"messageId": message, "delta": "Hello"})),
//!             ctx.event("message.text.completed", json!({"messageId": message})),
//!             ctx.event("run.finished", json!({})),
//!         ])
//!         .await?;
//!         Ok(())
//!     }
//! }
//!
//! let runtime = Runtime::builder(vec!["http://127.0.0.1:8080".into()], "JWT")
//!     .queue("agents")
//!     .build()?;
//! runtime.run(Greeter, async { tokio::signal::ctrl_c().await.ok(); }).await
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use narad_protocol::ErrorCode;
use narad_protocol::commands::OnLost;
use narad_protocol::primitives::{EventId, LeaseId, PROTOCOL_VERSION, QueueName, RunId, SessionId};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::urls::endpoint;

/// The header that carries a runtime lease on appends.
pub const LEASE_HEADER: &str = "narad-runtime-lease";

/// The longest a claim or a control poll may wait (the server's limit).
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// How long one control poll waits for a stop.
const CONTROLS_WAIT: Duration = Duration::from_secs(20);

/// The shortest lease renewal interval, whatever the lease's lifetime.
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

/// After a failed renewal the next try comes at most this much later.
const RENEW_RETRY: Duration = Duration::from_secs(1);

/// A history page's size (the server's largest).
const HISTORY_PAGE: u32 = 1000;

/// Attempts of a request that is safe to repeat (history reads, appends
/// with their eventIds, releases) before it is [`RuntimeError::Unavailable`].
const ATTEMPTS: u32 = 3;

/// The event types that end a run.
const TERMINALS: [&str; 3] = ["run.finished", "run.error", "run.cancelled"];

// ------------------------------------------------------------------ claims

/// A run handed to this runtime, as `POST /v1/runtime/claims` answered.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Claim {
    /// The run (the root of its run journal).
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// The queue it came from.
    pub queue: QueueName,
    /// Why it was ready.
    pub reason: ClaimReason,
    /// What is new to this holder starts after this sessionSequence.
    pub cursor: u64,
    /// This holder's number, from 1; above 1 after lost holders.
    pub attempt: u32,
    /// The most holders the run may have.
    pub max_attempts: u32,
    /// What the server does when this holder's lease lapses.
    pub on_lost: OnLost,
    /// The run was asked to stop before it was claimed.
    pub stop_requested: bool,
    /// The lease that fences the run's appends.
    pub lease: Lease,
}

/// Why a claimed run was ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimReason {
    /// It was just started.
    Started,
    /// Its journal moved while no runtime held it (an interrupt resolved,
    /// a client tool finished, a stop).
    Event,
    /// Its previous holder was lost; the server cancelled that holder's
    /// open backend tool calls.
    Retry,
    /// A reason this SDK does not know yet.
    #[serde(other)]
    Other,
}

/// A runtime lease.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Lease {
    /// The lease id, sent with every append (`Narad-Runtime-Lease`).
    pub lease_id: LeaseId,
    /// When it lapses unless renewed (RFC 3339, the server's clock).
    pub expires_at: String,
}

/// What the server answered an append.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Appended {
    /// The batch's events in order, with their sequences. A queued start
    /// that the batch let in (its run ended) follows them, as the
    /// server's `run.started` of another run.
    pub events: Vec<AppendedEvent>,
    /// The same batch had been appended before (a retry): nothing was
    /// written, and these are the stored sequences.
    #[serde(default)]
    pub duplicate: bool,
}

/// One appended event's identity and sequences.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AppendedEvent {
    /// The event.
    pub event_id: EventId,
    /// Its sessionSequence.
    pub session_sequence: u64,
    /// Its run-tree sequence.
    #[serde(default)]
    pub sequence: Option<u64>,
    /// Its workflowSequence, for a workflow's event.
    #[serde(default)]
    pub workflow_sequence: Option<u64>,
}

/// A lease's standing, as a heartbeat or a control poll reports it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Standing {
    expires_at: String,
    stop_requested: bool,
    /// The run ended under this lease (servers before this field: absent).
    #[serde(default)]
    ended: bool,
}

/// A page of history.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    events: Vec<Value>,
    #[serde(default)]
    next_session_sequence: Option<u64>,
}

// ------------------------------------------------------------------ errors

/// Why a runtime could not be built or stopped, or why a call of a
/// [`RunContext`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The configuration cannot work (no server, a bad URL, a bad queue
    /// name, a wait above 30 s, no concurrency).
    #[error("runtime configuration: {0}")]
    Config(String),
    /// The server refused the token (401 or 403).
    #[error(
        "the server refused the runtime's token ({status}): {}; use a valid token of role \
         backend for this tenant",
        envelope_text(.body)
    )]
    Unauthorized {
        /// The HTTP status.
        status: u16,
        /// The error envelope, as sent (null when the body was not JSON).
        body: Value,
    },
    /// The run's lease is no longer current: it lapsed, was released, or
    /// the run was handed to another runtime. Nothing was written.
    #[error(
        "the runtime lease of run {run_id} is no longer current (it lapsed, was released, or \
         the run went to another runtime): stop working on the run; the server retries it or \
         ends it as its onLost policy says"
    )]
    LeaseLost {
        /// The run.
        run_id: RunId,
    },
    /// The server refused the request for good: retrying it unchanged
    /// cannot help (an event that breaks a protocol rule, an eventId used
    /// for another event, an unknown session).
    #[error("the server refused the request ({status}): {}", envelope_text(.body))]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The error envelope (`{code, title, message, fields?, rule?}`),
        /// as sent.
        body: Value,
    },
    /// No replica gave an answer (connection failures, timeouts, 5xx).
    #[error("the server did not answer: {0}; check that it is up and reachable")]
    Unavailable(String),
    /// The server answered with what narad/v1 does not allow.
    #[error(
        "the server's answer is not what narad/v1 says ({0}); the server and this SDK may be \
         of different versions"
    )]
    Protocol(String),
    /// A run handler's own failure.
    #[error("the run handler failed: {0}")]
    Handler(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl RuntimeError {
    /// A handler's own failure, from any error or a message.
    pub fn handler(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RuntimeError {
        RuntimeError::Handler(error.into())
    }

    /// The `NRD-xxxx` code of a server refusal.
    pub fn code(&self) -> Option<&str> {
        match self {
            RuntimeError::Unauthorized { body, .. } | RuntimeError::Rejected { body, .. } => {
                body["code"].as_str()
            }
            RuntimeError::LeaseLost { .. } => Some(ErrorCode::RuntimeLeaseNotCurrent.code()),
            _ => None,
        }
    }

    /// The protocol rule a refused append broke, when the server named one.
    pub fn rule(&self) -> Option<&str> {
        match self {
            RuntimeError::Rejected { body, .. } => body["rule"].as_str(),
            _ => None,
        }
    }

    /// Whether the claim loop must stop rather than try again.
    fn ends_claiming(&self) -> bool {
        !matches!(self, RuntimeError::Unavailable(_))
    }
}

/// An error envelope as one line: code, message and rule.
fn envelope_text(body: &Value) -> String {
    let mut text = match (body["code"].as_str(), body["message"].as_str()) {
        (Some(code), Some(message)) => format!("{code} {message}"),
        (Some(code), None) => code.to_owned(),
        _ => body.to_string(),
    };
    if let Some(rule) = body["rule"].as_str() {
        text.push_str(&format!(" (rule {rule})"));
    }
    text
}

// ---------------------------------------------------------------- handlers

/// What a runtime does with a claimed run.
///
/// `handle` gets the run's [`RunContext`] and returns when it has done
/// what it can for now: the run ended, or it waits for something outside
/// (an interrupt, a client tool), or it was asked to stop and was closed.
/// Returning `Ok` releases the run; an error leaves its lease to lapse
/// (see the [module documentation](self)).
///
/// Implement it with an `async fn`, or pass a closure
/// `|ctx: RunContext| async move { …; Ok::<(), RuntimeError>(()) }`.
pub trait RunHandler: Send + Sync + 'static {
    /// Works on one claimed run.
    fn handle(&self, ctx: RunContext) -> impl Future<Output = Result<(), RuntimeError>> + Send;
}

impl<F, Fut> RunHandler for F
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), RuntimeError>> + Send,
{
    fn handle(&self, ctx: RunContext) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        self(ctx)
    }
}

// -------------------------------------------------------------------- HTTP

/// Timings of a runtime.
#[derive(Debug, Clone, Copy)]
struct Timings {
    heartbeat: Duration,
    claim_wait: Duration,
    request_timeout: Duration,
    shutdown_grace: Duration,
    first_backoff: Duration,
    max_backoff: Duration,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            heartbeat: Duration::from_secs(10),
            claim_wait: Duration::from_secs(20),
            request_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// The server's API: its replicas (the next one tried when one fails) and
/// the bearer token.
struct Api {
    http: reqwest::Client,
    bases: Vec<Url>,
    token: String,
    replica: AtomicUsize,
    timings: Timings,
}

/// One request.
struct Request<'a> {
    method: Method,
    path: &'a [&'a str],
    query: &'a [(&'a str, String)],
    body: Option<&'a Value>,
    lease: Option<&'a LeaseId>,
    /// How long the server may wait before it answers (a long poll).
    wait: Duration,
    /// How often to send it when no answer comes.
    attempts: u32,
}

impl<'a> Request<'a> {
    fn new(method: Method, path: &'a [&'a str]) -> Request<'a> {
        Request {
            method,
            path,
            query: &[],
            body: None,
            lease: None,
            wait: Duration::ZERO,
            attempts: 1,
        }
    }
}

/// A definite answer (anything but a transport failure, a timeout, a
/// 408, 429 or 5xx).
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    /// The error of a refusal. A 409 `NRD-0501` is [`RuntimeError::LeaseLost`]
    /// when `lease_of` names the run whose lease was presented.
    fn refusal(self, lease_of: Option<&RunId>) -> RuntimeError {
        let status = self.status.as_u16();
        let lease_code =
            self.body["code"].as_str() == Some(ErrorCode::RuntimeLeaseNotCurrent.code());
        match (status, lease_of) {
            (401 | 403, _) => RuntimeError::Unauthorized {
                status,
                body: self.body,
            },
            (409, Some(run)) if lease_code => RuntimeError::LeaseLost {
                run_id: run.clone(),
            },
            _ => RuntimeError::Rejected {
                status,
                body: self.body,
            },
        }
    }

    /// The body of a 2xx answer as `T`.
    fn parse<T: serde::de::DeserializeOwned>(self, what: &str) -> Result<T, RuntimeError> {
        serde_json::from_value(self.body)
            .map_err(|e| RuntimeError::Protocol(format!("{what}: {e}")))
    }
}

/// Whether an answer says nothing definite: try again, elsewhere.
fn transient(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

impl Api {
    /// Sends `request` until a replica gives a definite answer, up to its
    /// attempts, moving to the next replica after each failure.
    async fn send(&self, request: Request<'_>) -> Result<Answer, RuntimeError> {
        let mut backoff = self.timings.first_backoff;
        let mut last = String::new();
        // What the last answer's Retry-After asked for (429, 503).
        let mut asked = None;
        for attempt in 0..request.attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(crate::retry_after::next_wait(backoff, asked.take())).await;
                backoff = (backoff * 2).min(self.timings.max_backoff);
            }
            let replica = self.replica.load(Ordering::Relaxed);
            let base = &self.bases[replica % self.bases.len()];
            let mut url = endpoint(base, request.path);
            if !request.query.is_empty() {
                url.query_pairs_mut().extend_pairs(request.query);
            }
            let mut builder = self
                .http
                .request(request.method.clone(), url)
                .bearer_auth(&self.token)
                .timeout(self.timings.request_timeout + request.wait);
            if let Some(lease) = request.lease {
                builder = builder.header(LEASE_HEADER, lease.as_str());
            }
            if let Some(body) = request.body {
                builder = builder.json(body);
            }
            let failure = match builder.send().await {
                Ok(response) if transient(response.status()) => {
                    asked = crate::retry_after::retry_after(response.headers());
                    format!("{base}: HTTP {}", response.status())
                }
                Ok(response) => {
                    let status = response.status();
                    match response.bytes().await {
                        Ok(bytes) => {
                            let body = if bytes.is_empty() {
                                Value::Null
                            } else {
                                serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                                    Value::String(String::from_utf8_lossy(&bytes).into_owned())
                                })
                            };
                            return Ok(Answer { status, body });
                        }
                        Err(e) => format!("{base}: reading the answer: {e}"),
                    }
                }
                Err(e) => format!("{base}: {}", e.without_url()),
            };
            tracing::debug!(attempt, %failure, "no answer");
            // The next request goes to the next replica (unless another
            // failure moved on already).
            let _ = self.replica.compare_exchange(
                replica,
                replica.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            last = failure;
        }
        Err(RuntimeError::Unavailable(last))
    }

    /// Claims a run, waiting up to `wait` for one; `None` when none became
    /// ready in time.
    async fn claim(
        &self,
        queue: Option<&QueueName>,
        runtime_id: Option<&str>,
        wait: Duration,
    ) -> Result<Option<Claim>, RuntimeError> {
        let mut body = json!({ "waitMs": wait.as_millis() as u64 });
        if let Some(queue) = queue {
            body["queue"] = json!(queue);
        }
        if let Some(id) = runtime_id {
            body["runtimeId"] = json!(id);
        }
        let answer = self
            .send(Request {
                body: Some(&body),
                wait,
                ..Request::new(Method::POST, &["v1", "runtime", "claims"])
            })
            .await?;
        match answer.status {
            StatusCode::NO_CONTENT => Ok(None),
            s if s.is_success() => answer.parse("a claim").map(Some),
            _ => Err(answer.refusal(None)),
        }
    }

    /// Renews a lease.
    async fn heartbeat(&self, run: &RunId, lease: &LeaseId) -> Result<Standing, RuntimeError> {
        let answer = self
            .send(Request::new(
                Method::POST,
                &["v1", "runtime", "leases", lease.as_str(), "heartbeat"],
            ))
            .await?;
        if answer.status.is_success() {
            answer.parse("a heartbeat's answer")
        } else {
            Err(answer.refusal(Some(run)))
        }
    }

    /// Waits up to `wait` for a stop of the lease's run.
    async fn controls(
        &self,
        run: &RunId,
        lease: &LeaseId,
        wait: Duration,
    ) -> Result<Standing, RuntimeError> {
        let answer = self
            .send(Request {
                query: &[("waitMs", wait.as_millis().to_string())],
                wait,
                ..Request::new(
                    Method::GET,
                    &["v1", "runtime", "leases", lease.as_str(), "controls"],
                )
            })
            .await?;
        if answer.status.is_success() {
            answer.parse("a control poll's answer")
        } else {
            Err(answer.refusal(Some(run)))
        }
    }

    /// Gives a run back; what became of it (`idle`, `ready`, `ended`).
    async fn release(
        &self,
        run: &RunId,
        lease: &LeaseId,
        handled_through: u64,
    ) -> Result<String, RuntimeError> {
        let body = json!({ "handledThrough": handled_through });
        let answer = self
            .send(Request {
                body: Some(&body),
                attempts: ATTEMPTS,
                ..Request::new(
                    Method::POST,
                    &["v1", "runtime", "leases", lease.as_str(), "release"],
                )
            })
            .await?;
        if answer.status.is_success() {
            Ok(answer.body["released"].as_str().unwrap_or("").to_owned())
        } else {
            Err(answer.refusal(Some(run)))
        }
    }

    /// One page of a session's history after `after`.
    async fn history_page(&self, session: &SessionId, after: u64) -> Result<Page, RuntimeError> {
        let answer = self
            .send(Request {
                query: &[
                    ("afterSessionSequence", after.to_string()),
                    ("limit", HISTORY_PAGE.to_string()),
                ],
                attempts: ATTEMPTS,
                ..Request::new(Method::GET, &["v1", "sessions", session.as_str(), "events"])
            })
            .await?;
        if answer.status.is_success() {
            answer.parse("a history page")
        } else {
            Err(answer.refusal(None))
        }
    }

    /// Appends a batch under a lease. Resending is safe: the server
    /// answers a batch it already holds with the stored sequences.
    async fn append(
        &self,
        session: &SessionId,
        lease: &LeaseId,
        body: &Value,
    ) -> Result<Answer, RuntimeError> {
        self.send(Request {
            body: Some(body),
            lease: Some(lease),
            attempts: ATTEMPTS,
            ..Request::new(
                Method::POST,
                &["v1", "sessions", session.as_str(), "events"],
            )
        })
        .await
    }
}

// ----------------------------------------------------------------- context

/// The session sequences a run's context has read or written: every one
/// through `through`, and ranges beyond it (after a gap: events appended by
/// others between the context's reads and its writes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    through: u64,
    /// First → last (inclusive) of ranges beyond `through + 1`.
    ahead: BTreeMap<u64, u64>,
}

impl Seen {
    fn new(cursor: u64) -> Seen {
        Seen {
            through: cursor,
            ahead: BTreeMap::new(),
        }
    }

    /// Records that `first..=last` were read or written.
    fn add(&mut self, first: u64, last: u64) {
        if first > last || last <= self.through {
            return;
        }
        let end = self.ahead.entry(first).or_insert(last);
        *end = (*end).max(last);
        while let Some((&first, &last)) = self.ahead.first_key_value() {
            if first > self.through.saturating_add(1) {
                break;
            }
            self.ahead.pop_first();
            self.through = self.through.max(last);
        }
    }

    fn contains(&self, sequence: u64) -> bool {
        sequence <= self.through
            || self
                .ahead
                .range(..=sequence)
                .any(|(_, &last)| last >= sequence)
    }

    /// The last sequence read or written.
    fn furthest(&self) -> u64 {
        self.ahead.values().copied().max().unwrap_or(self.through)
    }
}

/// What the runtime and a run's context share.
struct RunState {
    api: Arc<Api>,
    claim: Claim,
    stop: CancellationToken,
    lost: CancellationToken,
    /// An append of the root's terminal succeeded: the lease ended with
    /// the run.
    ended: AtomicBool,
    /// Held while an append of the root's terminal is in flight, so that
    /// a lease refused meanwhile is judged once that append is answered.
    terminal: tokio::sync::Mutex<()>,
    seen: Mutex<Seen>,
}

impl RunState {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    fn request_stop(&self) {
        if !self.stop.is_cancelled() {
            tracing::info!("the run was asked to stop");
            self.stop.cancel();
        }
    }

    /// The server called the lease not current: the run is lost to this
    /// runtime, unless the lease ended with the run.
    async fn lease_refused(&self, by: &str) {
        let _settled = self.terminal.lock().await;
        if self.ended() {
            tracing::debug!(by, "the lease ended with the run");
        } else if !self.lost.is_cancelled() {
            tracing::warn!(
                by,
                "the runtime lease is no longer current: the run is given up"
            );
            self.lost.cancel();
        }
    }

    /// `handledThrough` for the release: through what the context read or
    /// wrote, and past a gap where the gap holds only events of other run
    /// journals (which do not concern this run).
    async fn handled_through(&self) -> u64 {
        let (through, furthest) = {
            let seen = self.seen();
            (seen.through, seen.furthest())
        };
        if furthest == through || self.ended() {
            return furthest;
        }
        let run = self.claim.run_id.as_str();
        let mut after = through;
        loop {
            let page = match self.api.history_page(&self.claim.session_id, after).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look into a gap of what the handler saw; releasing before it");
                    return through;
                }
            };
            for event in &page.events {
                let Some(sequence) = event["sessionSequence"].as_u64() else {
                    return through;
                };
                if sequence > furthest {
                    return furthest;
                }
                if event["rootRunId"].as_str() == Some(run) && !self.seen().contains(sequence) {
                    return sequence - 1;
                }
            }
            match page.next_session_sequence {
                Some(next) if next < furthest => after = next,
                _ => return furthest,
            }
        }
    }
}

/// A claimed run, as its handler sees it: the claim, the session's
/// history, appends under the run's lease, and the run's stop and lost
/// signals. Clones share one run.
#[derive(Clone)]
pub struct RunContext {
    state: Arc<RunState>,
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("claim", &self.state.claim)
            .field("stop_requested", &self.is_stop_requested())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl RunContext {
    fn new(api: Arc<Api>, claim: Claim) -> RunContext {
        let state = RunState {
            api,
            stop: CancellationToken::new(),
            lost: CancellationToken::new(),
            ended: AtomicBool::new(false),
            terminal: tokio::sync::Mutex::new(()),
            seen: Mutex::new(Seen::new(claim.cursor)),
            claim,
        };
        if state.claim.stop_requested {
            state.stop.cancel();
        }
        RunContext {
            state: Arc::new(state),
        }
    }

    /// The claim, as the server answered it.
    pub fn claim(&self) -> &Claim {
        &self.state.claim
    }

    /// The run (the root of its journal).
    pub fn run_id(&self) -> &RunId {
        &self.state.claim.run_id
    }

    /// Its session.
    pub fn session_id(&self) -> &SessionId {
        &self.state.claim.session_id
    }

    /// What is new to this holder starts after this sessionSequence.
    pub fn cursor(&self) -> u64 {
        self.state.claim.cursor
    }

    /// This holder's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.state.claim.attempt
    }

    /// Why the run was ready.
    pub fn reason(&self) -> ClaimReason {
        self.state.claim.reason
    }

    /// The session's events after the claim's cursor: what is new to this
    /// holder. See [`RunContext::history_after`].
    pub async fn history(&self) -> Result<Vec<Value>, RuntimeError> {
        self.history_after(self.cursor()).await
    }

    /// Every event of the session after `session_sequence`, page after
    /// page, in order.
    ///
    /// What the context reads counts as handled when the run is released:
    /// events of the run's journal that the handler neither read nor wrote
    /// queue the run again at once.
    pub async fn history_after(&self, session_sequence: u64) -> Result<Vec<Value>, RuntimeError> {
        let mut events = Vec::new();
        let mut after = session_sequence;
        loop {
            let page = self
                .state
                .api
                .history_page(&self.state.claim.session_id, after)
                .await?;
            let last = page
                .events
                .last()
                .and_then(|e| e["sessionSequence"].as_u64());
            if let Some(last) = last {
                // A page holds every event of the session in its range.
                self.state.seen().add(after + 1, last);
            }
            events.extend(page.events);
            match page.next_session_sequence {
                Some(next) if next > after => after = next,
                _ => return Ok(events),
            }
        }
    }

    /// Appends a batch of proposed authority events under the run's lease,
    /// atomically, and returns the server's answer. Build the events with
    /// [`RunContext::event`] (or give each its own eventId): a batch sent
    /// again, after a timeout, is recognised by its eventIds and written
    /// once.
    ///
    /// A batch must touch only this run's journal (and the session). When
    /// the lease is no longer current the error is
    /// [`RuntimeError::LeaseLost`] and the context is [lost](Self::lost);
    /// an event the protocol refuses is [`RuntimeError::Rejected`] with the
    /// rule broken.
    pub async fn append(&self, events: Vec<Value>) -> Result<Appended, RuntimeError> {
        let state = &self.state;
        let run = &state.claim.run_id;
        if state.lost.is_cancelled() {
            return Err(RuntimeError::LeaseLost {
                run_id: run.clone(),
            });
        }
        if events.is_empty() {
            return Ok(Appended {
                events: Vec::new(),
                duplicate: false,
            });
        }
        let ends_run = events.iter().any(|e| ends(e, run));
        // A refusal of another journal's lease says nothing of this one.
        let own_journal = events
            .iter()
            .all(|e| e["rootRunId"].as_str().is_none_or(|r| r == run.as_str()));
        let _terminal = if ends_run {
            Some(state.terminal.lock().await)
        } else {
            None
        };
        let body = json!({ "events": events });
        let answer = state
            .api
            .append(&state.claim.session_id, &state.claim.lease.lease_id, &body)
            .await?;
        if !answer.status.is_success() {
            let error = answer.refusal(own_journal.then_some(run));
            if let RuntimeError::LeaseLost { .. } = error
                && !state.lost.is_cancelled()
            {
                tracing::warn!("an append was refused: the runtime lease is no longer current");
                state.lost.cancel();
            }
            return Err(error);
        }
        let appended: Appended = answer.parse("an append's answer")?;
        {
            let mut seen = state.seen();
            for event in &appended.events {
                seen.add(event.session_sequence, event.session_sequence);
            }
        }
        if ends_run {
            state.ended.store(true, Ordering::SeqCst);
        }
        Ok(appended)
    }

    /// A proposed authority event of this run: `protocolVersion`, `type`,
    /// a new `eventId` (UUID v7), `rootRunId` and `runId` filled in, then
    /// `fields` (an object; its entries win, e.g. the `runId` of a child
    /// run or an eventId of your own).
    pub fn event(&self, event_type: &str, fields: Value) -> Value {
        let run = self.run_id().as_str();
        let mut event = Map::new();
        event.insert("protocolVersion".into(), json!(PROTOCOL_VERSION));
        event.insert("type".into(), json!(event_type));
        event.insert("eventId".into(), json!(uuid::Uuid::now_v7().to_string()));
        event.insert("rootRunId".into(), json!(run));
        event.insert("runId".into(), json!(run));
        if let Value::Object(fields) = fields {
            event.extend(fields);
        }
        Value::Object(event)
    }

    /// Whether the run was asked to stop.
    pub fn is_stop_requested(&self) -> bool {
        self.state.stop.is_cancelled()
    }

    /// Completes when the run is asked to stop (at once if it was): close
    /// its open work and end it, usually with `run.cancelled`.
    pub fn stop_requested(&self) -> impl Future<Output = ()> + Send + 'static {
        self.state.stop.clone().cancelled_owned()
    }

    /// Whether the lease was lost: appends fail, and the handler is
    /// stopped.
    pub fn is_lost(&self) -> bool {
        self.state.lost.is_cancelled()
    }

    /// Completes when the lease is lost. The runtime then drops the
    /// handler's future; work it spawned elsewhere should end here.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.state.lost.clone().cancelled_owned()
    }

    /// The sessionSequence through which the context has read or written
    /// every event of the session.
    pub fn handled_through(&self) -> u64 {
        self.state.seen().through
    }
}

/// Whether `event` ends the run journal of `root`.
fn ends(event: &Value, root: &RunId) -> bool {
    event["type"]
        .as_str()
        .is_some_and(|t| TERMINALS.contains(&t))
        && event["runId"].as_str() == Some(root.as_str())
}

// ----------------------------------------------------------------- runtime

/// An agent runtime, ready to [`run`](Runtime::run).
pub struct Runtime {
    api: Arc<Api>,
    queue: Option<QueueName>,
    runtime_id: Option<String>,
    concurrency: usize,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("bases", &self.api.bases)
            .field("token", &"[redacted]")
            .field("queue", &self.queue)
            .field("runtime_id", &self.runtime_id)
            .field("concurrency", &self.concurrency)
            .field("timings", &self.api.timings)
            .finish()
    }
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    bases: Vec<String>,
    token: String,
    queue: Option<String>,
    runtime_id: Option<String>,
    concurrency: usize,
    timings: Timings,
}

impl fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("bases", &self.bases)
            .field("token", &"[redacted]")
            .field("queue", &self.queue)
            .field("runtime_id", &self.runtime_id)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// Claim only runs of this queue (default: any queue).
    pub fn queue(mut self, queue: impl Into<String>) -> RuntimeBuilder {
        self.queue = Some(queue.into());
        self
    }

    /// A name for this runtime, shown to operators (default: the token's
    /// subject).
    pub fn runtime_id(mut self, id: impl Into<String>) -> RuntimeBuilder {
        self.runtime_id = Some(id.into());
        self
    }

    /// How many runs it works on at once (default 4); it claims only while
    /// fewer are running.
    pub fn concurrency(mut self, runs: usize) -> RuntimeBuilder {
        self.concurrency = runs;
        self
    }

    /// How often a lease is renewed (default 10 s; more often when the
    /// server's leases live less than three intervals).
    pub fn heartbeat_interval(mut self, interval: Duration) -> RuntimeBuilder {
        self.timings.heartbeat = interval;
        self
    }

    /// How long one claim waits for a run to become ready (default 20 s,
    /// at most 30 s).
    pub fn claim_wait(mut self, wait: Duration) -> RuntimeBuilder {
        self.timings.claim_wait = wait;
        self
    }

    /// How long a request may take beyond the wait of a long poll
    /// (default 10 s).
    pub fn request_timeout(mut self, timeout: Duration) -> RuntimeBuilder {
        self.timings.request_timeout = timeout;
        self
    }

    /// How long [`Runtime::run`], once asked to stop, waits for running
    /// handlers (default 30 s). Handlers still running then are dropped
    /// and their leases left to lapse.
    pub fn shutdown_grace(mut self, grace: Duration) -> RuntimeBuilder {
        self.timings.shutdown_grace = grace;
        self
    }

    /// The runtime, once the configuration holds together.
    pub fn build(self) -> Result<Runtime, RuntimeError> {
        if self.bases.is_empty() {
            return Err(RuntimeError::Config("no server base URL".to_owned()));
        }
        let bases = self
            .bases
            .iter()
            .map(|b| crate::urls::base_url(b).map_err(RuntimeError::Config))
            .collect::<Result<Vec<_>, _>>()?;
        let queue = self
            .queue
            .map(QueueName::new)
            .transpose()
            .map_err(|e| RuntimeError::Config(format!("queue: {e}")))?;
        if self.concurrency == 0 {
            return Err(RuntimeError::Config(
                "concurrency must be at least 1".to_owned(),
            ));
        }
        if self.timings.claim_wait > MAX_WAIT {
            return Err(RuntimeError::Config(format!(
                "claim wait {:?} is above the server's limit of {MAX_WAIT:?}",
                self.timings.claim_wait
            )));
        }
        if self.timings.heartbeat.is_zero() || self.timings.request_timeout.is_zero() {
            return Err(RuntimeError::Config(
                "the heartbeat interval and the request timeout must be above zero".to_owned(),
            ));
        }
        // HTTPS needs a process-wide crypto provider; one the application
        // installed first wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| RuntimeError::Config(format!("HTTP client: {e}")))?;
        Ok(Runtime {
            api: Arc::new(Api {
                http,
                bases,
                token: self.token,
                replica: AtomicUsize::new(0),
                timings: self.timings,
            }),
            queue,
            runtime_id: self.runtime_id,
            concurrency: self.concurrency,
        })
    }
}

impl Runtime {
    /// Starts building a runtime of the replicas at `bases` (e.g.
    /// `http://host:8080`, tried in turn), authenticating with `token` (a
    /// token of role `backend`).
    pub fn builder(bases: Vec<String>, token: impl Into<String>) -> RuntimeBuilder {
        RuntimeBuilder {
            bases,
            token: token.into(),
            queue: None,
            runtime_id: None,
            concurrency: 4,
            timings: Timings::default(),
        }
    }

    /// Claims runs and hands each to `handler` until `shutdown` completes
    /// (or the server refuses the runtime for good). Then it claims no
    /// more, waits up to the shutdown grace for running handlers and
    /// releases their runs.
    ///
    /// An unreachable server is retried with backoff; the error is a
    /// refused token ([`RuntimeError::Unauthorized`]), a refused claim
    /// ([`RuntimeError::Rejected`], e.g. a bad queue) or an answer that is
    /// not narad/v1.
    pub async fn run<H: RunHandler>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        let handler = Arc::new(handler);
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let timings = self.api.timings;
        // Runs in flight; dropping the set aborts them.
        let mut runs = JoinSet::new();
        let mut backoff = timings.first_backoff;
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(queue = ?self.queue, concurrency = self.concurrency, "agent runtime started");
        let result = loop {
            while let Some(joined) = runs.try_join_next() {
                reap(joined);
            }
            let slot = tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                slot = slots.clone().acquire_owned() => slot.expect("the slots are never closed"),
            };
            // A claim that arrives with the shutdown is served; one the
            // server makes just as the request is dropped is not lost for
            // good: its lease lapses and the server retries the run.
            let claiming = self.api.claim(
                self.queue.as_ref(),
                self.runtime_id.as_deref(),
                timings.claim_wait,
            );
            let claimed = tokio::select! {
                biased;
                claimed = claiming => claimed,
                () = &mut shutdown => break Ok(()),
            };
            match claimed {
                Ok(Some(claim)) => {
                    backoff = timings.first_backoff;
                    runs.spawn(serve(self.api.clone(), handler.clone(), claim, slot));
                }
                Ok(None) => backoff = timings.first_backoff,
                Err(e) if e.ends_claiming() => {
                    tracing::error!(error = %e, "the runtime stops claiming");
                    break Err(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "claiming failed");
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break Ok(()),
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(timings.max_backoff);
                }
            }
        };
        while let Some(joined) = runs.try_join_next() {
            reap(joined);
        }
        tracing::info!(
            running = runs.len(),
            "the runtime claims no more; waiting for running handlers"
        );
        let drained = tokio::time::timeout(timings.shutdown_grace, async {
            while let Some(joined) = runs.join_next().await {
                reap(joined);
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                running = runs.len(),
                "handlers still running after the shutdown grace are stopped; their leases lapse \
                 and the server applies each run's onLost policy"
            );
            runs.shutdown().await;
        }
        tracing::info!("agent runtime stopped");
        result
    }
}

/// Logs how a run's task ended, when it did not end normally.
fn reap(joined: Result<(), JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!(error = %e, "a run's task panicked");
    }
}

/// Works on one claimed run: keeps its lease, runs the handler, releases
/// the run. `_slot` is held until the run is released.
async fn serve<H: RunHandler>(
    api: Arc<Api>,
    handler: Arc<H>,
    claim: Claim,
    _slot: OwnedSemaphorePermit,
) {
    let span = tracing::info_span!(
        "run",
        run_id = %claim.run_id,
        session_id = %claim.session_id,
        attempt = claim.attempt,
    );
    async move {
        tracing::info!(reason = ?claim.reason, cursor = claim.cursor, "run claimed");
        let heartbeat = api.timings.heartbeat;
        let ctx = RunContext::new(api, claim);
        let state = ctx.state.clone();
        let keeper = AbortOnDropHandle::new(tokio::spawn(
            keep_lease(state.clone(), heartbeat).in_current_span(),
        ));
        // The handler runs in a task of its own: a panic is caught there,
        // and dropping the handle when the lease is lost aborts it.
        let mut handling = AbortOnDropHandle::new(tokio::spawn(
            async move { handler.handle(ctx).await }.in_current_span(),
        ));
        let outcome = tokio::select! {
            joined = &mut handling => Some(joined),
            () = state.lost.cancelled() => None,
        };
        drop(handling);
        drop(keeper);
        let release = match outcome {
            None => {
                tracing::warn!("the lease was lost: the handler is stopped");
                false
            }
            Some(Err(e)) => {
                tracing::error!(error = %e, "the handler panicked; its lease is left to lapse");
                state.ended()
            }
            Some(Ok(Err(RuntimeError::LeaseLost { .. }))) => {
                tracing::warn!("the handler ended on a lost lease");
                false
            }
            Some(Ok(Err(e))) => {
                if !state.ended() {
                    tracing::warn!(
                        error = %e,
                        "the handler failed; its lease is left to lapse, and the server retries \
                         the run or ends it as its onLost policy says"
                    );
                }
                state.ended()
            }
            Some(Ok(Ok(()))) => !state.lost.is_cancelled(),
        };
        if release {
            let through = state.handled_through().await;
            let claim = &state.claim;
            match state
                .api
                .release(&claim.run_id, &claim.lease.lease_id, through)
                .await
            {
                Ok(released) => {
                    tracing::info!(%released, handled_through = through, "run released")
                }
                Err(RuntimeError::LeaseLost { .. }) => tracing::warn!(
                    handled_through = through,
                    "the lease was no longer current at release; the server repairs the run"
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "the run could not be released; its lease lapses and the server applies its \
                     onLost policy"
                ),
            }
        }
    }
    .instrument(span)
    .await
}

/// Keeps a run's lease: renews it every interval and long-polls its
/// controls, flipping the run's stop signal when it is asked to stop and
/// its lost signal when the lease is refused.
async fn keep_lease(state: Arc<RunState>, interval: Duration) {
    let (run, lease) = (&state.claim.run_id, &state.claim.lease.lease_id);
    let timings = state.api.timings;
    let renew = async {
        let mut next = renewal_delay(interval, &state.claim.lease.expires_at, Utc::now());
        loop {
            tokio::time::sleep(next).await;
            if state.ended() {
                return;
            }
            match state.api.heartbeat(run, lease).await {
                Ok(standing) if standing.ended => return,
                Ok(standing) => {
                    if standing.stop_requested {
                        state.request_stop();
                    }
                    next = renewal_delay(interval, &standing.expires_at, Utc::now());
                }
                Err(RuntimeError::LeaseLost { .. }) => {
                    state.lease_refused("heartbeat").await;
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the lease failed; trying again");
                    next = interval.min(RENEW_RETRY);
                }
            }
        }
    };
    let watch = async {
        let mut backoff = timings.first_backoff;
        while !state.stop.is_cancelled() && !state.ended() {
            match state.api.controls(run, lease, CONTROLS_WAIT).await {
                Ok(standing) if standing.ended => return,
                Ok(standing) => {
                    backoff = timings.first_backoff;
                    if standing.stop_requested {
                        state.request_stop();
                    }
                }
                Err(RuntimeError::LeaseLost { .. }) => {
                    state.lease_refused("controls").await;
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, retry_in = ?backoff, "polling the run's controls failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(timings.max_backoff);
                }
            }
        }
    };
    tokio::join!(renew, watch);
}

/// How long until the next renewal of a lease expiring at `expires_at`:
/// the interval, or a third of what is left of the lease when that is
/// shorter (never under [`MIN_HEARTBEAT`]).
fn renewal_delay(interval: Duration, expires_at: &str, now: DateTime<Utc>) -> Duration {
    let left = DateTime::parse_from_rfc3339(expires_at)
        .ok()
        .and_then(|at| (at.to_utc() - now).to_std().ok());
    match left {
        Some(left) => interval.min(left / 3).max(MIN_HEARTBEAT),
        None => interval,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(cursor: u64) -> Claim {
        serde_json::from_value(json!({
            "runId": "r1", "sessionId": "s1", "queue": "default", "reason": "started",
            "cursor": cursor, "attempt": 1, "maxAttempts": 3, "onLost": "retry",
            "stopRequested": false,
            "lease": {"leaseId": "L1", "expiresAt": "2026-08-05T04:00:00Z"},
        }))
        .expect("a claim")
    }

    fn context(cursor: u64) -> RunContext {
        let runtime = Runtime::builder(vec!["http://127.0.0.1:1".into()], "t")
            .build()
            .expect("a runtime");
        RunContext::new(runtime.api, claim(cursor))
    }

    #[test]
    fn claims_read_as_the_server_sends_them() {
        let c = claim(7);
        assert_eq!(c.run_id.as_str(), "r1");
        assert_eq!(c.reason, ClaimReason::Started);
        assert_eq!(c.on_lost, OnLost::Retry);
        assert_eq!(c.lease.lease_id.as_str(), "L1");
        let later: ClaimReason = serde_json::from_value(json!("resumed")).unwrap();
        assert_eq!(later, ClaimReason::Other);
    }

    #[test]
    fn seen_sequences_count_as_handled_only_without_a_gap() {
        let mut seen = Seen::new(10);
        seen.add(13, 14);
        assert_eq!((seen.through, seen.furthest()), (10, 14));
        assert!(seen.contains(13) && !seen.contains(12) && !seen.contains(11));
        seen.add(11, 11);
        assert_eq!(seen.through, 11);
        seen.add(12, 12);
        assert_eq!((seen.through, seen.furthest()), (14, 14));
        seen.add(3, 5);
        assert_eq!(seen.through, 14);
        seen.add(15, 20);
        assert_eq!(seen, Seen::new(20));
    }

    #[test]
    fn events_are_proposals_of_the_claimed_run() {
        let ctx = context(0);
        let e = ctx.event(
            "message.text.delta",
            json!({"messageId": "m1", "delta": "hi"}),
        );
        assert_eq!(e["protocolVersion"], "narad/v1");
        assert_eq!(e["type"], "message.text.delta");
        assert_eq!((&e["rootRunId"], &e["runId"]), (&json!("r1"), &json!("r1")));
        assert_eq!(e["delta"], "hi");
        let id = uuid::Uuid::parse_str(e["eventId"].as_str().unwrap()).unwrap();
        assert_eq!(id.get_version_num(), 7);
        assert_ne!(
            ctx.event("run.finished", json!({}))["eventId"],
            e["eventId"]
        );
        let child = ctx.event("run.finished", json!({"runId": "child"}));
        assert_eq!(child["runId"], "child");
        assert!(!ends(&child, ctx.run_id()));
        assert!(ends(&ctx.event("run.cancelled", Value::Null), ctx.run_id()));
        assert!(!ends(&e, ctx.run_id()));
    }

    #[test]
    fn a_refused_lease_is_lost_only_for_the_run_that_presented_it() {
        let lease = || Answer {
            status: StatusCode::CONFLICT,
            body: json!({"code": "NRD-0501", "title": "t", "message": "stop"}),
        };
        let run = RunId::new("r1").unwrap();
        assert!(matches!(
            lease().refusal(Some(&run)),
            RuntimeError::LeaseLost { .. }
        ));
        let other = lease().refusal(None);
        assert!(matches!(other, RuntimeError::Rejected { status: 409, .. }));
        assert_eq!(other.code(), Some("NRD-0501"));
        let rule = Answer {
            status: StatusCode::CONFLICT,
            body: json!({"code": "NRD-0201", "title": "t", "message": "no", "rule": "x.y"}),
        }
        .refusal(Some(&run));
        assert_eq!(rule.rule(), Some("x.y"));
        assert!(rule.to_string().contains("NRD-0201 no (rule x.y)"));
        let token = Answer {
            status: StatusCode::UNAUTHORIZED,
            body: Value::Null,
        }
        .refusal(Some(&run));
        assert!(matches!(token, RuntimeError::Unauthorized { .. }));
    }

    #[test]
    fn leases_are_renewed_well_before_they_lapse() {
        let now = DateTime::parse_from_rfc3339("2026-08-05T04:00:00Z")
            .unwrap()
            .to_utc();
        let ten = Duration::from_secs(10);
        assert_eq!(renewal_delay(ten, "2026-08-05T04:00:30Z", now), ten);
        assert_eq!(
            renewal_delay(ten, "2026-08-05T04:00:03Z", now),
            Duration::from_secs(1)
        );
        assert_eq!(
            renewal_delay(ten, "2026-08-05T04:00:00.1Z", now),
            MIN_HEARTBEAT
        );
        assert_eq!(renewal_delay(ten, "2026-08-05T03:59:00Z", now), ten);
        assert_eq!(renewal_delay(ten, "not a time", now), ten);
    }

    #[test]
    fn a_runtime_needs_a_server_slots_and_a_wait_the_server_allows() {
        let build = |b: RuntimeBuilder| b.build().map(|_| ());
        let ok = || Runtime::builder(vec!["http://127.0.0.1:1/".into()], "secret-jwt");
        assert!(build(ok()).is_ok());
        assert!(!format!("{:?}", ok().build().unwrap()).contains("secret-jwt"));
        for bad in [
            Runtime::builder(vec![], "t"),
            Runtime::builder(vec!["ws://127.0.0.1:1".into()], "t"),
            ok().concurrency(0),
            ok().claim_wait(Duration::from_secs(31)),
            ok().queue(""),
            ok().heartbeat_interval(Duration::ZERO),
        ] {
            assert!(matches!(build(bad), Err(RuntimeError::Config(_))));
        }
    }

    #[test]
    fn endpoints_encode_their_ids() {
        let base = crate::urls::base_url("http://h:1/prefix/").unwrap();
        assert_eq!(
            endpoint(&base, &["v1", "runtime", "leases", "a/b c", "heartbeat"]).as_str(),
            "http://h:1/prefix/v1/runtime/leases/a%2Fb%20c/heartbeat"
        );
    }
}
