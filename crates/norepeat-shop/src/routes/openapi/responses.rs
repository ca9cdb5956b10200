//! The reusable problem responses of the document (`ToResponse`), one per
//! status, each an RFC 9457 problem.

use super::schemas::Problem;
use utoipa::ToResponse;

/// 400: `invalid_request` (bad JSON, duplicate keys, wrong types, values out
/// of range, control characters), `missing_token`, `missing_idempotency_key`
/// or `invalid_idempotency_key`.
#[derive(ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub(crate) struct BadRequest(Problem);

/// 401: `unauthenticated` (no or malformed `X-User-Id`, wrong
/// `X-Admin-Token`) or `invalid_signature`.
#[derive(ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub(crate) struct Unauthorized(Problem);

/// 404: `not_found` (unknown or another user's resource).
#[derive(ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub(crate) struct NotFound(Problem);

/// 409: `duplicate_submission`, `token_expired`, `out_of_stock`,
/// `idempotency_key_in_use`, `invalid_transition` or `order_not_payable`.
#[derive(ToResponse)]
#[response(
    content_type = "application/problem+json",
    headers(("Retry-After" = u64, description = "Whole seconds to wait (at least 1), with `duplicate_submission` by fingerprint and `idempotency_key_in_use`."))
)]
#[allow(dead_code)]
pub(crate) struct Conflict(Problem);

/// 413: `payload_too_large` (body over 64 KiB).
#[derive(ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub(crate) struct TooLarge(Problem);

/// 422: `idempotency_key_mismatch`.
#[derive(ToResponse)]
#[response(content_type = "application/problem+json")]
#[allow(dead_code)]
pub(crate) struct KeyMismatch(Problem);

/// 429: `rate_limited`.
#[derive(ToResponse)]
#[response(
    content_type = "application/problem+json",
    headers(
        ("Retry-After" = u64, description = "Whole seconds to wait (at least 1)."),
        ("RateLimit" = String, description = "`\"flash\";r=REMAINING;t=SECONDS` (draft-ietf-httpapi-ratelimit-headers)."),
        ("RateLimit-Policy" = String, description = "`\"flash\";q=QUOTA;w=WINDOW`."),
    )
)]
#[allow(dead_code)]
pub(crate) struct RateLimited(Problem);

/// 503: `guard_unavailable` (the store is down on a route that fails closed).
#[derive(ToResponse)]
#[response(
    content_type = "application/problem+json",
    headers(("Retry-After" = u64, description = "Whole seconds to wait (at least 1)."))
)]
#[allow(dead_code)]
pub(crate) struct Unavailable(Problem);
