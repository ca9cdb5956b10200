//! Identity is never guessed: a request carrying the caller's header twice
//! has no caller, in every layer that needs one (401 `unauthenticated`),
//! against a real Redis.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::ratelimit::{ByUser, Quota, RateLimitLayer, RateLimiter};
use norepeat::store::RedisStore;
use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
use norepeat_testkit::{RedisServer, send};
use std::num::NonZeroU32;

/// `users` as `X-User-Id` headers, one each, on a request every layer
/// would otherwise let through to its answer.
fn order(users: &[&str]) -> Request<Body> {
    let mut b = Request::post("/orders")
        .header("idempotency-key", "k-1")
        .header("repeat-token", "not-a-token")
        .header("content-type", "application/json");
    for u in users {
        b = b.header("x-user-id", *u);
    }
    b.body(Body::from(r#"{"sku":"SKU-1"}"#)).unwrap()
}

async fn answer(app: &Router, req: Request<Body>) -> (u16, String) {
    let answer = send(app, req).await;
    let code = answer.json()["code"].as_str().unwrap_or("").to_owned();
    (answer.status.as_u16(), code)
}

#[tokio::test]
async fn the_user_header_twice_is_401_in_every_layer() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let handler = post(|| async { (StatusCode::CREATED, "created") });
    let quota = Quota::per_minute(NonZeroU32::new(100).unwrap());
    let apps: Vec<(&str, Router)> = vec![
        (
            "fingerprint",
            Router::new().route(
                "/orders",
                handler
                    .clone()
                    .layer(FingerprintLayer::new(FingerprintGuard::new(store.clone()))),
            ),
        ),
        (
            "token",
            Router::new().route(
                "/orders",
                handler.clone().layer(TokenLayer::new(TokenGuard::new(
                    store.clone(),
                    TokenSigner::random(),
                ))),
            ),
        ),
        (
            "idempotency",
            Router::new().route(
                "/orders",
                handler.clone().layer(IdempotencyLayer::new(store.clone())),
            ),
        ),
        (
            "ratelimit",
            Router::new().route(
                "/orders",
                handler.clone().layer(RateLimitLayer::new(
                    RateLimiter::new(store.clone(), quota),
                    ByUser::default(),
                )),
            ),
        ),
    ];
    for (name, app) in &apps {
        for users in [&["mallory", "u1"][..], &["u1", "u1"][..]] {
            assert_eq!(
                answer(app, order(users)).await,
                (401, "unauthenticated".to_owned()),
                "{name}: {users:?}"
            );
        }
        // One header is a caller: the layer gets past identity.
        let (status, _) = answer(app, order(&["u1"])).await;
        assert_ne!(status, 401, "{name}");
    }
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

/// A previous identity whose record cannot be read (a real Redis whose
/// ACL refuses this client `GET`, so the read fails while the claim, a
/// `SET`, would succeed) is not taken as "no record": on a fail-closed
/// layer the request is refused 503 and its handler does not run, since
/// the record it could not read may be this very request's, made under the
/// old identity (before: the read's failure was taken as "none", and the
/// request claimed the key anew and ran a second time).
#[tokio::test]
async fn a_previous_identity_that_cannot_be_read_refuses_a_fail_closed_request() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let redis = RedisServer::start().await;
    let mut admin = redis.connection().await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "noget", "on", ">pw", "~*", "+@all", "-get"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://noget:pw@127.0.0.1:{}", redis.port());
    let store = RedisStore::connect(&url).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let layer = IdempotencyLayer::new(store)
        .identity(norepeat::identity::UserHeader::new(
            http::HeaderName::from_static("x-account"),
        ))
        .previous_identity(norepeat::identity::UserHeader::default());
    let app = Router::new().route(
        "/pay",
        post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::CREATED }
        })
        .layer(layer),
    );
    let req = Request::post("/pay")
        .header("x-account", "acct-1")
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-1")
        .body(Body::empty())
        .unwrap();
    let answer = send(&app, req).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        answer.body
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
}
