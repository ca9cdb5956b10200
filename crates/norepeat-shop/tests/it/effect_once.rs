//! Effect once in the database, over two shop processes, on SQLite and on
//! PostgreSQL: stock never oversold, a payment notice applied once, a
//! half-done payment repaired once.

use crate::common;

use common::BIN;
use norepeat_shop::db::Db;
use norepeat_shop::domain::PaymentStatus;
use norepeat_testkit::{ShopProcess, TestDb};
use serde_json::{Value, json};

async fn shops(db: &TestDb) -> (ShopProcess, ShopProcess) {
    let env = vec![
        ("DATABASE_URL".to_owned(), db.url()),
        ("NOREPEAT_ADMIN_TOKEN".to_owned(), "adm".to_owned()),
        ("NOREPEAT_STORE_TIMEOUT_MS".to_owned(), "2000".to_owned()),
    ];
    // Start one first so migrations and seeding are not raced by the test.
    let a = ShopProcess::start(BIN, env.clone()).await;
    let b = ShopProcess::start(BIN, env).await;
    (a, b)
}

async fn json_of(res: reqwest::Response) -> (u16, Value) {
    let s = res.status().as_u16();
    (s, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_buyers_for_fifty_units() {
    for db in TestDb::each().await {
        let (a, b) = shops(&db).await;
        let http = reqwest::Client::new();
        crate::common::set_stock(&a.base_url(), "adm", "SKU-2", 50).await;
        let bases = [a.base_url(), b.base_url()];
        let tasks: Vec<_> = (0..300)
            .map(|i| {
                let http = http.clone();
                let base = bases[i % 2].clone();
                tokio::spawn(async move {
                    http.post(format!("{base}/orders/quick"))
                        .header("x-user-id", format!("buyer-{i}"))
                        .json(&json!({"sku": "SKU-2", "quantity": 1}))
                        .send()
                        .await
                        .unwrap()
                        .status()
                        .as_u16()
                })
            })
            .collect();
        let mut created = 0;
        for t in tasks {
            match t.await.unwrap() {
                201 => created += 1,
                409 => {}
                s => panic!("status {s} on {}", db.url()),
            }
        }
        assert_eq!(created, 50, "{}", db.url());
        let (_, stock) = json_of(
            http.get(format!("{}/stock/SKU-2", bases[1]))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(stock["available"], 0, "{}", db.url());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_success_notices_apply_once_and_reconciliation_repairs_once() {
    for db in TestDb::each().await {
        let (a, b) = shops(&db).await;
        let http = reqwest::Client::new();
        let bases = [a.base_url(), b.base_url()];

        // An order and its payment.
        let (_, order) = json_of(
            http.post(format!("{}/orders/quick", bases[0]))
                .header("x-user-id", "payer")
                .json(&json!({"sku": "SKU-1", "quantity": 2}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let order_id = order["orderId"].as_str().unwrap().to_owned();
        let (status, payment) = json_of(
            http.post(format!("{}/payments", bases[1]))
                .header("x-user-id", "payer")
                .header("idempotency-key", "pay-once")
                .json(&json!({"orderId": order_id, "amount": 500}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 201, "{payment}");
        let payment_id = payment["paymentId"].as_str().unwrap().to_owned();

        // 30 notices at once, over both instances.
        let tasks: Vec<_> = (0..30)
            .map(|i| {
                let http = http.clone();
                let base = bases[i % 2].clone();
                let payment_id = payment_id.clone();
                tokio::spawn(async move {
                    json_of(
                        http.post(format!("{base}/payments/callback"))
                            .json(&json!({"paymentId": payment_id, "status": "SUCCESS"}))
                            .send()
                            .await
                            .unwrap(),
                    )
                    .await
                })
            })
            .collect();
        let mut applied = 0;
        for t in tasks {
            let (s, v) = t.await.unwrap();
            assert_eq!(s, 200, "{v}");
            if v["result"] == "applied" {
                applied += 1;
            } else {
                assert_eq!(v["result"], "already_applied");
            }
        }
        assert_eq!(applied, 1, "{}", db.url());
        let (_, o) = json_of(
            http.get(format!("{}/orders/{order_id}", bases[0]))
                .header("x-user-id", "payer")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(o["status"], "PAID");

        // The crash between two writes: a payment succeeded, its order UNPAID.
        let (_, order2) = json_of(
            http.post(format!("{}/orders/quick", bases[0]))
                .header("x-user-id", "payer")
                .json(&json!({"sku": "SKU-1", "quantity": 1}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let order2_id = order2["orderId"].as_str().unwrap().to_owned();
        let (_, payment2) = json_of(
            http.post(format!("{}/payments", bases[0]))
                .header("x-user-id", "payer")
                .header("idempotency-key", "pay-crash")
                .json(&json!({"orderId": order2_id, "amount": 300}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let direct = Db::connect(Some(&db.url())).await.unwrap();
        direct
            .force_payment_status_for_test(
                payment2["paymentId"].as_str().unwrap(),
                PaymentStatus::Succeeded,
            )
            .await
            .unwrap();

        // Two passes at once, one per instance: one repair between them.
        let pass = |base: String| {
            let http = http.clone();
            async move {
                json_of(
                    http.post(format!("{base}/admin/reconcile"))
                        .header("x-admin-token", "adm")
                        .send()
                        .await
                        .unwrap(),
                )
                .await
            }
        };
        let ((s1, r1), (s2, r2)) = tokio::join!(pass(bases[0].clone()), pass(bases[1].clone()));
        assert_eq!((s1, s2), (200, 200));
        let marked = |r: &Value| r["report"]["ordersMarkedPaid"].as_array().unwrap().len();
        assert_eq!(marked(&r1) + marked(&r2), 1, "{r1} {r2}");
        let (_, o2) = json_of(
            http.get(format!("{}/orders/{order2_id}", bases[1]))
                .header("x-user-id", "payer")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(o2["status"], "PAID");

        // The command-line pass finds nothing left to do.
        let out = common::shop_command()
            .args(["reconcile", "--once", "--database", &db.url()])
            .output()
            .unwrap();
        assert!(out.status.success());
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["report"]["ordersMarkedPaid"], json!([]), "{report}");
        direct.close().await;
    }
}
