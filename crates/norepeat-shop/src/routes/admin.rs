//! Admin routes, behind `X-Admin-Token`.

use super::body::{self, Segment};
use crate::app::AppState;
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{post, put};
use axum::{Json, Router};
use norepeat::problem::{Code, Problem};
use serde_json::{Value, json};

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/stock/{sku}", put(set_stock))
        .route("/admin/reconcile", post(reconcile))
}

/// Admin routes do not exist without a configured (non-empty) token; with
/// one, the request must carry `X-Admin-Token` exactly once, matching it.
/// A second copy is refused whatever the first says, as a second
/// `X-User-Id` is: a proxy that appends must not let a client pick which
/// one counts.
fn check(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = s.cfg.admin_token() else {
        return Err(ApiError::NotFound("No such route.".into()));
    };
    let mut given = headers.get_all("x-admin-token").iter();
    match (given.next(), given.next()) {
        (Some(token), None) if same_secret(token.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(ApiError::Problem(
            Problem::new(Code::Unauthenticated).detail(
                "Admin routes need exactly one X-Admin-Token header with the configured token.",
            ),
        )),
    }
}

/// Compares two secrets in constant time, length included: both sides are
/// hashed to 32 bytes first, so neither the position of the first difference
/// nor the expected length shows in the time taken.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let a = Sha256::digest(given);
    let b = Sha256::digest(expected);
    bool::from(a.as_slice().ct_eq(b.as_slice()))
}

#[utoipa::path(
    put,
    path = "/admin/stock/{sku}",
    operation_id = "setStock",
    tag = "admin",
    params(super::openapi::params::AdminToken, super::openapi::params::SkuPath),
    request_body = super::openapi::schemas::StockUpdate,
    responses(
        (status = 200, description = "The new stock level.", body = super::openapi::schemas::Stock),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
        (status = 413, response = super::openapi::responses::TooLarge),
    )
)]
async fn set_stock(
    State(s): State<AppState>,
    sku: Result<Segment, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    // Admin first: with admin off, even a malformed path is "no such route".
    check(&s, &headers)?;
    let Segment(sku) = sku?;
    body::check_sku(&sku)?;
    let m = body::object(&body::read(body, &headers).await?)?;
    let available = body::integer(&m, "available", 0..=1_000_000_000)?;
    s.db.set_stock(&sku, available).await?;
    Ok(Json(json!({"sku": sku, "available": available})))
}

#[utoipa::path(
    post,
    path = "/admin/reconcile",
    operation_id = "reconcile",
    tag = "admin",
    params(super::openapi::params::AdminToken),
    responses(
        (status = 200, description = "What one reconciliation pass repaired.", body = super::openapi::schemas::ReconcileResult),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
    )
)]
async fn reconcile(State(s): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    check(&s, &headers)?;
    let report = s.db.reconcile().await?;
    crate::events::kick(&s.events);
    Ok(Json(json!({"repaired": report.total(), "report": report})))
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"", b"s3cret"));
        assert!(!same_secret(b"s3creT", b"s3cret"));
    }
}
