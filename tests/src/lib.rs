//! End-to-end tests of narad: the real server against a real Postgres,
//! one fresh database per test. The harness and the tests arrive with the
//! journal and the HTTP API; the wire model's own tests live in
//! `services/narad-protocol/tests`.
