//! A graceful stop: on `SIGTERM` the shop stops accepting, lets the
//! requests in flight and the payment handlers of clients that left
//! finish (at most 10 s), and exits 0.

use crate::common;

use common::BIN;
use norepeat_testkit::{ShopProcess, SqliteFile};
use serde_json::{Value, json};
use std::time::Duration;

async fn post(
    http: &reqwest::Client,
    url: String,
    key: Option<&str>,
    body: Value,
) -> reqwest::Result<(u16, Value)> {
    let mut req = http.post(url).header("x-user-id", "payer").json(&body);
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let res = req.send().await?;
    let status = res.status().as_u16();
    Ok((status, res.json().await.unwrap_or(Value::Null)))
}

/// The number of payments the Idempotency-Key layer admitted, from `/metrics`.
async fn admitted(http: &reqwest::Client, base: &str) -> u64 {
    let labels = [("mode", "idempotency"), ("outcome", "admitted")];
    common::scrape(http, base, "norepeat_decisions_total", &labels).await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_slow_payments_finish_and_exits_0() {
    let db = SqliteFile::new();
    let url = db.url();
    let env = vec![
        ("DATABASE_URL".to_owned(), url.clone()),
        ("NOREPEAT_PAYMENT_LATENCY_MS".to_owned(), "2000".to_owned()),
    ];
    let mut shop = ShopProcess::start(BIN, env).await;
    let base = shop.base_url();
    let http = reqwest::Client::new();
    let mut orders = Vec::new();
    for _ in 0..2 {
        let body =
            json!({"sku": "SKU-1", "quantity": 1, "bizId": rand::random::<u64>().to_string()});
        let (s, o) = post(&http, format!("{base}/orders/quick"), None, body)
            .await
            .unwrap();
        assert_eq!(s, 201, "{o}");
        orders.push(o["orderId"].as_str().unwrap().to_owned());
    }

    // One client waits for its payment; another, a second later, gives up
    // at once and leaves its handler running, detached, after the first
    // request has ended (the server alone would not wait for it).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let until_admitted = |n: u64| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            while admitted(&http, &base).await < n {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "payments not admitted"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let waiting = {
        let (http, url) = (http.clone(), format!("{base}/payments"));
        let body = json!({"orderId": orders[0], "amount": 1999});
        tokio::spawn(async move { post(&http, url, Some("k-wait"), body).await })
    };
    until_admitted(1).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let leaving = {
        let (http, url) = (http.clone(), format!("{base}/payments"));
        let body = json!({"orderId": orders[1], "amount": 1999});
        tokio::spawn(async move { post(&http, url, Some("k-leave"), body).await })
    };
    until_admitted(2).await;
    leaving.abort();

    shop.terminate();
    let (status, payment) = waiting.await.unwrap().unwrap();
    assert_eq!(status, 201, "the request in flight finishes: {payment}");
    let exit = shop
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the shop exits");
    assert_eq!(exit.code(), Some(0), "{exit}");

    // The handler whose client left finished too: both payments exist.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    for order in &orders {
        let n: i64 =
            sqlx::query_scalar("SELECT CAST(COUNT(*) AS BIGINT) FROM payments WHERE order_id = $1")
                .bind(order)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(n, 1, "order {order}");
    }
    pool.close().await;
}

/// The grace has an end: a payment handler that would run for a minute
/// holds the stop for the 10 s grace, not for its minute, and the shop
/// still exits 0. (Bounds are generous: the point is "10 s, not 60 s".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_a_running_handler_at_most_the_grace() {
    let db = SqliteFile::new();
    let env = vec![
        ("DATABASE_URL".to_owned(), db.url()),
        ("NOREPEAT_PAYMENT_LATENCY_MS".to_owned(), "60000".to_owned()),
    ];
    let mut shop = ShopProcess::start(BIN, env).await;
    let base = shop.base_url();
    let http = reqwest::Client::new();
    let body = json!({"sku": "SKU-1", "quantity": 1, "bizId": rand::random::<u64>().to_string()});
    let (s, order) = post(&http, format!("{base}/orders/quick"), None, body)
        .await
        .unwrap();
    assert_eq!(s, 201, "{order}");
    let paying = {
        let (http, url) = (http.clone(), format!("{base}/payments"));
        let body = json!({"orderId": order["orderId"], "amount": 1999});
        tokio::spawn(async move { post(&http, url, Some("k-long"), body).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while admitted(&http, &base).await < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "payment not admitted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = std::time::Instant::now();
    shop.terminate();
    let exit = shop
        .wait_exit(Duration::from_secs(40))
        .await
        .expect("the shop exits before its handler's minute is up");
    let took = asked.elapsed();
    assert_eq!(exit.code(), Some(0), "{exit}");
    assert!(
        took >= Duration::from_secs(9),
        "it waited for the handler, up to the grace: {took:?}"
    );
    paying.abort();
}
