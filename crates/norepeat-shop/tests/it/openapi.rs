//! `GET /openapi.json` through the router, and answers the document relies
//! on (SQLite, memory store).

// Test helpers unwrap too: a failure there is a failed test.
use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::RouterShop;
use http_body_util::BodyExt;
use norepeat_shop::config::ShopConfig;
use serde_json::Value;
use tower::ServiceExt;

async fn shop() -> RouterShop {
    RouterShop::with(ShopConfig::default()).await
}

#[tokio::test]
async fn the_document_is_served_as_openapi_3_1_json() {
    let s = shop().await;
    let res = s
        .app
        .clone()
        .oneshot(Request::get("/openapi.json").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let doc: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["paths"]["/repeat/token"]["get"]["responses"]["200"]["links"]["placeOrder"]["operationId"],
        "createOrder"
    );
}

/// Schemathesis's `unsupported_method` check found `TRACE /orders`
/// answered 400 `missing_token`: the token guard wrapped the route's 405
/// fallback too. A method the document does not list is 405.
#[tokio::test]
async fn an_undocumented_method_on_orders_is_405_not_a_token_problem() {
    let s = shop().await;
    for method in ["TRACE", "DELETE", "PATCH", "PUT"] {
        let res = s
            .app
            .clone()
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri("/orders")
                    .header("x-user-id", "u1")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} /orders"
        );
    }
    // The token route itself is still guarded.
    let res = s
        .app
        .clone()
        .oneshot(
            Request::post("/orders")
                .header("x-user-id", "u1")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"sku":"SKU-1","quantity":1}"#))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}
