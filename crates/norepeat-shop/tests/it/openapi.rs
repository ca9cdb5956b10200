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

/// The value of attribute `attr` in the page's tag with `id="{id}"`.
fn attribute(page: &str, id: &str, attr: &str) -> String {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element with id {id} on the page"));
    let start = page[..at].rfind('<').unwrap();
    let end = at + page[at..].find('>').unwrap();
    let tag = &page[start..end];
    let (_, rest) = tag
        .split_once(&format!(" {attr}=\""))
        .unwrap_or_else(|| panic!("{tag}: no {attr}"));
    rest.split('"').next().unwrap().to_owned()
}

/// The page's order form takes what the API takes, no more and no less: a
/// business id the page cut at 64 characters was one the API accepts (128).
#[tokio::test]
async fn the_pages_form_has_the_apis_limits() {
    let s = shop().await;
    let get = |uri: &'static str| {
        let app = s.app.clone();
        async move {
            let res = app
                .oneshot(Request::get(uri).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{uri}");
            let body = res.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(body.to_vec()).unwrap()
        }
    };
    let page = get("/").await;
    let doc: Value = serde_json::from_str(&get("/openapi.json").await).unwrap();

    let order = &doc["components"]["schemas"]["OrderRequest"]["properties"];
    assert_eq!(
        attribute(&page, "biz-id", "maxlength"),
        order["bizId"]["maxLength"].to_string(),
        "business id"
    );
    assert_eq!(
        attribute(&page, "quantity", "min"),
        order["quantity"]["minimum"].to_string(),
        "quantity"
    );
    assert_eq!(
        attribute(&page, "quantity", "max"),
        order["quantity"]["maximum"].to_string(),
        "quantity"
    );

    let user = doc["paths"]["/orders"]["post"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "X-User-Id")
        .unwrap();
    let max = user["schema"]["maxLength"].to_string();
    assert_eq!(attribute(&page, "user-id", "maxlength"), max, "user id");
    // The page checks the user id before it sends one: the same visible
    // ASCII (`!` to `~`), the same lengths.
    assert_eq!(user["schema"]["pattern"], format!("^[!-~]{{1,{max}}}$"));
    assert!(
        page.contains(&format!("const USER_ID = /^[\\x21-\\x7e]{{1,{max}}}$/;")),
        "the page's user id check"
    );
}
