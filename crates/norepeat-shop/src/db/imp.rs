//! The queries, written once and instantiated for each backend.
//!
//! SQL here is portable between SQLite and PostgreSQL: `$N` placeholders (SQLite
//! accepts them), `ON CONFLICT ... DO NOTHING`, `RETURNING`, and every integer
//! read back is a 64-bit value (`CAST(... AS BIGINT)` around aggregates, which
//! PostgreSQL would otherwise return as NUMERIC).
//!
//! Write transactions start with `BEGIN IMMEDIATE` on SQLite (take the write
//! lock up front, waiting up to `busy_timeout`, instead of failing with
//! `SQLITE_BUSY_SNAPSHOT` when a read transaction tries to upgrade) and a plain
//! `BEGIN` (READ COMMITTED) on PostgreSQL, where the conditional updates and the
//! unique index do the work. Every write is wrapped in [`retry`], which runs the
//! whole transaction again a bounded number of times on transient errors.

use std::future::Future;

use futures_util::TryFutureExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::types::{
    CreateOutcome, DbError, DuplicatePayments, NoticeOutcome, Order, OrderStatus, OutboxEvent,
    Payment, PaymentOutcome, PaymentStatus, ReconcileReport, Transition,
};

/// Attempts of one transaction before a transient error is returned.
const MAX_ATTEMPTS: u32 = 16;

/// Runs `op` again on transient errors (busy, locked, serialization, deadlock),
/// with a jittered exponential back-off, at most [`MAX_ATTEMPTS`] times.
pub(super) async fn retry<T, F, Fut>(mut op: F) -> Result<T, DbError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbError>>,
{
    let mut attempt = 1u32;
    loop {
        match op().await {
            Err(e) if attempt < MAX_ATTEMPTS && e.is_transient() => {
                tracing::debug!(attempt, error = %e, "transient database error, retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    let base = 2u64.saturating_pow(attempt.min(7)).min(100);
    let jitter = rand::random::<u64>() % (base + 1);
    Duration::from_millis(base + jitter)
}

/// Milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `prefix` followed by 128 random bits in hex.
pub(super) fn new_id(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

pub(super) fn hex_encode(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub(super) fn hex_decode_32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// An order row as selected by [`ORDER_COLUMNS`].
type OrderRow = (String, String, String, String, i64, String);
/// A payment row as selected by [`PAYMENT_COLUMNS`].
type PaymentRow = (String, String, i64, String);

fn order_from_row(row: OrderRow) -> Result<Order, DbError> {
    let (order_id, biz_id, user_id, sku, quantity, status) = row;
    let status = OrderStatus::parse(&status).ok_or_else(|| {
        DbError::Corrupt(format!("order {order_id} has unknown status {status:?}"))
    })?;
    Ok(Order {
        order_id,
        biz_id,
        user_id,
        sku,
        quantity,
        status,
    })
}

fn payment_from_row(row: PaymentRow) -> Result<Payment, DbError> {
    let (payment_id, order_id, amount, status) = row;
    let status = PaymentStatus::parse(&status).ok_or_else(|| {
        DbError::Corrupt(format!(
            "payment {payment_id} has unknown status {status:?}"
        ))
    })?;
    Ok(Payment {
        payment_id,
        order_id,
        amount,
        status,
    })
}

fn event_payload(order_id: &str, user_id: &str, points: i64) -> String {
    serde_json::json!({
        "eventId": order_id,
        "type": "order.paid",
        "orderId": order_id,
        "userId": user_id,
        "points": points,
    })
    .to_string()
}

/// Points per unit ordered.
pub(super) const POINTS_PER_UNIT: i64 = 10;

/// Key of the repeat-token secret in `shop_meta`.
const SECRET_KEY: &str = "repeat_token_secret";

const SELECT_ORDER_BY_ID: &str = "SELECT order_id, biz_id, user_id, sku, quantity, status \
     FROM orders WHERE order_id = $1";
const SELECT_ORDER_BY_BIZ: &str = "SELECT order_id, biz_id, user_id, sku, quantity, status \
     FROM orders WHERE user_id = $1 AND biz_id = $2 AND naive = 0";
const SELECT_ORDERS_OF: &str = "SELECT order_id, biz_id, user_id, sku, quantity, status \
     FROM orders WHERE user_id = $1 ORDER BY created_at, order_id";
const SELECT_PAYMENT: &str = "SELECT payment_id, order_id, amount, status \
     FROM payments WHERE payment_id = $1";
const DECREMENT_STOCK: &str =
    "UPDATE stock SET available = available - $1 WHERE sku = $2 AND available >= $1";
const COUNT_SKU: &str = "SELECT COUNT(*) FROM stock WHERE sku = $1";
const INSERT_ORDER_SAFE: &str = "INSERT INTO orders \
     (order_id, biz_id, user_id, sku, quantity, status, naive, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, 'UNPAID', 0, $6, $6) \
     ON CONFLICT (user_id, biz_id) WHERE naive = 0 DO NOTHING";
const INSERT_ORDER_NAIVE: &str = "INSERT INTO orders \
     (order_id, biz_id, user_id, sku, quantity, status, naive, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, 'UNPAID', 1, $6, $6)";
const SEED_STOCK: &str =
    "INSERT INTO stock (sku, available) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING";
const UPSERT_STOCK: &str = "INSERT INTO stock (sku, available) VALUES ($1, $2) \
     ON CONFLICT (sku) DO UPDATE SET available = excluded.available";
const TRANSITION_ORDER: &str =
    "UPDATE orders SET status = $1, updated_at = $2 WHERE order_id = $3 AND status = $4";
const SELECT_ORDER_STATUS: &str = "SELECT status FROM orders WHERE order_id = $1";
/// Inserts a PENDING payment if the order is the user's and UNPAID, and has
/// no live payment: the partial unique index `payments_one_live` decides the
/// last part, race-free, whatever the idempotency store remembers.
const INSERT_PAYMENT: &str = "INSERT INTO payments \
     (payment_id, order_id, user_id, amount, status, created_at, updated_at) \
     SELECT $1, order_id, user_id, $2, 'PENDING', $3, $3 FROM orders \
     WHERE order_id = $4 AND user_id = $5 AND status = 'UNPAID' \
     ON CONFLICT (order_id) WHERE status IN ('PENDING', 'SUCCEEDED') AND superseded = 0 \
     DO NOTHING";
const SELECT_ORDER_OWNER_STATUS: &str = "SELECT user_id, status FROM orders WHERE order_id = $1";
const SELECT_LIVE_PAYMENT: &str = "SELECT payment_id FROM payments \
     WHERE order_id = $1 AND status IN ('PENDING', 'SUCCEEDED') AND superseded = 0";
/// FAILED may settle any pending payment, the order's live one or not.
const FAIL_PAYMENT: &str = "UPDATE payments SET status = 'FAILED', updated_at = $1 \
     WHERE payment_id = $2 AND status = 'PENDING' RETURNING order_id";
/// SUCCEEDED only settles the order's live payment.
const SUCCEED_PAYMENT: &str = "UPDATE payments SET status = 'SUCCEEDED', updated_at = $1 \
     WHERE payment_id = $2 AND status = 'PENDING' AND superseded = 0 RETURNING order_id";
const SELECT_PAYMENT_STATUS: &str =
    "SELECT status, CAST(superseded AS BIGINT) FROM payments WHERE payment_id = $1";
const MARK_ORDER_PAID: &str = "UPDATE orders SET status = 'PAID', updated_at = $1 \
     WHERE order_id = $2 AND status = 'UNPAID'";
const REPAIR_ORDER_PAID: &str = "UPDATE orders SET status = 'PAID', updated_at = $1 \
     WHERE order_id = $2 AND status = 'UNPAID' AND EXISTS \
     (SELECT 1 FROM payments p WHERE p.order_id = $2 AND p.status = 'SUCCEEDED')";
const SELECT_ORDER_FOR_EVENT: &str =
    "SELECT user_id, quantity, status FROM orders WHERE order_id = $1";
const INSERT_OUTBOX: &str = "INSERT INTO outbox \
     (event_id, event_type, user_id, points, payload, published, created_at) \
     VALUES ($1, 'order.paid', $2, $3, $4, 0, $5) ON CONFLICT (event_id) DO NOTHING";
const FIND_UNPAID_WITH_SUCCESS: &str = "SELECT DISTINCT o.order_id FROM orders o \
     JOIN payments p ON p.order_id = o.order_id \
     WHERE p.status = 'SUCCEEDED' AND o.status = 'UNPAID' ORDER BY o.order_id";
/// Every non-failed payment of an order that has more than one, the live
/// one first.
const FIND_DUPLICATE_PAYMENTS: &str = "SELECT order_id, payment_id FROM payments \
     WHERE status <> 'FAILED' AND order_id IN (SELECT order_id FROM payments \
     WHERE status <> 'FAILED' GROUP BY order_id HAVING COUNT(*) > 1) \
     ORDER BY order_id, superseded, created_at, payment_id";
const FIND_PAID_WITHOUT_EVENT: &str = "SELECT o.order_id FROM orders o \
     LEFT JOIN outbox e ON e.event_id = o.order_id \
     WHERE o.status IN ('PAID', 'COMPLETED') AND e.event_id IS NULL ORDER BY o.order_id";
const PENDING_EVENTS: &str = "SELECT event_id, user_id, points FROM outbox \
     WHERE published = 0 ORDER BY seq LIMIT $1";
const MARK_PUBLISHED: &str =
    "UPDATE outbox SET published = 1, published_at = $1 WHERE event_id = $2";
const AWARD_POINTS: &str = "INSERT INTO points_ledger (order_id, user_id, points, created_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING";
const SUM_POINTS: &str =
    "SELECT CAST(COALESCE(SUM(points), 0) AS BIGINT) FROM points_ledger WHERE user_id = $1";
const INSERT_SECRET: &str = "INSERT INTO shop_meta (meta_key, meta_value) VALUES ($1, $2) ON CONFLICT (meta_key) DO NOTHING";
const SELECT_SECRET: &str = "SELECT meta_value FROM shop_meta WHERE meta_key = $1";
pub(super) const DUPLICATES: &str = "SELECT CAST(COALESCE(SUM(c - 1), 0) AS BIGINT) FROM \
     (SELECT COUNT(*) AS c FROM orders GROUP BY user_id, biz_id) AS grouped";
pub(super) const ORDERS_COUNT: &str = "SELECT CAST(COUNT(*) AS BIGINT) FROM orders";
pub(super) const UNITS_ORDERED: &str =
    "SELECT CAST(COALESCE(SUM(quantity), 0) AS BIGINT) FROM orders WHERE sku = $1";
const FORCE_PAYMENT_STATUS: &str =
    "UPDATE payments SET status = $1, updated_at = $2 WHERE payment_id = $3";

/// Groups `(order_id, payment_id)` rows, sorted by order, per order.
fn group_duplicates(rows: Vec<(String, String)>) -> Vec<DuplicatePayments> {
    let mut out: Vec<DuplicatePayments> = Vec::new();
    for (order_id, payment_id) in rows {
        match out.last_mut() {
            Some(last) if last.order_id == order_id => last.payment_ids.push(payment_id),
            _ => out.push(DuplicatePayments {
                order_id,
                payment_ids: vec![payment_id],
            }),
        }
    }
    out
}

/// Instantiates the query functions for one backend: `$name` is the module to
/// create, `$db` the sqlx database type, `$begin` the statement that opens a
/// write transaction.
macro_rules! backend {
    ($name:ident, $db:ty, $begin:literal) => {
        pub(super) mod $name {
            use super::*;

            type Pool = sqlx::Pool<$db>;
            type Tx = sqlx::Transaction<'static, $db>;

            async fn begin(pool: &Pool) -> Result<Tx, DbError> {
                Ok(pool.begin_with($begin).await?)
            }

            pub(crate) async fn seed(pool: &Pool, skus: &[(&str, i64)]) -> Result<(), DbError> {
                retry(|| async {
                    let mut tx = begin(pool).await?;
                    for (sku, available) in skus {
                        sqlx::query::<$db>(SEED_STOCK)
                            .bind(*sku)
                            .bind(*available)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    Ok(())
                })
                .await
            }

            async fn find_by_biz(
                pool: &Pool,
                user: &str,
                biz_id: &str,
            ) -> Result<Option<Order>, DbError> {
                sqlx::query_as::<$db, OrderRow>(SELECT_ORDER_BY_BIZ)
                    .bind(user)
                    .bind(biz_id)
                    .fetch_optional(pool)
                    .await?
                    .map(order_from_row)
                    .transpose()
            }

            /// `None`: lost a unique-key race to an order that vanished again
            /// (reset in between); the caller tries again.
            async fn create_order_once(
                pool: &Pool,
                user: &str,
                sku: &str,
                quantity: i64,
                biz_id: &str,
            ) -> Result<Option<CreateOutcome>, DbError> {
                let mut tx = begin(pool).await?;
                if let Some(row) = sqlx::query_as::<$db, OrderRow>(SELECT_ORDER_BY_BIZ)
                    .bind(user)
                    .bind(biz_id)
                    .fetch_optional(&mut *tx)
                    .await?
                {
                    tx.rollback().await?;
                    return Ok(Some(CreateOutcome::Existing(order_from_row(row)?)));
                }
                let taken = sqlx::query::<$db>(DECREMENT_STOCK)
                    .bind(quantity)
                    .bind(sku)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if taken == 0 {
                    let known: i64 = sqlx::query_scalar::<$db, i64>(COUNT_SKU)
                        .bind(sku)
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.rollback().await?;
                    return Ok(Some(if known > 0 {
                        CreateOutcome::OutOfStock
                    } else {
                        CreateOutcome::UnknownSku
                    }));
                }
                let order = Order {
                    order_id: new_id("ord_"),
                    biz_id: biz_id.to_owned(),
                    user_id: user.to_owned(),
                    sku: sku.to_owned(),
                    quantity,
                    status: OrderStatus::Unpaid,
                };
                let inserted = sqlx::query::<$db>(INSERT_ORDER_SAFE)
                    .bind(&order.order_id)
                    .bind(&order.biz_id)
                    .bind(&order.user_id)
                    .bind(&order.sku)
                    .bind(order.quantity)
                    .bind(now_ms())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if inserted == 0 {
                    // A concurrent request with the same (user, bizId) committed
                    // first: give the stock back and answer with its order.
                    tx.rollback().await?;
                    return Ok(find_by_biz(pool, user, biz_id)
                        .await?
                        .map(CreateOutcome::Existing));
                }
                tx.commit().await?;
                Ok(Some(CreateOutcome::Created(order)))
            }

            pub(crate) async fn create_order(
                pool: &Pool,
                user: &str,
                sku: &str,
                quantity: i64,
                biz_id: &str,
            ) -> Result<CreateOutcome, DbError> {
                for _ in 0..MAX_ATTEMPTS {
                    if let Some(outcome) =
                        retry(|| create_order_once(pool, user, sku, quantity, biz_id)).await?
                    {
                        return Ok(outcome);
                    }
                }
                Err(DbError::Corrupt(format!(
                    "order ({user}, {biz_id}) kept conflicting but could not be read"
                )))
            }

            pub(crate) async fn create_order_naive(
                pool: &Pool,
                user: &str,
                sku: &str,
                quantity: i64,
                biz_id: &str,
                gap: Duration,
            ) -> Result<CreateOutcome, DbError> {
                // Check ...
                let available: Option<i64> = retry(|| {
                    sqlx::query_scalar::<$db, i64>("SELECT available FROM stock WHERE sku = $1")
                        .bind(sku)
                        .fetch_optional(pool)
                        .map_err(DbError::from)
                })
                .await?;
                let Some(available) = available else {
                    return Ok(CreateOutcome::UnknownSku);
                };
                if available < quantity {
                    return Ok(CreateOutcome::OutOfStock);
                }
                // ... then act, on a value that may be stale by now.
                if !gap.is_zero() {
                    tokio::time::sleep(gap).await;
                }
                retry(|| {
                    sqlx::query::<$db>("UPDATE stock SET available = $1 WHERE sku = $2")
                        .bind(available - quantity)
                        .bind(sku)
                        .execute(pool)
                        .map_err(DbError::from)
                })
                .await?;
                let order = Order {
                    order_id: new_id("ord_"),
                    biz_id: biz_id.to_owned(),
                    user_id: user.to_owned(),
                    sku: sku.to_owned(),
                    quantity,
                    status: OrderStatus::Unpaid,
                };
                let created_at = now_ms();
                retry(|| {
                    sqlx::query::<$db>(INSERT_ORDER_NAIVE)
                        .bind(&order.order_id)
                        .bind(&order.biz_id)
                        .bind(&order.user_id)
                        .bind(&order.sku)
                        .bind(order.quantity)
                        .bind(created_at)
                        .execute(pool)
                        .map_err(DbError::from)
                })
                .await?;
                Ok(CreateOutcome::Created(order))
            }

            pub(crate) async fn orders_of(pool: &Pool, user: &str) -> Result<Vec<Order>, DbError> {
                sqlx::query_as::<$db, OrderRow>(SELECT_ORDERS_OF)
                    .bind(user)
                    .fetch_all(pool)
                    .await?
                    .into_iter()
                    .map(order_from_row)
                    .collect()
            }

            pub(crate) async fn order(pool: &Pool, order_id: &str) -> Result<Option<Order>, DbError> {
                sqlx::query_as::<$db, OrderRow>(SELECT_ORDER_BY_ID)
                    .bind(order_id)
                    .fetch_optional(pool)
                    .await?
                    .map(order_from_row)
                    .transpose()
            }

            pub(crate) async fn stock(pool: &Pool, sku: &str) -> Result<Option<i64>, DbError> {
                Ok(sqlx::query_scalar::<$db, i64>("SELECT available FROM stock WHERE sku = $1")
                    .bind(sku)
                    .fetch_optional(pool)
                    .await?)
            }

            pub(crate) async fn set_stock(pool: &Pool, sku: &str, available: i64) -> Result<(), DbError> {
                retry(|| async {
                    sqlx::query::<$db>(UPSERT_STOCK)
                        .bind(sku)
                        .bind(available)
                        .execute(pool)
                        .await?;
                    Ok(())
                })
                .await
            }

            /// Inserts the `order.paid` outbox row of `order_id` if the order
            /// is PAID or COMPLETED and has none; true if inserted now.
            async fn ensure_outbox(tx: &mut Tx, order_id: &str) -> Result<bool, DbError> {
                let row: Option<(String, i64, String)> =
                    sqlx::query_as::<$db, (String, i64, String)>(SELECT_ORDER_FOR_EVENT)
                        .bind(order_id)
                        .fetch_optional(&mut **tx)
                        .await?;
                let Some((user_id, quantity, status)) = row else {
                    return Ok(false);
                };
                if status != OrderStatus::Paid.as_str() && status != OrderStatus::Completed.as_str()
                {
                    return Ok(false);
                }
                let points = quantity.saturating_mul(POINTS_PER_UNIT);
                let inserted = sqlx::query::<$db>(INSERT_OUTBOX)
                    .bind(order_id)
                    .bind(&user_id)
                    .bind(points)
                    .bind(event_payload(order_id, &user_id, points))
                    .bind(now_ms())
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                Ok(inserted == 1)
            }

            async fn transition_once(
                pool: &Pool,
                order_id: &str,
                from: OrderStatus,
                to: OrderStatus,
            ) -> Result<Transition, DbError> {
                let mut tx = begin(pool).await?;
                let changed = sqlx::query::<$db>(TRANSITION_ORDER)
                    .bind(to.as_str())
                    .bind(now_ms())
                    .bind(order_id)
                    .bind(from.as_str())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if changed == 1 {
                    if to == OrderStatus::Paid {
                        ensure_outbox(&mut tx, order_id).await?;
                    }
                    tx.commit().await?;
                    return Ok(Transition::Applied);
                }
                let current: Option<String> = sqlx::query_scalar::<$db, String>(SELECT_ORDER_STATUS)
                    .bind(order_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.rollback().await?;
                let Some(current) = current else {
                    return Ok(Transition::NotFound);
                };
                let current = OrderStatus::parse(&current).ok_or_else(|| {
                    DbError::Corrupt(format!("order {order_id} has unknown status {current:?}"))
                })?;
                Ok(if current == to {
                    Transition::AlreadyInState
                } else {
                    Transition::Invalid { current }
                })
            }

            pub(crate) async fn transition_order(
                pool: &Pool,
                order_id: &str,
                from: OrderStatus,
                to: OrderStatus,
            ) -> Result<Transition, DbError> {
                retry(|| transition_once(pool, order_id, from, to)).await
            }

            /// Creates the payment and commits it: [`begin_payment`] and a
            /// commit when the payment was created (a refusal's transaction
            /// is dropped, so rolled back), retried whole when the database
            /// is busy.
            pub(crate) async fn create_payment(
                pool: &Pool,
                user: &str,
                order_id: &str,
                amount: i64,
            ) -> Result<PaymentOutcome, DbError> {
                retry(|| async {
                    let (tx, outcome) = begin_payment(pool, user, order_id, amount).await?;
                    if matches!(outcome, PaymentOutcome::Created(_)) {
                        tx.commit().await?;
                    }
                    Ok(outcome)
                })
                .await
            }

            /// Creates the payment inside `tx`, left uncommitted (for
            /// the idempotency record to commit with it). `None`: the order
            /// is payable but the insert found a live payment that has
            /// failed since; the caller tries again. No retry of single
            /// statements: a failed statement spoils a PostgreSQL transaction.
            async fn payment_in_tx(
                tx: &mut Tx,
                user: &str,
                order_id: &str,
                amount: i64,
            ) -> Result<Option<PaymentOutcome>, DbError> {
                let payment = Payment {
                    payment_id: new_id("pay_"),
                    order_id: order_id.to_owned(),
                    amount,
                    status: PaymentStatus::Pending,
                };
                let inserted = sqlx::query::<$db>(INSERT_PAYMENT)
                    .bind(&payment.payment_id)
                    .bind(amount)
                    .bind(now_ms())
                    .bind(order_id)
                    .bind(user)
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                if inserted == 1 {
                    return Ok(Some(PaymentOutcome::Created(payment)));
                }
                let order: Option<(String, String)> =
                    sqlx::query_as::<$db, (String, String)>(SELECT_ORDER_OWNER_STATUS)
                        .bind(order_id)
                        .fetch_optional(&mut **tx)
                        .await?;
                let Some((owner, status)) = order.filter(|(owner, _)| owner == user) else {
                    return Ok(Some(PaymentOutcome::OrderNotFound));
                };
                let order_status = OrderStatus::parse(&status).ok_or_else(|| {
                    DbError::Corrupt(format!("order {order_id} of {owner} has unknown status {status:?}"))
                })?;
                let live_payment: Option<String> =
                    sqlx::query_scalar::<$db, String>(SELECT_LIVE_PAYMENT)
                        .bind(order_id)
                        .fetch_optional(&mut **tx)
                        .await?;
                if order_status != OrderStatus::Unpaid || live_payment.is_some() {
                    return Ok(Some(PaymentOutcome::NotPayable {
                        order_status,
                        live_payment,
                    }));
                }
                Ok(None)
            }

            /// Opens a write transaction and creates the payment in it,
            /// uncommitted; the caller commits (or drops to roll back).
            pub(crate) async fn begin_payment(
                pool: &Pool,
                user: &str,
                order_id: &str,
                amount: i64,
            ) -> Result<(Tx, PaymentOutcome), DbError> {
                for _ in 0..MAX_ATTEMPTS {
                    let mut tx = begin(pool).await?;
                    if let Some(outcome) = payment_in_tx(&mut tx, user, order_id, amount).await? {
                        return Ok((tx, outcome));
                    }
                }
                Err(DbError::Corrupt(format!(
                    "payment for order {order_id} kept conflicting with a payment that could not be read"
                )))
            }

            pub(crate) async fn payment(pool: &Pool, payment_id: &str) -> Result<Option<Payment>, DbError> {
                sqlx::query_as::<$db, PaymentRow>(SELECT_PAYMENT)
                    .bind(payment_id)
                    .fetch_optional(pool)
                    .await?
                    .map(payment_from_row)
                    .transpose()
            }

            async fn notice_once(
                pool: &Pool,
                payment_id: &str,
                success: bool,
            ) -> Result<NoticeOutcome, DbError> {
                let (target, settle) = if success {
                    (PaymentStatus::Succeeded, SUCCEED_PAYMENT)
                } else {
                    (PaymentStatus::Failed, FAIL_PAYMENT)
                };
                let now = now_ms();
                let mut tx = begin(pool).await?;
                let settled: Option<String> = sqlx::query_scalar::<$db, String>(settle)
                    .bind(now)
                    .bind(payment_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                if let Some(order_id) = settled {
                    if success {
                        sqlx::query::<$db>(MARK_ORDER_PAID)
                            .bind(now)
                            .bind(&order_id)
                            .execute(&mut *tx)
                            .await?;
                        ensure_outbox(&mut tx, &order_id).await?;
                    }
                    tx.commit().await?;
                    return Ok(NoticeOutcome::Applied);
                }
                let current: Option<(String, i64)> =
                    sqlx::query_as::<$db, (String, i64)>(SELECT_PAYMENT_STATUS)
                        .bind(payment_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                tx.rollback().await?;
                Ok(match current {
                    None => NoticeOutcome::NotFound,
                    Some((s, _)) if s == target.as_str() => NoticeOutcome::AlreadyApplied,
                    Some((s, superseded))
                        if superseded != 0 && s == PaymentStatus::Pending.as_str() =>
                    {
                        NoticeOutcome::NotLive
                    }
                    Some(_) => NoticeOutcome::InvalidTransition,
                })
            }

            pub(crate) async fn apply_payment_notice(
                pool: &Pool,
                payment_id: &str,
                success: bool,
            ) -> Result<NoticeOutcome, DbError> {
                retry(|| notice_once(pool, payment_id, success)).await
            }

            async fn repair_paid_once(pool: &Pool, order_id: &str) -> Result<bool, DbError> {
                let mut tx = begin(pool).await?;
                let changed = sqlx::query::<$db>(REPAIR_ORDER_PAID)
                    .bind(now_ms())
                    .bind(order_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if changed == 1 {
                    ensure_outbox(&mut tx, order_id).await?;
                    tx.commit().await?;
                    Ok(true)
                } else {
                    tx.rollback().await?;
                    Ok(false)
                }
            }

            async fn requeue_once(pool: &Pool, order_id: &str) -> Result<bool, DbError> {
                let mut tx = begin(pool).await?;
                let inserted = ensure_outbox(&mut tx, order_id).await?;
                tx.commit().await?;
                Ok(inserted)
            }

            pub(crate) async fn reconcile(pool: &Pool) -> Result<ReconcileReport, DbError> {
                let mut report = ReconcileReport::default();
                let unpaid: Vec<String> = sqlx::query_scalar::<$db, String>(FIND_UNPAID_WITH_SUCCESS)
                    .fetch_all(pool)
                    .await?;
                for order_id in unpaid {
                    if retry(|| repair_paid_once(pool, &order_id)).await? {
                        tracing::info!(%order_id, "reconcile: order marked PAID");
                        report.orders_marked_paid.push(order_id);
                    }
                }
                let missing: Vec<String> = sqlx::query_scalar::<$db, String>(FIND_PAID_WITHOUT_EVENT)
                    .fetch_all(pool)
                    .await?;
                for order_id in missing {
                    if retry(|| requeue_once(pool, &order_id)).await? {
                        tracing::info!(%order_id, "reconcile: order.paid event requeued");
                        report.events_requeued.push(order_id);
                    }
                }
                let rows: Vec<(String, String)> =
                    sqlx::query_as::<$db, (String, String)>(FIND_DUPLICATE_PAYMENTS)
                        .fetch_all(pool)
                        .await?;
                report.duplicate_payments = group_duplicates(rows);
                for d in &report.duplicate_payments {
                    tracing::warn!(order_id = %d.order_id, payments = ?d.payment_ids,
                        "reconcile: order has more than one non-failed payment");
                }
                Ok(report)
            }

            pub(crate) async fn pending_events(pool: &Pool, limit: i64) -> Result<Vec<OutboxEvent>, DbError> {
                let rows: Vec<(String, String, i64)> =
                    sqlx::query_as::<$db, (String, String, i64)>(PENDING_EVENTS)
                        .bind(limit.max(0))
                        .fetch_all(pool)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map(|(event_id, user_id, points)| OutboxEvent {
                        event_id,
                        user_id,
                        points,
                    })
                    .collect())
            }

            pub(crate) async fn mark_event_published(pool: &Pool, event_id: &str) -> Result<(), DbError> {
                let now = now_ms();
                retry(|| async {
                    sqlx::query::<$db>(MARK_PUBLISHED)
                        .bind(now)
                        .bind(event_id)
                        .execute(pool)
                        .await?;
                    Ok(())
                })
                .await
            }

            pub(crate) async fn award_points(
                pool: &Pool,
                user: &str,
                order_id: &str,
                points: i64,
            ) -> Result<bool, DbError> {
                let now = now_ms();
                let inserted = retry(|| {
                    sqlx::query::<$db>(AWARD_POINTS)
                        .bind(order_id)
                        .bind(user)
                        .bind(points)
                        .bind(now)
                        .execute(pool)
                        .map_err(DbError::from)
                })
                .await?
                .rows_affected();
                Ok(inserted == 1)
            }

            pub(crate) async fn points(pool: &Pool, user: &str) -> Result<i64, DbError> {
                Ok(sqlx::query_scalar::<$db, i64>(SUM_POINTS)
                    .bind(user)
                    .fetch_one(pool)
                    .await?)
            }

            pub(crate) async fn shared_secret(pool: &Pool) -> Result<[u8; 32], DbError> {
                let candidate = hex_encode(&rand::random::<[u8; 32]>());
                retry(|| {
                    sqlx::query::<$db>(INSERT_SECRET)
                        .bind(SECRET_KEY)
                        .bind(&candidate)
                        .execute(pool)
                        .map_err(DbError::from)
                })
                .await?;
                let stored: String = sqlx::query_scalar::<$db, String>(SELECT_SECRET)
                    .bind(SECRET_KEY)
                    .fetch_one(pool)
                    .await?;
                hex_decode_32(&stored)
                    .ok_or_else(|| DbError::Corrupt("shared secret is not 32 hex-encoded bytes".into()))
            }

            pub(crate) async fn scalar(pool: &Pool, sql: &'static str, arg: Option<&str>) -> Result<i64, DbError> {
                let query = sqlx::query_scalar::<$db, i64>(sql);
                let query = match arg {
                    Some(arg) => query.bind(arg.to_owned()),
                    None => query,
                };
                Ok(query.fetch_one(pool).await?)
            }

            pub(crate) async fn force_payment_status(
                pool: &Pool,
                payment_id: &str,
                status: PaymentStatus,
            ) -> Result<(), DbError> {
                let now = now_ms();
                retry(|| async {
                    sqlx::query::<$db>(FORCE_PAYMENT_STATUS)
                        .bind(status.as_str())
                        .bind(now)
                        .bind(payment_id)
                        .execute(pool)
                        .await?;
                    Ok(())
                })
                .await
            }

            pub(crate) async fn reset(pool: &Pool) -> Result<(), DbError> {
                retry(|| async {
                    let mut tx = begin(pool).await?;
                    for sql in [
                        "DELETE FROM payments",
                        "DELETE FROM outbox",
                        "DELETE FROM points_ledger",
                        "DELETE FROM orders",
                    ] {
                        sqlx::query::<$db>(sql).execute(&mut *tx).await?;
                    }
                    tx.commit().await?;
                    Ok(())
                })
                .await
            }
        }
    };
}

backend!(sqlite, sqlx::Sqlite, "BEGIN IMMEDIATE");
backend!(postgres, sqlx::Postgres, "BEGIN");
