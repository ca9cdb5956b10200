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

async fn healthz(State(s): State<AppState>) -> Json<Value> {
    use norepeat::store::Store;
    Json(json!({
        "status": "ok",
        "store": s.primary.kind(),
        "breaker": format!("{:?}", s.primary.circuit().state()),
        "database": s.db.backend(),
        "defence": s.cfg.defence.name(),
        "idempotencyStore": s.payments.name(),
    }))
}

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
