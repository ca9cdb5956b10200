//! Two gateways on the master three Sentinels name (`store:
//! redis+sentinel://...?replicas=1`), in front of the order service of
//! `tests/backend.py`, which counts one effect per request it runs. The
//! master is killed with SIGKILL while payments (idempotency keys), token
//! orders and fingerprinted orders go on through both, each retried on
//! the other gateway until it is answered: no request runs twice, and
//! the gateways decide on the new master without a restart.

use crate::common::{StatusCode, backend, effects, file_for, gateway, pay_on, token_for, url};
use norepeat_testkit::RedisSentinels;
use std::time::{Duration, Instant};

const ROUTES: &str = "
  - match: POST /payments
    guard: idempotency
    retention: 5m
    timeout: 2s
  - match: POST /orders
    guard: token
    on_store_failure: closed
  - match: POST /orders/quick
    guard: fingerprint
    window: 5m
    on_store_failure: closed
";

/// An order guarded by a token (`Some`, the token) or by its body's
/// fingerprint (`None`), and its first answer.
struct Order {
    token: Option<String>,
    body: String,
    first: StatusCode,
}

/// Sends `order` through the gateways in turn, starting with `first`,
/// until one answers other than 503 (the store failed, so the backend was
/// not called, and its claim was taken back); its status.
async fn order_until_answered(
    gateways: &[&crate::common::Process],
    first: usize,
    token: Option<&str>,
    body: &str,
) -> StatusCode {
    let began = Instant::now();
    let path = if token.is_some() {
        "/orders"
    } else {
        "/orders/quick"
    };
    for attempt in 0.. {
        let mut req = reqwest::Client::new()
            .post(url(gateways[(first + attempt) % 2], path))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(token) = token {
            req = req.header("repeat-token", token);
        }
        let answer = req.send().await.unwrap();
        let status = answer.status();
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return status;
        }
        if began.elapsed() >= Duration::from_secs(90) {
            let why = answer.text().await.unwrap_or_default();
            panic!("{path} {body}: still {status} after 90 s: {why}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!()
}

/// A token order and a fingerprinted order named `name`, each sent until
/// answered; a 201 ran once, a 409 ran nothing (a try whose answer was
/// lost may have spent the token or taken the fingerprint).
async fn two_orders(gateways: &[&crate::common::Process], n: usize, name: &str) -> [Order; 2] {
    let issued = token_for(gateways[n % 2], "u1").await;
    let token = issued["repeatToken"].as_str().unwrap().to_owned();
    let body = format!("{{\"order\": \"{name}\"}}");
    let by_token = order_until_answered(gateways, n, Some(&token), &body).await;
    let by_body = order_until_answered(gateways, n + 1, None, &body).await;
    for status in [by_token, by_body] {
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "{name}: {status}"
        );
    }
    [
        Order {
            token: Some(token),
            body: body.clone(),
            first: by_token,
        },
        Order {
            token: None,
            body,
            first: by_body,
        },
    ]
}

/// Sends payment `key` through the gateways in turn, starting with
/// `first`, until one answers other than 503 (the store failed, so the
/// backend was not called) or 409 (a try whose outcome is unknown holds
/// the key); its status.
async fn pay_until_answered(
    gateways: &[&crate::common::Process],
    first: usize,
    key: &str,
) -> StatusCode {
    let began = Instant::now();
    for attempt in 0.. {
        let answer = pay_on(gateways[(first + attempt) % 2], "/payments", key).await;
        let status = answer.status();
        if status != StatusCode::SERVICE_UNAVAILABLE && status != StatusCode::CONFLICT {
            return status;
        }
        if began.elapsed() >= Duration::from_secs(90) {
            let body = answer.text().await.unwrap_or_default();
            panic!("{key}: still {status} after 90 s: {body}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_run_no_request_twice_across_a_failover() {
    let mut group = RedisSentinels::start().await;
    let backend = backend(0).await;
    let store = format!("{}?replicas=1&replicas_timeout=500ms", group.url());
    let (g1, g2) = (
        gateway(&file_for(backend.port, &store, ROUTES)).await,
        gateway(&file_for(backend.port, &store, ROUTES)).await,
    );
    let gateways = [&g1, &g2];
    let mut paid = Vec::new();
    let mut orders = Vec::new();
    for n in 0..20 {
        let key = format!("before-{n}");
        assert!(pay_until_answered(&gateways, n, &key).await.is_success());
        orders.extend(two_orders(&gateways, n, &key).await);
        paid.push(key);
    }

    let old = group.kill_master().await;
    // Payments go on, each retried across the gateways, until the
    // Sentinels promoted a replica and the gateways followed.
    let killed = Instant::now();
    let mut n = 0;
    let new = loop {
        let key = format!("during-{n}");
        assert!(pay_until_answered(&gateways, n, &key).await.is_success());
        orders.extend(two_orders(&gateways, n, &key).await);
        paid.push(key);
        n += 1;
        if n >= 5 && killed.elapsed() > Duration::from_secs(3) {
            break group.wait_for_failover(old).await;
        }
    };
    assert_ne!(new, old);
    for n in 0..20 {
        let key = format!("after-{n}");
        assert!(pay_until_answered(&gateways, n, &key).await.is_success());
        orders.extend(two_orders(&gateways, n, &key).await);
        paid.push(key);
    }

    // Every payment again, through the other gateway: each a replay.
    for (n, key) in paid.iter().enumerate() {
        let again = pay_until_answered(&gateways, n + 1, key).await;
        assert!(again.is_success(), "{key}: {again}");
    }
    // Every order again, through the other gateway: each refused (its
    // token spent, its fingerprint held), whatever its first answer.
    for (n, order) in orders.iter().enumerate() {
        let again =
            order_until_answered(&gateways, n + 1, order.token.as_deref(), &order.body).await;
        assert_eq!(again, StatusCode::CONFLICT, "{}: {again}", order.body);
    }
    let ran = effects(&backend).await;
    let count = |path: &str| ran[path].as_u64().unwrap_or(0);
    assert_eq!(
        count("/payments"),
        paid.len() as u64,
        "each of {} payments ran once",
        paid.len()
    );
    let created = |by_token: bool| {
        orders
            .iter()
            .filter(|o| o.token.is_some() == by_token && o.first == StatusCode::CREATED)
            .count() as u64
    };
    assert_eq!(
        count("/orders"),
        created(true),
        "token orders: one run per 201"
    );
    assert_eq!(
        count("/orders/quick"),
        created(false),
        "fingerprinted orders: one run per 201"
    );
    // Most orders got through: a 409 first is an order whose try was cut
    // off by the failover (its answer lost, its claim not taken back yet).
    let each = orders.len() as u64 / 2;
    assert!(
        created(true) * 4 >= each * 3 && created(false) * 4 >= each * 3,
        "{} and {} of {each} orders each",
        created(true),
        created(false)
    );
}
