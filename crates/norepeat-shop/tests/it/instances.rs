//! Two shop processes sharing Redis and PostgreSQL (and, when Redis is
//! down, only PostgreSQL): one submission, one order.

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
use crate::common::{BIN, quick_orders, scrape};
use norepeat_testkit::{PgDatabase, RedisServer, ShopProcess, TestDb};
use serde_json::{Value, json};

async fn two_shops(redis: Option<&RedisServer>, pg: &PgDatabase) -> (ShopProcess, ShopProcess) {
    // A debug build under 200 concurrent requests on two cores can take
    // longer than the 50 ms default budget; past it the guard (rightly)
    // fails open to each instance's local store. This test is about
    // correctness across instances, so it gives the store time.
    let mut env = vec![
        ("DATABASE_URL".to_owned(), pg.url()),
        ("NOREPEAT_STORE_TIMEOUT_MS".to_owned(), "2000".to_owned()),
    ];
    if let Some(r) = redis {
        env.push(("REDIS_URL".to_owned(), r.url()));
    }
    let a = ShopProcess::start(BIN, env.clone()).await;
    let b = ShopProcess::start(BIN, env).await;
    (a, b)
}

async fn stock(http: &reqwest::Client, base: &str, sku: &str) -> i64 {
    let v: Value = http
        .get(format!("{base}/stock/{sku}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["available"].as_i64().unwrap()
}

async fn orders_of(http: &reqwest::Client, base: &str, user: &str) -> usize {
    let v: Value = http
        .get(format!("{base}/orders"))
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["orders"].as_array().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_duplicates_over_two_instances_make_one_order() {
    let redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    let (a, b) = two_shops(Some(&redis), &pg).await;
    let http = reqwest::Client::new();
    let before = stock(&http, &a.base_url(), "SKU-1").await;
    let bases = [a.base_url(), b.base_url()];
    let statuses = quick_orders(
        &bases,
        "storm-user",
        200,
        |i| json!({"sku": "SKU-1", "quantity": 1, "traceId": i}),
    )
    .await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "{statuses:?}"
    );
    assert_eq!(orders_of(&http, &a.base_url(), "storm-user").await, 1);
    assert_eq!(stock(&http, &b.base_url(), "SKU-1").await, before - 1);

    // A token issued by one instance is good once, on either.
    let t: Value = http
        .get(format!("{}/repeat/token", bases[0]))
        .header("x-user-id", "tok-user")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = t["repeatToken"].as_str().unwrap().to_owned();
    let mut created = 0;
    for base in [&bases[1], &bases[0], &bases[1]] {
        let s = http
            .post(format!("{base}/orders"))
            .header("x-user-id", "tok-user")
            .header("repeat-token", &token)
            .json(&json!({"sku": "SKU-2", "quantity": 1}))
            .send()
            .await
            .unwrap()
            .status();
        if s == 201 {
            created += 1;
        } else {
            assert_eq!(s, 409);
        }
    }
    assert_eq!(created, 1);
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_the_business_key_still_makes_one_order() {
    let mut redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    let (a, b) = two_shops(Some(&redis), &pg).await;
    redis.kill();
    let http = reqwest::Client::new();
    let before = stock(&http, &a.base_url(), "SKU-3").await;
    let bases = [a.base_url(), b.base_url()];
    let statuses = quick_orders(
        &bases,
        "biz-user",
        20,
        |i| json!({"sku": "SKU-3", "quantity": 1, "bizId": "cart-7", "traceId": i}),
    )
    .await;
    for s in statuses {
        assert!(s == 200 || s == 201 || s == 409, "status {s}");
    }
    assert_eq!(orders_of(&http, &a.base_url(), "biz-user").await, 1);
    assert_eq!(stock(&http, &b.base_url(), "SKU-3").await, before - 1);
}

/// Twenty identical quick orders without a `bizId`, spread over `bases`
/// (instances whose entry guards cannot see each other's admissions): one
/// order, the repeats 409 `duplicate_submission` with `Retry-After`, one
/// unit of stock taken.
async fn identical_quick_orders_make_one(bases: &[String], user: &str) {
    let http = reqwest::Client::new();
    let before = stock(&http, &bases[0], "SKU-3").await;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let send = http
                .post(format!("{}/orders/quick", bases[i % bases.len()]))
                .header("x-user-id", user)
                .json(&json!({"sku": "SKU-3", "quantity": 1, "traceId": i}))
                .send();
            tokio::spawn(async move {
                let res = send.await.unwrap();
                let status = res.status().as_u16();
                let retry_after = res.headers().contains_key("retry-after");
                (status, retry_after, res.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        let (status, retry_after, body) = t.await.unwrap();
        if status == 201 {
            created += 1;
        } else {
            assert_eq!(status, 409, "{body}");
            assert_eq!(body["code"], "duplicate_submission", "{body}");
            assert!(retry_after, "{body}");
        }
    }
    assert_eq!(created, 1);
    assert_eq!(orders_of(&http, &bases[1], user).await, 1);
    assert_eq!(stock(&http, &bases[1], "SKU-3").await, before - 1);
    // Each door let one in: the database turned the second away.
    let mut caught = 0.0;
    for base in bases {
        caught += scrape(&http, base, "shop_orders_repeated_total", &[]).await;
    }
    assert!(caught >= 1.0, "repeats the database caught: {caught}");
}

/// Redis down: each instance's guard remembers only its own admissions, and
/// the order has no business key. The database's window for the
/// submission's fingerprint makes it one order. Before, each instance
/// made one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_identical_quick_orders_over_two_instances_make_one() {
    let mut redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    let (a, b) = two_shops(Some(&redis), &pg).await;
    redis.kill();
    identical_quick_orders_make_one(&[a.base_url(), b.base_url()], "window-user").await;
}

/// Redis forgets everything (`FLUSHALL`) between a quick order and its
/// repeat, on either instance: the door lets the repeat in, the database's
/// window refuses it (409 with `Retry-After`), and the user still has one
/// order. Before the window, the repeat made a second order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forgets_still_makes_one_quick_order() {
    let redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    let (a, b) = two_shops(Some(&redis), &pg).await;
    let http = reqwest::Client::new();
    let body = json!({"sku": "SKU-3", "quantity": 1});
    let send = |base: String| {
        http.post(format!("{base}/orders/quick"))
            .header("x-user-id", "forgotten")
            .json(&body)
            .send()
    };
    assert_eq!(send(a.base_url()).await.unwrap().status(), 201);
    for base in [a.base_url(), b.base_url()] {
        let mut conn = redis.connection().await;
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        let res = send(base).await.unwrap();
        assert_eq!(res.status(), 409);
        assert!(res.headers().contains_key("retry-after"));
        let problem: Value = res.json().await.unwrap();
        assert_eq!(problem["code"], "duplicate_submission", "{problem}");
    }
    assert_eq!(orders_of(&http, &a.base_url(), "forgotten").await, 1);
}

/// No Redis at all: two instances on one database (a SQLite file, then
/// PostgreSQL), each guard on its own memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_memory_stores_identical_quick_orders_over_two_instances_make_one() {
    for db in TestDb::each().await {
        let env = vec![("DATABASE_URL".to_owned(), db.url())];
        let a = ShopProcess::start(BIN, env.clone()).await;
        let b = ShopProcess::start(BIN, env).await;
        identical_quick_orders_make_one(&[a.base_url(), b.base_url()], "memory-user").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flash_sale_rate_is_shared_by_both_instances() {
    let redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    let env = vec![
        ("DATABASE_URL".to_owned(), pg.url()),
        ("REDIS_URL".to_owned(), redis.url()),
        ("NOREPEAT_FLASH_RATE".to_owned(), "3/m".to_owned()),
        ("NOREPEAT_STORE_TIMEOUT_MS".to_owned(), "2000".to_owned()),
    ];
    let a = ShopProcess::start(BIN, env.clone()).await;
    let b = ShopProcess::start(BIN, env).await;
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for i in 0..8 {
        let base = if i % 2 == 0 {
            a.base_url()
        } else {
            b.base_url()
        };
        let res = http
            .post(format!("{base}/flash-sale/SKU-1"))
            .header("x-user-id", "flash-user")
            .json(&json!({"quantity": 1}))
            .send()
            .await
            .unwrap();
        if res.status() == 429 {
            assert!(res.headers().contains_key("retry-after"));
            assert!(res.headers().contains_key("ratelimit-policy"));
            let body: Value = res.json().await.unwrap();
            assert_eq!(body["code"], "rate_limited");
            statuses.push(429);
        } else {
            statuses.push(res.status().as_u16());
        }
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(redis.keys_without_ttl().await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_one_token_over_two_instances_makes_one_order() {
    let mut redis = RedisServer::start().await;
    let pg = PgDatabase::fresh().await;
    let (a, b) = two_shops(Some(&redis), &pg).await;
    redis.kill();
    let http = reqwest::Client::new();
    let bases = [a.base_url(), b.base_url()];
    let t: Value = http
        .get(format!("{}/repeat/token", bases[0]))
        .header("x-user-id", "replay-user")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = t["repeatToken"].as_str().unwrap().to_owned();
    // Each instance can only remember its own admissions: without a bizId,
    // only the token's business key stops the second order.
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let (http, base, token) = (http.clone(), bases[i % 2].clone(), token.clone());
            tokio::spawn(async move {
                let res = http
                    .post(format!("{base}/orders"))
                    .header("x-user-id", "replay-user")
                    .header("repeat-token", token)
                    .json(&json!({"sku": "SKU-2", "quantity": 1}))
                    .send()
                    .await
                    .unwrap();
                let status = res.status().as_u16();
                (status, res.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        if status == 201 {
            created += 1;
        } else {
            assert_eq!(status, 409, "{body}");
            assert_eq!(body["code"], "duplicate_submission", "{body}");
        }
    }
    assert_eq!(created, 1);
    assert_eq!(orders_of(&http, &bases[1], "replay-user").await, 1);
}

/// The `db` defence (no entry guard, no door fingerprint to hand on): the
/// handler fingerprints the quick order itself, and the database's window
/// still makes identical ones over two instances one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_alone_identical_quick_orders_make_one() {
    let db = TestDb::sqlite();
    let env = vec![
        ("DATABASE_URL".to_owned(), db.url()),
        ("NOREPEAT_DEFENCE".to_owned(), "db".to_owned()),
    ];
    let a = ShopProcess::start(BIN, env.clone()).await;
    let b = ShopProcess::start(BIN, env).await;
    identical_quick_orders_make_one(&[a.base_url(), b.base_url()], "db-user").await;
    // No door: every one of the 19 repeats was the database's to refuse.
    let http = reqwest::Client::new();
    let mut caught = 0.0;
    for base in [a.base_url(), b.base_url()] {
        caught += scrape(&http, &base, "shop_orders_repeated_total", &[]).await;
    }
    assert_eq!(caught, 19.0);
}
