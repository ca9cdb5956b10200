//! The bench's integration tests, one binary (`tests/it/`, as the shop's):
//! `bench` runs `norepeat-bench --quick --json` on every store, `gateway`
//! its `gateway.*` rows. Speed is never asserted, only that each row ran.

// A failed `unwrap` is a failed test.
#![allow(clippy::unwrap_used)]

mod bench;
mod gateway;
