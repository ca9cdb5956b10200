//! Idempotency-Key records kept in PostgreSQL, next to the effect, and
//! committed with it: the payment row and the completed record are one
//! `COMMIT`, so a crash leaves either neither (a retry runs once) or both
//! (a retry gets the replay), never a payment with its key free.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example sql_store --features postgres
//! ```

use axum::body::{Body, to_bytes};
use axum::extract::{Extension, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use norepeat::idempotency::{IdempotencyLayer, IdempotentTx, TxError};
use norepeat::store::PgStore;
use sqlx::PgPool;
use tower::ServiceExt;

#[derive(serde::Deserialize)]
struct PayRequest {
    #[serde(rename = "orderId")]
    order_id: String,
    amount: i64,
}

/// The effect and the completed record, in one transaction.
async fn pay(
    State(pool): State<PgPool>,
    Extension(idem): Extension<IdempotentTx<PgStore>>, // put there by the layer once it claimed the key
    Json(req): Json<PayRequest>,
) -> Response {
    let Ok(mut tx) = pool.begin().await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let id: Result<i64, _> = sqlx::query_scalar(
        "INSERT INTO example_payments (order_id, amount) VALUES ($1, $2) RETURNING id",
    )
    .bind(&req.order_id)
    .bind(req.amount)
    .fetch_one(&mut *tx)
    .await;
    let Ok(id) = id else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response(); // dropped: rolled back
    };
    let res = (
        StatusCode::CREATED,
        format!(r#"{{"paymentId":{id},"amount":{}}}"#, req.amount),
    );
    match idem.commit(tx, res.into_response()).await {
        Ok(res) => res.into_response(),
        // Our claim expired and another request took the key: rolled back.
        Err(TxError::Lost) => StatusCode::CONFLICT.into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = PgPool::connect(&url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS example_payments \
         (id BIGSERIAL PRIMARY KEY, order_id TEXT NOT NULL, amount BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let store = PgStore::new(pool.clone());
    store.migrate().await?; // the records' table
    let _reaper = store.spawn_reaper(std::time::Duration::from_secs(60)); // expired rows go

    let app = Router::new()
        .route(
            "/payments",
            post(pay).layer(IdempotencyLayer::new(store).route("/payments")),
        )
        .with_state(pool.clone());

    // A key of this run's own, so the example can run again on one database.
    let key = format!("pay-{}", std::process::id());
    let order = format!("order-{key}");
    let request = || {
        Request::post("/payments")
            .header("x-user-id", "u1")
            .header("idempotency-key", key.as_str())
            .header("content-type", "application/json")
            .body(Body::from(format!(
                r#"{{"orderId":"{order}","amount":1999}}"#
            )))
            .expect("a valid request")
    };
    let first = app.clone().oneshot(request()).await?;
    let status = first.status();
    let first_body = to_bytes(first.into_body(), 64 * 1024).await?;
    println!("first: {status} {}", String::from_utf8_lossy(&first_body));
    assert_eq!(status, StatusCode::CREATED);

    let retry = app.oneshot(request()).await?;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let retry_body = to_bytes(retry.into_body(), 64 * 1024).await?;
    println!("retry: replayed {}", String::from_utf8_lossy(&retry_body));
    assert_eq!(retry_body, first_body);

    let payments: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM example_payments WHERE order_id = $1")
            .bind(&order)
            .fetch_one(&pool)
            .await?;
    println!("payments for {order}: {payments}");
    assert_eq!(payments, 1);
    Ok(())
}
