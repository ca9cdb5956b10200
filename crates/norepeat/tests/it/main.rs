//! The library's integration tests, as one test binary: one module per
//! topic (the layout cargo's guide recommends), so that a test build links
//! one binary instead of one per file. A test is named by its module path:
//! `cargo nextest run -p norepeat -E 'test(/^idempotency_tx::/)'` runs one
//! former file.
//!
//! Process-wide state: nextest (the project's runner) runs each test in a
//! process of its own; under `cargo test` the modules share one, which the
//! tests that touch process-wide state allow for: the global metrics
//! recorder is one for the process (`norepeat_testkit::Recorded::global`,
//! each test reading counters or names no other test's checks depend on),
//! and every test that sets the default store of `#[norepeat::guard]` sets
//! the same kind. (Those modules, `attribute*`, `degrade`, `*_lost` and
//! `shadow`, pass together under `cargo test --test it`.) The one test that
//! needs the default store never set is `tests/attribute_no_store.rs`, a
//! binary of its own for that reason.
//!
//! Helpers the modules share are in [`common`]; the services they run
//! against, the metrics recorder and the SQL backends are the test kit's
//! (`norepeat-testkit`).

mod common;

// Abandoned claims on every store kind: Redis, PostgreSQL and SQLite.
#[cfg(all(feature = "redis", feature = "postgres", feature = "sqlite"))]
mod abandoned;
mod attribute;
mod attribute_default_store;
mod attribute_keys;
mod attribute_once_lost;
mod attribute_tx;
mod cancellation;
mod canonical;
mod cluster;
mod cluster_batching;
mod degrade;
mod examples;
mod failed_open;
mod guard;
mod idempotency;
mod idempotency_lost;
mod idempotency_taken_back;
mod idempotency_tx;
mod identity;
mod invalid_json;
mod kv_behaviour;
mod memory_store;
mod nested_paths;
mod packaging;
#[cfg(feature = "redis")]
mod persistence;
mod ratelimit;
mod ratelimit_algorithms;
mod redis_batching;
mod replicas;
mod replicas_guards;
mod sentinel;
mod shadow;
mod token_clocks;
mod webhook;
