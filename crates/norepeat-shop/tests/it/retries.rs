//! What a retry meets after its first attempt was refused or failed, as
//! the shop's contract says (issue 40: contract points with no test through the
//! binary): a payment answered 404 (an answer about the caller, not the
//! request) keeps its `Idempotency-Key` free, and a quick order that failed
//! with a 5xx lets its retry through at once instead of 409; a payment whose
//! answer was not stored replays as `Idempotent-Body: omitted`.

use crate::common::BIN;
use norepeat_testkit::{ShopProcess, SqliteFile};
use serde_json::{Value, json};
use sqlx::Connection;

async fn post(
    shop: &ShopProcess,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, bool, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}{path}", shop.base_url()))
        .header("x-user-id", "u1")
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    (
        res.status().as_u16(),
        replayed,
        res.json().await.unwrap_or(Value::Null),
    )
}

/// A payment of an order that does not exist is 404, not stored: the same
/// key and body again are answered anew (no `Idempotent-Replayed`), and the
/// key then pays a real order (not 422 for another body).
#[tokio::test]
async fn a_payment_answered_404_keeps_its_key_free() {
    let db = SqliteFile::new();
    let shop = ShopProcess::start(BIN, vec![("DATABASE_URL".to_owned(), db.url())]).await;
    let key = [("idempotency-key", "k-404")];
    let missing = json!({"orderId": "no-such-order", "amount": 1999});
    for _ in 0..2 {
        let (status, replayed, body) = post(&shop, "/payments", &key, &missing).await;
        assert_eq!((status, replayed), (404, false), "{body}");
        assert_eq!(body["code"], "not_found");
    }
    let order = json!({"sku": "SKU-1", "quantity": 1});
    let (status, _, placed) = post(&shop, "/orders/quick", &[], &order).await;
    assert_eq!(status, 201, "{placed}");
    let pay = json!({"orderId": placed["orderId"], "amount": 1999});
    let (status, replayed, body) = post(&shop, "/payments", &key, &pay).await;
    assert_eq!(
        (status, replayed),
        (201, false),
        "the key stayed free: {body}"
    );
    let (status, replayed, _) = post(&shop, "/payments", &key, &pay).await;
    assert_eq!((status, replayed), (201, true), "then it is the payment's");
}

/// A quick order that fails with a 5xx (its insert refused by the
/// database: a trigger the test puts on `orders`) lets the same order
/// through at once when it is retried, instead of 409: the fingerprint of
/// a failed request is not held for its window.
#[tokio::test]
async fn a_quick_order_that_failed_with_a_5xx_is_let_through_when_retried() {
    let db = SqliteFile::new();
    let shop = ShopProcess::start(BIN, vec![("DATABASE_URL".to_owned(), db.url())]).await;
    let order = json!({"sku": "SKU-2", "quantity": 1});
    let mut admin = sqlx::SqliteConnection::connect(&db.url()).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_orders BEFORE INSERT ON orders \
         BEGIN SELECT RAISE(ABORT, 'the test refuses orders'); END",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let (status, _, body) = post(&shop, "/orders/quick", &[], &order).await;
    assert!(status >= 500, "the refused insert: {status} {body}");
    sqlx::query("DROP TRIGGER refuse_orders")
        .execute(&mut admin)
        .await
        .unwrap();
    let (status, _, body) = post(&shop, "/orders/quick", &[], &order).await;
    assert_eq!(status, 201, "the retry of a failed order: {body}");
    // And the window holds for the order that was made.
    let (status, _, body) = post(&shop, "/orders/quick", &[], &order).await;
    assert_eq!(status, 409, "{body}");
}

/// A payment whose answer is over `NOREPEAT_MAX_STORED_RESPONSE` (here 10
/// bytes) is answered whole; its retry gets the status with an empty body,
/// `Idempotent-Replayed: true` and `Idempotent-Body: omitted`, and no second
/// payment is made: with the records in memory and in the shop's database
/// (where the record commits with the payment; before, an answer over the
/// cap rolled the payment back and answered 5xx).
#[tokio::test]
async fn a_payment_whose_answer_is_not_stored_replays_as_omitted() {
    for store in ["memory", "database"] {
        let db = SqliteFile::new();
        let shop = ShopProcess::start(
            BIN,
            vec![
                ("DATABASE_URL".to_owned(), db.url()),
                ("NOREPEAT_IDEMPOTENCY_STORE".to_owned(), store.to_owned()),
                ("NOREPEAT_MAX_STORED_RESPONSE".to_owned(), "10".to_owned()),
            ],
        )
        .await;
        let order = json!({"sku": "SKU-3", "quantity": 1});
        let (status, _, placed) = post(&shop, "/orders/quick", &[], &order).await;
        assert_eq!(status, 201, "{store}: {placed}");
        let pay = json!({"orderId": placed["orderId"], "amount": 1999});
        let key = [("idempotency-key", "k-omitted")];
        let (status, replayed, first) = post(&shop, "/payments", &key, &pay).await;
        assert_eq!((status, replayed), (201, false), "{store}: {first}");
        assert_eq!(first["status"], "PENDING", "{store}: answered whole");
        let again = reqwest::Client::new()
            .post(format!("{}/payments", shop.base_url()))
            .header("x-user-id", "u1")
            .header("idempotency-key", "k-omitted")
            .json(&pay)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 201, "{store}");
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{store}");
        assert_eq!(again.headers()["idempotent-body"], "omitted", "{store}");
        assert!(again.bytes().await.unwrap().is_empty(), "{store}");
        let mut conn = sqlx::SqliteConnection::connect(&db.url()).await.unwrap();
        let payments: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payments")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(payments, 1, "{store}: one payment");
    }
}
