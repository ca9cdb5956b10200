//! `order.paid` consumers across two shop processes: on NATS JetStream with
//! Redis and PostgreSQL, and on the embedded defaults (in-process queue,
//! memory store, one SQLite file). Every event is delivered several times
//! and the points arrive once; a consumer that fails before acknowledging
//! has the event delivered again and processed once.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
use crate::common;

use common::{BIN, env};
use norepeat_testkit::{PgDatabase, RedisServer, ShopProcess, SqliteFile};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NATS_URL: &str = "nats://127.0.0.1:4222";

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// A JetStream stream of its own for one test, deleted at the end.
struct NatsStream(String);

impl NatsStream {
    fn new() -> Self {
        Self(unique("NRTEST"))
    }
    async fn delete(self) {
        let client = async_nats::connect(NATS_URL).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let _ = js.delete_stream(&self.0).await;
    }
}

/// Creates an order of `qty` units on `base`, pays it and sends the
/// provider's SUCCESS notice (twice, as providers do).
async fn paid_order(http: &reqwest::Client, base: &str, user: &str, qty: i64) -> String {
    let res = http
        .post(format!("{base}/orders/quick"))
        .header("x-user-id", user)
        .json(&json!({"sku": "SKU-1", "quantity": qty, "bizId": unique("biz")}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let order: Value = res.json().await.unwrap();
    let order_id = order["orderId"].as_str().unwrap().to_owned();
    let res = http
        .post(format!("{base}/payments"))
        .header("x-user-id", user)
        .header("idempotency-key", unique("pay"))
        .json(&json!({"orderId": order_id, "amount": 1999}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let payment: Value = res.json().await.unwrap();
    let payment_id = payment["paymentId"].as_str().unwrap().to_owned();
    for _ in 0..2 {
        let res = http
            .post(format!("{base}/payments/callback"))
            .json(&json!({"paymentId": payment_id, "status": "SUCCESS"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    order_id
}

async fn points(http: &reqwest::Client, base: &str, user: &str) -> i64 {
    let v: Value = http
        .get(format!("{base}/points"))
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["userId"], user);
    v["points"].as_i64().unwrap()
}

/// Polls `GET /points` on every instance until it reads `expected`, then
/// checks that it stays there.
async fn points_arrive_once(http: &reqwest::Client, bases: &[String], user: &str, expected: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = points(http, &bases[0], user).await;
        assert!(p <= expected, "{user}: {p} points, more than {expected}");
        if p == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{user}: {p} points after 30 s, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Late duplicates and redeliveries change nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for base in bases {
        assert_eq!(points(http, base, user).await, expected, "{user} on {base}");
    }
}

/// `shop_events_consumed_total{outcome=...}` summed over the instances.
async fn consumed(http: &reqwest::Client, bases: &[String], outcome: &str) -> f64 {
    let mut total = 0.0;
    for base in bases {
        let labels = [("outcome", outcome)];
        total += common::scrape(http, base, "shop_events_consumed_total", &labels).await;
    }
    total
}

async fn two_shops(env: &[(String, String)]) -> (ShopProcess, ShopProcess, Vec<String>) {
    let a = ShopProcess::start(BIN, env.to_vec()).await;
    let b = ShopProcess::start(BIN, env.to_vec()).await;
    let bases = vec![a.base_url(), b.base_url()];
    (a, b, bases)
}

/// Three orders paid on alternating instances, every event published three
/// times: each order's points arrive once.
async fn three_deliveries_award_once(env: &[(String, String)]) {
    let (_a, _b, bases) = two_shops(env).await;
    let http = reqwest::Client::new();
    let user = unique("buyer");
    let mut expected = 0;
    for (i, qty) in [1_i64, 2, 3].into_iter().enumerate() {
        paid_order(&http, &bases[i % 2], &user, qty).await;
        expected += 10 * qty;
    }
    points_arrive_once(&http, &bases, &user, expected).await;
    // Every copy was consumed (3 per order, possibly more from both
    // publishers), and at most one per order wrote to the ledger.
    assert!(
        consumed(&http, &bases, "awarded").await + consumed(&http, &bases, "duplicate").await
            >= 9.0
    );
}

/// Each instance fails the first event it handles (`hook`: before the
/// effect, or after it and before the ack); the event is delivered again and
/// the points arrive once.
async fn failed_first_attempt_is_redelivered(env: &[(String, String)], qty: i64) {
    let (_a, _b, bases) = two_shops(env).await;
    let http = reqwest::Client::new();
    let user = unique("retry");
    paid_order(&http, &bases[0], &user, qty).await;
    points_arrive_once(&http, &bases, &user, 10 * qty).await;
    // The failure happened, and a later delivery was processed.
    assert!(consumed(&http, &bases, "failed").await >= 1.0);
    assert!(
        consumed(&http, &bases, "awarded").await + consumed(&http, &bases, "duplicate").await
            >= 1.0
    );
}

fn nats_env(
    stream: &NatsStream,
    redis: &RedisServer,
    pg: &PgDatabase,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut e = env(&[
        ("NATS_URL", NATS_URL),
        ("NOREPEAT_NATS_STREAM", &stream.0),
        ("REDIS_URL", &redis.url()),
        ("DATABASE_URL", &pg.url()),
        ("NOREPEAT_STORE_TIMEOUT_MS", "2000"),
    ]);
    e.extend(env(extra));
    e
}

fn embedded_env(db: &SqliteFile, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut e = env(&[("DATABASE_URL", &db.url())]);
    e.extend(env(extra));
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_every_event_three_times_over_two_instances_awards_once() {
    let stream = NatsStream::new();
    let redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    three_deliveries_award_once(&nats_env(
        &stream,
        &redis,
        &pg,
        &[("NOREPEAT_DUPLICATE_EVENTS", "3")],
    ))
    .await;
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_every_event_three_times_over_two_instances_awards_once() {
    let db = SqliteFile::new();
    three_deliveries_award_once(&embedded_env(&db, &[("NOREPEAT_DUPLICATE_EVENTS", "3")])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_failure_before_the_effect_is_redelivered_and_processed_once() {
    let stream = NatsStream::new();
    let redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    // One copy only: the points can only come from the redelivery.
    failed_first_attempt_is_redelivered(
        &nats_env(
            &stream,
            &redis,
            &pg,
            &[("NOREPEAT_FAIL_FIRST_EVENT", "before")],
        ),
        2,
    )
    .await;
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_failure_after_the_effect_before_the_ack_is_redelivered_and_processed_once() {
    let stream = NatsStream::new();
    let redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    failed_first_attempt_is_redelivered(
        &nats_env(
            &stream,
            &redis,
            &pg,
            &[
                ("NOREPEAT_FAIL_FIRST_EVENT", "after"),
                ("NOREPEAT_NATS_ACK_WAIT_MS", "1000"),
            ],
        ),
        3,
    )
    .await;
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_failures_before_and_after_the_effect_are_processed_once() {
    let db = SqliteFile::new();
    failed_first_attempt_is_redelivered(
        &embedded_env(&db, &[("NOREPEAT_FAIL_FIRST_EVENT", "before")]),
        2,
    )
    .await;
    let db = SqliteFile::new();
    failed_first_attempt_is_redelivered(
        &embedded_env(&db, &[("NOREPEAT_FAIL_FIRST_EVENT", "after")]),
        4,
    )
    .await;
}
