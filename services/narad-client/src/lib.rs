//! The narad Rust SDK: commands, history, a resumable SSE consumer that
//! feeds the client reducer, and the client-executor runtime.
//!
//! Empty for now: the wire model it reads lives in `narad-protocol`.
