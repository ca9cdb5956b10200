//! The path a guard sees is the path the client sent: inside
//! `Router::nest` axum strips the prefix, and every guard keyed on the
//! stripped path would take `/shop/orders/2/pay` for a repeat of
//! `/shop/orders/1/pay`. Routes here are nested two levels deep, against a
//! real Redis and the memory store.
#![allow(clippy::unwrap_used)]

use crate::common::RouteLayer;
use crate::common::each_store;
use axum::Router;
use axum::body::Body;
use axum::extract::OriginalUri;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::ratelimit::{ByRoute, Quota, RateLimitLayer, RateLimiter};
use norepeat::store::Store;
use norepeat_testkit::send;
use std::num::NonZeroU32;
use std::time::Duration;

/// `/shop/orders/{id}/pay`, two nests deep, guarded by `layer`; the handler
/// answers with the path it was sent.
fn nested<L: RouteLayer>(layer: L) -> Router {
    let pay = Router::new().route(
        "/pay",
        post(|OriginalUri(uri): OriginalUri| async move {
            (StatusCode::CREATED, format!("paid {}", uri.path()))
        })
        .layer(layer),
    );
    Router::new().nest("/shop", Router::new().nest("/orders/{id}", pay))
}

/// Sends the same request (caller, key, body) to order `order` and returns
/// its status, whether it was a replay, and its body.
async fn pay(app: &Router, order: u32) -> (StatusCode, bool, String) {
    let req = Request::post(format!("/shop/orders/{order}/pay"))
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-1")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"amount":1999}"#))
        .unwrap();
    let answer = send(app, req).await;
    (answer.status, answer.replayed(), answer.text())
}

async fn idempotency_key_is_per_order<G: Store + Clone>(store: G) {
    let app = nested(IdempotencyLayer::new(store).route("/shop/orders/{id}/pay"));
    let first = pay(&app, 1).await;
    assert_eq!(
        first,
        (StatusCode::CREATED, false, "paid /shop/orders/1/pay".into())
    );
    // Order 2, same key, same body: its own payment, not order 1's answer.
    let other = pay(&app, 2).await;
    assert_eq!(
        other,
        (StatusCode::CREATED, false, "paid /shop/orders/2/pay".into())
    );
    // A true repeat is still a replay.
    let again = pay(&app, 1).await;
    assert_eq!(
        again,
        (StatusCode::CREATED, true, "paid /shop/orders/1/pay".into())
    );
}

async fn fingerprint_is_per_order<G: Store + Clone>(store: G) {
    let guard = FingerprintGuard::new(store).window(Duration::from_secs(60));
    let app = nested(FingerprintLayer::new(guard).route("/shop/orders/{id}/pay"));
    assert_eq!(pay(&app, 1).await.0, StatusCode::CREATED);
    let other = pay(&app, 2).await;
    assert_eq!(
        other.0,
        StatusCode::CREATED,
        "order 2 is not order 1's duplicate: {other:?}"
    );
    assert_eq!(pay(&app, 1).await.0, StatusCode::CONFLICT);
}

async fn by_route_bucket_is_per_order<G: Store + Clone>(store: G) {
    let limiter =
        RateLimiter::new(store, Quota::per_minute(NonZeroU32::new(1).unwrap())).name("nested");
    let app = nested(RateLimitLayer::new(limiter, ByRoute));
    assert_eq!(pay(&app, 1).await.0, StatusCode::CREATED);
    let other = pay(&app, 2).await;
    assert_eq!(
        other.0,
        StatusCode::CREATED,
        "order 2 has its own bucket: {other:?}"
    );
    assert_eq!(pay(&app, 1).await.0, StatusCode::TOO_MANY_REQUESTS);
}

each_store!(
    idempotency_key_is_per_order,
    fingerprint_is_per_order,
    by_route_bucket_is_per_order,
);

/// A handler two nests deep reads the fingerprint its request was admitted
/// under from the request's extensions: the digest of the path the client
/// sent (`/shop/orders/1/pay`, not the nest's `/pay`), the same
/// `Fingerprinter::fingerprint` gives for those parts, and another one for
/// another order.
#[tokio::test]
async fn the_handler_gets_the_fingerprint_of_what_the_client_sent() {
    use axum::Extension;
    use norepeat::fingerprint::{Digest, Fingerprinter, RequestParts};
    use norepeat::store::MemoryStore;
    let layer = FingerprintLayer::new(FingerprintGuard::new(MemoryStore::default()));
    let pay_route =
        Router::new().route(
            "/pay",
            post(|Extension(fp): Extension<Digest>| async move {
                (StatusCode::CREATED, hex::encode(fp.0))
            })
            .layer(layer),
        );
    let app = Router::new().nest("/shop", Router::new().nest("/orders/{id}", pay_route));
    let want = |order: u32| {
        let route = format!("/shop/orders/{order}/pay");
        let parts = RequestParts {
            user: "u1",
            method: "POST",
            route: &route,
            query: None,
            json: true,
            body: br#"{"amount":1999}"#,
        };
        hex::encode(Fingerprinter::default().fingerprint(&parts).unwrap().0)
    };
    let (status, _, one) = pay(&app, 1).await;
    assert_eq!(
        (status, one.as_str()),
        (StatusCode::CREATED, want(1).as_str())
    );
    let (_, _, two) = pay(&app, 2).await;
    assert_eq!(two, want(2));
    assert_ne!(one, two);
}
