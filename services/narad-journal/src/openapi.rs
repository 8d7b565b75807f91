//! The journal's answers as OpenAPI schemas (utoipa): a field that holds a
//! wire value refers to the component of `schema/` that defines it, under
//! the name the server's OpenAPI document gives it (`defs.sequence`,
//! `events.run.started`, …; see `narad_server::routes::openapi`, whose
//! tests check that every reference resolves).

use utoipa::openapi::schema::ArrayBuilder;
use utoipa::openapi::{Array, Ref};

fn component(name: &str) -> Ref {
    Ref::from_schema_name(name)
}

/// A sequence: from 1, at most 2^53 − 1.
pub fn sequence() -> Ref {
    component("defs.sequence")
}

/// A non-negative integer, at most 2^53 − 1 (a cursor, a count).
pub fn uint() -> Ref {
    component("defs.uint")
}

/// An opaque id of 1 to 256 characters.
pub fn id() -> Ref {
    component("defs.id")
}

/// An `interrupt.requested` event.
pub fn interrupt_requested() -> Ref {
    component("events.interrupt.requested")
}

/// An RFC 3339 date-time.
pub fn timestamp() -> Ref {
    component("defs.timestamp")
}

/// Authority events of any type.
pub fn authority_events() -> Array {
    ArrayBuilder::new()
        .items(component("AuthorityEvent"))
        .build()
}

/// A proposed `run.started` (without the sequences the journal assigns).
pub fn run_started() -> Ref {
    component("proposed.run.started")
}

/// What happens to a run when its runtime is lost: the `onLost` of
/// `start-run`.
pub fn on_lost() -> Ref {
    component("defs.onLost")
}

/// A session's metadata: any JSON object, as `create-session` takes it.
pub fn metadata() -> Ref {
    Ref::new("#/components/schemas/commands.create-session/properties/metadata")
}

/// The session's active top-level execution: a run or a workflow.
pub fn active_execution() -> Ref {
    component("ActiveExecution")
}
