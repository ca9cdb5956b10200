//! A claim whose answer never came: the store was slow, not down. Through
//! a real Redis behind the test kit's proxy delaying every byte past the
//! client's 2 s response timeout, the claim's `SET` lands while the layer
//! (fail-closed) sees a timeout and refuses 503 without running the
//! handler. The claim it may have left is taken back (owner-checked), so
//! the client's retry, once the store is quick again, runs the payment
//! once; without the take-back the retry meets the claim of a request
//! that ran nothing and is answered 409 while its lease lasts, then as an
//! unknown outcome.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::common::eventually;
use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::RedisStore;
use norepeat_testkit::{ProxyMode, RedisServer, TcpProxy, send};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn payment() -> Request<Body> {
    Request::post("/payments")
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-slow")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_refused_on_a_slow_store_is_taken_back_and_its_retry_runs_once() {
    let redis = RedisServer::start().await;
    let proxy = TcpProxy::start(redis.addr()).await;
    let store = RedisStore::connect(&proxy.url_for_redis()).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = Router::new().route(
        "/payments",
        post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::CREATED }
        })
        .layer(IdempotencyLayer::new(store)),
    );
    // Each way 1.5 s: the reply comes after the 2 s timeout, the write
    // lands all the same.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(1500)));
    let slow = send(&app, payment()).await;
    assert_eq!(
        slow.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        slow.body
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The claim landed (the delete that takes it back leaves 1.5 s after
    // the timeout and takes 1.5 s more): this test's retry meets it unless
    // it is taken back.
    let mut admin = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "the timed-out claim is in Redis: {keys:?}");
    proxy.set_mode(ProxyMode::Pass);
    let answer = eventually("the retry runs the payment", || async {
        let a = send(&app, payment()).await;
        (a.status == StatusCode::CREATED).then_some(a)
    })
    .await;
    assert!(!answer.headers.contains_key("idempotent-replayed"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run once");
    let again = send(&app, payment()).await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
