//! Signed webhooks as a layer: the missing header is named, and the opt-in
//! memory of accepted signatures refuses (or marks) a replayed notice,
//! against a real Redis and the memory store.
#![allow(clippy::unwrap_used)]

use crate::common::each_store;
use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::routing::post;
use http::{HeaderName, Request};
use norepeat::store::KeyValueStore;
use norepeat::webhook::{OnReplay, Repeated, SIGNATURE_HEADER, WebhookLayer, WebhookVerifier};
#[cfg(feature = "redis")]
use norepeat_testkit::RedisServer;
use norepeat_testkit::{Answer, send};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const BODY: &str = r#"{"paymentId":"p-1","status":"SUCCESS"}"#;

/// The hook counts its runs and answers `repeat` when the layer marked the
/// notice a repeat, `applied` otherwise.
fn app(layer: WebhookLayer, runs: &Arc<AtomicUsize>) -> Router {
    let runs = Arc::clone(runs);
    Router::new().route(
        "/hook",
        post(move |repeated: Option<Extension<Repeated>>| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if repeated.is_some() {
                "repeat"
            } else {
                "applied"
            }
        })
        .layer(layer),
    )
}

/// The notice, with `header` (name, value) if any.
fn notice(header: Option<(&str, &str)>) -> Request<Body> {
    let mut b = Request::post("/hook");
    if let Some((name, value)) = header {
        b = b.header(name, value);
    }
    b.body(Body::from(BODY)).unwrap()
}

/// Status and text: what the hook answered.
fn reply(answer: &Answer) -> (u16, String) {
    (answer.status.as_u16(), answer.text())
}

fn detail(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    format!(
        "{} {}",
        v["code"].as_str().unwrap(),
        v["detail"].as_str().unwrap()
    )
}

#[tokio::test]
async fn a_missing_signature_header_is_named() {
    let runs = Arc::default();
    let v = WebhookVerifier::new("whsec");
    let (status, body) = reply(&send(&app(WebhookLayer::new(v), &runs), notice(None)).await);
    assert_eq!(status, 401);
    assert!(detail(&body).contains("invalid_signature"), "{body}");
    assert!(detail(&body).contains("Norepeat-Signature"), "{body}");

    let custom = WebhookVerifier::new("whsec").header(HeaderName::from_static("x-provider-sig"));
    let hook = app(WebhookLayer::new(custom.clone()), &runs);
    // Signed, but in the default header: the configured one is missing.
    let signed = custom.sign_now(BODY.as_bytes());
    let (status, body) = reply(&send(&hook, notice(Some((SIGNATURE_HEADER, &signed)))).await);
    assert_eq!(status, 401);
    assert!(detail(&body).contains("X-Provider-Sig"), "{body}");
    assert_eq!(
        send(&hook, notice(Some(("x-provider-sig", &signed))))
            .await
            .status,
        200
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn a_replayed_notice_is_refused<G: KeyValueStore + Clone>(store: G) {
    let runs = Arc::default();
    let v = WebhookVerifier::new("whsec");
    let hook = app(
        WebhookLayer::new(v.clone()).remember_in(store, OnReplay::Refuse),
        &runs,
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let first = v.sign(now, BODY.as_bytes());
    assert_eq!(
        reply(&send(&hook, notice(Some((SIGNATURE_HEADER, &first)))).await),
        (200, "applied".into())
    );
    // The same signed notice again, and with its entries decorated: one
    // signature, refused.
    let tag = first.split_once(",v1=").unwrap().1;
    let decorated = format!("t={now}, v0=x, v1={}, v1={tag}", "0".repeat(64));
    for header in [first.as_str(), decorated.as_str()] {
        let (status, body) = reply(&send(&hook, notice(Some((SIGNATURE_HEADER, header)))).await);
        assert_eq!(status, 409, "{header}: {body}");
        assert!(detail(&body).starts_with("duplicate_submission"), "{body}");
    }
    // The provider's next delivery, signed anew: a new signature.
    let next = v.sign(now - 1, BODY.as_bytes());
    assert_eq!(
        send(&hook, notice(Some((SIGNATURE_HEADER, &next))))
            .await
            .status,
        200
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn a_replayed_notice_may_pass_marked<G: KeyValueStore + Clone>(store: G) {
    let runs = Arc::default();
    let v = WebhookVerifier::new("whsec");
    let hook = app(
        WebhookLayer::new(v.clone()).remember_in(store, OnReplay::PassMarked),
        &runs,
    );
    let header = v.sign_now(BODY.as_bytes());
    assert_eq!(
        reply(&send(&hook, notice(Some((SIGNATURE_HEADER, &header)))).await),
        (200, "applied".into())
    );
    assert_eq!(
        reply(&send(&hook, notice(Some((SIGNATURE_HEADER, &header)))).await),
        (200, "repeat".into())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Without `remember_in`, nothing changes: the notice verifies each time.
#[tokio::test]
async fn without_memory_a_notice_verifies_again() {
    let runs = Arc::default();
    let v = WebhookVerifier::new("whsec");
    let hook = app(WebhookLayer::new(v.clone()), &runs);
    let header = v.sign_now(BODY.as_bytes());
    for _ in 0..2 {
        assert_eq!(
            reply(&send(&hook, notice(Some((SIGNATURE_HEADER, &header)))).await),
            (200, "applied".into())
        );
    }
}

each_store!(
    a_replayed_notice_is_refused,
    a_replayed_notice_may_pass_marked;
    then something_is_remembered
);

/// The Redis runs stored the signatures they saw.
#[cfg(feature = "redis")]
async fn something_is_remembered(redis: &RedisServer) {
    assert!(redis.dbsize().await > 0);
}
