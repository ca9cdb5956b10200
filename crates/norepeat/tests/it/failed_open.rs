//! The [`FailedOpen`] marker: each of the four layers (fingerprint, token,
//! Idempotency-Key, rate limit) puts its name in the response's extensions
//! when it let the request through because its store failed and it fails
//! open, and only then: not on a decided request, not when it fails closed
//! (503), not in a stack whose other layer decided.
//!
//! Its sibling [`DecidedLocally`]: over a [`Fallback`], whose local
//! memory decides when the store fails, each layer names itself there
//! instead, on the requests that memory admitted.
//!
//! The store is a memory store behind a breaker opened by hand, so every
//! store call fails at once (a killed Redis behaves the same through the
//! gateway's tests).

// A test that cannot build its request or read its answer cannot go on.
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, Response, StatusCode};
use norepeat::degrade::{DecidedLocally, FailedOpen, FailurePolicy};
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::idempotency::IdempotencyLayer;
use norepeat::ratelimit::{ByUser, Quota, RateLimitLayer, RateLimiter};
use norepeat::store::{Fallback, MemoryStore, Resilient};
use norepeat::token::{TokenGuard, TokenLayer, TokenSigner};
use std::time::Duration;
use tower::ServiceExt;

/// A store that answers (`down: false`) or fails every call at once.
fn store(down: bool) -> Resilient<MemoryStore> {
    let s = Resilient::new(MemoryStore::default()).breaker(1, Duration::from_secs(3600));
    if down {
        s.circuit().record(false);
    }
    s
}

/// `POST /orders` answering 201, behind `layer`.
macro_rules! app {
    ($layer:expr) => {
        Router::new().route(
            "/orders",
            post(|| async { StatusCode::CREATED }).layer($layer),
        )
    };
}

fn order(token: Option<&str>) -> Request<Body> {
    let mut r = Request::post("/orders")
        .header("x-user-id", "u1")
        .header("idempotency-key", "k-1")
        .header("content-type", "application/json");
    if let Some(t) = token {
        r = r.header("repeat-token", t);
    }
    r.body(Body::from(r#"{"sku":"a"}"#)).unwrap()
}

async fn call(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

fn marker(res: &Response<Body>) -> Option<Vec<&'static str>> {
    res.extensions().get::<FailedOpen>().map(|f| f.0.clone())
}

fn fingerprint(down: bool, policy: FailurePolicy) -> Router {
    let guard = FingerprintGuard::new(store(down)).on_store_failure(policy);
    app!(FingerprintLayer::new(guard))
}

fn idempotency(down: bool, policy: FailurePolicy) -> Router {
    app!(IdempotencyLayer::new(store(down)).on_store_failure(policy))
}

fn rate_limit(down: bool, policy: FailurePolicy) -> Router {
    let limiter =
        RateLimiter::new(store(down), Quota::parse("100/s").unwrap()).on_store_failure(policy);
    app!(RateLimitLayer::new(limiter, ByUser::default()))
}

fn tokens(down: bool, policy: FailurePolicy) -> (Router, TokenGuard<Resilient<MemoryStore>>) {
    let guard = TokenGuard::new(store(down), TokenSigner::random()).on_store_failure(policy);
    (app!(TokenLayer::new(guard.clone())), guard)
}

#[tokio::test]
async fn each_layer_that_fails_open_says_so() {
    use FailurePolicy::FailOpen;
    let res = call(&fingerprint(true, FailOpen), order(None)).await;
    assert_eq!(
        (res.status(), marker(&res)),
        (StatusCode::CREATED, Some(vec!["fingerprint"]))
    );
    let res = call(&idempotency(true, FailOpen), order(None)).await;
    assert_eq!(
        (res.status(), marker(&res)),
        (StatusCode::CREATED, Some(vec!["idempotency"]))
    );
    let res = call(&rate_limit(true, FailOpen), order(None)).await;
    assert_eq!(
        (res.status(), marker(&res)),
        (StatusCode::CREATED, Some(vec!["rate_limit"]))
    );
    let (app, guard) = tokens(true, FailOpen);
    let token = guard.issue("u1").token;
    let res = call(&app, order(Some(&token))).await;
    assert_eq!(
        (res.status(), marker(&res)),
        (StatusCode::CREATED, Some(vec!["token"]))
    );
}

#[tokio::test]
async fn a_decided_request_has_no_marker() {
    use FailurePolicy::FailOpen;
    for app in [
        fingerprint(false, FailOpen),
        idempotency(false, FailOpen),
        rate_limit(false, FailOpen),
    ] {
        let res = call(&app, order(None)).await;
        assert_eq!((res.status(), marker(&res)), (StatusCode::CREATED, None));
    }
    let (app, guard) = tokens(false, FailOpen);
    let token = guard.issue("u1").token;
    let res = call(&app, order(Some(&token))).await;
    assert_eq!((res.status(), marker(&res)), (StatusCode::CREATED, None));
    // A refusal is decided too.
    let res = call(&app, order(Some(&token))).await;
    assert_eq!((res.status(), marker(&res)), (StatusCode::CONFLICT, None));
}

#[tokio::test]
async fn a_layer_that_fails_closed_refuses_without_the_marker() {
    use FailurePolicy::FailClosed;
    for app in [
        fingerprint(true, FailClosed),
        idempotency(true, FailClosed),
        rate_limit(true, FailClosed),
        tokens(true, FailClosed).0,
    ] {
        let res = call(&app, order(Some("t"))).await;
        // The token layer checks the signature first: a bad token is 409
        // without asking the store.
        assert!(
            matches!(
                res.status(),
                StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT
            ),
            "{}",
            res.status()
        );
        assert_eq!(marker(&res), None);
    }
    let (app, guard) = tokens(true, FailClosed);
    let res = call(&app, order(Some(&guard.issue("u1").token))).await;
    assert_eq!(
        (res.status(), marker(&res)),
        (StatusCode::SERVICE_UNAVAILABLE, None)
    );
}

/// A rate limit over a fingerprint guard, both on a failed store and
/// failing open: both names, the inner layer first.
#[tokio::test]
async fn stacked_layers_each_add_their_name() {
    let s = store(true);
    let limiter = RateLimiter::new(s.clone(), Quota::parse("100/s").unwrap());
    let app = app!(FingerprintLayer::new(FingerprintGuard::new(s)))
        .layer(RateLimitLayer::new(limiter, ByUser::default()));
    let res = call(&app, order(None)).await;
    assert_eq!(marker(&res), Some(vec!["fingerprint", "rate_limit"]));
}

/// `store(down)` with a local memory behind it.
fn with_memory(down: bool) -> Fallback<Resilient<MemoryStore>> {
    Fallback::new(store(down), MemoryStore::default())
}

fn decided_locally(res: &Response<Body>) -> Option<Vec<&'static str>> {
    res.extensions()
        .get::<DecidedLocally>()
        .map(|d| d.0.clone())
}

/// Over a failed store with a local memory, each layer admits the first
/// request on the memory's decision and says so (not `FailedOpen`: it was
/// decided), and the memory catches the repeat (a replay for the
/// Idempotency-Key, which carries no marker: nothing was admitted). With
/// the store up, no marker.
#[tokio::test]
async fn each_layer_whose_local_memory_decided_says_so() {
    let both = |res: &Response<Body>| (res.status(), decided_locally(res), marker(res));
    let mine = |name| (StatusCode::CREATED, Some(vec![name]), None);
    for down in [true, false] {
        let fingerprint = app!(FingerprintLayer::new(FingerprintGuard::new(with_memory(
            down
        ))));
        let idempotency = app!(IdempotencyLayer::new(with_memory(down)));
        let limiter = RateLimiter::new(with_memory(down), Quota::parse("100/s").unwrap());
        let rate_limit = app!(RateLimitLayer::new(limiter, ByUser::default()));
        let guard = TokenGuard::new(with_memory(down), TokenSigner::random());
        let token = guard.issue("u1").token;
        let tokens = app!(TokenLayer::new(guard));
        let first = [
            (&fingerprint, None, "fingerprint"),
            (&idempotency, None, "idempotency"),
            (&rate_limit, None, "rate_limit"),
            (&tokens, Some(token.as_str()), "token"),
        ];
        for (app, token, name) in first {
            let res = call(app, order(token)).await;
            let want = if down {
                mine(name)
            } else {
                (StatusCode::CREATED, None, None)
            };
            assert_eq!(both(&res), want, "{name}, store down: {down}");
        }
        let again = |app, token| async move { both(&call(app, order(token)).await) };
        assert_eq!(
            again(&fingerprint, None).await,
            (StatusCode::CONFLICT, None, None)
        );
        assert_eq!(
            again(&idempotency, None).await,
            (StatusCode::CREATED, None, None)
        );
        assert_eq!(
            again(&tokens, Some(&token)).await,
            (StatusCode::CONFLICT, None, None)
        );
        let want = if down {
            mine("rate_limit")
        } else {
            (StatusCode::CREATED, None, None)
        };
        assert_eq!(again(&rate_limit, None).await, want);
    }
}

/// A key the local memory released (the handler answered 500) is taken
/// over by its retry from that memory too, and the retry says so: before,
/// the take-over was counted as the store's decision.
#[tokio::test]
async fn a_retry_that_takes_over_a_locally_released_key_says_so() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let failed = std::sync::Arc::new(AtomicBool::new(false));
    let handler = move || {
        let first = !failed.swap(true, Ordering::SeqCst);
        async move {
            if first {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::CREATED
            }
        }
    };
    let app = Router::new().route(
        "/orders",
        post(handler).layer(IdempotencyLayer::new(with_memory(true))),
    );
    let res = call(&app, order(None)).await;
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(decided_locally(&res), Some(vec!["idempotency"]));
    let res = call(&app, order(None)).await;
    assert_eq!(
        (res.status(), decided_locally(&res), marker(&res)),
        (StatusCode::CREATED, Some(vec!["idempotency"]), None)
    );
}
