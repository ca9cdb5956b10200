//! A guarded function that names no store, called before
//! `norepeat::attribute::set_default_store`: a clear error, the body not run,
//! never a panic.
//!
//! A test binary of its own, not a module of `tests/it`: the default store is
//! set once for a process and never unset, and the tests there set it. Under
//! nextest each test has its own process anyway, but `cargo test` runs a
//! binary's tests in one, where this test would see their store.
#![allow(clippy::unwrap_used)]

use norepeat::attribute::Rejected;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, PartialEq)]
struct Refused(Rejected);

impl From<Rejected> for Refused {
    fn from(r: Rejected) -> Self {
        Refused(r)
    }
}

static RUNS: AtomicU32 = AtomicU32::new(0);

#[norepeat::guard(key = "{id}", mode = once)]
async fn charge(id: u64) -> Result<u64, Refused> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[norepeat::guard(key = "{id}", on_store_failure = fail_open)]
async fn click(id: u64) -> Result<u64, Refused> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn without_a_store_the_call_is_refused_and_says_what_to_do() {
    assert_eq!(charge(1).await, Err(Refused(Rejected::NoDefaultStore)));
    // Fail-open is about outages, not a missing store: still refused.
    assert_eq!(click(1).await, Err(Refused(Rejected::NoDefaultStore)));
    assert_eq!(RUNS.load(Ordering::SeqCst), 0);
    let message = Rejected::NoDefaultStore.to_string();
    assert!(
        message.contains("norepeat::attribute::set_default_store"),
        "{message}"
    );
    assert!(norepeat::attribute::default_store().is_err());
}
