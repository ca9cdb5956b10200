//! Health and metrics.

use crate::app::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
}

#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "health",
    tag = "system",
    responses((status = 200, description = "The shop is up.", body = super::openapi::schemas::Health))
)]
async fn healthz(State(s): State<AppState>) -> Json<Value> {
    use norepeat::store::KeyValueStore;
    Json(json!({
        "status": "ok",
        "store": s.primary.kind(),
        "breaker": format!("{:?}", s.primary.circuit().state()),
        "database": s.db.backend(),
        "defence": s.cfg.defence.name(),
        "callbacks": if s.cfg.callback_verifier().is_some() { "signed" } else { "unsigned" },
        "demoProvider": s.cfg.demo_provider,
        "idempotencyStore": s.payments.name(),
    }))
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "system",
    responses((status = 200, description = "Prometheus text format.", body = String, content_type = "text/plain; version=0.0.4"))
)]
async fn metrics(
    State(s): State<AppState>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        s.metrics.render(),
    )
}
