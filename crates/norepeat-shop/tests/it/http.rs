// Over 400 lines: the whole HTTP contract through the router, one test per rule of the shop's contract, on one set of helpers.
//! The shop's HTTP contract, driven through the router (SQLite, memory store).

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Answer, RouterShop as Shop, sample};
use norepeat::store::{AnyStore, MemoryStore};
use norepeat_shop::app::AppState;
use norepeat_shop::config::ShopConfig;
use norepeat_shop::db::Db;
use norepeat_shop::events::Events;
use norepeat_testkit::SqliteFile;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn shop() -> Shop {
    Shop::with(ShopConfig {
        admin_token: Some("secret".into()),
        ..ShopConfig::default()
    })
    .await
}

impl Shop {
    async fn get(&self, path: &str, user: Option<&str>) -> Answer {
        let mut b = Request::get(path);
        if let Some(u) = user {
            b = b.header("x-user-id", u);
        }
        self.send(b.body(Body::empty()).unwrap()).await
    }

    async fn post(&self, path: &str, user: &str, headers: &[(&str, &str)], body: Value) -> Answer {
        let mut b = Request::post(path)
            .header("x-user-id", user)
            .header("content-type", "application/json");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.send(b.body(Body::from(body.to_string())).unwrap())
            .await
    }

    async fn token(&self, user: &str) -> String {
        let a = self.get("/repeat/token", Some(user)).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body["expiresIn"], 60);
        a.body["repeatToken"].as_str().unwrap().to_owned()
    }

    async fn stock(&self, sku: &str) -> i64 {
        self.get(&format!("/stock/{sku}"), None).await.body["available"]
            .as_i64()
            .unwrap()
    }
}

#[tokio::test]
async fn the_token_flow() {
    let s = shop().await;
    let order = json!({"sku": "SKU-1", "quantity": 2, "note": "ignored"});
    let a = s.post("/orders", "u1", &[], order.clone()).await;
    assert_eq!(
        (a.status.as_u16(), a.body["code"].as_str()),
        (400, Some("missing_token"))
    );

    let t = s.token("u1").await;
    let a = s
        .post("/orders", "u1", &[("repeat-token", &t)], order.clone())
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    for field in ["orderId", "bizId", "userId", "sku", "quantity", "status"] {
        assert!(a.body.get(field).is_some(), "{field} missing: {}", a.body);
    }
    assert_eq!(a.body["userId"], "u1");
    assert_eq!(a.body["status"], "UNPAID");
    assert_eq!(s.stock("SKU-1").await, 98);

    let again = s
        .post("/orders", "u1", &[("repeat-token", &t)], order.clone())
        .await;
    assert_eq!(
        (again.status.as_u16(), again.body["code"].as_str()),
        (409, Some("duplicate_submission"))
    );

    let theirs = s.token("u2").await;
    let a = s
        .post("/orders", "u1", &[("repeat-token", &theirs)], order)
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(s.stock("SKU-1").await, 98);
}

#[tokio::test]
async fn a_known_biz_id_returns_the_existing_order() {
    let s = shop().await;
    let order = json!({"sku": "SKU-2", "quantity": 1, "bizId": "cart-42"});
    let t1 = s.token("u1").await;
    let first = s
        .post("/orders", "u1", &[("repeat-token", &t1)], order.clone())
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let t2 = s.token("u1").await;
    let second = s
        .post("/orders", "u1", &[("repeat-token", &t2)], order.clone())
        .await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.headers["idempotent-replayed"], "true");
    assert_eq!(second.body["orderId"], first.body["orderId"]);
    assert_eq!(s.stock("SKU-2").await, 99);
    // Another user's equal bizId is another order.
    let t3 = s.token("u2").await;
    let other = s
        .post("/orders", "u2", &[("repeat-token", &t3)], order)
        .await;
    assert_eq!(other.status, StatusCode::CREATED);
}

#[tokio::test]
async fn the_fingerprint_route() {
    let s = shop().await;
    let a = s
        .post(
            "/orders/quick",
            "u1",
            &[],
            json!({"sku": "SKU-1", "quantity": 1, "traceId": "a"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let dup = s
        .post(
            "/orders/quick",
            "u1",
            &[],
            json!({"traceId": "b", "quantity": 1, "sku": "SKU-1"}),
        )
        .await;
    assert_eq!(
        (dup.status.as_u16(), dup.body["code"].as_str()),
        (409, Some("duplicate_submission"))
    );
    let retry_after: u64 = dup.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&retry_after));
    // The route reads no query: a parameter added to the same submission
    // (a cache-buster, a stray token) does not make it another one.
    for path in ["/orders/quick?a=1", "/orders/quick?repeatToken=zzz&_=2"] {
        let again = s
            .post(path, "u1", &[], json!({"sku": "SKU-1", "quantity": 1}))
            .await;
        assert_eq!(
            (again.status.as_u16(), again.body["code"].as_str()),
            (409, Some("duplicate_submission")),
            "{path}"
        );
    }
    let other = s
        .post(
            "/orders/quick",
            "u1",
            &[],
            json!({"sku": "SKU-1", "quantity": 3}),
        )
        .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(s.stock("SKU-1").await, 96);
}

#[tokio::test]
async fn a_failed_quick_order_can_be_retried_at_once() {
    let s = shop().await;
    // Out of stock is a 4xx: the fingerprint is released, a retry is let in.
    let a = s
        .post(
            "/orders/quick",
            "u1",
            &[],
            json!({"sku": "SKU-3", "quantity": 100}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let b = s
        .post(
            "/orders/quick",
            "u1",
            &[],
            json!({"sku": "SKU-3", "quantity": 1}),
        )
        .await;
    assert_eq!(
        (b.status.as_u16(), b.body["code"].as_str()),
        (409, Some("out_of_stock"))
    );
    let c = s
        .post(
            "/orders/quick",
            "u1",
            &[],
            json!({"sku": "SKU-3", "quantity": 1}),
        )
        .await;
    assert_eq!(
        c.body["code"], "out_of_stock",
        "retry reached the handler again"
    );
}

#[tokio::test]
async fn validation_answers_invalid_request() {
    let s = shop().await;
    for body in [
        json!({"sku": "SKU-1", "quantity": 0}),
        json!({"sku": "SKU-1", "quantity": 101}),
        json!({"sku": "SKU-1", "quantity": "1"}),
        json!({"sku": "SKU-1", "quantity": 1.5}),
        json!({"sku": "", "quantity": 1}),
        json!({"sku": "x".repeat(65), "quantity": 1}),
        json!({"sku": 5, "quantity": 1}),
        json!({"quantity": 1}),
        json!([1, 2]),
        json!({"sku": "SKU-1", "quantity": 1, "bizId": 7}),
    ] {
        let a = s.post("/orders/quick", "u1", &[], body.clone()).await;
        assert_eq!(
            (a.status.as_u16(), a.body["code"].as_str()),
            (400, Some("invalid_request")),
            "{body}"
        );
    }
    let a = s
        .post(
            "/orders/quick",
            "u1",
            &[],
            json!({"sku": "NOPE", "quantity": 1}),
        )
        .await;
    assert_eq!(
        (a.status.as_u16(), a.body["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test]
async fn malformed_requests_get_4xx_never_5xx() {
    let s = shop().await;
    let raw = |path: &str, user: &[u8], body: Vec<u8>| {
        Request::post(path)
            .header(
                "x-user-id",
                axum::http::HeaderValue::from_bytes(user).unwrap(),
            )
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    let t = s.token("u1").await;
    let cases: Vec<(Request<Body>, u16, &str)> = vec![
        (
            raw("/orders/quick", b"u1", b"{\"sku\":".to_vec()),
            400,
            "invalid_request",
        ),
        (
            raw("/orders/quick", b"u1", Vec::new()),
            400,
            "invalid_request",
        ),
        (
            raw("/orders/quick", b"u1", vec![b'7'; 100 * 1024]),
            413,
            "payload_too_large",
        ),
        (
            raw("/orders/quick", &[b'u'; 200], b"{}".to_vec()),
            401,
            "unauthenticated",
        ),
        (
            raw("/orders/quick", b"\xff\xfe", b"{}".to_vec()),
            401,
            "unauthenticated",
        ),
        (
            Request::post("/orders")
                .header("x-user-id", "u1")
                .header("repeat-token", &t)
                .body(Body::from(vec![b' '; 100 * 1024]))
                .unwrap(),
            413,
            "payload_too_large",
        ),
        (
            Request::post("/orders")
                .header("x-user-id", "u1")
                .header("repeat-token", "x".repeat(10 * 1024))
                .body(Body::from("{}"))
                .unwrap(),
            409,
            "duplicate_submission",
        ),
        (
            raw("/payments/callback", b"u1", b"nope".to_vec()),
            400,
            "invalid_request",
        ),
    ];
    for (req, status, code) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let a = s.send(req).await;
        assert_eq!(
            (a.status.as_u16(), a.body["code"].as_str()),
            (status, Some(code)),
            "{what}"
        );
    }
}

#[tokio::test]
async fn identity_is_required_where_the_contract_says() {
    let s = shop().await;
    for path in ["/repeat/token", "/orders", "/points"] {
        let a = s.get(path, None).await;
        assert_eq!(
            (a.status.as_u16(), a.body["code"].as_str()),
            (401, Some("unauthenticated")),
            "{path}"
        );
    }
}

/// A proxy that appends `X-User-Id` rather than replacing it must not let
/// the client pick the first: the header twice is no identity, on every
/// route that needs one.
#[tokio::test]
async fn the_user_header_twice_is_401() {
    let s = shop().await;
    let t = s.token("u1").await;
    let requests = [
        Request::get("/repeat/token"),
        Request::get("/orders"),
        Request::get("/points"),
        Request::post("/orders").header("repeat-token", &t),
        Request::post("/orders/quick"),
        Request::post("/payments").header("idempotency-key", "k-1"),
        Request::post("/flash-sale/SKU-1"),
    ];
    for b in requests {
        let req = b
            .header("x-user-id", "mallory")
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"sku":"SKU-1","quantity":1,"orderId":"o","amount":1}"#,
            ))
            .unwrap();
        let what = format!("{} {}", req.method(), req.uri());
        let a = s.send(req).await;
        assert_eq!(
            (a.status.as_u16(), a.body["code"].as_str()),
            (401, Some("unauthenticated")),
            "{what}"
        );
    }
}

#[tokio::test]
async fn reading_orders_and_stock() {
    let s = shop().await;
    let a = s
        .post(
            "/orders/quick",
            "u9",
            &[],
            json!({"sku": "SKU-1", "quantity": 1}),
        )
        .await;
    let id = a.body["orderId"].as_str().unwrap().to_owned();
    let list = s.get("/orders", Some("u9")).await;
    assert_eq!(list.body["orders"].as_array().unwrap().len(), 1);
    assert_eq!(s.get("/orders", Some("u8")).await.body["orders"], json!([]));
    let one = s.get(&format!("/orders/{id}"), Some("u9")).await;
    assert_eq!(one.body["orderId"], id.as_str());
    assert_eq!(
        s.get("/orders/ord_nope", Some("u9")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        s.get("/stock/NOPE", None).await.status,
        StatusCode::NOT_FOUND
    );
    // A sku over 64 characters is malformed, not unknown: 400, as in a body.
    let long = s.get(&format!("/stock/{}", "S".repeat(65)), None).await;
    assert_eq!(
        (long.status, long.body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    assert_eq!(s.get("/healthz", None).await.status, StatusCode::OK);
}

/// A method a route does not take is 405 as problem+json, with `Allow`.
#[tokio::test]
async fn a_wrong_method_is_405_problem_json() {
    let s = shop().await;
    for (method, path) in [
        ("DELETE", "/orders"),
        ("PUT", "/stock/SKU-1"),
        ("POST", "/repeat/token"),
        ("PATCH", "/payments"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("x-user-id", "u1")
            .body(Body::empty())
            .unwrap();
        let a = s.send(req).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(
            a.headers["content-type"], "application/problem+json",
            "{method} {path}"
        );
        assert_eq!(a.body["code"], "invalid_request", "{method} {path}");
        assert!(
            a.headers.contains_key("allow"),
            "{method} {path}: {:?}",
            a.headers
        );
    }
}

#[tokio::test]
async fn admin_routes_need_the_token() {
    let s = shop().await;
    let put = |token: Option<&str>, body: Value| {
        let mut b = Request::put("/admin/stock/SKU-1").header("content-type", "application/json");
        if let Some(t) = token {
            b = b.header("x-admin-token", t);
        }
        b.body(Body::from(body.to_string())).unwrap()
    };
    assert_eq!(
        s.send(put(None, json!({"available": 5}))).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        s.send(put(Some("wrong"), json!({"available": 5})))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        s.send(put(Some("secret"), json!({"available": -1})))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    let ok = s.send(put(Some("secret"), json!({"available": 5}))).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(s.stock("SKU-1").await, 5);
    // The token twice is refused, whichever copy is right (a proxy that
    // appends must not let a client pick the first), and the refusal says
    // what the admin routes need, not what a user route needs.
    for pair in [
        ["secret", "wrong"],
        ["wrong", "secret"],
        ["secret", "secret"],
    ] {
        let req = Request::put("/admin/stock/SKU-1")
            .header("content-type", "application/json")
            .header("x-admin-token", pair[0])
            .header("x-admin-token", pair[1])
            .body(Body::from(json!({"available": 7}).to_string()))
            .unwrap();
        let a = s.send(req).await;
        assert_eq!(
            (a.status, a.body["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthenticated")),
            "{pair:?}"
        );
        assert!(
            a.body["detail"].as_str().unwrap().contains("X-Admin-Token"),
            "{}",
            a.body
        );
    }
    assert_eq!(s.stock("SKU-1").await, 5);

    let closed = Shop::with(ShopConfig::default()).await;
    assert_eq!(
        closed
            .send(put(Some("secret"), json!({"available": 5})))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

impl Shop {
    async fn metrics(&self) -> String {
        let a = self.get("/metrics", None).await;
        assert_eq!(a.status, StatusCode::OK);
        String::from_utf8(a.bytes.to_vec()).unwrap()
    }
}

/// A quick order and its double: one 201, one 409 `duplicate_submission`,
/// and the decision counter grows by exactly one of each.
#[tokio::test]
async fn metrics_count_decisions() {
    let s = shop().await;
    let admitted = [("mode", "fingerprint"), ("outcome", "admitted")];
    let duplicate = [
        ("mode", "fingerprint"),
        ("outcome", "rejected"),
        ("reason", "duplicate"),
    ];
    let before = s.metrics().await;
    let order = json!({"sku": "SKU-1", "quantity": 1});
    let first = s.post("/orders/quick", "m1", &[], order.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let second = s.post("/orders/quick", "m1", &[], order).await;
    assert_eq!(second.code(), (409, "duplicate_submission"));
    let after = s.metrics().await;
    let grew = |labels: &[(&str, &str)]| {
        sample(&after, "norepeat_decisions_total", labels)
            - sample(&before, "norepeat_decisions_total", labels)
    };
    assert_eq!(grew(&admitted), 1.0, "{after}");
    assert_eq!(grew(&duplicate), 1.0, "{after}");
}

#[tokio::test]
async fn the_page_is_served() {
    let s = shop().await;
    let res = s
        .app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
}

/// `12.0` is the integer 12 wherever the shop wants an integer (JSON
/// Schema's `integer`, the document's type, admits it); `12.5` and values
/// out of range are still 400.
#[tokio::test]
async fn integers_may_carry_a_zero_fraction() {
    let s = shop().await;
    let code = |a: &Answer| {
        (
            a.status.as_u16(),
            a.body["code"].as_str().map(str::to_owned),
        )
    };
    let order = s
        .post(
            "/orders/quick",
            "z1",
            &[],
            json!({"sku": "SKU-1", "quantity": 12.0}),
        )
        .await;
    assert_eq!(order.status, StatusCode::CREATED, "{}", order.body);
    assert_eq!(order.body["quantity"], 12);
    for bad in [json!(12.5), json!(1e3), json!(0.0)] {
        let a = s
            .post(
                "/orders/quick",
                "z2",
                &[],
                json!({"sku": "SKU-1", "quantity": bad}),
            )
            .await;
        assert_eq!(code(&a), (400, Some("invalid_request".into())), "{bad}");
    }
    let flash = s
        .post("/flash-sale/SKU-2", "z1", &[], json!({"quantity": 2.0}))
        .await;
    assert_eq!(flash.status, StatusCode::CREATED, "{}", flash.body);

    let order_id = order.body["orderId"].as_str().unwrap();
    let bad = s
        .post(
            "/payments",
            "z1",
            &[("idempotency-key", "z-0")],
            json!({"orderId": order_id, "amount": 1999.5}),
        )
        .await;
    assert_eq!(code(&bad), (400, Some("invalid_request".into())));
    let paid = s
        .post(
            "/payments",
            "z1",
            &[("idempotency-key", "z-1")],
            json!({"orderId": order_id, "amount": 1999.0}),
        )
        .await;
    assert_eq!(paid.status, StatusCode::CREATED, "{}", paid.body);
    assert_eq!(paid.body["amount"], 1999);
    // The retry written as `1999` is the same request: the replay.
    let again = s
        .post(
            "/payments",
            "z1",
            &[("idempotency-key", "z-1")],
            json!({"orderId": order_id, "amount": 1999}),
        )
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, paid.body);

    let stock = s
        .send(
            Request::put("/admin/stock/SKU-3")
                .header("x-admin-token", "secret")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"available": 50.0}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(stock.status, StatusCode::OK, "{}", stock.body);
}

#[tokio::test]
async fn payments_replay_mismatch_and_key_rules() {
    let s = shop().await;
    let order = s
        .post(
            "/orders/quick",
            "p1",
            &[],
            json!({"sku": "SKU-1", "quantity": 1}),
        )
        .await;
    let order_id = order.body["orderId"].as_str().unwrap().to_owned();
    let pay = json!({"orderId": order_id, "amount": 1999});

    let a = s.post("/payments", "p1", &[], pay.clone()).await;
    assert_eq!(
        (a.status.as_u16(), a.body["code"].as_str()),
        (400, Some("missing_idempotency_key"))
    );
    for bad in ["", &"k".repeat(256), "a b"] {
        let a = s
            .post("/payments", "p1", &[("idempotency-key", bad)], pay.clone())
            .await;
        assert_eq!(
            (a.status.as_u16(), a.body["code"].as_str()),
            (400, Some("invalid_idempotency_key")),
            "{bad:?}"
        );
    }

    let first = s
        .post(
            "/payments",
            "p1",
            &[("idempotency-key", "pay-1")],
            pay.clone(),
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body["status"], "PENDING");
    assert_eq!(first.body["amount"], 1999);
    let again = s
        .post(
            "/payments",
            "p1",
            &[("idempotency-key", "pay-1")],
            pay.clone(),
        )
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, first.body);

    let other = json!({"orderId": order_id, "amount": 2000});
    let a = s
        .post("/payments", "p1", &[("idempotency-key", "pay-1")], other)
        .await;
    assert_eq!(
        (a.status.as_u16(), a.body["code"].as_str()),
        (422, Some("idempotency_key_mismatch"))
    );

    // Another user's order is not found; bad amounts are invalid.
    let a = s
        .post(
            "/payments",
            "p2",
            &[("idempotency-key", "pay-x")],
            pay.clone(),
        )
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    for (i, amount) in [json!(0), json!(-5), json!("10"), json!(1.5)]
        .into_iter()
        .enumerate()
    {
        // Each with its own key: a 400 is stored and replayed for its key.
        let key = format!("pay-bad-{i}");
        let a = s
            .post(
                "/payments",
                "p1",
                &[("idempotency-key", &key)],
                json!({"orderId": order_id, "amount": amount}),
            )
            .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{amount}");
    }

    // The provider's notices: applied once, then already applied; a FAILED
    // notice after success is an invalid transition.
    let payment_id = first.body["paymentId"].as_str().unwrap().to_owned();
    let notice = |status: &str| json!({"paymentId": payment_id, "status": status});
    let a = s
        .post("/payments/callback", "provider", &[], notice("SUCCESS"))
        .await;
    assert_eq!(a.body, json!({"result": "applied"}));
    let a = s
        .post("/payments/callback", "provider", &[], notice("SUCCESS"))
        .await;
    assert_eq!(a.body, json!({"result": "already_applied"}));
    let a = s
        .post("/payments/callback", "provider", &[], notice("FAILED"))
        .await;
    assert_eq!(
        (a.status.as_u16(), a.body["code"].as_str()),
        (409, Some("invalid_transition"))
    );
    let a = s
        .post(
            "/payments/callback",
            "provider",
            &[],
            json!({"paymentId": "pay_nope", "status": "SUCCESS"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let o = s.get(&format!("/orders/{order_id}"), Some("p1")).await;
    assert_eq!(o.body["status"], "PAID");
}

#[tokio::test]
async fn payments_fail_closed_when_the_store_is_down() {
    let (state, file) = common::state(ShopConfig::default()).await;
    state.outage.set_down(true);
    let s = Shop::new(state, file);
    let res = s
        .app
        .clone()
        .oneshot(
            Request::post("/payments")
                .header("x-user-id", "p1")
                .header("idempotency-key", "k1")
                .body(Body::from(r#"{"orderId":"x","amount":1}"#))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    let body: Value = serde_json::from_slice(
        &axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(body["code"], "guard_unavailable");
    // Fail-open routes keep working through the outage.
    let a = s
        .post(
            "/orders/quick",
            "p1",
            &[],
            json!({"sku": "SKU-1", "quantity": 1}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let dup = s
        .post(
            "/orders/quick",
            "p1",
            &[],
            json!({"sku": "SKU-1", "quantity": 1}),
        )
        .await;
    assert_eq!(
        dup.status,
        StatusCode::CONFLICT,
        "the local fallback still catches the repeat"
    );
}

#[tokio::test]
async fn the_flash_sale_is_rate_limited_per_user() {
    let s = Shop::with(ShopConfig {
        flash_rate: "3/m".into(),
        ..ShopConfig::default()
    })
    .await;
    for i in 0..3 {
        let a = s
            .post("/flash-sale/SKU-2", "f1", &[], json!({"quantity": 1}))
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "request {i}");
        assert!(a.headers.contains_key("ratelimit"));
    }
    let a = s
        .post("/flash-sale/SKU-2", "f1", &[], json!({"quantity": 1}))
        .await;
    assert_eq!(
        (a.status.as_u16(), a.body["code"].as_str()),
        (429, Some("rate_limited"))
    );
    for h in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert!(a.headers.contains_key(h), "{h} missing");
    }
    // Another user has their own allowance.
    let b = s
        .post("/flash-sale/SKU-2", "f2", &[], json!({"quantity": 1}))
        .await;
    assert_eq!(b.status, StatusCode::CREATED);
    let none = s
        .send(
            Request::post("/flash-sale/SKU-2")
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_bad_flash_rate_stops_the_start() {
    let file = SqliteFile::new();
    let db = Db::connect(Some(&file.url())).await.unwrap();
    for rate in ["0/s", "five/s", "5/day"] {
        let cfg = ShopConfig {
            flash_rate: rate.into(),
            ..ShopConfig::default()
        };
        let r = AppState::with(
            db.clone(),
            AnyStore::Memory(MemoryStore::default()),
            cfg,
            Events::disabled(),
        )
        .await;
        assert!(r.is_err(), "{rate} accepted");
        let cfg = ShopConfig {
            payment_rate: rate.into(),
            ..ShopConfig::default()
        };
        let r = AppState::with(
            db.clone(),
            AnyStore::Memory(MemoryStore::default()),
            cfg,
            Events::disabled(),
        )
        .await;
        let Err(e) = r else {
            panic!("payment rate {rate} accepted")
        };
        assert!(e.to_string().contains("NOREPEAT_PAYMENT_RATE"), "{e}");
    }
}
