//! Orders: the token route, the fingerprint route, reading.

use super::{body, user};
use crate::app::AppState;
use crate::db::CreateOutcome;
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use norepeat::guard::{FingerprintGuard, NoRepeatLayer};
use serde_json::json;
use std::time::Duration;

pub(super) fn routes(state: &AppState) -> Router<AppState> {
    let by_token = post(create);
    let by_fingerprint = post(create);
    let (by_token, by_fingerprint) = if state.cfg.defence.guard() {
        let fingerprints = FingerprintGuard::new(state.open.clone()).window(state.cfg.fp_window());
        (
            by_token.route_layer(NoRepeatLayer::token(state.tokens.clone())),
            by_fingerprint.layer(
                NoRepeatLayer::fingerprint(fingerprints)
                    .route("/orders/quick")
                    .max_body(body::MAX_BODY),
            ),
        )
    } else {
        (by_token, by_fingerprint)
    };
    Router::new()
        .route("/repeat/token", get(issue_token))
        .route("/orders", by_token.get(list))
        .route("/orders/quick", by_fingerprint)
        .route("/orders/{order_id}", get(one))
}

#[utoipa::path(
    get,
    path = "/repeat/token",
    operation_id = "issueToken",
    tag = "orders",
    description = "Issues a repeat token, good for one `POST /orders` by this user.",
    params(super::openapi::UserId),
    responses(
        (status = 200, description = "A fresh token.", body = super::openapi::RepeatTokenBody,
            headers(("Cache-Control" = String, description = "`no-store`")),
            links(("placeOrder" = (operation_id = "createOrder", parameters(
                ("header.Repeat-Token" = "$response.body#/repeatToken"),
                ("header.X-User-Id" = "$request.header.X-User-Id")
            ))))),
        (status = 401, response = super::openapi::Unauthorized),
    )
)]
async fn issue_token(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    let t = s.tokens.issue(&user);
    let body = json!({"repeatToken": t.token, "expiresIn": t.expires_in.as_secs()});
    Ok((
        [(axum::http::header::CACHE_CONTROL, "no-store")],
        Json(body),
    )
        .into_response())
}

#[utoipa::path(
    post,
    path = "/orders",
    operation_id = "createOrder",
    tag = "orders",
    description = "Places an order guarded by a repeat token (header `Repeat-Token` or query \
`repeatToken`): a used, expired, unknown or another user's token answers 409 `duplicate_submission`. \
`POST /orders/quick` is the same handler behind the fingerprint guard.",
    params(
        super::openapi::UserId,
        super::openapi::RepeatTokenHeader,
        super::openapi::RepeatTokenQuery
    ),
    request_body = super::openapi::OrderRequest,
    responses(
        (status = 201, description = "The new order.", body = crate::db::Order, links(
            ("getOrder" = (operation_id = "getOrder", parameters(("path.orderId" = "$response.body#/orderId"), ("header.X-User-Id" = "$request.header.X-User-Id")))),
            ("payOrder" = (operation_id = "createPayment", parameters(("header.X-User-Id" = "$request.header.X-User-Id")), request_body = json!({"orderId": "$response.body#/orderId"})))
        )),
        (status = 200, description = "The user's existing order with this `bizId`: nothing new was written.",
            body = crate::db::Order, headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
        (status = 409, response = super::openapi::Conflict),
        (status = 413, response = super::openapi::TooLarge),
        (status = 503, response = super::openapi::Unavailable),
    )
)]
/// `POST /orders` and `POST /orders/quick`: the same handler; the routes
/// differ only in the guard layered in front.
async fn create(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    let bytes = body::read(body).await?;
    place_order(&s, &user, &bytes).await
}

/// What an order request asks for.
pub(crate) struct OrderRequest {
    pub(crate) sku: String,
    pub(crate) quantity: i64,
    pub(crate) biz_id: Option<String>,
}

impl OrderRequest {
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let m = body::object(bytes)?;
        Ok(Self {
            sku: body::string(&m, "sku", 64)?,
            quantity: body::integer(&m, "quantity", 1..=100)?,
            biz_id: body::opt_string(&m, "bizId", 128)?,
        })
    }
}

/// Validates and writes an order; answers as the contract says.
pub(crate) async fn place_order(
    s: &AppState,
    user: &str,
    bytes: &[u8],
) -> Result<Response, ApiError> {
    let req = OrderRequest::parse(bytes)?;
    write_order(s, user, &req).await
}

pub(crate) async fn write_order(
    s: &AppState,
    user: &str,
    req: &OrderRequest,
) -> Result<Response, ApiError> {
    let outcome = if s.cfg.defence.safe_db() {
        s.db.create_order(user, &req.sku, req.quantity, req.biz_id.as_deref())
            .await?
    } else {
        s.db.create_order_naive(
            user,
            &req.sku,
            req.quantity,
            req.biz_id.as_deref(),
            Duration::from_millis(s.cfg.naive_gap_ms),
        )
        .await?
    };
    match outcome {
        CreateOutcome::Created(o) => {
            metrics::counter!("shop_orders_created_total").increment(1);
            Ok((StatusCode::CREATED, Json(o)).into_response())
        }
        CreateOutcome::Existing(o) => {
            metrics::counter!("shop_orders_replayed_total").increment(1);
            let mut res = (StatusCode::OK, Json(o)).into_response();
            res.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(res)
        }
        CreateOutcome::OutOfStock => Err(ApiError::OutOfStock),
        CreateOutcome::UnknownSku => Err(ApiError::NotFound(format!("No product {}.", req.sku))),
    }
}

#[utoipa::path(
    get,
    path = "/orders",
    operation_id = "listOrders",
    tag = "orders",
    params(super::openapi::UserId),
    responses(
        (status = 200, description = "The caller's orders.", body = super::openapi::OrderList),
        (status = 401, response = super::openapi::Unauthorized),
    )
)]
async fn list(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    let orders = s.db.orders_of(&user).await?;
    Ok(Json(json!({ "orders": orders })).into_response())
}

#[utoipa::path(
    get,
    path = "/orders/{orderId}",
    operation_id = "getOrder",
    tag = "orders",
    description = "One of the caller's orders; another user's answers 404.",
    params(super::openapi::UserId, super::openapi::OrderIdPath),
    responses(
        (status = 200, description = "The order.", body = crate::db::Order),
        (status = 400, response = super::openapi::BadRequest),
        (status = 401, response = super::openapi::Unauthorized),
        (status = 404, response = super::openapi::NotFound),
    )
)]
async fn one(State(s): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match s.db.order(&id).await? {
        Some(o) => Ok(Json(o).into_response()),
        None => Err(ApiError::NotFound(format!("No order {id}."))),
    }
}
