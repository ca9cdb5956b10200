//! One live payment per order, decided by the database whatever the
//! idempotency store remembers: a shop process over a private Redis, on
//! SQLite and on PostgreSQL.

use crate::common;

use common::BIN;
use norepeat_testkit::{RedisServer, ShopProcess, TestDb};
use serde_json::{Value, json};

/// Payments of `order_id` in `status`, read from the database itself.
async fn count(db: &TestDb, order_id: &str, status: &str) -> i64 {
    db.scalar(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM payments WHERE order_id = $1 AND status = $2",
        [order_id, status],
    )
    .await
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn post(&self, path: &str, user: &str, key: Option<&str>, body: Value) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("x-user-id", user)
            .json(&body);
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let res = req.send().await.unwrap();
        (
            res.status().as_u16(),
            res.json().await.unwrap_or(Value::Null),
        )
    }

    async fn order(&self, user: &str) -> String {
        let (s, o) = self
            .post(
                "/orders/quick",
                user,
                None,
                json!({"sku": "SKU-1", "quantity": 1, "bizId": rand::random::<u64>().to_string()}),
            )
            .await;
        assert_eq!(s, 201, "{o}");
        o["orderId"].as_str().unwrap().to_owned()
    }

    async fn pay(&self, user: &str, key: &str, order_id: &str, amount: Value) -> (u16, Value) {
        let body = json!({"orderId": order_id, "amount": amount});
        self.post("/payments", user, Some(key), body).await
    }

    async fn notice(&self, payment_id: &str, status: &str) -> (u16, Value) {
        let body = json!({"paymentId": payment_id, "status": status});
        self.post("/payments/callback", "provider", None, body)
            .await
    }
}

async fn shop(db: &TestDb, redis: &RedisServer) -> (ShopProcess, Client) {
    let env = vec![
        ("DATABASE_URL".to_owned(), db.url()),
        ("REDIS_URL".to_owned(), redis.url()),
        ("NOREPEAT_STORE_TIMEOUT_MS".to_owned(), "2000".to_owned()),
    ];
    let shop = ShopProcess::start(BIN, env).await;
    let client = Client {
        http: reqwest::Client::new(),
        base: shop.base_url(),
    };
    (shop, client)
}

fn assert_not_payable(answer: &(u16, Value), payment_id: &str) {
    assert_eq!(answer.0, 409, "{}", answer.1);
    assert_eq!(answer.1["code"], "order_not_payable", "{}", answer.1);
    assert_eq!(answer.1["paymentId"], payment_id, "{}", answer.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forgets_still_makes_one_live_payment() {
    for db in TestDb::each().await {
        let redis = RedisServer::start().await;
        let (_shop, c) = shop(&db, &redis).await;
        let order = c.order("payer").await;
        let (s, p1) = c.pay("payer", "K1", &order, json!(1999)).await;
        assert_eq!(s, 201, "{p1}");
        let p1 = p1["paymentId"].as_str().unwrap().to_owned();

        // The store loses its records: the same key and another key both
        // reach the handler again; the database refuses both.
        let mut conn = redis.connection().await;
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        assert_not_payable(&c.pay("payer", "K1", &order, json!(1999)).await, &p1);
        assert_not_payable(&c.pay("payer", "K2", &order, json!(5)).await, &p1);

        // Many keys at once for a fresh order: one payment.
        let order2 = c.order("payer").await;
        let c = std::sync::Arc::new(c);
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let (c, order2) = (c.clone(), order2.clone());
                tokio::spawn(
                    async move { c.pay("payer", &format!("R{i}"), &order2, json!(300)).await },
                )
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let created: Vec<String> = answers
            .iter()
            .filter(|a| a.0 == 201)
            .map(|a| a.1["paymentId"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(created.len(), 1, "{answers:?}");
        for a in answers.iter().filter(|a| a.0 != 201) {
            assert_not_payable(a, &created[0]);
        }

        // Every SUCCESS the provider could send: one payment succeeds.
        for p in [&p1, &created[0]] {
            assert_eq!(c.notice(p, "SUCCESS").await.1["result"], "applied");
        }
        assert_eq!(count(&db, &order, "SUCCEEDED").await, 1);
        assert_eq!(count(&db, &order2, "SUCCEEDED").await, 1);
        // A paid order takes no other payment.
        assert_not_payable(&c.pay("payer", "K3", &order, json!(1999)).await, &p1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amounts_owners_and_callbacks_are_checked() {
    for db in TestDb::each().await {
        let redis = RedisServer::start().await;
        let (_shop, c) = shop(&db, &redis).await;
        let order = c.order("owner").await;
        for (i, amount) in [json!(0), json!(10_000_001), json!(-1), json!(1.5)]
            .into_iter()
            .enumerate()
        {
            let (s, body) = c.pay("owner", &format!("bad{i}"), &order, amount).await;
            assert_eq!(
                (s, &body["code"]),
                (400, &json!("invalid_request")),
                "{body}"
            );
        }
        let (s, body) = c.pay("thief", "T1", &order, json!(100)).await;
        assert_eq!((s, &body["code"]), (404, &json!("not_found")), "{body}");

        // A failed payment is not live: the order takes another one, and
        // the failed one can no longer succeed.
        let (s, p1) = c.pay("owner", "A1", &order, json!(10_000_000)).await;
        assert_eq!(s, 201, "{p1}");
        let p1 = p1["paymentId"].as_str().unwrap().to_owned();
        assert_eq!(c.notice(&p1, "FAILED").await.1["result"], "applied");
        let (s, p2) = c.pay("owner", "A2", &order, json!(1999)).await;
        assert_eq!(s, 201, "{p2}");
        let p2 = p2["paymentId"].as_str().unwrap().to_owned();
        let (s, body) = c.notice(&p1, "SUCCESS").await;
        assert_eq!(
            (s, &body["code"]),
            (409, &json!("invalid_transition")),
            "{body}"
        );
        assert_eq!(c.notice(&p2, "SUCCESS").await.1["result"], "applied");
        assert_eq!(count(&db, &order, "SUCCEEDED").await, 1);
    }
}
