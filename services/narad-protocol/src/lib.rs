//! The narad/v1 protocol as types: the wire model of every authority event,
//! watch event, hydrate record, control message and command, the
//! classifier that reads raw JSON the way §13 of the specification
//! demands, and the catalog of `NRD-xxxx` error codes.
//!
//! This crate does no I/O. The journal, the server, the client SDK and the
//! conformance runner all build on it, so that one definition of the
//! protocol serves them all.
//!
//! Modules:
//! - [`primitives`]: ids, sequences, timestamps and constrained strings;
//! - [`profile`]: protocol profiles and their type namespaces;
//! - [`envelope`]: the class fields of each kind and the placement rules;
//! - [`authority`], [`watch`], [`hydrate`], [`control`]: per-type bodies;
//! - [`wire`]: the registry of wire types and the typed wire objects;
//! - [`classify`]: the entry point for raw JSON;
//! - [`commands`]: the inbound command bodies;
//! - [`errors`]: error codes and the error envelope;
//! - [`rules`]: the rule registry and [`rules::Violation`];
//! - [`engine`]: the rule engine, [`engine::SessionState`];
//! - [`reducer`]: the client reducer of delivered objects;
//! - [`repair`]: the events that close a run journal whose runtime is gone;
//! - [`conformance`]: the golden-trace runner;
//! - [`testing`]: a generator of valid sessions for tests and benchmarks.

pub mod authority;
pub mod classify;
pub mod commands;
pub mod conformance;
pub mod control;
pub mod engine;
pub mod envelope;
pub mod errors;
pub mod graph;
pub mod hydrate;
pub mod primitives;
pub mod profile;
pub mod reducer;
pub mod repair;
pub mod rules;
pub mod testing;
pub mod watch;
pub mod wire;

pub use classify::{Classified, IgnoreReason, Reader, WireError};
pub use errors::{ErrorBody, ErrorCode};
pub use profile::{Profile, ProfileSet};
pub use wire::{
    AuthorityBody, AuthorityEvent, ControlBody, ControlMessage, HydrateBody, HydrateRecord,
    WatchBody, WatchEvent, WireObject, WireType,
};
