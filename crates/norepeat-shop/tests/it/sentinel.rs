//! The shop behind Sentinel (`REDIS_URL=redis+sentinel://...?replicas=1`).

use crate::common;

use common::{BIN, quick_orders};
use norepeat_testkit::{RedisSentinels, ShopProcess, SqliteFile};
use serde_json::json;

/// Two shops, each with its own SQLite file, on the master three
/// Sentinels name, every claim waiting for a replica: 100 duplicates of
/// one order over both make one 201. The master is killed (SIGKILL); once
/// the Sentinels promoted a replica, the same shops (no restart) decide
/// on the new master: a new order's 100 duplicates make one 201 again,
/// and the order guarded before the failover is still caught (its claim
/// was on a replica when it was answered). Before: `REDIS_URL` took no
/// Sentinel URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shops_follow_the_master_through_a_failover() {
    let mut group = RedisSentinels::start().await;
    let (db_a, db_b) = (SqliteFile::new(), SqliteFile::new());
    let url = format!("{}?replicas=1&replicas_timeout=500ms", group.url());
    let env = |db: &SqliteFile| {
        vec![
            ("REDIS_URL".to_owned(), url.clone()),
            ("DATABASE_URL".to_owned(), db.url()),
            // A debug build under a burst on two cores can exceed the 50 ms
            // default budget, and then (rightly) fail open to its local store.
            ("NOREPEAT_STORE_TIMEOUT_MS".to_owned(), "2000".to_owned()),
            // Longer than the failover: the first order is still held after it.
            ("NOREPEAT_FP_WINDOW_MS".to_owned(), "120000".to_owned()),
            ("NOREPEAT_ADMIN_TOKEN".to_owned(), "adm".to_owned()),
        ]
    };
    let a = ShopProcess::start(BIN, env(&db_a)).await;
    let b = ShopProcess::start(BIN, env(&db_b)).await;
    let bases = [a.base_url(), b.base_url()];
    // Stock for every order below. While the new master has no replica
    // yet, each claim's WAIT falls short and each shop decides against
    // its own local memory (fail-open): a round's copies make an order on
    // each shop, and the rounds go on. Before, the 100 seeded units ran
    // out in such rounds (quantities 2, 3, ...), and every later order
    // was 409 out of stock.
    for base in &bases {
        common::set_stock(base, "adm", "SKU-1", 1_000_000).await;
    }
    // An order per quantity; `traceId` differs on each copy and is not
    // part of the fingerprint.
    let order =
        |quantity: u64| move |i: usize| json!({"sku": "SKU-1", "quantity": quantity, "traceId": i});
    let created = |statuses: &[u16]| statuses.iter().filter(|s| **s == 201).count();

    let before = quick_orders(&bases, "sentinel-user", 100, order(1)).await;
    assert_eq!(created(&before), 1, "{before:?}");

    let old = group.kill_master().await;
    let new = group.wait_for_failover(old).await;
    assert_ne!(old, new);
    // The shops' first calls after the kill fail, and their breakers open:
    // each then decides against its own local memory, which holds only
    // the orders it took itself. Send until both breakers closed again
    // (each closes on a call that the new master answered, with a
    // replica's acknowledgement) and one order is decided on the new
    // master. Before, one clean round was enough; in one CI run it came
    // while one shop's breaker was still open (only the other logged its
    // closing), and that shop then admitted the order guarded before the
    // failover from its local memory, as fail-open promises no more.
    let mut after = Vec::new();
    for quantity in 2..=100 {
        after = quick_orders(&bases, "sentinel-user", 20, order(quantity)).await;
        if created(&after) == 1
            && after.iter().all(|s| *s == 201 || *s == 409)
            && breakers_closed(&bases).await
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(created(&after), 1, "{after:?}");
    assert!(
        breakers_closed(&bases).await,
        "the shops' breakers stayed open"
    );
    let again = quick_orders(&bases, "sentinel-user", 10, order(1)).await;
    assert_eq!(
        created(&again),
        0,
        "the order before the failover: {again:?}"
    );
    assert!(
        !group.keys_with_pttl(new).await.is_empty(),
        "the guards wrote to the new master"
    );
}

/// Whether every shop at `bases` says its store's breaker is closed
/// (`GET /healthz`).
async fn breakers_closed(bases: &[String]) -> bool {
    let http = reqwest::Client::new();
    for base in bases {
        if common::healthz(&http, base).await["breaker"] != "Closed" {
            return false;
        }
    }
    true
}
