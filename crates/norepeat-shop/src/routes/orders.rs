//! Orders: the token route, the fingerprint route, reading.

use super::body::{self, Segment};
use super::user;
use crate::app::AppState;
use crate::db::{CreateOutcome, WindowOutcome};
use crate::domain::ORDER_QUANTITIES;
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use norepeat::fingerprint::{
    Digest, FingerprintGuard, FingerprintGuardError, FingerprintLayer, Fingerprinter, RequestParts,
};
use norepeat::problem::Problem;
use norepeat::token::{TokenGuardError, TokenLayer};
use serde_json::json;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

/// How `POST /orders/quick` tells submissions apart, at the door and in the
/// database. The handler reads no query parameter: `?a=1` is the same
/// submission (the contract's fingerprint is user, method, route and body).
static QUICK: LazyLock<Fingerprinter> = LazyLock::new(|| Fingerprinter::default().ignore_query());

pub(super) fn routes(state: &AppState) -> Router<AppState> {
    let by_token = post(create_with_token);
    let by_fingerprint = post(create);
    let (by_token, by_fingerprint) = if state.cfg.defence.guard() {
        let fingerprints = FingerprintGuard::new(state.open.clone())
            .window(state.cfg.fp_window())
            .fingerprinter(QUICK.clone());
        (
            by_token.route_layer(TokenLayer::new(state.tokens.clone()).missing_token_detail(
                "Send the token from GET /repeat/token in the Repeat-Token header or the repeatToken query parameter.",
            )),
            by_fingerprint.layer(
                FingerprintLayer::new(fingerprints)
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
    params(super::openapi::params::UserId),
    responses(
        (status = 200, description = "A fresh token.", body = super::openapi::schemas::RepeatTokenBody,
            headers(("Cache-Control" = String, description = "`no-store`")),
            links(("placeOrder" = (operation_id = "createOrder", parameters(
                ("header.Repeat-Token" = "$response.body#/repeatToken"),
                ("header.X-User-Id" = "$request.header.X-User-Id")
            ))))),
        (status = 401, response = super::openapi::responses::Unauthorized),
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

/// `POST /orders/quick`: the order as asked, its `bizId` (if any) the key.
/// Without one, the database holds the submission's fingerprint for the
/// window, behind the entry guard: a repeat that got past the door (the
/// store down or slow, another instance) still makes no second order.
async fn create(
    State(s): State<AppState>,
    admitted: Option<Extension<Digest>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    let user = user(&headers)?;
    let bytes = body::read(body, &headers).await?;
    let mut req = OrderRequest::parse(&bytes)?;
    if req.biz_id.is_none() && s.cfg.defence.safe_db() {
        // The fingerprint the door admitted the request under; computed
        // here only when there is no door (the `db` defence).
        let fp = match admitted {
            Some(Extension(fp)) => fp,
            None => {
                let parts = RequestParts {
                    user: &user,
                    method: "POST",
                    route: "/orders/quick",
                    query: None,
                    json: true,
                    body: &bytes,
                };
                // Parsed above: the body is JSON.
                QUICK
                    .fingerprint(&parts)
                    .map_err(|e| ApiError::Invalid(e.to_string()))?
            }
        };
        req.window = Some((fp.0, arrived));
    }
    write_order(&s, &user, &req).await
}

#[utoipa::path(
    post,
    path = "/orders",
    operation_id = "createOrder",
    tag = "orders",
    description = "Places an order guarded by a repeat token (header `Repeat-Token` or query \
`repeatToken`): a used, unknown or another user's token answers 409 `duplicate_submission`, an expired one 409 `token_expired`. \
Without a `bizId`, the order's business key is derived from the token, so a replayed token makes one order even with the store down.",
    params(
        super::openapi::params::UserId,
        super::openapi::params::RepeatTokenHeader,
        super::openapi::params::RepeatTokenQuery
    ),
    request_body = super::openapi::schemas::OrderRequest,
    responses(
        (status = 201, description = "The new order.", body = crate::domain::Order, links(
            ("getOrder" = (operation_id = "getOrder", parameters(("path.orderId" = "$response.body#/orderId"), ("header.X-User-Id" = "$request.header.X-User-Id")))),
            ("payOrder" = (operation_id = "createPayment", parameters(("header.X-User-Id" = "$request.header.X-User-Id")), request_body = json!({"orderId": "$response.body#/orderId"})))
        )),
        (status = 200, description = "The user's existing order with this `bizId`: nothing new was written.",
            body = crate::domain::Order, headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
        (status = 409, response = super::openapi::responses::Conflict),
        (status = 413, response = super::openapi::responses::TooLarge),
        (status = 503, response = super::openapi::responses::Unavailable),
    )
)]
/// `POST /orders`: like [`create`], but an order without a `bizId` takes
/// its business key from the repeat token, so the database makes the
/// token's order single even when the door let a replay through (the store
/// down, two instances).
async fn create_with_token(
    State(s): State<AppState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    let bytes = body::read(body, &headers).await?;
    let mut req = OrderRequest::parse(&bytes)?;
    if req.biz_id.is_none() {
        req.biz_id = token_biz_id(&s, &user, &headers, &uri)?;
        req.keyed_by_token = req.biz_id.is_some();
    }
    write_order(&s, &user, &req).await
}

/// The business key of the request's repeat token: `rt_` and the hex of its
/// nonce (96 random bits, fixed when the token was issued, the same on every
/// instance). The token is checked again here, so the key only ever comes
/// from a token this shop issued to this user. With the entry guard on, a
/// token it admitted that no longer checks out (it expired in between) is a
/// duplicate submission; with the guard off (the storm's baselines), a
/// missing or bad token just means no key.
fn token_biz_id(
    s: &AppState,
    user: &str,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Option<String>, ApiError> {
    let token = match headers.get("repeat-token") {
        Some(v) => v.to_str().ok(),
        None => uri.query().and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("repeatToken="))
        }),
    };
    let verified = token.map(|t| s.signer.verify(user, t));
    match verified {
        Some(Ok(v)) => Ok(Some(format!("rt_{}", hex(&v.nonce)))),
        // The guard's own answer for this token (expired, or unknown).
        Some(Err(e)) if s.cfg.defence.guard() => {
            Err(ApiError::Problem(Problem::from(TokenGuardError::from(e))))
        }
        _ => Ok(None),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What an order request asks for.
pub(crate) struct OrderRequest {
    pub(crate) sku: String,
    pub(crate) quantity: i64,
    pub(crate) biz_id: Option<String>,
    /// `biz_id` was derived from the repeat token: an existing order is a
    /// replayed token (409), not a client's retry with its own key (200).
    pub(crate) keyed_by_token: bool,
    /// Without a `biz_id`: the submission's fingerprint and the request's
    /// arrival, from which the database holds it for the fingerprint window.
    pub(crate) window: Option<([u8; 32], SystemTime)>,
}

impl OrderRequest {
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let m = body::object(bytes)?;
        Ok(Self {
            sku: body::string(&m, "sku", 64)?,
            quantity: body::integer(&m, "quantity", ORDER_QUANTITIES)?,
            biz_id: body::opt_string(&m, "bizId", 128)?,
            keyed_by_token: false,
            window: None,
        })
    }
}

/// Writes an order; answers as the contract says.
pub(crate) async fn write_order(
    s: &AppState,
    user: &str,
    req: &OrderRequest,
) -> Result<Response, ApiError> {
    let outcome = if !s.cfg.defence.safe_db() {
        s.db.create_order_naive(
            user,
            &req.sku,
            req.quantity,
            req.biz_id.as_deref(),
            Duration::from_millis(s.cfg.naive_gap_ms),
        )
        .await?
    } else if let (None, Some((fp, since))) = (&req.biz_id, &req.window) {
        let windowed = s.db.create_order_in_window(
            user,
            &req.sku,
            req.quantity,
            fp,
            *since,
            s.cfg.fp_window(),
        );
        match windowed.await? {
            WindowOutcome::Order(outcome) => outcome,
            WindowOutcome::Repeated { retry_after } => {
                metrics::counter!("shop_orders_repeated_total").increment(1);
                let e = FingerprintGuardError::Duplicate { retry_after };
                return Err(ApiError::Problem(Problem::from(e)));
            }
        }
    } else {
        s.db.create_order(user, &req.sku, req.quantity, req.biz_id.as_deref())
            .await?
    };
    match outcome {
        CreateOutcome::Created(o) => {
            metrics::counter!("shop_orders_created_total").increment(1);
            Ok((StatusCode::CREATED, Json(o)).into_response())
        }
        CreateOutcome::Existing(_) if req.keyed_by_token => {
            metrics::counter!("shop_orders_replayed_total").increment(1);
            Err(ApiError::Problem(Problem::from(TokenGuardError::Used)))
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
    params(super::openapi::params::UserId),
    responses(
        (status = 200, description = "The caller's orders.", body = super::openapi::schemas::OrderList),
        (status = 401, response = super::openapi::responses::Unauthorized),
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
    params(super::openapi::params::UserId, super::openapi::params::OrderIdPath),
    responses(
        (status = 200, description = "The order.", body = crate::domain::Order),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
    )
)]
/// `GET /orders/{orderId}`: the caller's own order only; another user's is
/// answered exactly as an unknown one, so ids cannot be probed.
async fn one(
    State(s): State<AppState>,
    headers: HeaderMap,
    Segment(id): Segment,
) -> Result<Response, ApiError> {
    let user = user(&headers)?;
    match s.db.order(&id).await? {
        Some(o) if o.user_id == user => Ok(Json(o).into_response()),
        _ => Err(ApiError::NotFound(format!("No order {id}."))),
    }
}
