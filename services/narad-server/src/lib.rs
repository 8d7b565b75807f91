//! The narad server: it will hold the axum routes, authentication, the SSE
//! fan-out hub and coalescer, the client-executor channel and the
//! background workers. Today it holds the configuration they will share.
//!
//! Modules:
//! - [`config`]: settings from flags and `NARAD_*` environment variables.

pub mod config;
