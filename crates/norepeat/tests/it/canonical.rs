//! The fingerprint guard reads JSON by RFC 8785: one request however a
//! client writes its numbers, an ambiguous body refused, and only JSON media
//! types read as JSON. Memory store and real Redis.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common::with_stores;
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use norepeat::fingerprint::{FingerprintGuard, FingerprintLayer};
use norepeat::store::{AnyStore, MemoryStore};
use norepeat_testkit::send;
use std::time::Duration;

fn app(store: AnyStore) -> Router {
    Router::new().route(
        "/orders",
        post(|| async { (StatusCode::CREATED, "created") }).layer(FingerprintLayer::new(
            FingerprintGuard::new(store).window(Duration::from_secs(10)),
        )),
    )
}

/// `POST /orders` as user `u1`, with `body` of `content_type`.
fn order(content_type: &str, body: &'static str) -> Request<Body> {
    Request::post("/orders")
        .header("x-user-id", "u1")
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test]
async fn one_and_one_point_zero_are_one_request() {
    with_stores(|store| async move {
        let app = app(store);
        const JSON: &str = "application/json";
        assert_eq!(
            send(&app, order(JSON, r#"{"sku":"S","quantity":1}"#))
                .await
                .status,
            StatusCode::CREATED
        );
        for retry in [
            r#"{"sku":"S","quantity":1.0}"#,
            r#"{"quantity":1e0,"sku":"S"}"#,
            r#"{ "sku" : "\u0053", "quantity" : 10E-1 }"#,
        ] {
            assert_eq!(
                send(&app, order(JSON, retry)).await.status,
                StatusCode::CONFLICT,
                "{retry}"
            );
        }
        // Numbers a double cannot tell apart are still different requests.
        assert_eq!(
            send(&app, order(JSON, r#"{"n":9007199254740992}"#))
                .await
                .status,
            StatusCode::CREATED
        );
        assert_eq!(
            send(&app, order(JSON, r#"{"n":9007199254740993}"#))
                .await
                .status,
            StatusCode::CREATED
        );
    })
    .await;
}

#[tokio::test]
async fn duplicate_keys_are_an_invalid_request() {
    with_stores(|store| async move {
        let app = app(store);
        for body in [
            r#"{"sku":"S","quantity":1,"quantity":2}"#,
            r#"{"sku":"S","meta":{"k":1,"k":1}}"#,
        ] {
            let answer = send(&app, order("application/json", body)).await;
            let problem = answer.text();
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(
                problem.contains("\"code\":\"invalid_request\""),
                "{problem}"
            );
            assert!(problem.contains("duplicate key"), "{problem}");
        }
    })
    .await;
}

#[tokio::test]
async fn only_json_media_types_are_read_as_json() {
    let app = app(AnyStore::Memory(MemoryStore::default()));
    // A +json type is JSON: key order does not matter.
    let ct = "application/vnd.shop+json; charset=utf-8";
    assert_eq!(
        send(&app, order(ct, r#"{"a":1,"b":2}"#)).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, order(ct, r#"{"b":2,"a":1}"#)).await.status,
        StatusCode::CONFLICT
    );
    // NDJSON is a stream of values, not JSON: its bytes are the request.
    let ct = "application/x-ndjson";
    assert_eq!(
        send(&app, order(ct, "{\"c\":1,\"d\":2}\n")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, order(ct, "{\"d\":2,\"c\":1}\n")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, order(ct, "{\"c\":1}\n{\"c\":2}\n")).await.status,
        StatusCode::CREATED,
        "two lines are not malformed JSON"
    );
    assert_eq!(
        send(&app, order(ct, "{\"c\":1,\"d\":2}\n")).await.status,
        StatusCode::CONFLICT
    );
}
