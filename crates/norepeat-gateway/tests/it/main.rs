//! The gateway's integration tests, one binary (issue 40: one test binary
//! per crate, so the test build links once). Most run the gateway binary
//! in front of `tests/backend.py`, an order service in Python's standard
//! library that counts each effect it runs; each test starts its own
//! processes on free ports.

// Test code: a failure is a panic with its place.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod around_the_guard;
mod backends;
mod browser;
mod check;
mod connections;
mod content_type;
mod cors;
mod documented;
mod examples;
mod guards;
mod idempotency;
mod identity;
mod introspect;
mod lifecycle;
mod never_panics;
mod on_repeat;
mod operator;
mod passthrough;
mod reconcile;
mod records;
mod refusal_page;
mod requests_never_5xx;
mod routing;
mod sentinel;
mod store_down;
mod store_urls;
mod tomcat;
mod transport;
mod upstream;
mod workers;
