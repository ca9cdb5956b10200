//! The shop's integration tests, one binary (issue 40: 52 test binaries
//! each linked on their own made the test build spend its time linking),
//! one module per topic, as cargo's guide lays out `tests/it/`.
//!
//! Every test still runs in a process of its own under nextest (the
//! workspace's runner), so no module needs a binary of its own: none sets
//! the environment of the process, installs a global recorder or
//! subscriber, or replaces the test harness. The nextest overrides name
//! their tests by module (`binary(it) & test(/^slow_store::/)`).

// A failed `unwrap` is a failed test.
#![allow(clippy::unwrap_used)]

#[cfg(feature = "bench")]
mod bench_command;
mod browser;
mod cli;
mod cluster;
mod common;
mod db;
mod effect_once;
mod events;
mod http;
mod instances;
mod logs;
mod openapi;
mod payments;
mod payments_database;
mod retries;
mod schemathesis;
mod security;
mod sentinel;
mod shutdown;
mod slow_store;
mod storm;
