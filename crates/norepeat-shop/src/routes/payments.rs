//! Payments (Idempotency-Key), the provider's callback, the flash sale.

use super::body::{self, Segment};
use super::user;
use crate::app::AppState;
use crate::db::{NoticeOutcome, PaymentOutcome};
use crate::domain::{ORDER_QUANTITIES, PAYMENT_AMOUNTS};
use crate::error::ApiError;
use crate::payments_store::{DatabaseRecords, PaymentsRoute};
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::extract::{Extension, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use axum::{Json, Router};
use norepeat::degrade::FailurePolicy;
use norepeat::idempotency::{Abandoned, IdempotencyError, IdempotencyLayer, IdempotentTx, TxError};
use norepeat::problem::{Code, Problem};
use norepeat::ratelimit::{ByClientIp, ByUser, ExtractKey, PeerAddr, RateLimitLayer, RateLimiter};
use norepeat::store::KeyValueStore;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

pub(super) fn routes(state: &AppState) -> Router<AppState> {
    let pay = state.payments.build(&state.primary, CreatePayment(state));
    // Outside the Idempotency-Key layer, so a request over the rate is
    // refused before it claims a key (and before it stores anything): per
    // user, and per client address at ten times that.
    let pay = pay
        .layer(
            RateLimitLayer::new(
                RateLimiter::new(state.open.clone(), state.payment_quota()).name("payments"),
                ByUser::default(),
            )
            .and(
                RateLimiter::new(state.open.clone(), state.payment_address_quota())
                    .name("payments-address"),
                by_address,
            ),
        )
        .layer(axum::middleware::map_request(peer_addr));
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

/// `POST /payments` behind its Idempotency-Key layer, on whichever store
/// `NOREPEAT_IDEMPOTENCY_STORE` names.
///
/// Payments fail closed: without the store the shop cannot be sure a
/// retry is not a second payment, so it refuses (503) instead. With
/// `NOREPEAT_IDEMPOTENCY_STORE=database` the record is a row of the shop's
/// database, completed in the payment's own transaction. Its detached
/// handlers are waited for at shutdown (`serve`).
struct CreatePayment<'a>(&'a AppState);

impl CreatePayment<'_> {
    fn layer<G: KeyValueStore + Clone>(&self, store: G) -> IdempotencyLayer<G> {
        // The database is the last line: a payment commits in the shop's
        // database (with its record, on the database store), and an order
        // has at most one live payment. So a claim whose instance died
        // mid-payment is taken over by the retry: it either finds nothing
        // committed and pays once, or meets the payment that was
        // (409 `order_not_payable`, naming it).
        IdempotencyLayer::new(store)
            .abandoned(Abandoned::Retry)
            .route("/payments")
            .max_body(self.0.cfg.max_stored_response)
            .on_store_failure(FailurePolicy::FailClosed)
            .detached_tasks_in(&self.0.detached)
    }
}

impl PaymentsRoute for CreatePayment<'_> {
    type Output = MethodRouter<AppState>;

    fn key_value<G: KeyValueStore + Clone>(self, store: G) -> Self::Output {
        post(create_payment).layer(self.layer(store))
    }

    fn in_database<G: DatabaseRecords>(self, store: G) -> Self::Output {
        post(create_payment_in_tx::<G>).layer(self.layer(store))
    }
}

/// The client's address as [`ByClientIp`] keys it. A request that came
/// through no socket (a test driving the router in process) has none: those
/// share one bucket.
fn by_address(parts: &Parts) -> Option<String> {
    Some(
        ByClientIp::new()
            .extract_key(parts)
            .unwrap_or_else(|| "no-peer".to_owned()),
    )
}

/// Hands the connection's peer (axum's `ConnectInfo`, set by `serve`) to
/// the rate limiter as [`PeerAddr`].
async fn peer_addr(mut req: axum::extract::Request) -> axum::extract::Request {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| *addr);
    if let Some(addr) = peer {
        req.extensions_mut().insert(PeerAddr(addr));
    }
    req
}

#[utoipa::path(
    post,
    path = "/payments",
    operation_id = "createPayment",
    tag = "payments",
    description = "Pays for one of the caller's orders. The same `Idempotency-Key` (per user) and body \
again replay the stored answer byte for byte with `Idempotent-Replayed: true`; another body answers 422; \
while the first is running, 409 `idempotency_key_in_use`. Fails closed: 503 with the store down. \
At most one live payment per order: otherwise 409 `order_not_payable` naming it in `paymentId`. \
Rate limited per user (`NOREPEAT_PAYMENT_RATE`, default 20/s) and per client address (10 times that) \
before the key is claimed: 429 `rate_limited`.",
    params(super::openapi::params::UserId, super::openapi::params::IdempotencyKey),
    request_body = super::openapi::schemas::PaymentRequest,
    responses(
        (status = 201, description = "The new payment, `PENDING` (or its replay).", body = crate::domain::Payment,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replay")),
            links(
                ("notify" = (operation_id = "paymentCallback", request_body = json!({"paymentId": "$response.body#/paymentId"}))),
                ("getOrder" = (operation_id = "getOrder", parameters(("path.orderId" = "$response.body#/orderId"), ("header.X-User-Id" = "$request.header.X-User-Id"))))
            )),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
        (status = 409, response = super::openapi::responses::Conflict),
        (status = 413, response = super::openapi::responses::TooLarge),
        (status = 422, response = super::openapi::responses::KeyMismatch),
        (status = 429, response = super::openapi::responses::RateLimited),
        (status = 503, response = super::openapi::responses::Unavailable),
    )
)]
async fn create_payment(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (user, order_id, amount) = payment_request(&headers, body).await?;
    if s.cfg.payment_latency_ms > 0 {
        // The fake provider's round trip.
        tokio::time::sleep(Duration::from_millis(s.cfg.payment_latency_ms)).await;
    }
    match s.db.create_payment(&user, &order_id, amount).await? {
        PaymentOutcome::Created(p) => Ok((StatusCode::CREATED, Json(p)).into_response()),
        refused => Err(refusal(&order_id, refused)),
    }
}

/// The caller, and the order and amount of `POST /payments`'s body.
async fn payment_request(
    headers: &HeaderMap,
    body: Body,
) -> Result<(String, String, i64), ApiError> {
    let user = user(headers)?;
    let m = body::object(&body::read(body, headers).await?)?;
    let order_id = body::string(&m, "orderId", 128)?;
    let amount = body::integer(&m, "amount", PAYMENT_AMOUNTS)?;
    Ok((user, order_id, amount))
}

/// Why a payment was not created, as the answer.
fn refusal(order_id: &str, outcome: PaymentOutcome) -> ApiError {
    match outcome {
        PaymentOutcome::NotPayable {
            order_status,
            live_payment,
        } => ApiError::NotPayable {
            detail: match &live_payment {
                Some(p) => format!("Order {order_id} already has payment {p}."),
                None => format!("Order {order_id} is {order_status}, not UNPAID."),
            },
            payment_id: live_payment,
        },
        _ => ApiError::NotFound(format!("No order {order_id}.")),
    }
}

/// `POST /payments` on the database store: the payment row and the
/// completed idempotency record commit in one transaction. A crash before
/// the commit leaves neither (the claim's lease then frees the key, and a
/// retry pays once); after it, both.
async fn create_payment_in_tx<G: DatabaseRecords>(
    State(s): State<AppState>,
    idem: Option<Extension<IdempotentTx<G>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (user, order_id, amount) = payment_request(&headers, body).await?;
    let (tx, outcome) = s.db.begin_payment(&user, &order_id, amount).await?;
    let payment = match outcome {
        PaymentOutcome::Created(p) => p,
        // `tx` is dropped: rolled back, nothing was written.
        refused => return Err(refusal(&order_id, refused)),
    };
    if s.cfg.payment_latency_ms > 0 {
        // The fake provider's round trip, with the payment written and not
        // yet committed (a crash here leaves no payment).
        tokio::time::sleep(Duration::from_millis(s.cfg.payment_latency_ms)).await;
    }
    let res = (StatusCode::CREATED, Json(payment)).into_response();
    let committed = match idem {
        Some(Extension(idem)) => G::commit(&idem, tx, res).await,
        None => None,
    };
    let Some(committed) = committed else {
        tracing::error!("payments on the database store without its idempotency claim");
        return Err(unavailable());
    };
    match committed {
        Ok(res) => Ok(res.into_response()),
        // The lease ran out and another request took the key: this payment
        // was rolled back; the retry gets that request's answer.
        Err(TxError::Lost) => Err(ApiError::Problem(Problem::from(IdempotencyError::InUse))),
        Err(e) => {
            tracing::warn!(error = %e, "payment not committed");
            Err(unavailable())
        }
    }
}

/// 503 `guard_unavailable`: the database failed around the commit.
fn unavailable() -> ApiError {
    ApiError::Problem(
        Problem::new(Code::GuardUnavailable)
            .detail("The payment could not be recorded; retry with the same Idempotency-Key.")
            .retry_after_secs(1),
    )
}

#[utoipa::path(
    post,
    path = "/payments/callback",
    operation_id = "paymentCallback",
    tag = "payments",
    description = "The payment provider's notice; may arrive many times, in any order. \
With `NOREPEAT_CALLBACK_SECRET` set it must carry a valid `Norepeat-Signature`.",
    params(super::openapi::params::Signature),
    request_body = super::openapi::schemas::PaymentNotice,
    responses(
        (status = 200, description = "`applied` the first time it changes state, `already_applied` after.",
            body = super::openapi::schemas::NoticeResult),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
        (status = 409, response = super::openapi::responses::Conflict),
        (status = 413, response = super::openapi::responses::TooLarge),
    )
)]
pub(super) async fn callback(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = body::read(body, &headers).await?;
    // The provider's signature, over the raw bytes, before anything else.
    if let Some(verifier) = s.cfg.callback_verifier() {
        verifier
            .verify_headers(&headers, &bytes)
            .map_err(norepeat::problem::Problem::from)?;
    }
    let m = body::object(&bytes)?;
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

#[utoipa::path(
    post,
    path = "/flash-sale/{sku}",
    operation_id = "flashSale",
    tag = "shop",
    description = "Orders under a per-user rate (`NOREPEAT_FLASH_RATE`), counted across instances.",
    params(super::openapi::params::UserId, super::openapi::params::SkuPath),
    request_body = super::openapi::schemas::FlashSaleRequest,
    responses(
        (status = 201, description = "The new order.", body = crate::domain::Order,
            headers(
                ("RateLimit" = String, description = "`\"flash\";r=REMAINING;t=SECONDS`"),
                ("RateLimit-Policy" = String, description = "`\"flash\";q=QUOTA;w=WINDOW`"),
            ),
            links(
            ("getOrder" = (operation_id = "getOrder", parameters(("path.orderId" = "$response.body#/orderId"), ("header.X-User-Id" = "$request.header.X-User-Id")))),
            ("payOrder" = (operation_id = "createPayment", parameters(("header.X-User-Id" = "$request.header.X-User-Id")), request_body = json!({"orderId": "$response.body#/orderId"})))
        )),
        (status = 200, description = "The user's existing order with this `bizId`.", body = crate::domain::Order,
            headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
        (status = 409, response = super::openapi::responses::Conflict),
        (status = 413, response = super::openapi::responses::TooLarge),
        (status = 429, response = super::openapi::responses::RateLimited),
        (status = 503, response = super::openapi::responses::Unavailable),
    )
)]
async fn flash_sale(
    State(s): State<AppState>,
    Segment(sku): Segment,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    let m = body::object(&body::read(body, &headers).await?)?;
    let req = super::orders::OrderRequest {
        sku,
        quantity: body::integer(&m, "quantity", ORDER_QUANTITIES)?,
        biz_id: body::opt_string(&m, "bizId", 128)?,
        keyed_by_token: false,
        window: None,
    };
    body::check_sku(&req.sku)?;
    super::orders::write_order(&s, &user, &req).await
}
