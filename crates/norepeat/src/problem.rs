//! Rejections as RFC 9457 `application/problem+json` responses.
//!
//! Every answer a guard gives instead of calling the handler is a
//! [`Problem`]: a status, a stable machine-readable `code`, a title, a
//! detail message you can configure, and for some a `Retry-After`. The
//! problem also rides in the response's extensions, so an outer layer can
//! log or reshape it.
//!
//! The guards themselves say what they refused and why in their own error
//! types; each capability's tower layer (its `layer.rs`) turns them into
//! answers with a `From<...> for Problem` beside itself, at the edge. This
//! module knows none of them: HTTP points one way, from the layers down to
//! here.
//!
//! | error | answer |
//! |---|---|
//! | [`FingerprintGuardError`](crate::fingerprint::FingerprintGuardError) | 409 `duplicate_submission` with `Retry-After`; 503 `guard_unavailable` |
//! | [`TokenGuardError`](crate::token::TokenGuardError) | 409 `duplicate_submission`; 503 `guard_unavailable` |
//! | [`IdempotencyError`](crate::idempotency::IdempotencyError) | 409 `idempotency_key_in_use`; 422 `idempotency_key_mismatch`; 503 `guard_unavailable` |
//! | [`RateLimitError`](crate::ratelimit::RateLimitError) | 503 `guard_unavailable` |
//! | [`BodyError`](crate::body::BodyError) | 413 `payload_too_large`; 400 `invalid_request` |
//! | [`InvalidJson`](crate::json::InvalidJson) | 400 `invalid_request` |
//! | [`SignatureError`](crate::webhook::SignatureError) | 401 `invalid_signature` |
//!
//! An application adds its own codes with [`Problem::custom`]: the same
//! body, headers and extensions as the library's.
//!
//! ```
//! use norepeat::problem::{Problem, Code};
//! let p = Problem::new(Code::DuplicateSubmission).retry_after_secs(3);
//! let res = p.to_response();
//! assert_eq!(res.status(), 409);
//! assert_eq!(res.headers()["retry-after"], "3");
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! ```

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use std::borrow::Cow;
use std::time::Duration;

/// The machine-readable reason of a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// 400: the request body is not valid for the guard (malformed JSON).
    InvalidRequest,
    /// 401: no (or a malformed) caller identity.
    Unauthenticated,
    /// 400: a token route was called without a token.
    MissingToken,
    /// 409: a used, unknown or foreign token; or a fingerprint seen within
    /// its window.
    DuplicateSubmission,
    /// 409: a token past its life: fetch a new one.
    TokenExpired,
    /// 413: the body is larger than the guard reads.
    PayloadTooLarge,
    /// 400: an `Idempotency-Key` is required and missing.
    MissingIdempotencyKey,
    /// 400: the `Idempotency-Key` is empty, too long or not visible ASCII.
    InvalidIdempotencyKey,
    /// 409: the same `Idempotency-Key` is still being processed.
    IdempotencyKeyInUse,
    /// 409: the request that held this `Idempotency-Key` ended without an
    /// answer that could be stored (its process died, or its upstream
    /// timed out): whether its effect happened is unknown, so it is not
    /// run again.
    IdempotencyOutcomeUnknown,
    /// 422: the same `Idempotency-Key` was used with another request.
    IdempotencyKeyMismatch,
    /// 429: over the rate.
    RateLimited,
    /// 503: the store is unavailable on a route that fails closed.
    GuardUnavailable,
    /// 401: a signed request (a webhook) whose signature is missing, wrong
    /// or too old; see [`webhook`](crate::webhook).
    InvalidSignature,
    /// An application's own code, made with [`Problem::custom`].
    Custom {
        /// The HTTP status.
        status: StatusCode,
        /// The `code` member (and the last segment of `type`).
        code: &'static str,
        /// The `title` member.
        title: &'static str,
    },
}

impl Code {
    /// The code as it appears in the `code` member.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "invalid_request",
            Code::Unauthenticated => "unauthenticated",
            Code::MissingToken => "missing_token",
            Code::DuplicateSubmission => "duplicate_submission",
            Code::TokenExpired => "token_expired",
            Code::PayloadTooLarge => "payload_too_large",
            Code::MissingIdempotencyKey => "missing_idempotency_key",
            Code::InvalidIdempotencyKey => "invalid_idempotency_key",
            Code::IdempotencyKeyInUse => "idempotency_key_in_use",
            Code::IdempotencyOutcomeUnknown => "idempotency_outcome_unknown",
            Code::IdempotencyKeyMismatch => "idempotency_key_mismatch",
            Code::RateLimited => "rate_limited",
            Code::GuardUnavailable => "guard_unavailable",
            Code::InvalidSignature => "invalid_signature",
            Code::Custom { code, .. } => code,
        }
    }

    /// The HTTP status this code is answered with.
    #[must_use]
    pub const fn status(self) -> StatusCode {
        match self {
            Code::InvalidRequest
            | Code::MissingToken
            | Code::MissingIdempotencyKey
            | Code::InvalidIdempotencyKey => StatusCode::BAD_REQUEST,
            Code::Unauthenticated | Code::InvalidSignature => StatusCode::UNAUTHORIZED,
            Code::DuplicateSubmission
            | Code::TokenExpired
            | Code::IdempotencyKeyInUse
            | Code::IdempotencyOutcomeUnknown => StatusCode::CONFLICT,
            Code::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::IdempotencyKeyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Code::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Code::GuardUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Custom { status, .. } => status,
        }
    }

    /// A short, human-readable summary (the `title` member).
    #[must_use]
    pub const fn title(self) -> &'static str {
        match self {
            Code::InvalidRequest => "Invalid request",
            Code::Unauthenticated => "Unauthenticated",
            Code::MissingToken => "Missing repeat token",
            Code::DuplicateSubmission => "Duplicate submission",
            Code::TokenExpired => "Repeat token expired",
            Code::PayloadTooLarge => "Payload too large",
            Code::MissingIdempotencyKey => "Missing Idempotency-Key",
            Code::InvalidIdempotencyKey => "Invalid Idempotency-Key",
            Code::IdempotencyKeyInUse => "Idempotency-Key in use",
            Code::IdempotencyOutcomeUnknown => "Idempotency outcome unknown",
            Code::IdempotencyKeyMismatch => "Idempotency-Key reused with another request",
            Code::RateLimited => "Too many requests",
            Code::GuardUnavailable => "Guard unavailable",
            Code::InvalidSignature => "Invalid signature",
            Code::Custom { title, .. } => title,
        }
    }
}

/// An RFC 9457 problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The reason.
    pub code: Code,
    /// The `detail` member.
    pub detail: Cow<'static, str>,
    /// Whole seconds for `Retry-After`, if any (at least 1).
    pub retry_after: Option<u64>,
    /// Extra headers (for example `RateLimit`).
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl Problem {
    /// A problem with the code's title as its detail.
    #[must_use]
    pub fn new(code: Code) -> Self {
        Self {
            code,
            detail: Cow::Borrowed(code.title()),
            retry_after: None,
            headers: Vec::new(),
        }
    }

    /// A problem with an application's own code: `status`, the `code`
    /// member (also the last segment of `type`) and the `title`, which is
    /// the detail until [`detail`](Self::detail) sets one. Its response has
    /// the same shape as the library's own.
    ///
    /// ```
    /// use http::StatusCode;
    /// use norepeat::problem::Problem;
    /// let p = Problem::custom(StatusCode::CONFLICT, "out_of_stock", "Out of stock")
    ///     .detail("Not enough stock for this order.");
    /// let res = p.to_response();
    /// assert_eq!(res.status(), 409);
    /// let body: serde_json::Value = serde_json::from_slice(&p.body()).unwrap();
    /// assert_eq!(body["code"], "out_of_stock");
    /// assert_eq!(body["type"], "https://norepeat.dev/problems/out_of_stock");
    /// ```
    #[must_use]
    pub fn custom(status: StatusCode, code: &'static str, title: &'static str) -> Self {
        Self::new(Code::Custom {
            status,
            code,
            title,
        })
    }

    /// Sets the `detail` message.
    #[must_use]
    pub fn detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.detail = detail.into();
        self
    }

    /// Sets `Retry-After` in whole seconds (at least 1).
    #[must_use]
    pub fn retry_after_secs(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs.max(1));
        self
    }

    /// Sets `Retry-After` from a duration, rounded up to whole seconds.
    #[must_use]
    pub fn retry_after(self, d: Duration) -> Self {
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        self.retry_after_secs(secs)
    }

    /// Adds a header to the response.
    #[must_use]
    pub fn header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The JSON body.
    #[must_use]
    pub fn body(&self) -> Bytes {
        let status = self.code.status();
        let v = serde_json::json!({
            "type": format!("https://norepeat.dev/problems/{}", self.code.as_str()),
            "title": self.code.title(),
            "status": status.as_u16(),
            "detail": self.detail,
            "code": self.code.as_str(),
        });
        Bytes::from(v.to_string())
    }

    /// The response: status, `application/problem+json`, `Retry-After` if
    /// set, and the problem itself in the extensions.
    #[must_use]
    pub fn to_response(&self) -> Response<Full<Bytes>> {
        let mut res = Response::new(Full::new(self.body()));
        *res.status_mut() = self.code.status();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        for (k, v) in &self.headers {
            h.append(k.clone(), v.clone());
        }
        res.extensions_mut().insert(self.clone());
        res
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code.as_str(),
            self.code.status(),
            self.detail
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_every_member() {
        let p = Problem::new(Code::IdempotencyKeyMismatch).detail("other body");
        let v: serde_json::Value = serde_json::from_slice(&p.body()).unwrap();
        assert_eq!(v["status"], 422);
        assert_eq!(v["code"], "idempotency_key_mismatch");
        assert_eq!(v["detail"], "other body");
        assert!(
            v["type"]
                .as_str()
                .unwrap()
                .ends_with("idempotency_key_mismatch")
        );
    }

    #[test]
    fn a_custom_code_answers_as_the_library_codes_do() {
        let p = Problem::custom(
            StatusCode::CONFLICT,
            "order_not_payable",
            "Order not payable",
        )
        .detail("Order o-1 already has a live payment.");
        let res = p.to_response();
        assert_eq!(res.status(), 409);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.extensions().get::<Problem>(), Some(&p));
        let v: serde_json::Value = serde_json::from_slice(&p.body()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "type": "https://norepeat.dev/problems/order_not_payable",
                "title": "Order not payable",
                "status": 409,
                "detail": "Order o-1 already has a live payment.",
                "code": "order_not_payable",
            })
        );
        assert_eq!(p.code.as_str(), "order_not_payable");
        assert_eq!(p.code.title(), "Order not payable");
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        let p = Problem::new(Code::RateLimited).retry_after(Duration::from_millis(1));
        assert_eq!(p.retry_after, Some(1));
        let p = Problem::new(Code::RateLimited).retry_after(Duration::from_millis(2001));
        assert_eq!(p.retry_after, Some(3));
    }
}
