//! The shop's one error type: every failure a handler can meet, answered as
//! RFC 9457 problem+json.

use crate::db::DbError;
use axum::response::{IntoResponse, Response};
use norepeat::problem::{Code, Problem};

/// A handler's failure.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A problem the library knows (401, 400, 409, ...).
    #[error("{0}")]
    Problem(Problem),
    /// 404 `not_found`.
    #[error("not found: {0}")]
    NotFound(String),
    /// 409 `out_of_stock`.
    #[error("out of stock")]
    OutOfStock,
    /// 409 `order_not_payable`, naming the order's live payment (member
    /// `paymentId`) when it has one.
    #[error("order not payable: {detail}")]
    NotPayable {
        /// The `detail` member.
        detail: String,
        /// The order's live payment.
        payment_id: Option<String>,
    },
    /// 409 `invalid_transition`.
    #[error("invalid transition: {0}")]
    InvalidTransition(String),
    /// 400 `invalid_request`.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A database failure: logged, answered 500 without details.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<Problem> for ApiError {
    fn from(p: Problem) -> Self {
        ApiError::Problem(p)
    }
}

/// Builds a problem+json response with a code the library does not know.
fn custom(status: u16, code: &str, title: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": format!("https://norepeat.dev/problems/{code}"),
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    });
    let status = axum::http::StatusCode::from_u16(status)
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// 409 `order_not_payable`: the shop's own code, on the library's
/// problem (so it rides in the response's extensions like the others).
fn not_payable() -> Problem {
    Problem::custom(
        axum::http::StatusCode::CONFLICT,
        "order_not_payable",
        "Order not payable",
    )
}

/// A library problem with one extension member (RFC 9457 section 3.2), left
/// out when `value` is `None`.
fn with_member(p: &Problem, name: &str, value: Option<String>) -> Response {
    let mut res = p.to_response().into_response();
    if let Some(value) = value {
        // The library's body is always a JSON object; parse it back to add
        // the member rather than write the standard members a second time.
        if let Ok(serde_json::Value::Object(mut m)) = serde_json::from_slice(&p.body()) {
            m.insert(name.to_owned(), value.into());
            *res.body_mut() = axum::body::Body::from(serde_json::Value::Object(m).to_string());
            res.headers_mut().remove(axum::http::header::CONTENT_LENGTH);
        }
    }
    res
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Problem(p) => p.to_response().into_response(),
            ApiError::Invalid(d) => Problem::new(Code::InvalidRequest)
                .detail(d)
                .to_response()
                .into_response(),
            ApiError::NotFound(what) => custom(404, "not_found", "Not found", &what),
            ApiError::OutOfStock => custom(
                409,
                "out_of_stock",
                "Out of stock",
                "Not enough stock for this order.",
            ),
            ApiError::NotPayable { detail, payment_id } => {
                with_member(&not_payable().detail(detail), "paymentId", payment_id)
            }
            ApiError::InvalidTransition(d) => {
                custom(409, "invalid_transition", "Invalid transition", &d)
            }
            ApiError::Db(DbError::InvalidInput(d)) => Problem::new(Code::InvalidRequest)
                .detail(d)
                .to_response()
                .into_response(),
            ApiError::Db(e) => {
                tracing::error!(error = %e, "database failure");
                custom(
                    500,
                    "internal",
                    "Internal error",
                    "The request could not be completed; it is safe to retry.",
                )
            }
        }
    }
}

/// 401 `unauthenticated`.
pub fn unauthenticated() -> ApiError {
    use norepeat::identity::{Identify, UserHeader};
    ApiError::Problem(Problem::new(Code::Unauthenticated).detail(UserHeader::default().missing()))
}
