//! Unit tests of the document: routes, problem codes, links and headers of
//! the contract.

#![allow(clippy::unwrap_used)]

use super::*;

fn doc() -> Value {
    serde_json::from_str(document()).unwrap()
}

#[test]
fn is_openapi_3_1_with_every_route_of_the_contract() {
    let d = doc();
    assert!(d["openapi"].as_str().unwrap().starts_with("3.1"));
    let routes = [
        ("get", "/"),
        ("get", "/healthz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("get", "/repeat/token"),
        ("post", "/orders"),
        ("get", "/orders"),
        ("post", "/orders/quick"),
        ("get", "/orders/{orderId}"),
        ("get", "/stock/{sku}"),
        ("post", "/payments"),
        ("post", "/payments/callback"),
        ("post", "/demo/provider/notify"),
        ("post", "/flash-sale/{sku}"),
        ("get", "/points"),
        ("put", "/admin/stock/{sku}"),
        ("post", "/admin/reconcile"),
    ];
    for (method, path) in routes {
        assert!(
            d["paths"][path][method].is_object(),
            "{method} {path} is not in the document"
        );
    }
    let documented: usize = d["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|item| item.as_object().unwrap().len())
        .sum();
    assert_eq!(documented, routes.len(), "an undocumented extra operation");
}

#[test]
fn problem_codes_are_those_of_the_contract() {
    let d = doc();
    let codes: Vec<&str> = d["components"]["schemas"]["ProblemCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for code in [
        "invalid_request",
        "unauthenticated",
        "missing_token",
        "duplicate_submission",
        "token_expired",
        "out_of_stock",
        "not_found",
        "payload_too_large",
        "missing_idempotency_key",
        "invalid_idempotency_key",
        "idempotency_key_in_use",
        "idempotency_key_mismatch",
        "rate_limited",
        "invalid_transition",
        "order_not_payable",
        "invalid_signature",
        "guard_unavailable",
    ] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
    // The problem's members.
    let problem = &d["components"]["schemas"]["Problem"]["properties"];
    for member in ["type", "title", "status", "detail", "code", "paymentId"] {
        assert!(problem[member].is_object(), "{member} missing");
    }
}

#[test]
fn links_chain_token_order_payment_callback() {
    let d = doc();
    let link = |path: &str, method: &str, status: &str, name: &str| {
        d["paths"][path][method]["responses"][status]["links"][name].clone()
    };
    let place = link("/repeat/token", "get", "200", "placeOrder");
    assert_eq!(place["operationId"], "createOrder");
    assert_eq!(
        place["parameters"]["header.Repeat-Token"],
        "$response.body#/repeatToken"
    );
    let pay = link("/orders", "post", "201", "payOrder");
    assert_eq!(pay["operationId"], "createPayment");
    assert_eq!(pay["requestBody"]["orderId"], "$response.body#/orderId");
    assert!(pay.get("request_body").is_none());
    let notify = link("/payments", "post", "201", "notify");
    assert_eq!(notify["operationId"], "paymentCallback");
    // Every link names an operation of the document.
    let ids: Vec<&str> = d["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    for text in document().split("\"operationId\": \"").skip(1) {
        let id = text.split('"').next().unwrap();
        assert!(ids.contains(&id), "link to unknown operation {id}");
    }
}

#[test]
fn headers_of_the_contract_are_declared() {
    let text = document();
    for h in [
        "X-User-Id",
        "Idempotency-Key",
        "Repeat-Token",
        "X-Admin-Token",
        "Norepeat-Signature",
        "Retry-After",
        "Idempotent-Replayed",
        "RateLimit",
        "RateLimit-Policy",
    ] {
        assert!(text.contains(&format!("\"{h}\"")), "{h} missing");
    }
    let d = doc();
    let amount = &d["components"]["schemas"]["PaymentRequest"]["properties"]["amount"];
    assert_eq!(amount["minimum"], 1);
    assert_eq!(amount["maximum"], 10_000_000);
}

/// The shop reads `12.0` as `12` wherever it wants an integer; the document
/// says `integer` there, which JSON Schema (2020-12, OpenAPI 3.1's) defines
/// as any number with a zero fraction, so the two agree. A `multipleOf`, a
/// `pattern` or a `type` other than `integer` would not.
#[test]
fn integer_fields_are_json_schema_integers() {
    let d = doc();
    let schemas = &d["components"]["schemas"];
    for (schema, field) in [
        ("OrderRequest", "quantity"),
        ("FlashSaleRequest", "quantity"),
        ("PaymentRequest", "amount"),
        ("StockUpdate", "available"),
    ] {
        let p = &schemas[schema]["properties"][field];
        assert_eq!(p["type"], "integer", "{schema}.{field}: {p}");
        assert!(p.get("multipleOf").is_none(), "{schema}.{field}: {p}");
        assert!(
            p["description"].as_str().unwrap().contains("whole number"),
            "{schema}.{field}: {p}"
        );
    }
}
