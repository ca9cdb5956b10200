//! The shop on a Redis Cluster (`REDIS_URL=redis+cluster://...`).

// Test helpers outside #[test] functions unwrap too: a failure there is a failed test.
use crate::common;

use common::{BIN, quick_orders};
use norepeat_testkit::{RedisCluster, ShopProcess, SqliteFile};
use serde_json::json;

/// Two shops on one cluster, each with its *own* SQLite file: no shared
/// database backs the guard up, so one order out of 100 duplicates spread
/// over both shows the cluster deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_shop_quick_order_duplicates_make_one_201() {
    let cluster = RedisCluster::start().await;
    let (db_a, db_b) = (SqliteFile::new(), SqliteFile::new());
    let env = |db: &SqliteFile| {
        vec![
            ("REDIS_URL".to_owned(), cluster.url()),
            ("DATABASE_URL".to_owned(), db.url()),
            // A debug build under a burst on two cores can exceed the 50 ms
            // default budget, and then (rightly) fail open to its local store.
            ("NOREPEAT_STORE_TIMEOUT_MS".to_owned(), "2000".to_owned()),
        ]
    };
    let a = ShopProcess::start(BIN, env(&db_a)).await;
    let b = ShopProcess::start(BIN, env(&db_b)).await;
    let bases = [a.base_url(), b.base_url()];
    let statuses = quick_orders(
        &bases,
        "cluster-user",
        100,
        |i| json!({"sku": "SKU-1", "quantity": 1, "traceId": i}),
    )
    .await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        99,
        "{statuses:?}"
    );
    let keys: u64 = cluster.keys_per_master().await.iter().map(|(_, n)| n).sum();
    assert!(keys >= 1, "the guard wrote to the cluster");
}
