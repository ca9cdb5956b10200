//! The schemas of the document (`ToSchema`): request and answer bodies,
//! the RFC 9457 problem and its codes. They only describe the wire format
//! and are never built.

use utoipa::ToSchema;

/// The body of `POST /orders` and `POST /orders/quick`. Other members are
/// allowed and ignored.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct OrderRequest {
    /// The product: 1 to 64 characters, no control characters.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = "^[^\\x00-\\x1F\\x7F]+$",
        example = "SKU-1"
    )]
    sku: String,
    /// Units, 1 to 100: a whole number (`12.0` is `12`, `12.5` is refused).
    #[schema(minimum = 1, maximum = 100, example = 1)]
    quantity: i64,
    /// The client's business id: a second order with the same `bizId` (same
    /// user) answers 200 with the first one. 1 to 128 characters.
    #[schema(min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F]+$")]
    biz_id: Option<String>,
}

/// The body of `POST /flash-sale/{sku}`.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct FlashSaleRequest {
    /// Units, 1 to 100: a whole number (`12.0` is `12`, `12.5` is refused).
    #[schema(minimum = 1, maximum = 100, example = 1)]
    quantity: i64,
    /// The client's business id, as in `POST /orders`: 1 to 128 characters.
    #[schema(min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F]+$")]
    biz_id: Option<String>,
}

/// A repeat token, good for one `POST /orders` by this user.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct RepeatTokenBody {
    /// The opaque token.
    repeat_token: String,
    /// Seconds it stays valid.
    #[schema(minimum = 0)]
    expires_in: u64,
}

/// The user's orders.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct OrderList {
    /// Every order of the caller.
    orders: Vec<crate::domain::Order>,
}

/// The body of `POST /payments`.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct PaymentRequest {
    /// The order to pay (the caller's own).
    #[schema(min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F]+$")]
    order_id: String,
    /// Amount in minor units (cents), 1 to 10 000 000: a whole number
    /// (`1999.0` is `1999`, `1999.5` is refused).
    #[schema(minimum = 1, maximum = 10_000_000, example = 1999)]
    amount: i64,
}

/// The payment provider's notice.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct PaymentNotice {
    /// The payment the notice is about.
    #[schema(min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F]+$")]
    payment_id: String,
    /// What the provider reports.
    status: NoticeStatus,
}

/// What the provider reports.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) enum NoticeStatus {
    /// The payment went through.
    #[schema(rename = "SUCCESS")]
    Success,
    /// The payment failed.
    #[schema(rename = "FAILED")]
    Failed,
}

/// What a notice did.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct NoticeResult {
    /// `applied` the first time it changed state, `already_applied` after.
    result: NoticeResultKind,
}

/// `applied` or `already_applied`.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum NoticeResultKind {
    /// The notice changed the payment's state now.
    Applied,
    /// The payment already was in that state.
    AlreadyApplied,
}

/// A product's stock.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct Stock {
    /// The product.
    sku: String,
    /// Units available.
    #[schema(minimum = 0)]
    available: i64,
}

/// The body of `PUT /admin/stock/{sku}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct StockUpdate {
    /// Units available, 0 to 1 000 000 000: a whole number (`50.0` is `50`).
    #[schema(minimum = 0, maximum = 1_000_000_000, example = 50)]
    available: i64,
}

/// What `POST /admin/reconcile` repaired.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct ReconcileResult {
    /// Number of repairs.
    #[schema(minimum = 0)]
    repaired: u64,
    /// The repairs.
    report: crate::db::ReconcileReport,
}

/// A user's loyalty points.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct Points {
    /// The user.
    user_id: String,
    /// Points earned: 10 per unit of each paid order.
    #[schema(minimum = 0)]
    points: i64,
}

/// The shop's health.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct Health {
    /// `ok`.
    status: String,
    /// The guard store in use (`memory`, `redis`, ...).
    store: String,
    /// The store's circuit breaker.
    breaker: String,
    /// `sqlite` or `postgres`.
    database: String,
    /// The defence layers in force.
    defence: String,
    /// `signed` or `unsigned`: whether payment callbacks must be signed.
    callbacks: Option<String>,
    /// Whether `POST /demo/provider/notify` is served (`NOREPEAT_DEMO_PROVIDER`).
    demo_provider: Option<bool>,
}

/// An RFC 9457 problem (`application/problem+json`).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct Problem {
    /// A URI naming the problem type.
    #[schema(rename = "type")]
    type_: String,
    /// A short summary of the problem type.
    title: String,
    /// The HTTP status.
    #[schema(minimum = 400, maximum = 599)]
    status: u16,
    /// What went wrong with this request.
    detail: String,
    /// The machine-readable reason.
    code: ProblemCode,
    /// With `order_not_payable`: the order's live payment.
    payment_id: Option<String>,
}

/// Every `code` a problem carries.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum ProblemCode {
    /// 400: bad body, field, header or path segment.
    InvalidRequest,
    /// 401: no or malformed `X-User-Id` (or a wrong `X-Admin-Token`).
    Unauthenticated,
    /// 400: token route without a repeat token.
    MissingToken,
    /// 409: repeat token used, unknown or another user's; or fingerprint
    /// seen in its window.
    DuplicateSubmission,
    /// 409: repeat token past its life (fetch a new one).
    TokenExpired,
    /// 409: not enough stock.
    OutOfStock,
    /// 404: unknown sku, order, payment or route.
    NotFound,
    /// 413: body over 64 KiB.
    PayloadTooLarge,
    /// 400: `POST /payments` without `Idempotency-Key`.
    MissingIdempotencyKey,
    /// 400: key empty, over 255 characters, or not visible ASCII.
    InvalidIdempotencyKey,
    /// 409: same key still being processed.
    IdempotencyKeyInUse,
    /// 422: same key reused with a different request.
    IdempotencyKeyMismatch,
    /// 429: over the rate.
    RateLimited,
    /// 409: a callback the payment's state does not allow.
    InvalidTransition,
    /// 409: the order is not `UNPAID` or already has a live payment
    /// (named in `paymentId`).
    OrderNotPayable,
    /// 401: missing, wrong or stale `Norepeat-Signature`.
    InvalidSignature,
    /// 503: the guard store is down on a route that fails closed.
    GuardUnavailable,
}
