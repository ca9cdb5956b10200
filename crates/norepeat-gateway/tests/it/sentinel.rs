//! Two gateways on the master three Sentinels name (`store:
//! redis+sentinel://...?replicas=1`), in front of the order service of
//! `tests/backend.py`, which counts one effect per request it runs. The
//! master is killed with SIGKILL while payments (idempotency keys), token
//! orders and fingerprinted orders go on through both, each retried on
//! the other gateway until it is answered: no request runs twice, and
//! the gateways decide on the new master without a restart.

use crate::common::{
    Process, StatusCode, backend, effects, file_for, gateway, payment, token_for, url,
};
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

/// Sends the request `build` makes for each gateway in turn, starting
/// with `first`, until one answers other than 503 (the store failed, so
/// the backend was not called and the claim was taken back) or, where
/// `conflict_is_a_try`, 409 (a try whose outcome is unknown holds the
/// key); its status. `what` names the request in a failure.
async fn until_answered(
    gateways: &[&Process],
    first: usize,
    what: &str,
    conflict_is_a_try: bool,
    build: impl Fn(&Process) -> reqwest::RequestBuilder,
) -> StatusCode {
    let began = Instant::now();
    for attempt in 0.. {
        let answer = build(gateways[(first + attempt) % 2]).send().await.unwrap();
        let status = answer.status();
        let a_try = status == StatusCode::SERVICE_UNAVAILABLE
            || (conflict_is_a_try && status == StatusCode::CONFLICT);
        if !a_try {
            return status;
        }
        if began.elapsed() >= Duration::from_secs(90) {
            let why = answer.text().await.unwrap_or_default();
            panic!("{what}: still {status} after 90 s: {why}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!()
}

/// Order `body`, by its token when it has one, else by its fingerprint,
/// sent until answered (see [`until_answered`]; a 409 is an answer).
async fn order_until_answered(
    gateways: &[&Process],
    first: usize,
    token: Option<&str>,
    body: &str,
) -> StatusCode {
    let path = if token.is_some() {
        "/orders"
    } else {
        "/orders/quick"
    };
    until_answered(gateways, first, &format!("{path} {body}"), false, |g| {
        let req = reqwest::Client::new()
            .post(url(g, path))
            .header("x-user-id", "u1")
            .header("content-type", "application/json")
            .body(body.to_owned());
        match token {
            Some(token) => req.header("repeat-token", token),
            None => req,
        }
    })
    .await
}

/// A token order and a fingerprinted order named `name`, each sent until
/// answered; a 201 ran once, a 409 ran nothing (a try whose answer was
/// lost may have spent the token or taken the fingerprint).
async fn two_orders(gateways: &[&Process], n: usize, name: &str) -> [Order; 2] {
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

/// Payment `key` sent until answered (see [`until_answered`]; a 409 is
/// a try: an unknown outcome may hold the key for a while).
async fn pay_until_answered(gateways: &[&Process], first: usize, key: &str) -> StatusCode {
    until_answered(gateways, first, key, true, |g| payment(g, "/payments", key)).await
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
