//! The header, query and path parameters of the document (`IntoParams`).

use utoipa::IntoParams;

/// Header parameter: the caller.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct UserId {
    /// The caller's identity (a stand-in for real authentication): 1 to 64
    /// visible ASCII characters. Without it, 401 `unauthenticated`.
    #[param(
        rename = "X-User-Id",
        min_length = 1,
        max_length = 64,
        pattern = "^[!-~]{1,64}$",
        example = "u1"
    )]
    x_user_id: String,
}

/// Header parameter: the repeat token of `POST /orders`.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct RepeatTokenHeader {
    /// The repeat token from `GET /repeat/token` (or give it as the
    /// `repeatToken` query parameter). Without either, 400 `missing_token`.
    #[param(rename = "Repeat-Token", required = false)]
    repeat_token: String,
}

/// Query parameter: the repeat token of `POST /orders`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct RepeatTokenQuery {
    /// The repeat token, when not in the `Repeat-Token` header.
    #[param(rename = "repeatToken", required = false)]
    repeat_token: String,
}

/// Header parameter: the key of `POST /payments`.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct IdempotencyKey {
    /// The client's key for this payment (per user): 1 to 255 visible ASCII
    /// characters. The same key and body again replay the stored answer.
    #[param(
        rename = "Idempotency-Key",
        min_length = 1,
        max_length = 255,
        pattern = "^[!-~]{1,255}$"
    )]
    idempotency_key: String,
}

/// Header parameter: the admin token.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct AdminToken {
    /// The shared secret `NOREPEAT_ADMIN_TOKEN`; a wrong one gets 401.
    #[param(rename = "X-Admin-Token")]
    x_admin_token: String,
}

/// Header parameter: the payment provider's signature.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct Signature {
    /// `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>`, with `t`
    /// within 300 s of now. Required when `NOREPEAT_CALLBACK_SECRET` is set;
    /// missing, wrong or stale: 401 `invalid_signature`.
    #[param(rename = "Norepeat-Signature", required = false)]
    norepeat_signature: String,
}

/// Path parameter: a product.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct SkuPath {
    /// The product: 1 to 64 characters, no control characters.
    #[param(
        min_length = 1,
        max_length = 64,
        pattern = "^[^\\x00-\\x1F\\x7F]+$",
        example = "SKU-1"
    )]
    sku: String,
}

/// Path parameter: an order.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct OrderIdPath {
    /// The order's id (`ord_...`), no control characters.
    #[param(
        rename = "orderId",
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1F\\x7F]+$"
    )]
    order_id: String,
}
