//! The shop's web page.

use crate::app::AppState;
use axum::Router;
use axum::response::Html;
use axum::routing::get;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route(
        "/",
        get(|| async { Html(include_str!("../../static/index.html")) }),
    )
}
