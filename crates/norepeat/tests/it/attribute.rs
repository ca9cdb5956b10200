// Over 400 lines: each of the attribute's modes and failure policies on both stores, sharing the annotated functions.
//! `#[norepeat::guard]` on async fns and methods, against the memory store
//! and a real Redis: once per key with the stored result, release on
//! failure, windows, the self-call case, failure policies, compile errors.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common::Error;
use crate::common::{drop_when, eventually, eventually_within, with_stores};
use norepeat::attribute::Rejected;
use norepeat::store::KeyValueStoreExt;
#[cfg(feature = "redis")]
use norepeat::store::RedisStore;
#[cfg(feature = "redis")]
use norepeat::store::Resilient;
use norepeat::store::{MemoryStore, Store};
#[cfg(feature = "redis")]
use norepeat_testkit::RedisServer;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

struct Order {
    user_id: String,
    biz_id: String,
}

fn order(user: &str, biz: &str) -> Order {
    Order {
        user_id: user.into(),
        biz_id: biz.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    number: u32,
    user: String,
}

/// A service whose guarded methods count the runs of their bodies.
struct Shop<S> {
    store: S,
    runs: AtomicU32,
    fail_next: AtomicBool,
    panic_next: AtomicBool,
    pause: Duration,
}

impl<S: Store + Clone> Shop<S> {
    fn new(store: S) -> Self {
        Self {
            store,
            runs: AtomicU32::new(0),
            fail_next: AtomicBool::new(false),
            panic_next: AtomicBool::new(false),
            pause: Duration::from_millis(100),
        }
    }

    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }

    async fn body(&self, order: &Order) -> Result<Receipt, Error> {
        let number = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.pause).await;
        assert!(
            !self.panic_next.swap(false, Ordering::SeqCst),
            "injected panic"
        );
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(Error::Failed);
        }
        Ok(Receipt {
            number,
            user: order.user_id.clone(),
        })
    }

    #[norepeat::guard(store = self.store, key = "{order.user_id}:{order.biz_id}", mode = once)]
    async fn place_once(&self, order: &Order) -> Result<Receipt, Error> {
        self.body(order).await
    }

    #[norepeat::guard(store = self.store, key = "{order.user_id}:{order.biz_id}", window = "1s")]
    async fn place_window(&self, order: &Order) -> Result<Receipt, Error> {
        self.body(order).await
    }

    /// Window mode with a window far longer than a test waits, so a key
    /// that is free again was released, not expired.
    #[norepeat::guard(store = self.store, key = "{order.user_id}:{order.biz_id}", window = "60s")]
    async fn place_long_window(&self, order: &Order) -> Result<Receipt, Error> {
        self.body(order).await
    }

    /// Not guarded: calls the guarded methods on `self`, the call Spring's
    /// proxies would not see.
    async fn checkout(&self, order: &Order, once: bool) -> Result<Receipt, Error> {
        if once {
            self.place_once(order).await
        } else {
            self.place_window(order).await
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn once_concurrent_calls_with_one_key_run_the_body_once() {
    with_stores(|store| async move {
        let shop = Arc::new(Shop::new(store));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let shop = Arc::clone(&shop);
                tokio::spawn(async move { shop.place_once(&order("u1", "cart-1")).await })
            })
            .collect();
        let mut ok = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(r) => ok.push(r),
                Err(e) => assert_eq!(e, Error::Refused(Rejected::InProgress)),
            }
        }
        assert_eq!(shop.runs(), 1);
        assert!(!ok.is_empty());
        let first = Receipt {
            number: 1,
            user: "u1".into(),
        };
        assert!(ok.iter().all(|r| *r == first), "{ok:?}");
        // Later calls get the stored result without running the body.
        for _ in 0..3 {
            assert_eq!(
                shop.place_once(&order("u1", "cart-1")).await,
                Ok(first.clone())
            );
        }
        assert_eq!(shop.runs(), 1);
        // Another key runs.
        let other = shop.place_once(&order("u1", "cart-2")).await.unwrap();
        assert_eq!(other.number, 2);
        assert_eq!(shop.runs(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_failed_call_releases_the_key_so_a_retry_runs() {
    with_stores(|store| async move {
        let shop = Shop::new(store);
        shop.fail_next.store(true, Ordering::SeqCst);
        assert_eq!(
            shop.place_once(&order("u2", "cart-1")).await,
            Err(Error::Failed)
        );
        // Released at once: the retry runs, and its success is kept.
        let second = shop.place_once(&order("u2", "cart-1")).await.unwrap();
        assert_eq!(second.number, 2);
        assert_eq!(shop.place_once(&order("u2", "cart-1")).await, Ok(second));
        assert_eq!(shop.runs(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_panic_releases_the_key_a_dropped_call_keeps_it() {
    with_stores(|store| async move {
        let shop = Arc::new(Shop::new(store));
        shop.panic_next.store(true, Ordering::SeqCst);
        let s = Arc::clone(&shop);
        let panicked = tokio::spawn(async move { s.place_once(&order("u3", "c")).await }).await;
        assert!(panicked.unwrap_err().is_panic());
        // The release runs in a short task: the retry runs once it is done.
        let retry = eventually("the panic's release", || async {
            let out = shop.place_once(&order("u3", "c")).await;
            (out != Err(Error::Refused(Rejected::InProgress))).then_some(out)
        })
        .await;
        assert_eq!(retry.unwrap().number, 2);

        // A call whose future is dropped mid-body (a timeout) may have had
        // its effect: its claim is kept until the lease ends.
        drop_when(shop.place_once(&order("u3", "d")), "the body runs", || {
            shop.runs() == 3
        })
        .await;
        // A bounded wait, generous beside the release's short task: it
        // shows the claim is NOT freed, which no condition can signal.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            shop.place_once(&order("u3", "d")).await,
            Err(Error::Refused(Rejected::InProgress))
        );
        assert_eq!(shop.runs(), 3);
    })
    .await;
}

/// Window mode: a panic releases the key at once, as in once mode, so a
/// repeat within the (60 s) window runs; polled for at most 5 s, so the
/// window's end cannot stand in for the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_a_panic_releases_the_key() {
    with_stores(|store| async move {
        let shop = Arc::new(Shop::new(store));
        shop.panic_next.store(true, Ordering::SeqCst);
        let s = Arc::clone(&shop);
        let panicked =
            tokio::spawn(async move { s.place_long_window(&order("u6", "c")).await }).await;
        assert!(panicked.unwrap_err().is_panic());
        let repeat = eventually_within(Duration::from_secs(5), "the panic's release", || async {
            let out = shop.place_long_window(&order("u6", "c")).await;
            (!matches!(out, Err(Error::Refused(Rejected::Duplicate { .. })))).then_some(out)
        })
        .await;
        assert_eq!(repeat.unwrap().number, 2, "the repeat ran the body");
        // Its success holds the key for the window.
        assert!(matches!(
            shop.place_long_window(&order("u6", "c")).await,
            Err(Error::Refused(Rejected::Duplicate { .. }))
        ));
        assert_eq!(shop.runs(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_method_called_from_another_method_of_the_same_type_is_guarded() {
    with_stores(|store| async move {
        let shop = Shop::new(store);
        // Once mode: the second checkout gets the first receipt.
        let first = shop.checkout(&order("u4", "cart-1"), true).await.unwrap();
        assert_eq!(shop.checkout(&order("u4", "cart-1"), true).await, Ok(first));
        assert_eq!(shop.runs(), 1);
        // Window mode: the second checkout is refused.
        shop.checkout(&order("u4", "cart-2"), false).await.unwrap();
        assert!(matches!(
            shop.checkout(&order("u4", "cart-2"), false).await,
            Err(Error::Refused(Rejected::Duplicate { .. }))
        ));
        assert_eq!(shop.runs(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn window_mode_rejects_repeats_within_the_window_and_admits_after() {
    with_stores(|store| async move {
        let shop = Arc::new(Shop::new(store));
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let shop = Arc::clone(&shop);
                tokio::spawn(async move { shop.place_window(&order("u5", "cart-1")).await })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => admitted += 1,
                Err(Error::Refused(Rejected::Duplicate { retry_after })) => {
                    assert!(retry_after >= Duration::from_secs(1));
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(admitted, 1);
        assert_eq!(shop.runs(), 1);
        // Held after success for the rest of the window...
        assert!(shop.place_window(&order("u5", "cart-1")).await.is_err());
        // ...and free once it has passed.
        let after = eventually("the window has passed", || async {
            let out = shop.place_window(&order("u5", "cart-1")).await;
            (!matches!(out, Err(Error::Refused(Rejected::Duplicate { .. })))).then_some(out)
        })
        .await;
        assert!(after.is_ok(), "{after:?}");
        assert_eq!(shop.runs(), 2);

        // A failure releases at once: the retry runs inside the window.
        shop.fail_next.store(true, Ordering::SeqCst);
        assert_eq!(
            shop.place_window(&order("u5", "cart-9")).await,
            Err(Error::Failed)
        );
        assert!(shop.place_window(&order("u5", "cart-9")).await.is_ok());
        assert_eq!(shop.runs(), 4);
    })
    .await;
}

// Free functions, a store argument by reference, tuple fields, scope.

#[norepeat::guard(store = store, key = "{pair.0}/{pair.1}", mode = once, scope = "tests::pairs", retention = "1m", lease = "5s")]
async fn pairs(store: &MemoryStore, pair: (u32, &str), runs: &AtomicU32) -> Result<u32, Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + pair.0)
}

#[norepeat::guard(store = store, key = "{{literal}}-{id:?}", mode = once)]
async fn unit(store: &MemoryStore, id: &str, runs: &AtomicU32) -> Result<(), Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Arguments taken by value are moved into the body as written.
#[norepeat::guard(store = store, key = "{id}", window = "500ms")]
async fn owned(store: MemoryStore, id: String) -> Result<String, Error> {
    drop(store);
    Ok(id)
}

#[tokio::test]
async fn free_functions_tuple_fields_and_unit_results() {
    let store = MemoryStore::default();
    let runs = AtomicU32::new(0);
    assert_eq!(pairs(&store, (10, "a"), &runs).await, Ok(10));
    assert_eq!(pairs(&store, (10, "a"), &runs).await, Ok(10));
    assert_eq!(pairs(&store, (10, "b"), &runs).await, Ok(11));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let key = norepeat::attribute::Guarded::once("tests::pairs")
        .store_key(&norepeat::keys::key_from_parts(&["10", "/", "a"]));
    assert!(
        store
            .put_if_absent(&key, b"x", Duration::from_secs(1))
            .await
            .unwrap()
            .is_some()
    );

    let runs = AtomicU32::new(0);
    unit(&store, "x", &runs).await.unwrap();
    unit(&store, "x", &runs).await.unwrap();
    unit(&store, "y", &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    assert_eq!(owned(store.clone(), "z".into()).await, Ok("z".to_owned()));
    assert!(matches!(
        owned(store.clone(), "z".into()).await,
        Err(Error::Refused(Rejected::Duplicate { .. }))
    ));
}

// Failure policies, against a Redis that is gone.

#[cfg(feature = "redis")]
struct Down<S> {
    store: S,
    runs: AtomicU32,
}

#[cfg(feature = "redis")]
impl<S: Store + Clone> Down<S> {
    #[norepeat::guard(store = self.store, key = "{id}", mode = once, on_store_failure = fail_open)]
    async fn open(&self, id: u32) -> Result<u32, Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + id)
    }

    #[norepeat::guard(store = self.store, key = "{id}", mode = once, on_store_failure = fail_closed)]
    async fn closed(&self, id: u32) -> Result<u32, Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + id)
    }

    #[norepeat::guard(store = self.store, key = "{id}", window = "2s", on_store_failure = fail_closed)]
    async fn closed_window(&self, id: u32) -> Result<u32, Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + id)
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failure_runs_unguarded_when_open_and_refuses_when_closed() {
    let mut redis = RedisServer::start().await;
    let store = Resilient::new(RedisStore::connect(&redis.url()).await.unwrap())
        .timeout(Duration::from_millis(200));
    redis.kill();
    let down = Down {
        store,
        runs: AtomicU32::new(0),
    };
    // Fail-open: runs every time (nothing could be stored).
    assert_eq!(down.open(1).await, Ok(1));
    assert_eq!(down.open(1).await, Ok(2));
    // Fail-closed: refuses without running.
    assert!(matches!(
        down.closed(1).await,
        Err(Error::Refused(Rejected::Unavailable(_)))
    ));
    assert!(matches!(
        down.closed_window(1).await,
        Err(Error::Refused(Rejected::Unavailable(_)))
    ));
    assert_eq!(down.runs.load(Ordering::SeqCst), 2);
}

/// A memory store whose `replace_if_equals` (how a result replaces its
/// claim) waits at a gate: a store that hangs on the first completion
/// write, then answers.
#[derive(Clone, Default)]
struct CompletionHangs {
    inner: MemoryStore,
    gate: Arc<tokio::sync::Notify>,
    waiting: Arc<AtomicBool>,
}

impl norepeat::store::KeyValueStore for CompletionHangs {
    async fn execute(
        &self,
        op: norepeat::store::KeyOp<'_>,
    ) -> Result<norepeat::store::KeyReply, norepeat::store::StoreError> {
        if matches!(op, norepeat::store::KeyOp::ReplaceIfEquals { .. }) {
            let opened = self.gate.notified();
            self.waiting.store(true, Ordering::SeqCst);
            opened.await;
        }
        self.inner.execute(op).await
    }
    fn kind(&self) -> &'static str {
        "completion-hangs"
    }
}

impl norepeat::store::RateStore for CompletionHangs {
    async fn rate(
        &self,
        op: norepeat::store::RateOp<'_>,
    ) -> Result<norepeat::store::RateDecision, norepeat::store::StoreError> {
        self.inner.rate(op).await
    }
}

/// Once mode: a call dropped during its first completion write (the body
/// done, the store hanging) still stores its result when the store
/// answers, so a repeat gets it and the body never runs again. Before, the
/// write was dropped with the call and the claim was left to its lease.
#[tokio::test]
async fn once_a_call_dropped_while_its_result_is_written_still_stores_it() {
    use norepeat::attribute::Guarded;
    let store = CompletionHangs::default();
    let once = Guarded::once("tests::dropped_write").lease(Duration::from_secs(30));
    let runs = Arc::new(AtomicU32::new(0));
    let call = |n: u32| {
        let (once, store, runs) = (once.clone(), store.clone(), Arc::clone(&runs));
        async move {
            once.run_once(&store, "order-9", async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<u32, Error>(n)
            })
            .await
        }
    };
    drop_when(call(1), "the result's write", || {
        store.waiting.load(Ordering::SeqCst)
    })
    .await;
    // The store answers now; the dropped call's write goes on.
    store.gate.notify_waiters();
    let stored = eventually("the result is stored", || async {
        let held = store
            .inner
            .put_if_absent(&once.store_key("order-9"), b"x", Duration::from_secs(1))
            .await
            .unwrap();
        held.filter(|v| v.first() == Some(&b'D'))
    })
    .await;
    assert_eq!(&stored[..], b"D1");
    store.waiting.store(false, Ordering::SeqCst);
    assert_eq!(call(2).await, Ok(1), "the repeat gets the stored result");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `#[norepeat::guard(mode = once)]` and a call that died mid-body (here:
/// dropped, so its claim is never renewed or completed): by default the
/// next call, once the lease has passed, gets `Rejected::OutcomeUnknown`
/// and the body never runs again; with `abandoned = retry` a later call
/// takes the claim over and runs it (after the lease and a second for
/// clocks that disagree).
#[tokio::test]
async fn once_an_abandoned_claim_is_an_unknown_outcome_or_taken_over() {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    #[norepeat::guard(store = store, key = "{id}", mode = once, lease = "300ms")]
    async fn unknown(store: &MemoryStore, id: u32, hang: bool) -> Result<u32, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        if hang {
            std::future::pending::<()>().await;
        }
        Ok(id)
    }
    #[norepeat::guard(store = store, key = "{id}", mode = once, lease = "300ms", abandoned = retry)]
    async fn retried(store: &MemoryStore, id: u32, hang: bool) -> Result<u32, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        if hang {
            std::future::pending::<()>().await;
        }
        Ok(id)
    }
    let store = MemoryStore::default();
    drop_when(unknown(&store, 1, true), "the body runs", || {
        RUNS.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(
        unknown(&store, 1, false).await,
        Err(Error::Refused(Rejected::InProgress))
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        unknown(&store, 1, false).await,
        Err(Error::Refused(Rejected::OutcomeUnknown))
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran again");

    drop_when(retried(&store, 2, true), "the body runs", || {
        RUNS.load(Ordering::SeqCst) == 2
    })
    .await;
    let taken = eventually("the abandoned claim is taken over", || async {
        match retried(&store, 2, false).await {
            Err(Error::Refused(Rejected::InProgress)) => None,
            other => Some(other),
        }
    })
    .await;
    assert_eq!(taken, Ok(2));
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
    assert_eq!(retried(&store, 2, false).await, Ok(2), "the stored result");
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
}
