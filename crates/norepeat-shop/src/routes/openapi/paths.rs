//! The operations documented here rather than above a handler:
//! `GET /openapi.json` itself, `GET /` (a closure in `page.rs`) and
//! `POST /orders/quick` (the handler of `POST /orders` behind another guard).

use super::params::UserId;
use super::responses::{BadRequest, Conflict, NotFound, TooLarge, Unauthorized, Unavailable};
use super::schemas::OrderRequest;

/// `GET /` is served by a closure in `page.rs`: this only documents it.
#[utoipa::path(
    get,
    path = "/",
    operation_id = "webPage",
    tag = "system",
    responses((status = 200, description = "The shop's web page.", body = String, content_type = "text/html; charset=utf-8"))
)]
#[allow(dead_code)]
fn index() {}

/// `POST /orders/quick` shares its handler with `POST /orders` (only the
/// guard in front differs), and a handler carries one path: this documents
/// the second route.
#[utoipa::path(
    post,
    path = "/orders/quick",
    operation_id = "createOrderQuick",
    tag = "orders",
    description = "Places an order guarded by the request fingerprint (user + method + route + body, \
JSON keys in any order, `traceId`, `timestamp`, `random` and `sign` not counted): the same fingerprint \
again inside its window answers 409 `duplicate_submission` with `Retry-After`. Without a `bizId`, the \
database holds the submission's window too, so a repeat the door let through (its store down, another \
instance) still makes no second order.",
    params(UserId),
    request_body = OrderRequest,
    responses(
        (status = 201, description = "The new order.", body = crate::domain::Order, links(
            ("getOrder" = (operation_id = "getOrder", parameters(("path.orderId" = "$response.body#/orderId"), ("header.X-User-Id" = "$request.header.X-User-Id")))),
            ("payOrder" = (operation_id = "createPayment", parameters(("header.X-User-Id" = "$request.header.X-User-Id")), request_body = json!({"orderId": "$response.body#/orderId"})))
        )),
        (status = 200, description = "The user's existing order with this `bizId`: nothing new was written.",
            body = crate::domain::Order, headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 503, response = Unavailable),
    )
)]
#[allow(dead_code)]
fn quick_order() {}
