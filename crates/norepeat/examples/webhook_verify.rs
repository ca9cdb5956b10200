//! A payment provider's signed notice, verified before the handler runs; a
//! forged one (wrong secret), a tampered body and an unsigned one are
//! refused with 401 `invalid_signature`.
//!
//! ```sh
//! cargo run --example webhook_verify
//! ```

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use norepeat::webhook::{SIGNATURE_HEADER, WebhookLayer, WebhookVerifier};
use tower::ServiceExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The shop and the provider share this secret (in production: from the
    // environment, never in the code).
    let shop = WebhookVerifier::new("whsec_shared");
    let app = Router::new().route(
        "/payments/callback",
        // The handler sees the raw body unchanged, and only once verified.
        post(|body: Bytes| async move { format!("applied {}", String::from_utf8_lossy(&body)) })
            .layer(WebhookLayer::new(shop)),
    );
    let notice = r#"{"paymentId":"p-1","status":"SUCCESS"}"#;
    let send = |signature: Option<String>, body: &str| {
        let mut req = Request::post("/payments/callback");
        if let Some(signature) = signature {
            req = req.header(SIGNATURE_HEADER, signature);
        }
        req.body(Body::from(body.to_owned()))
            .expect("a valid request")
    };

    // The provider signs `t=<now>,v1=HMAC-SHA256(secret, "<t>." + body)`.
    let provider = WebhookVerifier::new("whsec_shared");
    let signed = app
        .clone()
        .oneshot(send(Some(provider.sign_now(notice.as_bytes())), notice))
        .await?;
    println!("signed notice: {}", signed.status());
    assert_eq!(signed.status(), StatusCode::OK);

    let forger = WebhookVerifier::new("a guess");
    let forged = app
        .clone()
        .oneshot(send(Some(forger.sign_now(notice.as_bytes())), notice))
        .await?;
    println!("forged notice: {}", forged.status());
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);

    let tampered_body = r#"{"paymentId":"p-2","status":"SUCCESS"}"#;
    let tampered = app
        .clone()
        .oneshot(send(
            Some(provider.sign_now(notice.as_bytes())),
            tampered_body,
        ))
        .await?;
    println!("signature of another body: {}", tampered.status());
    assert_eq!(tampered.status(), StatusCode::UNAUTHORIZED);

    let unsigned = app.oneshot(send(None, notice)).await?;
    println!("unsigned notice: {}", unsigned.status());
    assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
    let problem = axum::body::to_bytes(unsigned.into_body(), 64 * 1024).await?;
    let problem: serde_json::Value = serde_json::from_slice(&problem)?;
    assert_eq!(problem["code"], "invalid_signature");
    Ok(())
}
