//! Once mode when the store will not take the result: the body succeeded,
//! so its claim is never deleted. Storing the result is tried again with
//! backoff for up to the lease; a store back within it gets the result,
//! and a repeat gets that result without running the body. A store away
//! for the whole lease: the loss is counted in
//! `norepeat_once_completion_lost_total`, and the claim, its lease passed,
//! stays: a repeat gets `Rejected::OutcomeUnknown`, never a second run.
//! A store that forgets (FLUSHALL) while the body runs: nothing is written
//! back, and the loss is counted too.
//!
//! The test reads the process's global metrics recorder
//! (`norepeat_testkit::Recorded::global`); no other test counts this
//! counter, so it holds whether the tests share a process or not.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use norepeat::attribute::{Guarded, Rejected};
use norepeat::degrade::FailurePolicy;
use norepeat::store::RedisStore;
use norepeat_testkit::{ProxyMode, Recorded, RedisServer, TcpProxy};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;

const LOST: &str = "norepeat_once_completion_lost_total";

#[derive(Debug)]
enum Error {
    Rejected(Rejected),
}

impl From<Rejected> for Error {
    fn from(r: Rejected) -> Self {
        Error::Rejected(r)
    }
}

/// The body's runs, and the gate each run waits at until the test has cut
/// the store off (so its result cannot be stored, however slow the machine).
#[derive(Clone)]
struct Runs {
    n: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Runs {
    fn new() -> Self {
        Runs {
            n: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn count(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }

    /// One call of the guarded function: counts its run, waits at the gate
    /// when `gated`, answers its run's number.
    async fn call(
        &self,
        once: &Guarded,
        store: &RedisStore,
        key: &str,
        gated: bool,
    ) -> Result<usize, Error> {
        once.run_once(store, key, async {
            let n = self.n.fetch_add(1, Ordering::SeqCst) + 1;
            if gated {
                self.gate.acquire().await.unwrap().forget();
            }
            Ok(n)
        })
        .await
    }
}

/// A call's answer once the store's client has reconnected: `None` while
/// the store is unavailable (fail-closed), and any other refusal fails the
/// test.
fn answered(out: Result<usize, Error>) -> Option<usize> {
    match out {
        Ok(n) => Some(n),
        Err(Error::Rejected(Rejected::Unavailable(_))) => None,
        Err(e) => panic!("refused: {e:?}"),
    }
}

/// What the store holds under `key`'s store key: its first byte (`L` a
/// claim in progress, `D` a stored result), if any.
async fn tag(redis: &RedisServer, once: &Guarded, key: &str) -> Option<u8> {
    let mut con = redis.connection().await;
    let value: Option<Vec<u8>> = redis::cmd("GET")
        .arg(once.store_key(key))
        .query_async(&mut con)
        .await
        .unwrap();
    value.and_then(|v| v.first().copied())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_store_would_not_take_is_stored_later_and_never_run_again() {
    let counters = Recorded::global();

    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let store = RedisStore::connect(&proxy.url_for_redis()).await.unwrap();
    let runs = Runs::new();

    // 1. The store is away when the body ends, and back within the lease.
    // Fail-closed: a call while the client reconnects is refused, never run
    // unguarded (which the counts below would take for a repeat).
    let once = Guarded::once("tests::award")
        .lease(Duration::from_secs(4))
        .on_store_failure(FailurePolicy::FailClosed);
    let first = {
        let (once, store, runs) = (once.clone(), store.clone(), runs.clone());
        tokio::spawn(async move { runs.call(&once, &store, "order-1", true).await })
    };
    crate::common::eventually("the claim is written", || async {
        (tag(&redis, &once, "order-1").await == Some(b'L') && runs.count() == 1).then_some(())
    })
    .await;
    proxy.set_mode(ProxyMode::Refuse);
    runs.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), 1);
    // Its first try to store the result failed (the proxy refuses), and the
    // claim is still there: not deleted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(tag(&redis, &once, "order-1").await, Some(b'L'));
    proxy.set_mode(ProxyMode::Pass);
    // Stored once the store is back, well before the claim's lease ends.
    crate::common::eventually_within(Duration::from_secs(3), "the result is stored", || async {
        (tag(&redis, &once, "order-1").await == Some(b'D')).then_some(())
    })
    .await;
    // A repeat gets the first call's result; the body does not run again.
    let again = crate::common::eventually("the client reconnected", || async {
        answered(runs.call(&once, &store, "order-1", false).await)
    })
    .await;
    assert_eq!(again, 1);
    assert_eq!(runs.count(), 1, "the body ran again");
    assert_eq!(counters.counter(LOST), 0);

    // 2. The store is away for the whole lease: the loss is counted, and
    // the claim, its lease passed, stays: a repeat is an unknown outcome,
    // never a second run of a body that had its effect (before: the claim
    // ended with its lease and the repeat ran the body again).
    let once = Guarded::once("tests::award")
        .lease(Duration::from_secs(1))
        .on_store_failure(FailurePolicy::FailClosed);
    let first = {
        let (once, store, runs) = (once.clone(), store.clone(), runs.clone());
        tokio::spawn(async move { runs.call(&once, &store, "order-2", true).await })
    };
    crate::common::eventually("the second claim is written", || async {
        (tag(&redis, &once, "order-2").await == Some(b'L') && runs.count() == 2).then_some(())
    })
    .await;
    proxy.set_mode(ProxyMode::Refuse);
    runs.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), 2);
    crate::common::eventually("the completion is given up", || async {
        (counters.counter(LOST) == 1).then_some(())
    })
    .await;
    proxy.set_mode(ProxyMode::Pass);
    let retry = crate::common::eventually("the client reconnected", || async {
        match runs.call(&once, &store, "order-2", false).await {
            Err(Error::Rejected(Rejected::Unavailable(_))) => None,
            other => Some(other),
        }
    })
    .await;
    assert!(
        matches!(retry, Err(Error::Rejected(Rejected::OutcomeUnknown))),
        "{retry:?}"
    );
    assert_eq!(runs.count(), 2, "the repeat ran the body again");
    assert_eq!(tag(&redis, &once, "order-2").await, Some(b'L'));
    assert_eq!(counters.counter(LOST), 1, "counted once");

    // 3. The store forgets (FLUSHALL) while the body runs: the result finds
    // no claim to replace. Nothing is written back (no key, none without a
    // TTL), and the loss is counted.
    let once = Guarded::once("tests::award")
        .lease(Duration::from_secs(4))
        .on_store_failure(FailurePolicy::FailClosed);
    let first = {
        let (once, store, runs) = (once.clone(), store.clone(), runs.clone());
        // Until the client has reconnected after part 2 (fail-closed: the
        // body does not run while the store is unavailable).
        tokio::spawn(async move {
            loop {
                if let Some(n) = answered(runs.call(&once, &store, "order-3", true).await) {
                    return n;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    crate::common::eventually("the third claim is written", || async {
        (tag(&redis, &once, "order-3").await == Some(b'L') && runs.count() == 3).then_some(())
    })
    .await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    runs.gate.add_permits(1);
    assert_eq!(first.await.unwrap(), 3);
    crate::common::eventually("the forgotten claim's result is counted lost", || async {
        (counters.counter(LOST) == 2).then_some(())
    })
    .await;
    assert_eq!(tag(&redis, &once, "order-3").await, None, "written back");
    assert!(redis.keys_without_ttl().await.is_empty());
}
