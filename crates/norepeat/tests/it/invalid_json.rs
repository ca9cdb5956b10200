//! One rule for a body declared JSON that does not parse, in both layers:
//! 400 `invalid_request` before any claim, the handler not run, nothing
//! stored, so the corrected request with the same key runs. On the memory
//! store and a real Redis.
#![allow(clippy::unwrap_used)]

use crate::common::RouteLayer;
use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::KeyValueStore;
#[cfg(feature = "redis")]
use norepeat::store::RedisStore;
use norepeat::store::{AnyStore, MemoryStore};
#[cfg(feature = "redis")]
use norepeat_testkit::RedisServer;
use norepeat_testkit::{Answer, send};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bodies whose content type says JSON and that do not parse.
const BROKEN: [&str; 3] = [r#"{"orderId":"o1","amount":"#, "", "amount=1999"];
const GOOD: &str = r#"{"orderId":"o1","amount":1999}"#;

fn app<L: RouteLayer>(layer: L, runs: &Arc<AtomicUsize>) -> Router {
    let runs = Arc::clone(runs);
    Router::new().route(
        "/payments",
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, "paid")
        })
        .layer(layer),
    )
}

/// `POST /payments` as user `u1` with `body`, and `Idempotency-Key: key` if any.
fn payment(key: Option<&str>, body: &str) -> Request<Body> {
    let mut req = Request::post("/payments")
        .header("x-user-id", "u1")
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    req.body(Body::from(body.to_owned())).unwrap()
}

/// The status, the problem's code (empty on success) and whether the
/// answer was replayed.
fn outcome(answer: &Answer) -> (StatusCode, String, bool) {
    let code = if answer.status.is_success() {
        String::new()
    } else {
        answer.code()
    };
    (answer.status, code, answer.replayed())
}

async fn both_layers_refuse_invalid_json(store: AnyStore) {
    let runs = Arc::new(AtomicUsize::new(0));
    let idem = app(IdempotencyLayer::new(store.clone()), &runs);
    for (i, broken) in BROKEN.iter().enumerate() {
        let key = format!("pay-{i}");
        for _ in 0..2 {
            // Refused each time, never replayed: nothing was stored.
            assert_eq!(
                outcome(&send(&idem, payment(Some(&key), broken)).await),
                (StatusCode::BAD_REQUEST, "invalid_request".to_owned(), false),
                "idempotency, {broken:?}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), i, "the handler did not run");
        // No claim was made: the corrected request runs under the same key
        // (not 422 `idempotency_key_mismatch`, not 409 in use)...
        assert_eq!(
            outcome(&send(&idem, payment(Some(&key), GOOD)).await),
            (StatusCode::CREATED, String::new(), false)
        );
        // ...and is the one replayed.
        assert_eq!(
            outcome(&send(&idem, payment(Some(&key), GOOD)).await),
            (StatusCode::CREATED, String::new(), true)
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), BROKEN.len());

    let runs = Arc::new(AtomicUsize::new(0));
    let fp = app(
        FingerprintLayer::new(FingerprintGuard::new(store.clone())),
        &runs,
    );
    for broken in BROKEN {
        for _ in 0..2 {
            assert_eq!(
                outcome(&send(&fp, payment(None, broken)).await),
                (StatusCode::BAD_REQUEST, "invalid_request".to_owned(), false),
                "fingerprint, {broken:?}"
            );
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    assert_eq!(
        outcome(&send(&fp, payment(None, GOOD)).await),
        (StatusCode::CREATED, String::new(), false)
    );
    assert_eq!(
        send(&fp, payment(None, GOOD)).await.code(),
        "duplicate_submission",
        "{}",
        store.kind()
    );
}

#[tokio::test]
async fn memory() {
    both_layers_refuse_invalid_json(AnyStore::Memory(MemoryStore::default())).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis() {
    let redis = RedisServer::start().await;
    both_layers_refuse_invalid_json(AnyStore::Redis(
        RedisStore::connect(&redis.url()).await.unwrap(),
    ))
    .await;
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}
