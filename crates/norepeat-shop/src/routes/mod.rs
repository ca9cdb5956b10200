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
use axum::http::HeaderMap;
use norepeat::identity::UserHeader;

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
