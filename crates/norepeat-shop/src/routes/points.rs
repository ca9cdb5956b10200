//! Loyalty points.

use super::user;
use crate::app::AppState;
use crate::error::ApiError;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/points", get(points))
}

#[utoipa::path(
    get,
    path = "/points",
    operation_id = "getPoints",
    tag = "shop",
    params(super::openapi::params::UserId),
    responses(
        (status = 200, description = "The caller's loyalty points.", body = super::openapi::schemas::Points),
        (status = 401, response = super::openapi::responses::Unauthorized),
    )
)]
async fn points(State(s): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let user = user(&headers)?;
    let points = s.db.points(&user).await?;
    Ok(Json(json!({"userId": user, "points": points})))
}
