//! A client executor (§11): attaches to a logical `clientExecutorId` over a
//! WebSocket, runs the tools the server assigns to it, and reports each
//! result with a `client.tool.finish` over HTTP.
//!
//! The rules it keeps (§11.3):
//! - a tool runs only from a `client.tool.execute` addressed to this
//!   executor, under the connection's current lease, with an unexpired
//!   token;
//! - the token is recorded as accepted in the [`TokenStore`] before the
//!   tool runs, and a token the store already holds never runs again;
//! - the result is stored before its finish is sent, and the finish is
//!   resent (after failures and on every reconnect) until the server gives
//!   a definite answer, always under the lease the token was delivered
//!   under;
//! - a token an earlier process accepted but never finished is finished
//!   with outcome `error` and code `client_restarted`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use narad_client::executor::{Executor, FileTokenStore, ToolResult};
//!
//! let executor = Executor::builder(vec!["http://127.0.0.1:8080".into()], "JWT", "desktop-1")
//!     .tool("echo", |args| async move { ToolResult::ok(args.into()) })
//!     .store(FileTokenStore::open("desktop-1.tokens")?)
//!     .build()?;
//! executor.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```
//!
//! Modules: `dispatch` decides what a delivery may do (a pure function)
//! and carries it out; `connection` keeps the WebSocket; `finish` sends
//! finishes; [`store`] is the durable token memory.

mod connection;
mod dispatch;
mod finish;
pub mod store;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use narad_protocol::authority::Outcome;
use narad_protocol::primitives::{ClientExecutorId, JsonObject, LeaseId, NonEmptyString};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

pub use store::{
    AcceptedToken, FileTokenStore, MemoryTokenStore, StoreError, TokenEntry, TokenStore,
};

use dispatch::Core;
use finish::{FinishRequest, Finisher};

/// Error codes the runtime itself puts in finishes.
pub mod codes {
    /// The server assigned a tool this executor has no handler for.
    pub const UNKNOWN_TOOL: &str = "unknown_tool";
    /// An earlier process accepted the token and stopped before recording
    /// a result: the tool may or may not have taken effect.
    pub const CLIENT_RESTARTED: &str = "client_restarted";
    /// The tool's handler panicked.
    pub const TOOL_PANICKED: &str = "tool_panicked";
    /// [`super::ToolResult::error`] was given an empty code.
    pub const TOOL_ERROR: &str = "tool_error";
}

/// How a tool call ended, as its `client.tool.finish` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// `success`, `error` or `cancelled`.
    pub outcome: Outcome,
    /// Any JSON value, including null.
    pub response: Value,
    /// A machine code, for an error or a cancellation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<NonEmptyString>,
    /// User-safe text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ToolResult {
    /// A success with this response.
    pub fn ok(response: Value) -> ToolResult {
        ToolResult {
            outcome: Outcome::Success,
            response,
            code: None,
            message: None,
        }
    }

    /// An error with a machine code (an empty one becomes
    /// [`codes::TOOL_ERROR`]) and user-safe text; the response is null.
    pub fn error(code: &str, message: impl Into<String>) -> ToolResult {
        ToolResult {
            outcome: Outcome::Error,
            response: Value::Null,
            code: Some(non_empty(code)),
            message: Some(message.into()),
        }
    }

    /// A cancellation with a machine code and user-safe text; the response
    /// is null.
    pub fn cancelled(code: &str, message: impl Into<String>) -> ToolResult {
        ToolResult {
            outcome: Outcome::Cancelled,
            ..ToolResult::error(code, message)
        }
    }

    /// The same result with this response.
    pub fn with_response(mut self, response: Value) -> ToolResult {
        self.response = response;
        self
    }
}

fn non_empty(code: &str) -> NonEmptyString {
    NonEmptyString::new(code)
        .or_else(|_| NonEmptyString::new(codes::TOOL_ERROR))
        .expect("a constant code is not empty")
}

/// A tool's handler: the call's `args` in, its result out.
type Handler = Arc<dyn Fn(JsonObject) -> BoxFuture<'static, ToolResult> + Send + Sync>;

/// Why an executor could not be built or stopped running.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The configuration cannot work (no server, a bad id or URL, no
    /// token store).
    #[error("executor configuration: {0}")]
    Config(String),
    /// The token store failed at start-up.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The server refused the attachment for good (401 or 403: a bad
    /// token, or one not allowed to attach as this executor).
    #[error("the server refused the executor: {status} {body}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error envelope, as sent (null when the body was not JSON).
        body: Value,
    },
}

/// Counters of what an executor did, readable while it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Attachments: `client.attached` received (one per connection).
    pub attachments: u64,
    /// Handlers started (each at most once per token).
    pub executions_started: u64,
    /// Handlers that returned (or panicked) and had their result stored.
    pub executions_finished: u64,
    /// Deliveries of an unknown tool, answered `unknown_tool`.
    pub unknown_tools: u64,
    /// Deliveries of a token the store already held (not run again).
    pub duplicate_deliveries: u64,
    /// Deliveries refused because their lease was not the current one.
    pub stale_lease_refused: u64,
    /// Deliveries refused because their token had expired.
    pub expired_refused: u64,
    /// Deliveries refused because they named another executor.
    pub misaddressed_refused: u64,
    /// Tokens an earlier process left unfinished, finished as
    /// `client_restarted`.
    pub restarted_recovered: u64,
    /// Finish requests sent (every attempt, including resends).
    pub finishes_sent: u64,
    /// Finishes the server accepted (200), duplicates included.
    pub finishes_accepted: u64,
    /// Of those, the ones the server called duplicates.
    pub finishes_duplicate: u64,
    /// Finishes the server refused for good (a 4xx answer).
    pub finishes_refused: u64,
    /// Finish attempts that must be retried (5xx or no answer).
    pub finish_retries: u64,
    /// Token store failures while running.
    pub store_errors: u64,
}

macro_rules! counters {
    ($($field:ident),* $(,)?) => {
        #[derive(Debug, Default)]
        struct Counters {
            $($field: AtomicU64,)*
        }

        impl Counters {
            fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot {
                    $($field: self.$field.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

counters!(
    attachments,
    executions_started,
    executions_finished,
    unknown_tools,
    duplicate_deliveries,
    stale_lease_refused,
    expired_refused,
    misaddressed_refused,
    restarted_recovered,
    finishes_sent,
    finishes_accepted,
    finishes_duplicate,
    finishes_refused,
    finish_retries,
    store_errors,
);

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Runs a store call off the async threads (store calls fsync).
async fn blocking<T: Send + 'static>(
    store: &Arc<dyn TokenStore>,
    call: impl FnOnce(&dyn TokenStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || call(&*store)).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(StoreError::Io(std::io::Error::other(e))),
    }
}

/// A live view of an executor's counters and current lease; clone it
/// before [`Executor::run`] consumes the executor.
#[derive(Debug, Clone, Default)]
pub struct ExecutorStats {
    counters: Arc<Counters>,
    lease: Arc<Mutex<Option<LeaseId>>>,
}

impl ExecutorStats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.counters.snapshot()
    }

    /// The lease of the current connection, if attached.
    pub fn lease(&self) -> Option<LeaseId> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_lease(&self, lease: Option<LeaseId>) {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = lease;
    }
}

/// Timings of an executor; the defaults follow the narad/v1 contract.
#[derive(Debug, Clone, Copy)]
struct Timings {
    /// The first reconnect delay, doubled per failure up to `max_backoff`.
    first_backoff: Duration,
    max_backoff: Duration,
    /// How long `run` waits, once asked to stop, for running tools and
    /// their finishes.
    shutdown_grace: Duration,
    /// A connection attempt (handshake and `client.attached`) and one
    /// finish request give up after this long.
    request_timeout: Duration,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// A client executor, ready to [`run`](Executor::run).
pub struct Executor {
    bases: Vec<reqwest::Url>,
    jwt: String,
    id: ClientExecutorId,
    tools: HashMap<String, Handler>,
    store: Arc<dyn TokenStore>,
    stats: ExecutorStats,
    timings: Timings,
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tools: Vec<_> = self.tools.keys().collect();
        tools.sort();
        f.debug_struct("Executor")
            .field("bases", &self.bases)
            .field("jwt", &"[redacted]")
            .field("id", &self.id)
            .field("tools", &tools)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Executor`]: its tools, its token store and its timings.
pub struct ExecutorBuilder {
    bases: Vec<String>,
    jwt: String,
    id: String,
    tools: HashMap<String, Handler>,
    store: Option<Arc<dyn TokenStore>>,
    timings: Timings,
}

impl fmt::Debug for ExecutorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutorBuilder")
            .field("bases", &self.bases)
            .field("jwt", &"[redacted]")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ExecutorBuilder {
    /// Registers the handler of `name` (a later one for the same name
    /// replaces it). The handler gets the call's `args`.
    pub fn tool<F, Fut>(mut self, name: impl Into<String>, handler: F) -> ExecutorBuilder
    where
        F: Fn(JsonObject) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolResult> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |args| Box::pin(handler(args)));
        self.tools.insert(name.into(), handler);
        self
    }

    /// The durable token store (required). Pass an `Arc` to keep a handle,
    /// e.g. to share a [`MemoryTokenStore`] across executors in a test.
    pub fn store(mut self, store: impl TokenStore + 'static) -> ExecutorBuilder {
        self.store = Some(Arc::new(store));
        self
    }

    /// The reconnect backoff: `first` after a lost connection, doubled per
    /// failed attempt up to `max` (default 100 ms to 5 s). Finishes are
    /// retried on the same schedule.
    pub fn reconnect_backoff(mut self, first: Duration, max: Duration) -> ExecutorBuilder {
        self.timings.first_backoff = first.max(Duration::from_millis(1));
        self.timings.max_backoff = max.max(self.timings.first_backoff);
        self
    }

    /// How long [`Executor::run`], once asked to stop, waits for running
    /// tools and their finishes (default 5 s). What is left then is
    /// finished by the next start.
    pub fn shutdown_grace(mut self, grace: Duration) -> ExecutorBuilder {
        self.timings.shutdown_grace = grace;
        self
    }

    /// How long a connection attempt or a finish request may take
    /// (default 10 s).
    pub fn request_timeout(mut self, timeout: Duration) -> ExecutorBuilder {
        self.timings.request_timeout = timeout;
        self
    }

    /// The executor, once the configuration holds together.
    pub fn build(self) -> Result<Executor, ExecutorError> {
        let id = ClientExecutorId::new(self.id)
            .map_err(|e| ExecutorError::Config(format!("clientExecutorId: {e}")))?;
        if self.bases.is_empty() {
            return Err(ExecutorError::Config("no server base URL".to_owned()));
        }
        let bases = self
            .bases
            .iter()
            .map(|b| crate::urls::base_url(b).map_err(ExecutorError::Config))
            .collect::<Result<Vec<_>, _>>()?;
        let store = self.store.ok_or_else(|| {
            ExecutorError::Config(
                "no token store: executions must be recorded durably (FileTokenStore)".to_owned(),
            )
        })?;
        Ok(Executor {
            bases,
            jwt: self.jwt,
            id,
            tools: self.tools,
            store,
            stats: ExecutorStats::default(),
            timings: self.timings,
        })
    }
}

impl Executor {
    /// Starts building the executor `client_executor_id` of the replicas
    /// at `bases` (e.g. `http://host:8080`, tried in turn), authenticating
    /// with `jwt` (a token of role `executor`).
    pub fn builder(
        bases: Vec<String>,
        jwt: impl Into<String>,
        client_executor_id: impl Into<String>,
    ) -> ExecutorBuilder {
        ExecutorBuilder {
            bases,
            jwt: jwt.into(),
            id: client_executor_id.into(),
            tools: HashMap::new(),
            store: None,
            timings: Timings::default(),
        }
    }

    /// The executor's counters and lease, readable while it runs.
    pub fn stats(&self) -> ExecutorStats {
        self.stats.clone()
    }

    /// Runs until `shutdown` completes (or the server refuses the
    /// executor for good): finishes what an earlier process left
    /// unfinished, attaches, runs what is assigned, reconnects when the
    /// connection is lost. Once stopping, it waits up to the shutdown
    /// grace for running tools and their finishes.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ExecutorError> {
        // wss:// and https:// need a process-wide crypto provider; one the
        // application installed first wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(self.timings.request_timeout)
            .build()
            .map_err(|e| ExecutorError::Config(format!("HTTP client: {e}")))?;
        let (finish_tx, finish_rx) = tokio::sync::mpsc::unbounded_channel();
        let core = Arc::new(Core::new(
            self.id.clone(),
            self.tools,
            self.store.clone(),
            self.stats.clone(),
            finish_tx.clone(),
        ));
        let recovered = core.recover().await?;
        if recovered > 0 {
            tracing::warn!(
                count = recovered,
                "tokens an earlier process left running are finished as client_restarted"
            );
        }

        let finisher_stop = CancellationToken::new();
        let finisher = Finisher::new(
            http,
            self.bases.clone(),
            self.jwt.clone(),
            self.store.clone(),
            self.stats.clone(),
            self.timings,
        );
        // Both tasks end with `run`, even when its future is dropped
        // mid-way: nothing of the executor outlives it.
        let finisher =
            AbortOnDropHandle::new(tokio::spawn(finisher.run(finish_rx, finisher_stop.clone())));
        let _ = finish_tx.send(FinishRequest::AllPending);

        let connection_stop = CancellationToken::new();
        let mut connection = AbortOnDropHandle::new(tokio::spawn(connection::run(
            core.clone(),
            self.bases,
            self.jwt,
            self.timings,
            connection_stop.clone(),
        )));
        let result = tokio::select! {
            joined = &mut connection => joined,
            () = shutdown => {
                connection_stop.cancel();
                connection.await
            }
        };
        let result = match result {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(ExecutorError::Config(format!("the connection task: {e}"))),
        };
        self.stats.set_lease(None);

        // Let running tools end and their finishes go out, within the grace.
        let deadline = tokio::time::Instant::now() + self.timings.shutdown_grace;
        if tokio::time::timeout_at(deadline, core.wait_idle())
            .await
            .is_err()
        {
            tracing::warn!(
                "tools still running at shutdown; the next start finishes them as client_restarted"
            );
        }
        let (flushed_tx, flushed_rx) = tokio::sync::oneshot::channel();
        let _ = finish_tx.send(FinishRequest::AllPending);
        let _ = finish_tx.send(FinishRequest::Flush(flushed_tx));
        if tokio::time::timeout_at(deadline, flushed_rx).await.is_err() {
            tracing::warn!("finishes still unanswered at shutdown; the next start resends them");
        }
        finisher_stop.cancel();
        let _ = finisher.await;
        tracing::info!(executor = %self.id, "executor stopped");
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn results_serialise_as_finish_fields() {
        assert_eq!(
            serde_json::to_value(ToolResult::ok(json!({"a": 1}))).unwrap(),
            json!({"outcome": "success", "response": {"a": 1}})
        );
        assert_eq!(
            serde_json::to_value(ToolResult::error("", "boom")).unwrap(),
            json!({"outcome": "error", "response": null, "code": "tool_error", "message": "boom"})
        );
    }

    #[test]
    fn an_executor_needs_a_store_a_server_and_a_valid_id() {
        let no_store = Executor::builder(vec!["http://127.0.0.1:1".into()], "t", "e").build();
        assert!(matches!(no_store, Err(ExecutorError::Config(_))));
        let no_server = Executor::builder(vec![], "t", "e")
            .store(MemoryTokenStore::new())
            .build();
        assert!(matches!(no_server, Err(ExecutorError::Config(_))));
        let bad_id = Executor::builder(vec!["http://127.0.0.1:1".into()], "t", "")
            .store(MemoryTokenStore::new())
            .build();
        assert!(matches!(bad_id, Err(ExecutorError::Config(_))));
        let ws_base = Executor::builder(vec!["ws://127.0.0.1:1".into()], "t", "e")
            .store(MemoryTokenStore::new())
            .build();
        assert!(matches!(ws_base, Err(ExecutorError::Config(_))));
        let ok = Executor::builder(vec!["http://127.0.0.1:1/".into()], "secret-jwt", "e")
            .store(MemoryTokenStore::new())
            .build()
            .unwrap();
        assert!(!format!("{ok:?}").contains("secret-jwt"));
    }
}
