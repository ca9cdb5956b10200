//! The README's quickstart: a guarded function and an axum route guarded by
//! request fingerprints, on Redis.
//!
//! ```sh
//! cargo run --example axum_fingerprint                  # runs the requests below and exits
//! cargo run --example axum_fingerprint -- --serve       # then serves on 127.0.0.1:3000
//! curl -i -X POST localhost:3000/orders -H 'x-user-id: u1' -d '{"sku":"SKU-1"}'   # twice: 200, then 409
//! ```
//!
//! `REDIS_URL` names the Redis to use (default `redis://127.0.0.1:6379`).

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use norepeat::attribute::Rejected;
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::store::RedisStore;
use std::time::Duration;
use tower::ServiceExt;

/// Runs once per order: a repeat (a redelivered message) gets the first
/// result back without running the body. No `store = ...`: it uses the
/// process-wide store set in `main`.
#[norepeat::guard(key = "{order_id}", mode = once, wait = "2s")]
async fn award_points(order_id: u64, points: i64) -> Result<i64, Rejected> {
    // The effect: in a real service an INSERT with a unique key on order_id.
    Ok(points)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let store = RedisStore::connect(&url).await?;
    // Once, at start: every guarded function without `store = ...` uses it.
    norepeat::attribute::set_default_store(store.clone())?;

    // A fresh order id per run, so a second run is not a repeat of the first.
    let order_id = rand_u64();
    assert_eq!(award_points(order_id, 30).await?, 30);
    assert_eq!(award_points(order_id, 99).await?, 30); // the stored result
    println!("award_points: 30 points once; the repeat got the stored 30 back");

    // The route: the same caller, method, path and body within 3 s is a repeat.
    let guard = FingerprintGuard::new(store).window(Duration::from_secs(3));
    let app = Router::new().route(
        "/orders",
        post(|| async { "created" }).layer(FingerprintLayer::new(guard).route("/orders")),
    );

    let body = format!(r#"{{"sku":"SKU-1","quantity":1,"nonce":{order_id}}}"#);
    // Key order and per-request fields (`traceId`, `timestamp`) do not make
    // another request: the repeat below is caught.
    let repeat = format!(r#"{{"quantity":1,"traceId":"t-2","nonce":{order_id},"sku":"SKU-1"}}"#);
    let order = |body: String| {
        Request::post("/orders")
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("a valid request")
    };
    let first = app.clone().oneshot(order(body)).await?;
    println!("first submit: {}", first.status());
    assert_eq!(first.status(), StatusCode::OK);

    let second = app.clone().oneshot(order(repeat)).await?;
    println!(
        "double click: {} {} (Retry-After: {})",
        second.status(),
        second.headers()["content-type"].to_str()?,
        second.headers()["retry-after"].to_str()?,
    );
    assert_eq!(second.status(), StatusCode::CONFLICT);
    let problem = axum::body::to_bytes(second.into_body(), 64 * 1024).await?;
    let problem: serde_json::Value = serde_json::from_slice(&problem)?;
    assert_eq!(problem["code"], "duplicate_submission");

    if std::env::args().any(|a| a == "--serve") {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
        println!("serving on http://127.0.0.1:3000 (Ctrl-C to stop)");
        axum::serve(listener, app).await?;
    }
    Ok(())
}

/// A number that differs from run to run (no `rand` needed for an example).
fn rand_u64() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
