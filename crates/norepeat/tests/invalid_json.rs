//! One rule for a body declared JSON that does not parse, in both layers:
//! 400 `invalid_request` before any claim, the handler not run, nothing
//! stored, so the corrected request with the same key runs. On the memory
//! store and a real Redis.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::KeyValueStore;
use norepeat::store::{AnyStore, MemoryStore, RedisStore};
use norepeat_testkit::RedisServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::ServiceExt;

/// Bodies whose content type says JSON and that do not parse.
const BROKEN: [&str; 3] = [r#"{"orderId":"o1","amount":"#, "", "amount=1999"];
const GOOD: &str = r#"{"orderId":"o1","amount":1999}"#;

fn app<L>(layer: L, runs: &Arc<AtomicUsize>) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
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

async fn send(app: &Router, key: Option<&str>, body: &str) -> (StatusCode, String, bool) {
    let mut req = Request::post("/payments")
        .header("x-user-id", "u1")
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let code = if status.is_success() {
        String::new()
    } else {
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["code"].as_str().unwrap().to_owned()
    };
    (status, code, replayed)
}

async fn both_layers_refuse_invalid_json(store: AnyStore) {
    let runs = Arc::new(AtomicUsize::new(0));
    let idem = app(IdempotencyLayer::new(store.clone()), &runs);
    for (i, broken) in BROKEN.iter().enumerate() {
        let key = format!("pay-{i}");
        for _ in 0..2 {
            // Refused each time, never replayed: nothing was stored.
            assert_eq!(
                send(&idem, Some(&key), broken).await,
                (StatusCode::BAD_REQUEST, "invalid_request".to_owned(), false),
                "idempotency, {broken:?}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), i, "the handler did not run");
        // No claim was made: the corrected request runs under the same key
        // (not 422 `idempotency_key_mismatch`, not 409 in use)...
        assert_eq!(
            send(&idem, Some(&key), GOOD).await,
            (StatusCode::CREATED, String::new(), false)
        );
        // ...and is the one replayed.
        assert_eq!(
            send(&idem, Some(&key), GOOD).await,
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
                send(&fp, None, broken).await,
                (StatusCode::BAD_REQUEST, "invalid_request".to_owned(), false),
                "fingerprint, {broken:?}"
            );
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    assert_eq!(
        send(&fp, None, GOOD).await,
        (StatusCode::CREATED, String::new(), false)
    );
    assert_eq!(
        send(&fp, None, GOOD).await.1,
        "duplicate_submission",
        "{}",
        store.kind()
    );
}

#[tokio::test]
async fn memory() {
    both_layers_refuse_invalid_json(AnyStore::Memory(MemoryStore::default())).await;
}

#[tokio::test]
async fn redis() {
    let redis = RedisServer::start().await;
    both_layers_refuse_invalid_json(AnyStore::Redis(
        RedisStore::connect(&redis.url()).await.unwrap(),
    ))
    .await;
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}
