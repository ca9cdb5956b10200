//! The shop's routes, one module per resource.

mod admin;
mod body;
mod demo;
mod openapi;
mod orders;
mod page;
mod payments;
mod points;
mod stock;
mod system;

use crate::app::AppState;
use crate::error::{ApiError, unauthenticated};
use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use norepeat::identity::UserHeader;
use norepeat::problem::Problem;

/// Every route of the contract.
pub fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .merge(page::routes())
        .merge(system::routes())
        .merge(orders::routes(state))
        .merge(stock::routes())
        .merge(admin::routes())
        .merge(payments::routes(state))
        .merge(points::routes())
        .merge(demo::routes())
        .route("/openapi.json", axum::routing::get(openapi::serve))
}

/// The caller, from `X-User-Id`.
pub(crate) fn user(headers: &HeaderMap) -> Result<String, ApiError> {
    UserHeader::default()
        .user_in(headers)
        .ok_or_else(unauthenticated)
}

/// The shop's router.
pub fn app(state: AppState) -> Router {
    router(&state)
        // After every route: it applies to the routes there are.
        .method_not_allowed_fallback(|| async {
            ApiError::Problem(
                Problem::custom(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "invalid_request",
                    "Method not allowed",
                )
                .detail(
                    "This route does not take this method; the Allow header lists those it takes.",
                ),
            )
        })
        .fallback(|| async { ApiError::NotFound("No such route.".into()) })
        .with_state(state)
}
