//! The narad Rust SDK: a consumer of the session and tenant streams that
//! survives disconnects, server restarts and replica failover, and hands
//! each authority event to its caller exactly once, in order; and a client
//! executor runtime that runs the tools the server assigns to it (§11).
//!
//! Modules:
//! - `follow`: the resumable stream consumer ([`Client`], [`Follow`]);
//! - [`blobs`]: attachment and artifact bytes, up and down by reference;
//! - [`executor`]: the client executor ([`Executor`]) and its durable
//!   token store ([`TokenStore`], [`FileTokenStore`]);
//! - [`runtime`]: the agent runtime loop ([`Runtime`]) that claims queued
//!   runs and hands each to a [`RunHandler`] under a renewed lease.
//!
//! ```no_run
//! # async fn demo() -> Result<(), narad_client::ClientError> {
//! let client = narad_client::Client::new(
//!     vec!["http://127.0.0.1:8080".into(), "http://127.0.0.1:8081".into()],
//!     "TOKEN",
//! );
//! let mut follow = client.follow_session("s1");
//! while let Some(item) = follow.next().await? {
//!     if let narad_client::Item::Authority(event) = item {
//!         println!("{}", event["type"]);
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod blobs;
pub mod executor;
mod follow;
pub mod graph;
pub mod retry_after;
pub mod runtime;
mod urls;

pub use executor::{
    Executor, ExecutorBuilder, ExecutorError, ExecutorStats, FileTokenStore, MemoryTokenStore,
    StatsSnapshot, TokenStore, ToolResult,
};
pub use follow::{Follow, Item};
pub use graph::{GraphUpdate, GraphView, HeldGraph};
pub use runtime::{RunContext, RunHandler, Runtime, RuntimeBuilder, RuntimeError};

/// A connection to one narad deployment: its replicas' base URLs (tried in
/// turn when one fails) and a bearer token.
#[derive(Debug, Clone)]
pub struct Client {
    bases: Vec<String>,
    token: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of the replicas at `bases` (e.g. `http://host:8080`),
    /// authenticating with `token`.
    pub fn new(bases: Vec<String>, token: impl Into<String>) -> Client {
        // HTTPS needs a process-wide crypto provider; one the application
        // installed first wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client {
            bases: bases
                .into_iter()
                .map(|b| b.trim_end_matches('/').to_owned())
                .collect(),
            token: token.into(),
            http: reqwest::Client::new(),
        }
    }

    /// Follows one session's stream from its first event (capabilities,
    /// then every authority event once, in sessionSequence order, with
    /// watch events and hydrate records between).
    pub fn follow_session(&self, session_id: &str) -> Follow {
        Follow::session(self.clone(), session_id)
    }

    /// Follows a session from after `session_sequence`.
    pub fn follow_session_after(&self, session_id: &str, session_sequence: u64) -> Follow {
        Follow::session(self.clone(), session_id).after(session_sequence)
    }

    /// Follows the tenant stream (`GET /v1/events`), narrowed to one
    /// session when given, live from now, or after `last_event_id`.
    pub fn follow_tenant(&self, session_id: Option<&str>, last_event_id: Option<&str>) -> Follow {
        Follow::tenant(self.clone(), session_id, last_event_id)
    }
}

/// Why following stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused the request for good (bad token, forbidden, no
    /// such session, a cursor from another store): retrying the same
    /// request cannot help.
    #[error("the server refused the stream: {status} {body}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error envelope (`{code, title, message}`), as sent.
        body: serde_json::Value,
    },
    /// The stream carried what the protocol forbids (the client reducer
    /// refused it, with the rule broken).
    #[error("the stream broke a protocol rule: {0:?}")]
    Protocol(narad_protocol::rules::Violation),
    /// No replica answered within the retry budget.
    #[error("no replica answered: {0}")]
    Unavailable(String),
}
