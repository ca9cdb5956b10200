// Over 400 lines: the token and the fingerprint guard held to one contract on Redis and in memory, sharing its checks.
//! The entry guard against real Redis and the memory store: exactly one
//! handler run per submission, owner-checked release, contract answers.
//!
//! Over 400 lines: the token and the fingerprint guard are held to one
//! contract with the same request builders; one file keeps the two side by
//! side.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common::{counting_route, panicking_route, send_and_panic};
use crate::common::{eventually, eventually_within, with_stores};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use norepeat::fingerprint::Digest;
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer, ReleasePolicy};
use norepeat::problem::Problem;
#[cfg(feature = "redis")]
use norepeat::store::KeyValueStore;
#[cfg(feature = "redis")]
use norepeat::store::RedisStore;
use norepeat::store::{AnyStore, MemoryStore};
use norepeat::token::TokenSigner;
use norepeat::token::{TokenGuard, TokenLayer};
#[cfg(feature = "redis")]
use norepeat_testkit::RedisServer;
use norepeat_testkit::{Answer, post_with_token, send};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tower::ServiceExt;

fn order(user: &str, body: &'static str) -> Request<Body> {
    Request::post("/orders")
        .header("x-user-id", user)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_identical_fingerprints_run_the_handler_once() {
    with_stores(|store| async move {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = counting_route(
            FingerprintLayer::new(FingerprintGuard::new(store).window(Duration::from_secs(10))),
            Arc::clone(&runs),
        );
        let tasks: Vec<_> = (0..1000)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move {
                    app.oneshot(order("u1", r#"{"sku":"SKU-1","quantity":1}"#))
                        .await
                        .unwrap()
                        .status()
                })
            })
            .collect();
        let mut created = 0;
        let mut duplicates = 0;
        for t in tasks {
            match t.await.unwrap() {
                StatusCode::CREATED => created += 1,
                StatusCode::CONFLICT => duplicates += 1,
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!((created, duplicates), (1, 999));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_uses_of_one_token_run_the_handler_once() {
    with_stores(|store| async move {
        let runs = Arc::new(AtomicUsize::new(0));
        let tokens = TokenGuard::new(store, TokenSigner::random());
        let token = tokens.issue("u1").token;
        let app = counting_route(TokenLayer::new(tokens), Arc::clone(&runs));
        let tasks: Vec<_> = (0..1000)
            .map(|i| {
                let app = app.clone();
                let token = token.clone();
                tokio::spawn(async move {
                    // Different bodies: only the token makes them repeats.
                    let body = format!(r#"{{"sku":"SKU-1","quantity":{}}}"#, i % 100 + 1);
                    let req = post_with_token("/orders", "u1", token)
                        .body(Body::from(body))
                        .unwrap();
                    app.oneshot(req).await.unwrap().status()
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.unwrap());
        }
        assert_eq!(
            statuses
                .iter()
                .filter(|s| **s == StatusCode::CREATED)
                .count(),
            1
        );
        assert_eq!(
            statuses
                .iter()
                .filter(|s| **s == StatusCode::CONFLICT)
                .count(),
            999
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    })
    .await;
}

/// The article's lost lock: A's key expires while A still runs, B takes
/// it, A finishes and releases. B's key must survive A's release. A blind
/// `DEL` would remove it, and the third request would pass.
#[tokio::test]
async fn a_late_release_never_deletes_the_next_owners_key() {
    with_stores(|store| async move {
        let guard = FingerprintGuard::new(store.clone())
            .window(Duration::from_millis(100))
            .release(ReleasePolicy::ReleaseOnCompletion);
        // B's window is seconds long (the key does not depend on the
        // window), so B's key cannot expire by itself between B's claim and
        // the checks below, however slow the machine: only A's release
        // could remove it.
        let b_window = Duration::from_secs(2);
        let next = FingerprintGuard::new(store)
            .window(b_window)
            .release(ReleasePolicy::ReleaseOnCompletion);
        let fp = Digest([9; 32]);
        assert_eq!(guard.key_of(&fp), next.key_of(&fp));
        let a = guard.acquire(&fp).await.expect("A takes the key");
        // A's key expires after its 100 ms window: B takes it then.
        let b = eventually("A's key expires", || async { next.acquire(&fp).await.ok() }).await;
        a.finish(true).await; // A releases: must not touch B's key
        let c = next.acquire(&fp).await;
        assert!(c.is_err(), "B's key was deleted by A's release");
        drop(b);
        // B's lease was dropped (its request gave up): the key is held for
        // the rest of its window, then free.
        assert!(
            next.acquire(&fp).await.is_err(),
            "a dropped lease freed its key"
        );
        eventually("a dropped lease's key outlives its window", || async {
            next.acquire(&fp).await.ok()
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn after_success_the_key_is_held_for_the_window_after_failure_released() {
    with_stores(|store| async move {
        let guard = FingerprintGuard::new(store).window(Duration::from_secs(10));
        let ok = Digest([1; 32]);
        guard.acquire(&ok).await.unwrap().finish(true).await;
        let dup = Problem::from(guard.acquire(&ok).await.unwrap_err());
        assert_eq!(dup.code.as_str(), "duplicate_submission");
        let secs = dup.retry_after.expect("Retry-After");
        assert!((1..=10).contains(&secs), "retry after {secs}s");

        let failed = Digest([2; 32]);
        guard.acquire(&failed).await.unwrap().finish(false).await;
        assert!(
            guard.acquire(&failed).await.is_ok(),
            "a failed request can be retried at once"
        );
    })
    .await;
}

/// A handler that panics releases its fingerprint at once (a panic is a
/// failure, as a 5xx is): the same request, sent again, runs the handler a
/// second time. The window is a minute and the retry is polled for at most
/// 5 s, so the key's own end cannot stand in for the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_releases_its_fingerprint() {
    with_stores(|store| async move {
        let runs = Arc::new(AtomicUsize::new(0));
        let panic_next = Arc::new(AtomicBool::new(true));
        let guard = FingerprintGuard::new(store).window(Duration::from_secs(60));
        let app = panicking_route(
            "/orders",
            FingerprintLayer::new(guard),
            Arc::clone(&runs),
            Arc::clone(&panic_next),
        );
        let body = r#"{"sku":"SKU-1","quantity":1}"#;
        send_and_panic(&app, order("u1", body)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // The release runs in a short task: until it is done the repeat
        // may still be told 409.
        let retry = eventually_within(Duration::from_secs(5), "the panic's release", || async {
            let a = send(&app, order("u1", body)).await;
            (a.status != StatusCode::CONFLICT).then_some(a)
        })
        .await;
        assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the repeat ran the handler");
        // Its success is held for the window, as any other.
        assert_eq!(
            send(&app, order("u1", body)).await.status,
            StatusCode::CONFLICT
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    })
    .await;
}

#[tokio::test]
async fn a_5xx_releases_the_fingerprint_so_a_retry_runs() {
    with_stores(|store| async move {
        let runs = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&runs);
        let app = Router::new().route(
            "/orders",
            post(move || {
                let r = Arc::clone(&r);
                async move {
                    if r.fetch_add(1, Ordering::SeqCst) == 0 {
                        StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        StatusCode::CREATED
                    }
                }
            })
            .layer(FingerprintLayer::new(FingerprintGuard::new(store))),
        );
        let body = r#"{"sku":"SKU-1","quantity":1}"#;
        let first = app.clone().oneshot(order("u1", body)).await.unwrap();
        assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let retry = app.clone().oneshot(order("u1", body)).await.unwrap();
        assert_eq!(retry.status(), StatusCode::CREATED);
        let again = app.oneshot(order("u1", body)).await.unwrap();
        assert_eq!(again.status(), StatusCode::CONFLICT);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    })
    .await;
}

#[tokio::test]
async fn key_order_ignored_fields_users_and_quantities() {
    with_stores(|store| async move {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = counting_route(
            FingerprintLayer::new(FingerprintGuard::new(store)),
            Arc::clone(&runs),
        );
        let send = |user: &'static str, body: &'static str| {
            let app = app.clone();
            async move { app.oneshot(order(user, body)).await.unwrap().status() }
        };
        assert_eq!(
            send(
                "u1",
                r#"{"sku":"SKU-1","quantity":1,"traceId":"a","meta":{"timestamp":1}}"#
            )
            .await,
            StatusCode::CREATED
        );
        // Same request: other key order, other ignored fields at depth.
        assert_eq!(
            send(
                "u1",
                r#"{"meta":{"timestamp":2,"sign":"s"},"quantity":1,"sku":"SKU-1","random":7}"#
            )
            .await,
            StatusCode::CONFLICT
        );
        // Another user, another quantity: different requests.
        assert_eq!(
            send("u2", r#"{"sku":"SKU-1","quantity":1,"meta":{}}"#).await,
            StatusCode::CREATED
        );
        assert_eq!(
            send("u1", r#"{"sku":"SKU-1","quantity":2,"meta":{}}"#).await,
            StatusCode::CREATED
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    })
    .await;
}

/// The status and the problem body of `answer`, which must be a problem.
fn problem(answer: Answer) -> (StatusCode, serde_json::Value) {
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    (answer.status, serde_json::from_slice(&answer.body).unwrap())
}

#[tokio::test]
async fn bad_input_gets_the_contracts_4xx() {
    let store = AnyStore::Memory(MemoryStore::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let fp = counting_route(
        FingerprintLayer::new(FingerprintGuard::new(store.clone())),
        Arc::clone(&runs),
    );
    let tokens = TokenGuard::new(store, TokenSigner::random());
    let tk = counting_route(TokenLayer::new(tokens), Arc::clone(&runs));

    let (s, p) = problem(send(&fp, order("u1", r#"{"sku":"#)).await);
    assert_eq!(
        (s.as_u16(), p["code"].as_str()),
        (400, Some("invalid_request"))
    );

    let (s, p) = problem(send(&fp, order("u1", "")).await);
    assert_eq!(
        (s.as_u16(), p["code"].as_str()),
        (400, Some("invalid_request"))
    );

    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(100 * 1024));
    let req = Request::post("/orders")
        .header("x-user-id", "u1")
        .header("content-type", "application/json")
        .body(Body::from(big))
        .unwrap();
    let (s, p) = problem(send(&fp, req).await);
    assert_eq!(
        (s.as_u16(), p["code"].as_str()),
        (413, Some("payload_too_large"))
    );

    let long_user = "u".repeat(200);
    let req = Request::post("/orders")
        .header("x-user-id", long_user)
        .body(Body::from("{}"))
        .unwrap();
    let (s, p) = problem(send(&fp, req).await);
    assert_eq!(
        (s.as_u16(), p["code"].as_str()),
        (401, Some("unauthenticated"))
    );

    let req = Request::post("/orders")
        .header(
            "x-user-id",
            axum::http::HeaderValue::from_bytes(b"\xffu\xfe").unwrap(),
        )
        .body(Body::from("{}"))
        .unwrap();
    let (s, p) = problem(send(&fp, req).await);
    assert_eq!(
        (s.as_u16(), p["code"].as_str()),
        (401, Some("unauthenticated"))
    );

    let req = Request::post("/orders")
        .header("x-user-id", "u1")
        .body(Body::from("{}"))
        .unwrap();
    let (s, p) = problem(send(&tk, req).await);
    assert_eq!(
        (s.as_u16(), p["code"].as_str()),
        (400, Some("missing_token"))
    );

    let req = post_with_token("/orders", "u1", "t".repeat(10 * 1024))
        .body(Body::from("{}"))
        .unwrap();
    let (s, p) = problem(send(&tk, req).await);
    assert_eq!(
        (s.as_u16(), p["code"].as_str()),
        (409, Some("duplicate_submission"))
    );

    let req = post_with_token(
        "/orders",
        "u1",
        axum::http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
    )
    .body(Body::from("{}"))
    .unwrap();
    let (s, _) = problem(send(&tk, req).await);
    assert_eq!(s.as_u16(), 409);

    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "no bad request reached the handler"
    );
}

#[tokio::test]
async fn a_token_is_good_for_its_user_only_and_via_the_query_too() {
    with_stores(|store| async move {
        let runs = Arc::new(AtomicUsize::new(0));
        let tokens = TokenGuard::new(store, TokenSigner::random());
        let t = tokens.issue("alice").token;
        let app = counting_route(TokenLayer::new(tokens), Arc::clone(&runs));
        let as_bob = Request::post(format!("/orders?repeatToken={t}"))
            .header("x-user-id", "bob")
            .body(Body::from("{}"))
            .unwrap();
        assert_eq!(
            app.clone().oneshot(as_bob).await.unwrap().status(),
            StatusCode::CONFLICT
        );
        let as_alice = Request::post(format!("/orders?x=1&repeatToken={t}"))
            .header("x-user-id", "alice")
            .body(Body::from("{}"))
            .unwrap();
        assert_eq!(
            app.oneshot(as_alice).await.unwrap().status(),
            StatusCode::CREATED
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test]
async fn the_body_reaches_the_handler_unchanged() {
    let store = AnyStore::Memory(MemoryStore::default());
    let app = Router::new().route(
        "/orders",
        post(|body: axum::body::Bytes| async move { body })
            .layer(FingerprintLayer::new(FingerprintGuard::new(store))),
    );
    let raw = r#"{ "b": 1,   "a": [1, 2], "traceId": "x" }"#;
    let body = send(&app, order("u1", raw)).await.body;
    assert_eq!(&body[..], raw.as_bytes());
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_keys_are_short_expire_and_are_released_by_their_owner() {
    let redis = RedisServer::start().await;
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    assert_eq!(store.kind(), "redis");
    let guard = FingerprintGuard::new(store);
    let fp = Digest([3; 32]);
    let lease = guard.acquire(&fp).await.unwrap();
    let key = guard.key_of(&fp);
    assert!(key.len() < 64);
    let mut con = redis.connection().await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= 3000, "ttl {ttl}");
    lease.finish(false).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(exists, 0);
}

/// Without a JSON content type, a body that parses as JSON is still
/// canonicalised (clients such as `curl -d` send no JSON type), and one that
/// only starts like JSON is hashed as bytes rather than refused.
#[tokio::test]
async fn bodies_without_a_json_content_type() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = counting_route(
        FingerprintLayer::new(FingerprintGuard::new(AnyStore::Memory(
            MemoryStore::default(),
        ))),
        Arc::clone(&runs),
    );
    let send = |body: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::post("/orders")
                .header("x-user-id", "u1")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap();
            app.oneshot(req).await.unwrap().status()
        }
    };
    assert_eq!(send(r#"{"b":1,"a":2}"#).await, StatusCode::CREATED);
    assert_eq!(
        send(r#" {"a":2,"b":1,"traceId":"x"}"#).await,
        StatusCode::CONFLICT
    );
    assert_eq!(send("{not json").await, StatusCode::CREATED);
    assert_eq!(send("{not json").await, StatusCode::CONFLICT);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A token past its life answers its own code, `token_expired` (409), not
/// `duplicate_submission` (before: `duplicate_submission`).
#[tokio::test]
async fn an_expired_token_answers_token_expired() {
    with_stores(|store| async move {
        let tokens = TokenGuard::new(store, TokenSigner::random()).ttl(Duration::ZERO);
        let token = tokens.issue("u1").token;
        let app: Router = Router::new().route(
            "/orders",
            post(|| async { StatusCode::CREATED }).layer(TokenLayer::new(tokens)),
        );
        let req = post_with_token("/orders", "u1", token)
            .body(Body::empty())
            .unwrap();
        let (status, body) = problem(send(&app, req).await);
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(body["code"], "token_expired");
    })
    .await;
}

/// A request whose service never reached its effect (marked
/// [`NotReached`]: a proxy's upstream was down) does not use up its token:
/// the retry with the same token runs. Any other answer, a 5xx included
/// (its effect may have happened), keeps the token used. Before: the
/// retry after a 502 got 409 "already submitted" and no order existed.
#[tokio::test]
async fn a_request_that_never_reached_its_effect_does_not_use_up_its_token() {
    use axum::response::IntoResponse;
    use norepeat::token::NotReached;
    with_stores(|store| async move {
        let tokens = TokenGuard::new(store, TokenSigner::random());
        let up = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (up, runs) = (Arc::clone(&up), Arc::clone(&runs));
            move || {
                let (up, runs) = (Arc::clone(&up), Arc::clone(&runs));
                async move {
                    if !up.load(Ordering::SeqCst) {
                        let mut res = StatusCode::BAD_GATEWAY.into_response();
                        res.extensions_mut().insert(NotReached);
                        return res;
                    }
                    runs.fetch_add(1, Ordering::SeqCst);
                    StatusCode::CREATED.into_response()
                }
            }
        };
        let app: Router = Router::new().route(
            "/orders",
            post(handler).layer(TokenLayer::new(tokens.clone())),
        );
        let req = |token: &str| {
            post_with_token("/orders", "u1", token)
                .body(Body::empty())
                .unwrap()
        };
        let token = tokens.issue("u1").token;
        assert_eq!(
            send(&app, req(&token)).await.status,
            StatusCode::BAD_GATEWAY
        );
        up.store(true, Ordering::SeqCst);
        assert_eq!(send(&app, req(&token)).await.status, StatusCode::CREATED);
        let (status, body) = problem(send(&app, req(&token)).await);
        assert_eq!(
            (status, &body["code"]),
            (StatusCode::CONFLICT, &"duplicate_submission".into())
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // A 5xx without the mark: the token stays used.
        let failing: Router = Router::new().route(
            "/orders",
            post(|| async { StatusCode::INTERNAL_SERVER_ERROR })
                .layer(TokenLayer::new(tokens.clone())),
        );
        let token = tokens.issue("u1").token;
        assert_eq!(
            send(&failing, req(&token)).await.status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let (status, _) = problem(send(&failing, req(&token)).await);
        assert_eq!(status, StatusCode::CONFLICT);
    })
    .await;
}
