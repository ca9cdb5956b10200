//! A payment route behind `IdempotencyLayer`, and a client that retries with
//! the same `Idempotency-Key`: the payment is made once, and every retry
//! gets the first answer back, byte for byte.
//!
//! ```sh
//! cargo run --example idempotency_replay
//! ```
//!
//! The store here is memory (one process). Across instances, use
//! `RedisStore` or keep the records in your database (`sql_store`).

use axum::Router;
use axum::body::{Body, Bytes, to_bytes};
use axum::http::{Request, Response, StatusCode};
use axum::routing::post;
use norepeat::idempotency::IdempotencyLayer;
use norepeat::store::MemoryStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;
use tower::ServiceExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let payments = Arc::new(AtomicU64::new(0)); // the effect: payments made
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());

    let handler = {
        let (payments, started, finish) = (payments.clone(), started.clone(), finish.clone());
        move |body: Bytes| async move {
            started.notify_one();
            finish.notified().await; // a slow payment provider
            let n = payments.fetch_add(1, Ordering::SeqCst) + 1;
            let amount = String::from_utf8_lossy(&body).into_owned();
            (
                StatusCode::CREATED,
                format!(r#"{{"paymentId":"p-{n}","amount":{amount}}}"#),
            )
        }
    };
    let app = Router::new().route(
        "/payments",
        post(handler).layer(IdempotencyLayer::new(MemoryStore::default()).route("/payments")),
    );
    let pay = |key: &str, amount: &str| {
        Request::post("/payments")
            .header("x-user-id", "u1")
            .header("idempotency-key", key)
            .body(Body::from(amount.to_owned()))
            .expect("a valid request")
    };

    // 1. The first try; the client times out while the provider is slow...
    let first = tokio::spawn(app.clone().oneshot(pay("key-1", "1999")));
    started.notified().await;
    // 2. ...and retries at once with the same key: the first is still running.
    let early = app.clone().oneshot(pay("key-1", "1999")).await?;
    println!(
        "retry while the first runs: {} (Retry-After: {})",
        early.status(),
        early.headers()["retry-after"].to_str()?
    );
    assert_eq!(early.status(), StatusCode::CONFLICT);

    finish.notify_one();
    let (status, first_body) = read(first.await??).await?;
    println!("first answer: {status} {first_body}");

    // 3. A later retry gets the stored answer; the handler does not run.
    let retry = app.clone().oneshot(pay("key-1", "1999")).await?;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let (status, body) = read(retry).await?;
    println!("retry after it finished: {status} {body} (replayed)");
    assert_eq!(body, first_body);

    // 4. The same key with another request is a client bug: 422.
    let other = app.clone().oneshot(pay("key-1", "5")).await?;
    println!("same key, other amount: {}", other.status());
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);

    println!("payments made: {}", payments.load(Ordering::SeqCst));
    assert_eq!(payments.load(Ordering::SeqCst), 1);
    Ok(())
}

async fn read(res: Response<Body>) -> Result<(StatusCode, String), Box<dyn std::error::Error>> {
    let status = res.status();
    let body = to_bytes(res.into_body(), 64 * 1024).await?;
    Ok((status, String::from_utf8(body.to_vec())?))
}
