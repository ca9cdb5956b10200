//! Tokens, fingerprints, rate limits and shadow mode through the binary.

use crate::common::*;

#[tokio::test]
async fn double_submit_on_a_fingerprint_route_runs_once() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let send = |trace: &'static str| {
        c.post(url(&g, "/orders/quick"))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(format!(r#"{{"sku":"a1","qty":1,"traceId":"{trace}"}}"#))
            .send()
    };
    assert_eq!(send("t1").await.unwrap().status(), 201);
    assert_eq!(
        code(send("t2").await.unwrap()).await,
        (StatusCode::CONFLICT, "duplicate_submission".into())
    );
    assert_eq!(effects(&b).await["/orders/quick"], 1);
}

#[tokio::test]
async fn a_token_route_wants_a_token_and_takes_it_once() {
    let b = backend(0).await;
    let yaml = file(&b, "memory", ROUTES).replace("X-User-Id\n", "X-User-Id\n  required: true\n");
    let g = gateway(&yaml).await;
    let c = Client::new();
    let bare = c
        .post(url(&g, "/orders"))
        .header("x-user-id", "u1")
        .send()
        .await
        .unwrap();
    assert_eq!(code(bare).await.1, "missing_token");
    let issued = token_for(&g, "u1").await;
    assert!(issued["expiresIn"].as_u64().unwrap() > 0);
    let order = || {
        c.post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .header("repeat-token", issued["repeatToken"].as_str().unwrap())
            .send()
    };
    assert_eq!(order().await.unwrap().status(), 201);
    assert_eq!(code(order().await.unwrap()).await.0, StatusCode::CONFLICT);
    assert_eq!(effects(&b).await["/orders"], 1);
    // `required: true`: no X-User-Id is no caller, on the route and for a token.
    let anonymous = c.post(url(&g, "/orders")).send().await.unwrap();
    assert_eq!(
        code(anonymous).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".into())
    );
    let no_token = c.get(url(&g, "/.norepeat/token")).send().await.unwrap();
    assert_eq!(
        code(no_token).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".into())
    );
}

#[tokio::test]
async fn a_shadow_route_lets_every_request_through_and_counts() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    for _ in 0..3 {
        let res = c
            .post(url(&g, "/coupons/c7/redeem"))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(r#"{"coupon":"c7"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
    }
    assert_eq!(effects(&b).await["/coupons/c7/redeem"], 3);
    let text = c
        .get(url(&g, "/.norepeat/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"norepeat_gateway_requests_total{route="POST /coupons/{id}/redeem",outcome="passed"} 3"#),
        "{text}"
    );
    assert!(
        !text.contains("/coupons/c7"),
        "the route is labelled by its match, never the path"
    );
    let shadow = text
        .lines()
        .find(|l| l.starts_with("norepeat_shadow_total") && l.contains("duplicate"))
        .unwrap_or_else(|| panic!("no shadow count: {text}"));
    assert!(shadow.ends_with(" 2"), "{shadow}");
    assert!(
        text.contains(r#"norepeat_gateway_shadow_total{route="POST /coupons/{id}/redeem",would="duplicate"} 2"#),
        "{text}"
    );
    assert!(
        text.contains("norepeat_gateway_upstream_seconds_bucket"),
        "{text}"
    );
    let health = health_once(&g, "store_answers", true.into()).await;
    assert_eq!(
        health,
        serde_json::json!({"status":"ok","routes":7,"store":"memory","records":null,"store_persistent":null,"store_lost_data_at":null,"breaker":"Closed",
            "store_answers":true,"refusing":[],"last_reload":null})
    );
    assert_eq!(
        c.get(url(&g, "/.norepeat/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn a_rate_limited_route_counts_per_caller() {
    let b = backend(0).await;
    let g = gateway(&file(&b, "memory", ROUTES)).await;
    let c = Client::new();
    let buy = |user: &'static str, sku: &'static str| {
        c.post(url(&g, &format!("/flash-sale/{sku}")))
            .header("x-user-id", user)
            .send()
    };
    // The route is the template: two SKUs share one budget.
    assert_eq!(buy("u1", "a").await.unwrap().status(), 201);
    assert_eq!(buy("u1", "b").await.unwrap().status(), 201);
    assert_eq!(
        code(buy("u1", "c").await.unwrap()).await,
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited".into())
    );
    assert_eq!(
        buy("u2", "c").await.unwrap().status(),
        201,
        "another caller has its own budget"
    );
    let e = effects(&b).await;
    assert_eq!(
        (e["/flash-sale/a"].clone(), e["/flash-sale/c"].clone()),
        (1.into(), 1.into())
    );
    let text = c
        .get(url(&g, "/.norepeat/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"norepeat_gateway_requests_total{route="POST /flash-sale/{sku}",outcome="rate_limited"} 1"#),
        "{text}"
    );
}

/// A token route whose backend could not be reached (502, nothing sent)
/// does not use up the token: the retry with the same token reaches the
/// backend once it is up. Before: 409 "already submitted", and no order.
#[tokio::test]
async fn a_token_is_not_used_up_by_a_request_that_never_reached_the_backend() {
    let port = free_port();
    let g = gateway(&file_for(port, "memory", ROUTES)).await;
    let token = token_for(&g, "u1").await;
    let order = || {
        Client::new()
            .post(url(&g, "/orders"))
            .header("x-user-id", "u1")
            .header("repeat-token", token["repeatToken"].as_str().unwrap())
            .send()
    };
    assert_eq!(
        code(order().await.unwrap()).await,
        (StatusCode::BAD_GATEWAY, "upstream_unavailable".into())
    );
    let b = backend(port).await;
    assert_eq!(
        order().await.unwrap().status(),
        201,
        "the token was used up"
    );
    assert_eq!(
        code(order().await.unwrap()).await,
        (StatusCode::CONFLICT, "duplicate_submission".into())
    );
    assert_eq!(effects(&b).await["/orders"], 1);
}

/// Issue 40, item 4: contract points that had no test through the binary.
/// Fixed and sliding windows (the README credited them to a test that
/// serves only GCRA), `by: address` (two callers from one address share a
/// budget), and per-caller keys (one key, two callers, two effects).
#[tokio::test]
async fn every_rate_limit_algorithm_and_address_budgets_hold_through_the_gateway() {
    let b = backend(0).await;
    let routes = "
  - match: POST /fixed
    rate_limit: { algorithm: fixed_window, rate: 2/m }
  - match: POST /sliding
    rate_limit: { algorithm: sliding_window, rate: 2/m }
  - match: POST /by-address
    rate_limit: { algorithm: gcra, rate: 2/m, burst: 2, by: address }
";
    let g = gateway(&file(&b, "memory", routes)).await;
    let c = Client::new();
    let send = |path: &'static str, user: &'static str| {
        c.post(url(&g, path))
            .header("x-user-id", user)
            .body("{}")
            .send()
    };
    for path in ["/fixed", "/sliding"] {
        assert_eq!(send(path, "u1").await.unwrap().status(), 201, "{path}");
        assert_eq!(send(path, "u1").await.unwrap().status(), 201, "{path}");
        let third = send(path, "u1").await.unwrap();
        assert!(third.headers().contains_key("retry-after"), "{path}");
        assert_eq!(
            code(third).await,
            (StatusCode::TOO_MANY_REQUESTS, "rate_limited".into()),
            "{path}"
        );
        assert_eq!(
            send(path, "u2").await.unwrap().status(),
            201,
            "{path}: another caller"
        );
        assert_eq!(effects(&b).await[path], 3, "{path}");
    }
    // One address: u1 and u2 spend one budget.
    assert_eq!(send("/by-address", "u1").await.unwrap().status(), 201);
    assert_eq!(send("/by-address", "u2").await.unwrap().status(), 201);
    assert_eq!(
        code(send("/by-address", "u3").await.unwrap()).await.1,
        "rate_limited"
    );
}

/// Issue 40, item 4: a fingerprint route leaves the library's four default
/// fields (`traceId`, `timestamp`, `random`, `sign`) out of the
/// fingerprint, as documented, and `ignore_default_fields: false` makes
/// them count (two bodies differing only in `sign` are two orders).
#[tokio::test]
async fn the_library_default_fields_are_left_out_unless_the_file_makes_them_count() {
    let b = backend(0).await;
    let routes = "
  - match: POST /quick
    guard: fingerprint
    window: 1m
  - match: POST /signed
    guard: fingerprint
    window: 1m
    ignore_default_fields: false
";
    let g = gateway(&file(&b, "memory", routes)).await;
    let c = Client::new();
    let order = |path: &'static str, sign: &'static str| {
        c.post(url(&g, path))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(format!(r#"{{"sku":"s1","sign":"{sign}"}}"#))
            .send()
    };
    assert_eq!(order("/quick", "a").await.unwrap().status(), 201);
    assert_eq!(
        order("/quick", "b").await.unwrap().status(),
        409,
        "sign is left out"
    );
    assert_eq!(order("/signed", "a").await.unwrap().status(), 201);
    assert_eq!(
        order("/signed", "b").await.unwrap().status(),
        201,
        "sign counts"
    );
    assert_eq!(order("/signed", "b").await.unwrap().status(), 409);
}
