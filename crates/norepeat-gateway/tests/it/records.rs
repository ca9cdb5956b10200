//! Issue 51, item 1: `records:` keeps the idempotency routes' records in a
//! database, so a cache that forgets (a Redis without persistence, killed
//! and started empty) costs no payment twice, and gateways on one
//! database share them.

use crate::common::*;
use norepeat_testkit::TestDb;

/// `POST /payments` with `key` on `g` until an answer that is not a 5xx
/// or a 409 of a key still in use: the status and whether it was a replay.
async fn pay_until_answered(g: &Process, key: &str) -> (u16, bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let res = pay_on(g, "/payments", key).await;
        let status = res.status().as_u16();
        let replayed = res.headers().contains_key("idempotent-replayed");
        if status < 500 && status != 409 {
            return (status, replayed);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key}: still {status} after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Payments under load while Redis (no persistence) is killed with SIGKILL
/// and started empty: with the records in PostgreSQL, every key's retry
/// after the restart is a replay, and each key ran once. A second gateway
/// on the same database replays the first's answers.
#[tokio::test]
async fn records_in_postgres_outlive_a_redis_that_forgets() {
    let mut redis = RedisServer::start().await;
    let pg = TestDb::postgres().await;
    let b = backend(0).await;
    let yaml = format!("records: {}\n{}", pg.url(), file(&b, &redis.url(), ROUTES));
    let g = std::sync::Arc::new(gateway(&yaml).await);
    const KEYS: usize = 60;
    // Four clients pay their keys one after another while Redis dies.
    let mut clients = Vec::new();
    for c in 0..4 {
        let g = std::sync::Arc::clone(&g);
        clients.push(tokio::spawn(async move {
            for i in (c..KEYS).step_by(4) {
                let (status, _) = pay_until_answered(&g, &format!("k-{i}")).await;
                assert_eq!(status, 201, "k-{i}");
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.restart().await;
    for c in clients {
        c.await.unwrap();
    }
    // Every client retries every key, on this gateway and on another.
    let g2 = gateway(&yaml).await;
    for i in 0..KEYS {
        for on in [&*g, &g2] {
            let (status, replayed) = pay_until_answered(on, &format!("k-{i}")).await;
            assert_eq!((status, replayed), (201, true), "k-{i}");
        }
    }
    assert_eq!(effects(&b).await["/payments"], KEYS, "each key paid once");
    let rows = pg
        .scalar(
            "SELECT count(*) FROM norepeat_keys",
            std::iter::empty::<i64>(),
        )
        .await;
    assert!(rows >= KEYS as i64, "{rows} records in PostgreSQL");
}

/// `records: sqlite:FILE`: the schema made at start, two gateways on one
/// file share the records, and the other guards stay on `store`.
#[tokio::test]
async fn records_in_sqlite_are_shared_by_two_gateways() {
    let db = TestDb::sqlite();
    let b = backend(0).await;
    let yaml = format!("records: {}\n{}", db.url(), file(&b, "memory", ROUTES));
    let g1 = gateway(&yaml).await;
    let g2 = gateway(&yaml).await;
    assert_eq!(pay_until_answered(&g1, "k-lite").await, (201, false));
    assert_eq!(pay_until_answered(&g2, "k-lite").await, (201, true));
    assert_eq!(effects(&b).await["/payments"], 1);
    let rows = db
        .scalar(
            "SELECT count(*) FROM norepeat_keys",
            std::iter::empty::<i64>(),
        )
        .await;
    assert_eq!(rows, 1, "the one record, in the file");
    // Fingerprints stay on `store` (memory: each instance its own).
    let quick = |g: &Process| {
        Client::new()
            .post(url(g, "/orders/quick"))
            .header("x-user-id", "u1")
            .body(r#"{"sku":"A"}"#)
            .send()
    };
    assert_eq!(quick(&g1).await.unwrap().status(), 201);
    assert_eq!(quick(&g2).await.unwrap().status(), 201);
}
