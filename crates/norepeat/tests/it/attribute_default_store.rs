//! `#[norepeat::guard]` without `store = ...`: the process-wide store set
//! by `norepeat::attribute::set_default_store`, shared by free functions; and
//! the once mode's bounded wait (`wait = "..."`, `Guarded::wait`), on the
//! memory store and a real Redis.
//!
//! Every test sets the same process-wide memory store (the first set wins,
//! the others get `AlreadySet`), so the file works whether its tests share
//! one process or not. `tests/attribute_no_store.rs` (a binary of its own)
//! covers the unset case.
#![allow(clippy::unwrap_used)]

use crate::common::Error;
use crate::common::{eventually, with_stores};
use norepeat::attribute::{Guarded, Rejected};
use norepeat::store::KeyValueStore;
use norepeat::store::MemoryStore;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

fn init() {
    // Another test of this process may have set it first: same kind of store.
    norepeat::attribute::set_default_store(MemoryStore::default()).ok();
}

static SHIPPED: AtomicU32 = AtomicU32::new(0);

/// A free function: no `self`, no store argument.
#[norepeat::guard(key = "ship:{order_id}", mode = once)]
async fn ship(order_id: u64) -> Result<u32, Error> {
    Ok(SHIPPED.fetch_add(1, Ordering::SeqCst) + 1)
}

static NOTIFIED: AtomicU32 = AtomicU32::new(0);

/// Window mode on the process-wide store.
#[norepeat::guard(key = "notify:{user}")]
async fn notify(user: &str) -> Result<(), Error> {
    NOTIFIED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_free_function_uses_the_process_wide_store() {
    init();
    let first = ship(1).await.unwrap();
    assert_eq!(ship(1).await, Ok(first), "the stored result comes back");
    assert_eq!(SHIPPED.load(Ordering::SeqCst), 1);
    assert_ne!(ship(2).await.unwrap(), first, "another key runs");

    notify("ann").await.unwrap();
    assert!(matches!(
        notify("ann").await,
        Err(Error::Refused(Rejected::Duplicate { .. }))
    ));
    assert_eq!(NOTIFIED.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_store_is_set_once() {
    init();
    assert_eq!(
        norepeat::attribute::set_default_store(MemoryStore::default()),
        Err(norepeat::attribute::AlreadySet)
    );
    assert_eq!(
        norepeat::attribute::default_store().unwrap().kind(),
        "memory"
    );
}

/// Runs of `slow`'s body with the key `w-1` (the tests of this file may
/// share a process).
static WAIT_RUNS: AtomicU32 = AtomicU32::new(0);

/// The keys whose body has started, in `slow` and `short_wait`.
static STARTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn start(key: &str) {
    STARTED.lock().unwrap().push(key.to_owned());
}

/// Waits until a body with `key` has started (so its call holds the
/// claim): polled, where a fixed 50 ms could pass before the claim on a
/// busy machine.
async fn started(key: &str) {
    eventually("the first body runs", || async {
        STARTED
            .lock()
            .unwrap()
            .iter()
            .any(|k| k == key)
            .then_some(())
    })
    .await;
}

/// Waits until `runs` has reached `n`.
async fn reached(runs: &AtomicU32, n: u32) {
    eventually("the first body runs", || async {
        (runs.load(Ordering::SeqCst) >= n).then_some(())
    })
    .await;
}

/// Once mode with a bounded wait; the body takes `ms` and fails when told.
#[norepeat::guard(key = "{key}", mode = once, wait = "2s")]
async fn slow(key: &str, ms: u64, value: u32, fail: bool) -> Result<u32, Error> {
    if key == "w-1" {
        WAIT_RUNS.fetch_add(1, Ordering::SeqCst);
    }
    start(key);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    if fail { Err(Error::Failed) } else { Ok(value) }
}

/// Held `short_wait` bodies wait here until the test closes it.
static SHORT_GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

/// The same with a wait shorter than the body: a `held` body runs until
/// the test closes [`SHORT_GATE`], so it still runs when the wait ends
/// however slow the machine.
#[norepeat::guard(key = "{key}", mode = once, wait = "50ms", scope = "short")]
async fn short_wait(key: &str, held: bool, value: u32) -> Result<u32, Error> {
    start(key);
    if held {
        // Closed by the test: the error is the go-ahead.
        let _ = SHORT_GATE.acquire().await;
    }
    Ok(value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_call_waits_for_the_first_result() {
    init();
    let first = tokio::spawn(slow("w-1", 300, 1, false));
    started("w-1").await;
    // Starts while the first runs: its body does not run, it gets 1.
    let second = slow("w-1", 0, 2, false).await;
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(second, Ok(1));
    assert_eq!(WAIT_RUNS.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_wait_a_concurrent_call_gets_in_progress() {
    init();
    let first = tokio::spawn(short_wait("t-1", true, 1));
    started("t-1").await;
    let started = std::time::Instant::now();
    let second = short_wait("t-1", false, 2).await;
    assert_eq!(second, Err(Error::Refused(Rejected::InProgress)));
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "it waited: {:?}",
        started.elapsed()
    );
    SHORT_GATE.close();
    assert_eq!(first.await.unwrap(), Ok(1));
    // The result is stored now: a late call gets it.
    assert_eq!(short_wait("t-1", false, 3).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_runs_the_body_when_the_first_fails() {
    init();
    let first = tokio::spawn(slow("f-1", 200, 1, true));
    started("f-1").await;
    // The first fails and frees the key: the waiting call takes it and runs.
    let second = slow("f-1", 0, 2, false).await;
    assert_eq!(first.await.unwrap(), Err(Error::Failed));
    assert_eq!(second, Ok(2));
    assert_eq!(slow("f-1", 0, 3, false).await, Ok(2));
}

/// `Guarded::wait` without the attribute, on a memory store and a real
/// Redis: the waiting call gets the first result; with a short wait,
/// `InProgress`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_wait_on_memory_and_redis() {
    with_stores(|store| async move {
        let runs = AtomicU32::new(0);
        let body = |ms: u64, v: u32| {
            let runs = &runs;
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<u32, Error>(v)
            }
        };
        let waiting = Guarded::once("test::wait").wait(Duration::from_secs(2));
        let (first, second) = tokio::join!(waiting.run_once(&store, "k", body(300, 1)), async {
            reached(&runs, 1).await;
            waiting.run_once(&store, "k", body(0, 2)).await
        });
        assert_eq!((first, second), (Ok(1), Ok(1)), "{}", store.kind());
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let impatient = Guarded::once("test::wait").wait(Duration::from_millis(30));
        let (first, second) = tokio::join!(impatient.run_once(&store, "k2", body(400, 1)), async {
            reached(&runs, 2).await;
            impatient.run_once(&store, "k2", body(0, 2)).await
        });
        assert_eq!(first, Ok(1));
        assert_eq!(second, Err(Error::Refused(Rejected::InProgress)));
        // No wait (the default): InProgress at once.
        let no_wait = Guarded::once("test::wait");
        let (_, third) = tokio::join!(no_wait.run_once(&store, "k3", body(300, 1)), async {
            reached(&runs, 3).await;
            no_wait.run_once(&store, "k3", body(0, 2)).await
        });
        assert_eq!(third, Err(Error::Refused(Rejected::InProgress)));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    })
    .await;
}
