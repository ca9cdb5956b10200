// Over 400 lines: every scenario of the database layer, each run on SQLite and PostgreSQL by one both_backends! list.
//! Integration tests of the shop's database layer, against SQLite (a temporary
//! file) and PostgreSQL (a fresh database per test, through
//! `NOREPEAT_TEST_PG_ADMIN_URL` or `postgres://postgres@127.0.0.1:5432/postgres`).
//!
//! "Two instances" are simulated with two separate `Db` pools on one database.
use crate::common;

use std::time::{Duration, SystemTime};

use norepeat_shop::db::{
    CreateOutcome, Db, DbError, NoticeOutcome, PaymentOutcome, Transition, WindowOutcome,
};
use norepeat_shop::domain::{Order, OrderStatus, PaymentStatus};
use norepeat_testkit::TestDb;

/// A new pool on `fresh` (connecting, migrating and seeding like the shop).
async fn connect(fresh: &TestDb) -> Db {
    Db::connect(Some(&fresh.url())).await.unwrap()
}

/// Runs `$scenario(fresh)` once on SQLite and once on PostgreSQL.
macro_rules! both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let fresh = super::TestDb::sqlite();
                    super::$scenario(&fresh).await;
                    drop(fresh);
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let fresh = super::TestDb::postgres().await;
                    super::$scenario(&fresh).await;
                    drop(fresh);
                }
            )*
        }
    };
}

both_backends!(
    seed_create_and_replay,
    concurrent_connect_and_migrate,
    concurrent_buyers_never_oversell,
    concurrent_same_biz_id_one_order,
    order_state_machine,
    concurrent_payment_notices_apply_once,
    reconciliation_repairs_once,
    points_awarded_once,
    shared_secret_is_shared,
    naive_path_oversells_and_duplicates,
    several_processes,
    one_live_payment_per_order,
    migration_over_duplicate_payments,
    a_window_makes_one_order_per_submission,
    concurrent_submissions_in_one_window_make_one_order,
);

fn created(outcome: CreateOutcome) -> Order {
    match outcome {
        CreateOutcome::Created(order) => order,
        other => panic!("expected Created, got {other:?}"),
    }
}

async fn seed_create_and_replay(fresh: &TestDb) {
    let db = connect(fresh).await;
    assert_eq!(
        db.backend(),
        if matches!(fresh, TestDb::Sqlite(_)) {
            "sqlite"
        } else {
            "postgres"
        }
    );
    for sku in ["SKU-1", "SKU-2", "SKU-3"] {
        assert_eq!(db.stock(sku).await.unwrap(), Some(100), "{sku} seeded");
    }
    assert_eq!(db.stock("SKU-404").await.unwrap(), None);

    let order = created(
        db.create_order("u1", "SKU-1", 2, Some("biz-1"))
            .await
            .unwrap(),
    );
    assert!(order.order_id.starts_with("ord_"));
    assert_eq!(order.biz_id, "biz-1");
    assert_eq!(order.user_id, "u1");
    assert_eq!(order.quantity, 2);
    assert_eq!(order.status, OrderStatus::Unpaid);
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(98));

    // Same (user, bizId) again: the existing order, no stock taken.
    let again = db
        .create_order("u1", "SKU-1", 2, Some("biz-1"))
        .await
        .unwrap();
    assert_eq!(again, CreateOutcome::Existing(order.clone()));
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(98));
    // Even with another body: the business key decides.
    let again = db
        .create_order("u1", "SKU-2", 5, Some("biz-1"))
        .await
        .unwrap();
    assert_eq!(again, CreateOutcome::Existing(order.clone()));
    assert_eq!(db.stock("SKU-2").await.unwrap(), Some(100));

    // Another user may use the same bizId.
    let other = created(
        db.create_order("u2", "SKU-1", 1, Some("biz-1"))
            .await
            .unwrap(),
    );
    assert_ne!(other.order_id, order.order_id);
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(97));

    // Generated bizId.
    let generated = created(db.create_order("u1", "SKU-3", 1, None).await.unwrap());
    assert!(generated.biz_id.starts_with("biz_"));

    assert_eq!(
        db.create_order("u1", "SKU-404", 1, Some("b-x"))
            .await
            .unwrap(),
        CreateOutcome::UnknownSku
    );
    assert_eq!(
        db.create_order("u1", "SKU-1", 98, Some("b-y"))
            .await
            .unwrap(),
        CreateOutcome::OutOfStock
    );
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(97));
    assert!(matches!(
        db.create_order("u1", "SKU-1", 0, Some("b-z")).await,
        Err(DbError::InvalidInput(_))
    ));
    assert!(matches!(
        db.set_stock("SKU-1", -1).await,
        Err(DbError::InvalidInput(_))
    ));

    let mine = db.orders_of("u1").await.unwrap();
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|o| o.user_id == "u1"));
    assert_eq!(
        db.order(&order.order_id).await.unwrap(),
        Some(order.clone())
    );
    assert_eq!(db.order("ord_nope").await.unwrap(), None);
    assert_eq!(db.orders_count().await.unwrap(), 3);
    assert_eq!(db.units_ordered("SKU-1").await.unwrap(), 3);
    assert_eq!(db.duplicates().await.unwrap(), 0);

    // The contract's JSON shape.
    let json = serde_json::to_value(&order).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "orderId": order.order_id, "bizId": "biz-1", "userId": "u1",
            "sku": "SKU-1", "quantity": 2, "status": "UNPAID"
        })
    );

    // set_stock upserts; reconnecting does not re-seed over it.
    db.set_stock("SKU-1", 5).await.unwrap();
    db.set_stock("SKU-NEW", 7).await.unwrap();
    let db2 = connect(fresh).await;
    assert_eq!(db2.stock("SKU-1").await.unwrap(), Some(5));
    assert_eq!(db2.stock("SKU-NEW").await.unwrap(), Some(7));

    db.reset_for_demo().await.unwrap();
    assert_eq!(db.orders_count().await.unwrap(), 0);
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(5));
}

async fn concurrent_connect_and_migrate(fresh: &TestDb) {
    // Four "processes" start at once on a fresh database.
    let url = fresh.url();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move { Db::connect(Some(&url)).await }));
    }
    let mut dbs = Vec::new();
    for t in tasks {
        dbs.push(t.await.unwrap().unwrap());
    }
    for db in &dbs {
        assert_eq!(db.stock("SKU-2").await.unwrap(), Some(100));
    }
}

async fn concurrent_buyers_never_oversell(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    a.set_stock("SKU-HOT", 50).await.unwrap();

    let mut tasks = Vec::new();
    for i in 0..300 {
        let db = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            db.create_order(
                &format!("buyer-{i}"),
                "SKU-HOT",
                1,
                Some(&format!("biz-{i}")),
            )
            .await
        }));
    }
    let (mut made, mut sold_out) = (0, 0);
    for t in tasks {
        match t.await.unwrap().unwrap() {
            CreateOutcome::Created(_) => made += 1,
            CreateOutcome::OutOfStock => sold_out += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(made, 50);
    assert_eq!(sold_out, 250);
    assert_eq!(a.stock("SKU-HOT").await.unwrap(), Some(0));
    assert_eq!(b.units_ordered("SKU-HOT").await.unwrap(), 50);
    assert_eq!(b.orders_count().await.unwrap(), 50);
    assert_eq!(b.duplicates().await.unwrap(), 0);
}

async fn concurrent_same_biz_id_one_order(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    let before = a.stock("SKU-1").await.unwrap().unwrap();

    let mut tasks = Vec::new();
    for i in 0..20 {
        let db = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            db.create_order("clicker", "SKU-1", 1, Some("double-click"))
                .await
        }));
    }
    let mut created_ids = Vec::new();
    let mut existing_ids = Vec::new();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            CreateOutcome::Created(o) => created_ids.push(o.order_id),
            CreateOutcome::Existing(o) => existing_ids.push(o.order_id),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(created_ids.len(), 1, "exactly one order created");
    assert_eq!(existing_ids.len(), 19);
    assert!(existing_ids.iter().all(|id| *id == created_ids[0]));
    assert_eq!(a.stock("SKU-1").await.unwrap(), Some(before - 1));
    assert_eq!(b.orders_of("clicker").await.unwrap().len(), 1);
    assert_eq!(b.duplicates().await.unwrap(), 0);
}

async fn order_state_machine(fresh: &TestDb) {
    use OrderStatus::*;
    let db = connect(fresh).await;
    let o = created(
        db.create_order("u1", "SKU-1", 1, Some("sm-1"))
            .await
            .unwrap(),
    );

    // Not in the table: refused without touching the database.
    for (from, to) in [
        (Unpaid, Completed),
        (Paid, Unpaid),
        (Cancelled, Paid),
        (Paid, Cancelled),
    ] {
        match db.transition_order(&o.order_id, from, to).await {
            Err(DbError::InvalidTransition { from: f, to: t }) => assert_eq!((f, t), (from, to)),
            other => panic!("expected InvalidTransition, got {other:?}"),
        }
    }
    assert_eq!(db.order(&o.order_id).await.unwrap().unwrap().status, Unpaid);

    assert_eq!(
        db.transition_order(&o.order_id, Unpaid, Paid)
            .await
            .unwrap(),
        Transition::Applied
    );
    assert_eq!(
        db.transition_order(&o.order_id, Unpaid, Paid)
            .await
            .unwrap(),
        Transition::AlreadyInState
    );
    assert_eq!(
        db.transition_order(&o.order_id, Unpaid, Cancelled)
            .await
            .unwrap(),
        Transition::Invalid { current: Paid }
    );
    // Becoming PAID queued the order.paid event.
    let events = db.pending_events(10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_id, o.order_id);
    assert_eq!(events[0].points, 10);

    assert_eq!(
        db.transition_order(&o.order_id, Paid, Completed)
            .await
            .unwrap(),
        Transition::Applied
    );
    assert_eq!(
        db.order(&o.order_id).await.unwrap().unwrap().status,
        Completed
    );
    assert_eq!(
        db.transition_order(&o.order_id, Paid, Completed)
            .await
            .unwrap(),
        Transition::AlreadyInState
    );

    let c = created(
        db.create_order("u1", "SKU-1", 1, Some("sm-2"))
            .await
            .unwrap(),
    );
    assert_eq!(
        db.transition_order(&c.order_id, Unpaid, Cancelled)
            .await
            .unwrap(),
        Transition::Applied
    );
    assert_eq!(
        db.transition_order(&c.order_id, Unpaid, Paid)
            .await
            .unwrap(),
        Transition::Invalid { current: Cancelled }
    );
    assert_eq!(
        db.transition_order("ord_missing", Unpaid, Paid)
            .await
            .unwrap(),
        Transition::NotFound
    );

    // Concurrent identical transitions: one Applied.
    let d = created(
        db.create_order("u1", "SKU-1", 1, Some("sm-3"))
            .await
            .unwrap(),
    );
    let other = connect(fresh).await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let db = if i % 2 == 0 {
            db.clone()
        } else {
            other.clone()
        };
        let id = d.order_id.clone();
        tasks.push(tokio::spawn(async move {
            db.transition_order(&id, Unpaid, Cancelled).await
        }));
    }
    let mut applied = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            Transition::Applied => applied += 1,
            Transition::AlreadyInState => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(applied, 1);
}

async fn concurrent_payment_notices_apply_once(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    let o = created(
        a.create_order("payer", "SKU-2", 3, Some("pay-1"))
            .await
            .unwrap(),
    );

    assert_eq!(
        a.create_payment("someone-else", &o.order_id, 1999)
            .await
            .unwrap(),
        PaymentOutcome::OrderNotFound
    );
    assert_eq!(
        a.create_payment("payer", "ord_missing", 1999)
            .await
            .unwrap(),
        PaymentOutcome::OrderNotFound
    );
    let payment = match a.create_payment("payer", &o.order_id, 1999).await.unwrap() {
        PaymentOutcome::Created(p) => p,
        other => panic!("unexpected {other:?}"),
    };
    assert!(payment.payment_id.starts_with("pay_"));
    assert_eq!(payment.status, PaymentStatus::Pending);
    assert_eq!(
        serde_json::to_value(&payment).unwrap(),
        serde_json::json!({
            "paymentId": payment.payment_id, "orderId": o.order_id,
            "amount": 1999, "status": "PENDING"
        })
    );
    assert_eq!(
        b.payment(&payment.payment_id).await.unwrap(),
        Some(payment.clone())
    );
    assert_eq!(b.payment("pay_missing").await.unwrap(), None);

    let mut tasks = Vec::new();
    for i in 0..30 {
        let db = if i % 2 == 0 { a.clone() } else { b.clone() };
        let id = payment.payment_id.clone();
        tasks.push(tokio::spawn(async move {
            db.apply_payment_notice(&id, true).await
        }));
    }
    let (mut applied, mut repeats) = (0, 0);
    for t in tasks {
        match t.await.unwrap().unwrap() {
            NoticeOutcome::Applied => applied += 1,
            NoticeOutcome::AlreadyApplied => repeats += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((applied, repeats), (1, 29));
    assert_eq!(
        a.order(&o.order_id).await.unwrap().unwrap().status,
        OrderStatus::Paid
    );
    assert_eq!(
        a.payment(&payment.payment_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        PaymentStatus::Succeeded
    );

    // A late FAILED notice cannot undo a success.
    assert_eq!(
        b.apply_payment_notice(&payment.payment_id, false)
            .await
            .unwrap(),
        NoticeOutcome::InvalidTransition
    );
    assert_eq!(
        b.apply_payment_notice("pay_missing", true).await.unwrap(),
        NoticeOutcome::NotFound
    );

    // Exactly one order.paid event, 10 points per unit.
    let events = a.pending_events(100).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_id, o.order_id);
    assert_eq!(events[0].user_id, "payer");
    assert_eq!(events[0].points, 30);
    b.mark_event_published(&o.order_id).await.unwrap();
    assert!(a.pending_events(100).await.unwrap().is_empty());

    // FAILED first: the order stays UNPAID, a later SUCCESS is refused.
    let o2 = created(
        a.create_order("payer", "SKU-2", 1, Some("pay-2"))
            .await
            .unwrap(),
    );
    let p2 = match a.create_payment("payer", &o2.order_id, 500).await.unwrap() {
        PaymentOutcome::Created(p) => p,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(
        a.apply_payment_notice(&p2.payment_id, false).await.unwrap(),
        NoticeOutcome::Applied
    );
    assert_eq!(
        a.apply_payment_notice(&p2.payment_id, false).await.unwrap(),
        NoticeOutcome::AlreadyApplied
    );
    assert_eq!(
        b.apply_payment_notice(&p2.payment_id, true).await.unwrap(),
        NoticeOutcome::InvalidTransition
    );
    assert_eq!(
        a.order(&o2.order_id).await.unwrap().unwrap().status,
        OrderStatus::Unpaid
    );
    assert!(a.pending_events(100).await.unwrap().is_empty());
}

async fn reconciliation_repairs_once(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    let o = created(
        a.create_order("late", "SKU-3", 2, Some("rec-1"))
            .await
            .unwrap(),
    );
    let p = match a.create_payment("late", &o.order_id, 100).await.unwrap() {
        PaymentOutcome::Created(p) => p,
        other => panic!("unexpected {other:?}"),
    };
    // The crash between the two writes: payment SUCCEEDED, order still UNPAID.
    a.force_payment_status_for_test(&p.payment_id, PaymentStatus::Succeeded)
        .await
        .unwrap();
    assert_eq!(
        a.order(&o.order_id).await.unwrap().unwrap().status,
        OrderStatus::Unpaid
    );

    let (ra, rb) = tokio::join!(a.reconcile(), b.reconcile());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let marked: Vec<_> = ra
        .orders_marked_paid
        .iter()
        .chain(&rb.orders_marked_paid)
        .collect();
    assert_eq!(
        marked,
        vec![&o.order_id],
        "one repair in total: {ra:?} {rb:?}"
    );
    assert_eq!(ra.total() + rb.total(), 1, "{ra:?} {rb:?}");
    assert_eq!(
        b.order(&o.order_id).await.unwrap().unwrap().status,
        OrderStatus::Paid
    );
    let events = b.pending_events(10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_id, o.order_id);
    assert_eq!(events[0].points, 20);
    assert_eq!(
        a.reconcile().await.unwrap().total(),
        0,
        "nothing left to repair"
    );

    let report = serde_json::to_value(&ra).unwrap();
    assert!(report.get("ordersMarkedPaid").is_some() && report.get("eventsRequeued").is_some());

    // A PAID order whose outbox row went missing gets it back, once.
    match &a {
        Db::Sqlite(pool) => {
            sqlx::query("DELETE FROM outbox")
                .execute(pool)
                .await
                .unwrap();
        }
        Db::Postgres(pool) => {
            sqlx::query("DELETE FROM outbox")
                .execute(pool)
                .await
                .unwrap();
        }
    }
    let (ra, rb) = tokio::join!(a.reconcile(), b.reconcile());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let requeued: Vec<_> = ra
        .events_requeued
        .iter()
        .chain(&rb.events_requeued)
        .collect();
    assert_eq!(requeued, vec![&o.order_id], "{ra:?} {rb:?}");
    assert_eq!(ra.orders_marked_paid.len() + rb.orders_marked_paid.len(), 0);
    assert_eq!(a.pending_events(10).await.unwrap().len(), 1);

    // Many repairs at once, many passes at once: every order once.
    let mut ids = Vec::new();
    for i in 0..20 {
        let o = created(
            a.create_order("late", "SKU-3", 1, Some(&format!("rec-m{i}")))
                .await
                .unwrap(),
        );
        let p = match a.create_payment("late", &o.order_id, 100).await.unwrap() {
            PaymentOutcome::Created(p) => p,
            other => panic!("unexpected {other:?}"),
        };
        a.force_payment_status_for_test(&p.payment_id, PaymentStatus::Succeeded)
            .await
            .unwrap();
        ids.push(o.order_id);
    }
    let mut tasks = Vec::new();
    for i in 0..4 {
        let db = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move { db.reconcile().await }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert!(r.events_requeued.is_empty(), "{r:?}");
        all.extend(r.orders_marked_paid);
    }
    all.sort();
    ids.sort();
    assert_eq!(all, ids);
}

async fn points_awarded_once(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let db = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            db.award_points("fan", "ord_p1", 30).await
        }));
    }
    let mut awarded = 0;
    for t in tasks {
        if t.await.unwrap().unwrap() {
            awarded += 1;
        }
    }
    assert_eq!(awarded, 1);
    assert_eq!(a.points("fan").await.unwrap(), 30);
    assert!(b.award_points("fan", "ord_p2", 10).await.unwrap());
    assert!(!a.award_points("fan", "ord_p2", 10).await.unwrap());
    assert_eq!(b.points("fan").await.unwrap(), 40);
    assert_eq!(b.points("nobody").await.unwrap(), 0);
}

async fn shared_secret_is_shared(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    let (sa, sb) = tokio::join!(a.shared_secret(), b.shared_secret());
    let (sa, sb) = (sa.unwrap(), sb.unwrap());
    assert_eq!(sa, sb);
    assert_ne!(sa, [0u8; 32]);
    assert_eq!(a.shared_secret().await.unwrap(), sa);
    let c = connect(fresh).await;
    assert_eq!(c.shared_secret().await.unwrap(), sa);
}

async fn naive_path_oversells_and_duplicates(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    a.set_stock("SKU-NAIVE", 10).await.unwrap();

    let mut tasks = Vec::new();
    for i in 0..100 {
        let db = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            db.create_order_naive(
                &format!("n{i}"),
                "SKU-NAIVE",
                1,
                Some(&format!("nb{i}")),
                Duration::from_millis(20),
            )
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let sold = a.units_ordered("SKU-NAIVE").await.unwrap();
    assert!(
        sold > 10,
        "the naive path should oversell, sold {sold} of 10"
    );
    assert!(a.stock("SKU-NAIVE").await.unwrap().unwrap() >= 0);

    // And it does not de-duplicate: the same click twice is two orders.
    for _ in 0..2 {
        created(
            b.create_order_naive("twice", "SKU-1", 1, Some("dup"), Duration::ZERO)
                .await
                .unwrap(),
        );
    }
    assert_eq!(a.duplicates().await.unwrap(), 1);
    assert_eq!(
        a.create_order_naive("x", "SKU-404", 1, None, Duration::ZERO)
            .await
            .unwrap(),
        CreateOutcome::UnknownSku
    );

    a.reset_for_demo().await.unwrap();
    assert_eq!(b.orders_count().await.unwrap(), 0);
    assert_eq!(b.duplicates().await.unwrap(), 0);
}

#[tokio::test]
async fn sqlite_in_memory_works() {
    let db = Db::connect(Some("sqlite::memory:")).await.unwrap();
    assert_eq!(db.backend(), "sqlite");
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(100));
    let o = created(db.create_order("m", "SKU-1", 1, Some("mem")).await.unwrap());
    assert_eq!(
        db.create_order("m", "SKU-1", 1, Some("mem")).await.unwrap(),
        CreateOutcome::Existing(o)
    );
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(99));
}

#[tokio::test]
async fn unsupported_url_is_rejected() {
    assert!(matches!(
        Db::connect(Some("mysql://localhost/x")).await,
        Err(DbError::InvalidInput(_))
    ));
}

/// Environment variable that turns [`child_process_worker`] on in a child process.
const CHILD_URL_ENV: &str = "NR_DBTEST_CHILD_URL";

/// Not a test on its own: the body of a child process started by
/// [`several_processes`]. Connects (racing the other child to migrate a fresh
/// database), then buys 150 times on SKU-HOT and double-submits 10 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "run as a child process by several_processes"]
async fn child_process_worker() {
    let Ok(url) = std::env::var(CHILD_URL_ENV) else {
        return;
    };
    let tag = std::process::id();
    let db = Db::connect(Some(&url)).await.unwrap();
    // Wait for the parent's go signal (SKU-HOT exists) so both children overlap.
    while db.stock("SKU-HOT").await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut tasks = Vec::new();
    for i in 0..150 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            db.create_order(&format!("p{tag}-{i}"), "SKU-HOT", 1, Some("once"))
                .await
        }));
    }
    for _ in 0..10 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            db.create_order("shared-user", "SKU-1", 1, Some("shared-biz"))
                .await
        }));
    }
    for t in tasks {
        match t.await.unwrap().unwrap() {
            CreateOutcome::Created(_) | CreateOutcome::Existing(_) | CreateOutcome::OutOfStock => {}
            CreateOutcome::UnknownSku => panic!("unknown sku"),
        }
    }
}

/// Two real processes on one fresh database: concurrent migration, 300 buyers
/// on 50 units, the same bizId submitted from both.
async fn several_processes(fresh: &TestDb) {
    let exe = std::env::current_exe().unwrap();
    let spawn = || {
        tokio::process::Command::new(&exe)
            .args([
                "--exact",
                // Its path in the one test binary (`tests/it/`).
                "db::child_process_worker",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_URL_ENV, fresh.url())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut c1, mut c2) = (spawn(), spawn());
    // Let the children race on the migrations, then open the sale.
    let db = connect(fresh).await;
    db.set_stock("SKU-HOT", 50).await.unwrap();
    assert!(c1.wait().await.unwrap().success(), "child 1 failed");
    assert!(c2.wait().await.unwrap().success(), "child 2 failed");
    assert_eq!(db.stock("SKU-HOT").await.unwrap(), Some(0));
    assert_eq!(db.units_ordered("SKU-HOT").await.unwrap(), 50);
    assert_eq!(db.orders_of("shared-user").await.unwrap().len(), 1);
    assert_eq!(db.stock("SKU-1").await.unwrap(), Some(99));
    assert_eq!(db.duplicates().await.unwrap(), 0);
}

/// Concurrent payments for one order from two pools: one is created, every
/// other caller is told which; a paid order takes none.
async fn one_live_payment_per_order(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    let o = created(
        a.create_order("one", "SKU-1", 1, Some("live-1"))
            .await
            .unwrap(),
    );
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let db = if i % 2 == 0 { a.clone() } else { b.clone() };
            let id = o.order_id.clone();
            tokio::spawn(async move { db.create_payment("one", &id, 100 + i).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap().unwrap());
    }
    let live: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            PaymentOutcome::Created(p) => Some(p.payment_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(live.len(), 1, "{outcomes:?}");
    let not_payable = PaymentOutcome::NotPayable {
        order_status: OrderStatus::Unpaid,
        live_payment: Some(live[0].clone()),
    };
    assert_eq!(outcomes.iter().filter(|o| **o == not_payable).count(), 9);
    assert!(matches!(
        a.create_payment("one", &o.order_id, 0).await,
        Err(DbError::InvalidInput(_))
    ));
    assert!(matches!(
        a.create_payment("one", &o.order_id, 10_000_001).await,
        Err(DbError::InvalidInput(_))
    ));

    assert_eq!(
        a.apply_payment_notice(&live[0], true).await.unwrap(),
        NoticeOutcome::Applied
    );
    assert_eq!(
        b.create_payment("one", &o.order_id, 100).await.unwrap(),
        PaymentOutcome::NotPayable {
            order_status: OrderStatus::Paid,
            live_payment: Some(live[0].clone()),
        }
    );
}

/// The schema as the previous version left it, with two orders holding
/// several live payments each.
const OLD_ROWS: &str = "
INSERT INTO stock (sku, available) VALUES ('SKU-1', 10);
INSERT INTO orders (order_id, biz_id, user_id, sku, quantity, status, naive, created_at, updated_at)
VALUES ('ord_a', 'a', 'u', 'SKU-1', 1, 'PAID', 0, 1, 1),
       ('ord_b', 'b', 'u', 'SKU-1', 1, 'UNPAID', 0, 1, 1),
       ('ord_c', 'c', 'u', 'SKU-1', 1, 'UNPAID', 0, 1, 1);
INSERT INTO payments (payment_id, order_id, user_id, amount, status, created_at, updated_at)
VALUES ('pay_a1', 'ord_a', 'u', 5, 'PENDING', 1, 1),
       ('pay_a2', 'ord_a', 'u', 1999, 'SUCCEEDED', 2, 2),
       ('pay_a3', 'ord_a', 'u', 5, 'SUCCEEDED', 3, 3),
       ('pay_a4', 'ord_a', 'u', 5, 'FAILED', 4, 4),
       ('pay_b1', 'ord_b', 'u', 5, 'PENDING', 1, 1),
       ('pay_b2', 'ord_b', 'u', 5, 'PENDING', 2, 2),
       ('pay_c1', 'ord_c', 'u', 5, 'PENDING', 1, 1),
       ('pay_c2', 'ord_c', 'u', 5, 'FAILED', 2, 2);
";

/// Writes the first migration only (as the previous version did) and
/// [`OLD_ROWS`].
async fn write_old_database(fresh: &TestDb) {
    let backend = fresh.backend();
    let dir = std::env::temp_dir().join(format!("nr_oldmig_{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        format!(
            "{}/migrations/{backend}/0001_init.sql",
            env!("CARGO_MANIFEST_DIR")
        ),
        dir.join("0001_init.sql"),
    )
    .unwrap();
    let old = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    match fresh {
        TestDb::Sqlite(_) => {
            let pool = sqlx::SqlitePool::connect(&fresh.url()).await.unwrap();
            old.run(&pool).await.unwrap();
            sqlx::raw_sql(OLD_ROWS).execute(&pool).await.unwrap();
            pool.close().await;
        }
        TestDb::Postgres(pg) => {
            let pool = pg.pool().await;
            old.run(&pool).await.unwrap();
            sqlx::raw_sql(OLD_ROWS).execute(&pool).await.unwrap();
            pool.close().await;
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Today's migrations over a database that already holds several live
/// payments per order: they apply, each order keeps one live payment (a
/// SUCCEEDED one first), the others cannot succeed, and reconciliation
/// reports every such order, from the library and from the command line.
async fn migration_over_duplicate_payments(fresh: &TestDb) {
    write_old_database(fresh).await;
    let db = connect(fresh).await;
    let report = db.reconcile().await.unwrap();
    let found: Vec<(&str, Vec<&str>)> = report
        .duplicate_payments
        .iter()
        .map(|d| {
            let ids = d.payment_ids.iter().map(String::as_str).collect();
            (d.order_id.as_str(), ids)
        })
        .collect();
    assert_eq!(
        found,
        vec![
            ("ord_a", vec!["pay_a2", "pay_a1", "pay_a3"]),
            ("ord_b", vec!["pay_b1", "pay_b2"]),
        ]
    );
    // Reported, not repaired (ord_a's missing outbox row is the one repair).
    assert_eq!(report.total(), 1, "{report:?}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["duplicatePayments"][1]["orderId"], "ord_b");

    // The superseded payment cannot succeed; the live one can.
    assert_eq!(
        db.apply_payment_notice("pay_b2", true).await.unwrap(),
        NoticeOutcome::NotLive
    );
    assert_eq!(
        db.payment("pay_b2").await.unwrap().unwrap().status,
        PaymentStatus::Pending
    );
    assert_eq!(
        db.create_payment("u", "ord_b", 5).await.unwrap(),
        PaymentOutcome::NotPayable {
            order_status: OrderStatus::Unpaid,
            live_payment: Some("pay_b1".into()),
        }
    );
    assert_eq!(
        db.apply_payment_notice("pay_b1", true).await.unwrap(),
        NoticeOutcome::Applied
    );
    assert_eq!(
        db.apply_payment_notice("pay_b2", false).await.unwrap(),
        NoticeOutcome::Applied,
        "a superseded payment may still fail"
    );
    db.close().await;

    let out = common::shop_command()
        .args(["reconcile", "--once", "--database", &fresh.url()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let orders: Vec<&serde_json::Value> = printed["report"]["duplicatePayments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["orderId"])
        .collect();
    assert_eq!(orders, ["ord_a"], "{printed}");
}

const MINUTE: Duration = Duration::from_secs(60);

/// A submission's window: one order inside it, the repeat told the time
/// left; another user or another fingerprint is another submission; an
/// order that was not written (out of stock) does not hold the window;
/// past its end, the same submission orders again.
async fn a_window_makes_one_order_per_submission(fresh: &TestDb) {
    let db = connect(fresh).await;
    let now = SystemTime::now();
    let (fp, other) = ([1u8; 32], [2u8; 32]);
    let first = db
        .create_order_in_window("w1", "SKU-1", 1, &fp, now, MINUTE)
        .await
        .unwrap();
    assert!(
        matches!(first, WindowOutcome::Order(CreateOutcome::Created(_))),
        "{first:?}"
    );
    match db
        .create_order_in_window("w1", "SKU-1", 1, &fp, now, MINUTE)
        .await
        .unwrap()
    {
        WindowOutcome::Repeated { retry_after } => {
            assert!(retry_after > Duration::from_secs(50), "{retry_after:?}");
            assert!(retry_after <= MINUTE, "{retry_after:?}");
        }
        other => panic!("expected Repeated, got {other:?}"),
    }
    for (user, fp) in [("w2", &fp), ("w1", &other)] {
        let made = db
            .create_order_in_window(user, "SKU-1", 1, fp, now, MINUTE)
            .await
            .unwrap();
        assert!(
            matches!(made, WindowOutcome::Order(CreateOutcome::Created(_))),
            "{user}: {made:?}"
        );
    }
    assert_eq!(db.orders_of("w1").await.unwrap().len(), 2);

    // Not written, not held: the retry orders.
    db.set_stock("SKU-W", 0).await.unwrap();
    let refused = db
        .create_order_in_window("w3", "SKU-W", 1, &fp, now, MINUTE)
        .await
        .unwrap();
    assert_eq!(refused, WindowOutcome::Order(CreateOutcome::OutOfStock));
    db.set_stock("SKU-W", 1).await.unwrap();
    let retried = db
        .create_order_in_window("w3", "SKU-W", 1, &fp, now, MINUTE)
        .await
        .unwrap();
    assert!(
        matches!(retried, WindowOutcome::Order(CreateOutcome::Created(_))),
        "{retried:?}"
    );

    // Windows that started two minutes ago have ended: each is a new order.
    let then = now - 2 * MINUTE;
    for _ in 0..2 {
        let made = db
            .create_order_in_window("w4", "SKU-1", 1, &fp, then, MINUTE)
            .await
            .unwrap();
        assert!(
            matches!(made, WindowOutcome::Order(CreateOutcome::Created(_))),
            "{made:?}"
        );
    }
    assert_eq!(db.orders_of("w4").await.unwrap().len(), 2);
    assert_eq!(db.duplicates().await.unwrap(), 0);

    // Housekeeping: the reconciler's sweep deletes ended windows (w4's one
    // row, taken over by its second order), not running ones (w1..w3's).
    assert_eq!(db.drop_ended_windows().await.unwrap(), 1);
    let short = Duration::from_secs(1);
    let made = db
        .create_order_in_window("w5", "SKU-1", 1, &fp, SystemTime::now(), short)
        .await
        .unwrap();
    assert!(
        matches!(made, WindowOutcome::Order(CreateOutcome::Created(_))),
        "{made:?}"
    );
    assert_eq!(db.drop_ended_windows().await.unwrap(), 0, "still running");
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    assert_eq!(db.drop_ended_windows().await.unwrap(), 1);
    assert_eq!(db.drop_ended_windows().await.unwrap(), 0);
}

/// Twenty copies of one submission at once over two pools ("two
/// instances"): one order, nineteen repeats, one unit of stock.
async fn concurrent_submissions_in_one_window_make_one_order(fresh: &TestDb) {
    let a = connect(fresh).await;
    let b = connect(fresh).await;
    let before = a.stock("SKU-2").await.unwrap().unwrap();
    let now = SystemTime::now();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let db = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                db.create_order_in_window("clicker", "SKU-2", 1, &[7u8; 32], now, MINUTE)
                    .await
            })
        })
        .collect();
    let (mut made, mut repeated) = (0, 0);
    for t in tasks {
        match t.await.unwrap().unwrap() {
            WindowOutcome::Order(CreateOutcome::Created(_)) => made += 1,
            WindowOutcome::Repeated { .. } => repeated += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((made, repeated), (1, 19));
    assert_eq!(b.stock("SKU-2").await.unwrap(), Some(before - 1));
    assert_eq!(a.orders_of("clicker").await.unwrap().len(), 1);
}
