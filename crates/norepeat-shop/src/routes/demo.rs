//! A stand-in for the payment provider, for the demo page.
//!
//! A real provider signs its notices with the secret it shares with the
//! shop (`NOREPEAT_CALLBACK_SECRET`), and a browser must never hold that
//! secret. So the page's "provider" button posts here, and this route signs
//! the notice exactly as the provider would and hands it to
//! `POST /payments/callback`, through the same signature check.
//!
//! It is off unless `NOREPEAT_DEMO_PROVIDER` is set: while on, anyone can
//! mark a payment paid, which is the hole signed callbacks close.

use super::payments::callback;
use crate::app::AppState;
use crate::error::ApiError;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use axum::routing::post;
use norepeat::webhook::SIGNATURE_HEADER;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/demo/provider/notify", post(notify))
}

#[utoipa::path(
    post,
    path = "/demo/provider/notify",
    operation_id = "demoProviderNotify",
    tag = "payments",
    description = "Demo only (`NOREPEAT_DEMO_PROVIDER`, off by default: 404): signs the notice as the \
payment provider would, when the shop has a callback secret, and delivers it to `POST /payments/callback`. \
Answers exactly as that route does.",
    request_body = super::openapi::schemas::PaymentNotice,
    responses(
        (status = 200, description = "`applied` the first time it changes state, `already_applied` after.",
            body = super::openapi::schemas::NoticeResult),
        (status = 400, response = super::openapi::responses::BadRequest),
        (status = 401, response = super::openapi::responses::Unauthorized),
        (status = 404, response = super::openapi::responses::NotFound),
        (status = 409, response = super::openapi::responses::Conflict),
        (status = 413, response = super::openapi::responses::TooLarge),
    )
)]
pub(super) async fn notify(
    State(s): State<AppState>,
    sent: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    if !s.cfg.demo_provider {
        return Err(ApiError::NotFound(
            "The demo payment provider is off (NOREPEAT_DEMO_PROVIDER).".into(),
        ));
    }
    let body = super::body::read(body, &sent).await?;
    let mut headers = HeaderMap::new();
    if let Some(verifier) = s.cfg.callback_verifier() {
        let signature = verifier.sign_now(&body);
        let value = HeaderValue::from_str(&signature)
            .map_err(|e| ApiError::Invalid(format!("cannot sign the notice: {e}")))?;
        headers.insert(SIGNATURE_HEADER, value);
    }
    callback(State(s), headers, Body::from(body)).await
}
