//! Payments (Idempotency-Key), the provider's callback, the flash sale.

use super::{body, user};
use crate::app::AppState;
use crate::db::{MAX_PAYMENT_AMOUNT, NoticeOutcome, PaymentOutcome};
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use norepeat::degrade::FailurePolicy;
use norepeat::idempotency::IdempotencyLayer;
use norepeat::ratelimit::{ByUser, RateLimitLayer, RateLimiter};
use serde_json::json;
use std::time::Duration;

pub(super) fn routes(state: &AppState) -> Router<AppState> {
    // Payments fail closed: without the store the shop cannot be sure a
    // retry is not a second payment, so it refuses (503) instead.
    let pay = post(create_payment).layer(
        IdempotencyLayer::new(state.primary.clone())
            .route("/payments")
            .on_store_failure(FailurePolicy::FailClosed),
    );
    let quota = state.flash_quota();
    let flash = post(flash_sale).layer(
        RateLimitLayer::new(
            RateLimiter::new(state.open.clone(), quota).name("flash"),
            ByUser::default(),
        )
        .headers_on_allowed(true),
    );
    Router::new()
        .route("/payments", pay)
        .route("/payments/callback", post(callback))
        .route("/flash-sale/{sku}", flash)
}

async fn create_payment(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    let m = body::object(&body::read(body).await?)?;
    let order_id = body::string(&m, "orderId", 128)?;
    let amount = body::integer(&m, "amount", 1..=MAX_PAYMENT_AMOUNT)?;
    if s.cfg.payment_latency_ms > 0 {
        // The fake provider's round trip.
        tokio::time::sleep(Duration::from_millis(s.cfg.payment_latency_ms)).await;
    }
    match s.db.create_payment(&user, &order_id, amount).await? {
        PaymentOutcome::Created(p) => Ok((StatusCode::CREATED, Json(p)).into_response()),
        PaymentOutcome::OrderNotFound => Err(ApiError::NotFound(format!("No order {order_id}."))),
        PaymentOutcome::NotPayable {
            order_status,
            live_payment,
        } => Err(ApiError::NotPayable {
            detail: match &live_payment {
                Some(p) => format!("Order {order_id} already has payment {p}."),
                None => format!("Order {order_id} is {order_status}, not UNPAID."),
            },
            payment_id: live_payment,
        }),
    }
}

async fn callback(State(s): State<AppState>, body: Body) -> Result<Response, ApiError> {
    let m = body::object(&body::read(body).await?)?;
    let payment_id = body::string(&m, "paymentId", 128)?;
    let success = match body::string(&m, "status", 16)?.as_str() {
        "SUCCESS" => true,
        "FAILED" => false,
        other => {
            return Err(ApiError::Invalid(format!(
                "`status` must be SUCCESS or FAILED, not {other}."
            )));
        }
    };
    match s.db.apply_payment_notice(&payment_id, success).await? {
        NoticeOutcome::Applied => {
            if success {
                crate::events::kick(&s.events);
            }
            Ok(Json(json!({"result": "applied"})).into_response())
        }
        NoticeOutcome::AlreadyApplied => {
            Ok(Json(json!({"result": "already_applied"})).into_response())
        }
        NoticeOutcome::InvalidTransition => Err(ApiError::InvalidTransition(
            "The payment is already in the other final state.".into(),
        )),
        NoticeOutcome::NotLive => Err(ApiError::InvalidTransition(
            "The payment is not its order's live payment; it cannot succeed.".into(),
        )),
        NoticeOutcome::NotFound => Err(ApiError::NotFound(format!("No payment {payment_id}."))),
    }
}

async fn flash_sale(
    State(s): State<AppState>,
    Path(sku): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    let m = body::object(&body::read(body).await?)?;
    let req = super::orders::OrderRequest {
        sku,
        quantity: body::integer(&m, "quantity", 1..=100)?,
        biz_id: body::opt_string(&m, "bizId", 128)?,
        keyed_by_token: false,
    };
    if req.sku.is_empty() || req.sku.chars().count() > 64 {
        return Err(ApiError::Invalid(
            "The sku must be 1 to 64 characters.".into(),
        ));
    }
    super::orders::write_order(&s, &user, &req).await
}
