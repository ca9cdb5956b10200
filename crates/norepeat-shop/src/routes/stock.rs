//! Stock levels.

use super::body::Segment;
use crate::app::AppState;
use crate::error::ApiError;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/stock/{sku}", get(stock))
}

async fn stock(State(s): State<AppState>, Segment(sku): Segment) -> Result<Json<Value>, ApiError> {
    match s.db.stock(&sku).await? {
        Some(available) => Ok(Json(json!({"sku": sku, "available": available}))),
        None => Err(ApiError::NotFound(format!("No product {sku}."))),
    }
}
