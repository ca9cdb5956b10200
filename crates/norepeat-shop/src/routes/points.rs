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

async fn points(State(s): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let user = user(&headers)?;
    let points = s.db.points(&user).await?;
    Ok(Json(json!({"userId": user, "points": points})))
}
