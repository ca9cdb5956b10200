//! The lost completion (`idempotency/mod.rs`, the answers table's last
//! row): the handler answered, but the store refuses every try to store its
//! response for the whole lease. The client still gets its answer; the
//! claim then ends with its lease, a retry runs the handler again, and the
//! loss is counted in `norepeat_idempotency_completion_lost_total`.
//!
//! The test reads the process's global metrics recorder
//! (`norepeat_testkit::Recorded::global`); no other test counts this
//! counter, so it holds whether the tests share a process or not.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::RedisStore;
use norepeat_testkit::{ProxyMode, Recorded, RedisServer, TcpProxy, send};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const LOST: &str = "norepeat_idempotency_completion_lost_total";

/// The handler's runs, and the gate its first run waits at until the test
/// has cut the store off (so the completion cannot land, however slow the
/// machine); later runs pass at once.
#[derive(Clone)]
struct Runs {
    n: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Default for Runs {
    fn default() -> Self {
        Runs {
            n: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

impl Runs {
    fn load(&self, order: Ordering) -> usize {
        self.n.load(order)
    }
}

/// Counts its runs; the first waits at the gate. Answers 201 with the
/// run's number.
async fn pay(State(runs): State<Runs>) -> (StatusCode, String) {
    let n = runs.n.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        let _open = runs.gate.acquire().await.expect("never closed");
    }
    (StatusCode::CREATED, format!(r#"{{"run":{n}}}"#))
}

fn payment() -> Request<Body> {
    Request::post("/payments")
        .header("x-user-id", "u1")
        .header("idempotency-key", "k")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"amount":1999}"#))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_lost_for_the_whole_lease_is_counted_and_the_retry_is_an_unknown_outcome() {
    let counters = Recorded::global();

    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let store = RedisStore::connect(&proxy.url_for_redis()).await.unwrap();
    let runs = Runs::default();
    let lease = Duration::from_secs(1);
    let app = Router::new()
        .route(
            "/payments",
            post(pay).layer(IdempotencyLayer::new(store).lease(lease)),
        )
        .with_state(runs.clone());

    let first = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, payment()).await })
    };
    // Once the claim is in Redis (and the handler runs), the store refuses
    // every connection: the completion cannot land.
    crate::common::eventually("the claim is written", || async {
        (redis.dbsize().await == 1 && runs.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    proxy.set_mode(ProxyMode::Refuse);
    runs.gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(!first.replayed());
    assert_eq!(first.json()["run"], 1);

    // The completion is tried again for up to the lease, then given up:
    // counted once. The claim, unrenewed, passes its lease deadline, but
    // its record stays (it lives for the retention).
    crate::common::eventually("the completion is given up", || async {
        (counters.counter(LOST) == 1).then_some(())
    })
    .await;

    // The store is back: the handler answered, so its effect happened, but
    // its answer was never stored. The retry is an unknown outcome (409),
    // never a second run (before: the claim had ended with its lease and
    // the retry ran the handler again).
    proxy.set_mode(ProxyMode::Pass);
    let retry = crate::common::eventually("the store is back", || async {
        let a = send(&app, payment()).await;
        (a.status != StatusCode::SERVICE_UNAVAILABLE).then_some(a)
    })
    .await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{:?}", retry.body);
    assert_eq!(retry.json()["code"], "idempotency_outcome_unknown");
    assert_eq!(redis.dbsize().await, 1, "the abandoned claim is kept");
    for _ in 0..3 {
        let again = send(&app, payment()).await;
        assert_eq!(again.json()["code"], "idempotency_outcome_unknown");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran again");
    assert_eq!(counters.counter(LOST), 1, "counted once");
    assert!(redis.keys_without_ttl().await.is_empty());
}
