//! `NOREPEAT_IDEMPOTENCY_STORE=database`: `POST /payments` keeps its
//! idempotency records in the shop's database (SQLite or PostgreSQL), each
//! completed in the payment's own transaction. Shop processes over a private
//! Redis that is flushed and killed, two processes sharing one database, and
//! a process killed in the middle of a payment.

use crate::common;

use common::{Answer, BIN};
use norepeat_testkit::{PgDatabase, RedisServer, ShopProcess, TestDb};
use serde_json::{Value, json};
use std::time::Duration;

/// Payments of `order_id`, whatever their status.
async fn payments(db: &TestDb, order_id: &str) -> i64 {
    db.scalar(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM payments WHERE order_id = $1",
        [order_id],
    )
    .await
}

/// Idempotency rows by state: the record's second byte is 1 while in
/// progress, 2 once completed. Returns (in progress, completed).
async fn records(db: &TestDb) -> (i64, i64) {
    let sql = "SELECT CAST(COUNT(*) AS BIGINT) FROM norepeat_keys \
               WHERE substr(value, 2, 1) = $1";
    (
        db.scalar(sql, [vec![1u8]]).await,
        db.scalar(sql, [vec![2u8]]).await,
    )
}

/// A shop on `db` with payments on the database store.
async fn shop(db: &TestDb, redis: Option<&RedisServer>, extra: &[(&str, &str)]) -> ShopProcess {
    let mut env = vec![
        ("DATABASE_URL".to_owned(), db.url()),
        (
            "NOREPEAT_IDEMPOTENCY_STORE".to_owned(),
            "database".to_owned(),
        ),
        ("NOREPEAT_STORE_TIMEOUT_MS".to_owned(), "2000".to_owned()),
    ];
    if let Some(r) = redis {
        env.push(("REDIS_URL".to_owned(), r.url()));
    }
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    ShopProcess::start(BIN, env).await
}

async fn pay(http: &reqwest::Client, base: &str, key: &str, order_id: &str) -> Answer {
    let res = http
        .post(format!("{base}/payments"))
        .header("x-user-id", "payer")
        .header("idempotency-key", key)
        .json(&json!({"orderId": order_id, "amount": 1999}))
        .send()
        .await
        .unwrap();
    Answer::read_unchecked(res).await
}

async fn order(http: &reqwest::Client, base: &str) -> String {
    let res = http
        .post(format!("{base}/orders/quick"))
        .header("x-user-id", "payer")
        .json(&json!({"sku": "SKU-1", "quantity": 1, "bizId": rand::random::<u64>().to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let o: Value = res.json().await.unwrap();
    o["orderId"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_survives_flushall_and_payments_go_on_without_redis() {
    for db in TestDb::each().await {
        let mut redis = RedisServer::start().await;
        let shop = shop(&db, Some(&redis), &[]).await;
        let base = shop.base_url();
        let http = reqwest::Client::new();
        let health = common::healthz(&http, &base).await;
        assert_eq!(health["idempotencyStore"], "database", "{health}");

        let order1 = order(&http, &base).await;
        let order2 = order(&http, &base).await;
        let first = pay(&http, &base, "K1", &order1).await;
        assert_eq!(
            (first.status.as_u16(), first.replayed()),
            (201, false),
            "{:?}",
            first.bytes
        );

        // Redis forgets everything: the record is in the database.
        let mut conn = redis.connection().await;
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        let again = pay(&http, &base, "K1", &order1).await;
        assert_eq!(
            (again.status.as_u16(), again.replayed()),
            (201, true),
            "{:?}",
            again.bytes
        );
        assert_eq!(again.bytes, first.bytes, "byte for byte");

        // Redis dies: replays and new payments go on.
        redis.kill();
        let again = pay(&http, &base, "K1", &order1).await;
        assert_eq!(
            (again.status.as_u16(), again.replayed()),
            (201, true),
            "{:?}",
            again.bytes
        );
        assert_eq!(again.bytes, first.bytes);
        let other = pay(&http, &base, "K2", &order2).await;
        assert_eq!(
            (other.status.as_u16(), other.replayed()),
            (201, false),
            "{:?}",
            other.bytes
        );
        let other_again = pay(&http, &base, "K2", &order2).await;
        assert_eq!(other_again.bytes, other.bytes);

        assert_eq!(payments(&db, &order1).await, 1);
        assert_eq!(payments(&db, &order2).await, 1);
        assert_eq!(records(&db).await, (0, 2));
    }
}

/// 50 requests with one key at once, spread over two shop processes on one
/// PostgreSQL database: one payment; every other answer is its replay or
/// 409 `idempotency_key_in_use`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_requests_one_key_two_processes_one_payment() {
    let db = TestDb::postgres().await;
    let redis = RedisServer::start().await;
    // One user's 50 requests at once: above the default payment rate (20/s).
    let slow = [
        ("NOREPEAT_PAYMENT_LATENCY_MS", "300"),
        ("NOREPEAT_PAYMENT_RATE", "1000/s"),
    ];
    let a = shop(&db, Some(&redis), &slow).await;
    let b = shop(&db, Some(&redis), &slow).await;
    let http = reqwest::Client::new();
    let order_id = order(&http, &a.base_url()).await;
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let base = if i % 2 == 0 {
                a.base_url()
            } else {
                b.base_url()
            };
            let (http, order_id) = (http.clone(), order_id.clone());
            tokio::spawn(async move { pay(&http, &base, "ONE", &order_id).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let first: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status.as_u16() == 201 && !a.replayed())
        .collect();
    assert_eq!(first.len(), 1, "{answers:?}");
    for a in &answers {
        match a.status.as_u16() {
            201 => assert_eq!(a.bytes, first[0].bytes, "a replay is the first answer"),
            409 => assert_eq!(a.code().1, "idempotency_key_in_use", "{a:?}"),
            _ => panic!("unexpected answer {a:?}"),
        }
    }
    assert_eq!(payments(&db, &order_id).await, 1);
    // After the first is done, everyone gets the replay.
    let late = pay(&http, &b.base_url(), "ONE", &order_id).await;
    assert_eq!((late.status.as_u16(), late.replayed()), (201, true));
    assert_eq!(late.bytes, first[0].bytes);
}

/// A process SIGKILLed while a payment is written and not committed (the
/// slow provider): neither the payment nor a completed record; the claim
/// stays until its lease ends, then a retry makes exactly one payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_mid_payment_leaves_nothing_and_the_retry_pays_once() {
    for db in TestDb::each().await {
        let mut victim = shop(&db, None, &[("NOREPEAT_PAYMENT_LATENCY_MS", "3000")]).await;
        let http = reqwest::Client::new();
        let order_id = order(&http, &victim.base_url()).await;
        let doomed = tokio::spawn({
            let (http, base, order_id) = (http.clone(), victim.base_url(), order_id.clone());
            async move { pay(&http, &base, "K", &order_id).await }
        });
        // Wait until the claim is taken (the payment is then being written).
        for _ in 0..200 {
            if records(&db).await.0 == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        victim.kill();
        let _ = doomed.await;
        // Either nothing, or the payment with its record: here, nothing.
        assert_eq!(payments(&db, &order_id).await, 0);
        assert_eq!(
            records(&db).await,
            (1, 0),
            "the claim is open, nothing completed"
        );

        let survivor = shop(&db, None, &[]).await;
        let base = survivor.base_url();
        let early = pay(&http, &base, "K", &order_id).await;
        assert_eq!(
            early.status.as_u16(),
            409,
            "the lease still holds: {:?}",
            early.bytes
        );
        assert_eq!(early.code().1, "idempotency_key_in_use");
        // The lease (10 s, no longer renewed) runs out; the retry pays.
        let mut paid = None;
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let a = pay(&http, &base, "K", &order_id).await;
            if a.status.as_u16() != 409 {
                paid = Some(a);
                break;
            }
        }
        let paid = paid.expect("the lease never ran out");
        assert_eq!(
            (paid.status.as_u16(), paid.replayed()),
            (201, false),
            "{:?}",
            paid.bytes
        );
        let replay = pay(&http, &base, "K", &order_id).await;
        assert_eq!((replay.status.as_u16(), replay.replayed()), (201, true));
        assert_eq!(replay.bytes, paid.bytes);
        assert_eq!(payments(&db, &order_id).await, 1);
        assert_eq!(records(&db).await, (0, 1));
    }
}

#[test]
fn an_unknown_store_is_a_start_up_error() {
    let out = common::shop_command()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("NOREPEAT_IDEMPOTENCY_STORE", "dynamo")
        .env("DATABASE_URL", "sqlite::memory:")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NOREPEAT_IDEMPOTENCY_STORE") && err.contains("dynamo"),
        "{err}"
    );
}

/// With payments on the database, the database is the one thing they need:
/// while it is unreachable, `POST /payments` fails closed (503
/// `guard_unavailable`), never pays unguarded; when it is back, the key
/// works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_fail_closed_while_the_database_is_down() {
    use norepeat_testkit::{ProxyMode, TcpProxy};
    let pg = PgDatabase::fresh().await;
    // Through the kit's admin URL (its password and port, when it has them).
    let proxy = TcpProxy::start(pg.server()).await;
    let url = pg.url_through(proxy.addr());
    let db = TestDb::Postgres(pg);
    let shop = ShopProcess::start(
        BIN,
        vec![
            ("DATABASE_URL".to_owned(), url),
            (
                "NOREPEAT_IDEMPOTENCY_STORE".to_owned(),
                "database".to_owned(),
            ),
        ],
    )
    .await;
    let base = shop.base_url();
    let http = reqwest::Client::new();
    let order_id = order(&http, &base).await;
    proxy.set_mode(ProxyMode::Refuse);
    let down = pay(&http, &base, "K", &order_id).await;
    assert_eq!(down.status.as_u16(), 503, "{:?}", down.bytes);
    assert_eq!(down.code().1, "guard_unavailable");
    proxy.set_mode(ProxyMode::Pass);
    let mut paid = None;
    for _ in 0..40 {
        let a = pay(&http, &base, "K", &order_id).await;
        if a.status.as_u16() == 201 {
            paid = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let paid = paid.expect("payments never came back");
    assert!(!paid.replayed());
    assert_eq!(payments(&db, &order_id).await, 1);
}
