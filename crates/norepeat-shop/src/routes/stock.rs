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

#[utoipa::path(
    get,
    path = "/stock/{sku}",
    operation_id = "getStock",
    tag = "shop",
    params(super::openapi::params::SkuPath),
    responses(
        (status = 200, description = "The product's stock.", body = super::openapi::schemas::Stock),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 404, response = super::openapi::responses::NotFound),
    )
)]
async fn stock(State(s): State<AppState>, Segment(sku): Segment) -> Result<Json<Value>, ApiError> {
    super::body::check_sku(&sku)?;
    match s.db.stock(&sku).await? {
        Some(available) => Ok(Json(json!({"sku": sku, "available": available}))),
        None => Err(ApiError::NotFound(format!("No product {sku}."))),
    }
}
