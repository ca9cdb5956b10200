// Over 400 lines on purpose: orders and stock: each statement that decides an order (its unique business key, the stock's conditional update) beside the others.
//! Orders and stock: creating an order (safely, and the storm's naive
//! baseline), reading orders and stock, the order state machine, seeding and
//! the storm's counters.

use std::time::Duration;

use futures_util::TryFutureExt;
use sqlx::{ColumnIndex, Encode, Executor, Type};

use super::backend::{Backend, Field, Queries};
use super::ids::{new_id, now_ms};
use super::retry::{MAX_ATTEMPTS, retry};
use super::types::{CreateOutcome, DbError, Transition, WindowOutcome};
use crate::domain::{Order, OrderStatus};

/// An order row as selected by the `SELECT_ORDER*` queries.
type OrderRow = (String, String, String, String, i64, String);

const SELECT_ORDER_BY_ID: &str = "SELECT order_id, biz_id, user_id, sku, quantity, status \
     FROM orders WHERE order_id = $1";
const SELECT_ORDER_BY_BIZ: &str = "SELECT order_id, biz_id, user_id, sku, quantity, status \
     FROM orders WHERE user_id = $1 AND biz_id = $2 AND naive = 0";
const SELECT_ORDERS_OF: &str = "SELECT order_id, biz_id, user_id, sku, quantity, status \
     FROM orders WHERE user_id = $1 ORDER BY created_at, order_id";
const SELECT_STOCK: &str = "SELECT available FROM stock WHERE sku = $1";
const DECREMENT_STOCK: &str =
    "UPDATE stock SET available = available - $1 WHERE sku = $2 AND available >= $1";
const COUNT_SKU: &str = "SELECT COUNT(*) FROM stock WHERE sku = $1";
/// The naive path's write-back of a value read earlier (the race on purpose).
const WRITE_STOCK: &str = "UPDATE stock SET available = $1 WHERE sku = $2";
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
/// Claims a submission's window: inserted, or taken over once the old one
/// has ended; no row changed while it lasts.
const CLAIM_WINDOW: &str = "INSERT INTO order_windows (user_id, fingerprint, until_ms) \
     VALUES ($1, $2, $3) \
     ON CONFLICT (user_id, fingerprint) DO UPDATE SET until_ms = excluded.until_ms \
     WHERE order_windows.until_ms <= $4";
const WINDOW_UNTIL: &str =
    "SELECT until_ms FROM order_windows WHERE user_id = $1 AND fingerprint = $2";
const DROP_ALL_ENDED_WINDOWS: &str = "DELETE FROM order_windows WHERE until_ms <= $1";
const TRANSITION_ORDER: &str =
    "UPDATE orders SET status = $1, updated_at = $2 WHERE order_id = $3 AND status = $4";
const SELECT_ORDER_STATUS: &str = "SELECT status FROM orders WHERE order_id = $1";
const DUPLICATES: &str = "SELECT CAST(COALESCE(SUM(c - 1), 0) AS BIGINT) FROM \
     (SELECT COUNT(*) AS c FROM orders GROUP BY user_id, biz_id) AS grouped";
const ORDERS_COUNT: &str = "SELECT CAST(COUNT(*) AS BIGINT) FROM orders";
const UNITS_ORDERED: &str =
    "SELECT CAST(COALESCE(SUM(quantity), 0) AS BIGINT) FROM orders WHERE sku = $1";

/// A submission's window in the database (see
/// [`Db::create_order_in_window`](super::Db::create_order_in_window)).
#[derive(Debug)]
pub(super) struct OrderWindow {
    /// The request fingerprint, in hex.
    pub(super) fingerprint: String,
    /// When the window ends, in Unix milliseconds.
    pub(super) until_ms: i64,
}

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

fn new_order(user: &str, sku: &str, quantity: i64, biz_id: &str) -> Order {
    Order {
        order_id: new_id("ord_"),
        biz_id: biz_id.to_owned(),
        user_id: user.to_owned(),
        sku: sku.to_owned(),
        quantity,
        status: OrderStatus::Unpaid,
    }
}

impl<DB> Queries<'_, DB>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    String: Field<DB>,
    i64: Field<DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// Stocks each `(sku, units)` that is absent.
    pub(super) async fn seed(&self, skus: &[(&str, i64)]) -> Result<(), DbError> {
        retry(|| async {
            let mut tx = self.begin().await?;
            for (sku, available) in skus {
                sqlx::query::<DB>(SEED_STOCK)
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

    async fn find_by_biz(&self, user: &str, biz_id: &str) -> Result<Option<Order>, DbError> {
        sqlx::query_as::<DB, OrderRow>(SELECT_ORDER_BY_BIZ)
            .bind(user)
            .bind(biz_id)
            .fetch_optional(self.pool)
            .await?
            .map(order_from_row)
            .transpose()
    }

    /// `None`: lost a unique-key race to an order that vanished again
    /// (reset in between); the caller tries again.
    async fn create_order_once(
        &self,
        user: &str,
        sku: &str,
        quantity: i64,
        biz_id: &str,
        window: Option<&OrderWindow>,
    ) -> Result<Option<WindowOutcome>, DbError> {
        let mut tx = self.begin().await?;
        if let Some(w) = window {
            // First, so that a repeat never touches stock. On PostgreSQL a
            // concurrent claim of the same pair waits here for this
            // transaction and then finds the window taken (or free again,
            // if this one rolled back).
            let now = now_ms();
            let claimed = sqlx::query::<DB>(CLAIM_WINDOW)
                .bind(user)
                .bind(w.fingerprint.as_str())
                .bind(w.until_ms)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            if DB::rows_affected(&claimed) == 0 {
                let until = sqlx::query_scalar::<DB, i64>(WINDOW_UNTIL)
                    .bind(user)
                    .bind(w.fingerprint.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.rollback().await?;
                // `None`: the window vanished in between (a reset); try again.
                return Ok(until.map(|until| WindowOutcome::Repeated {
                    retry_after: Duration::from_millis(
                        u64::try_from(until.saturating_sub(now)).unwrap_or(0),
                    ),
                }));
            }
        }
        if let Some(row) = sqlx::query_as::<DB, OrderRow>(SELECT_ORDER_BY_BIZ)
            .bind(user)
            .bind(biz_id)
            .fetch_optional(&mut *tx)
            .await?
        {
            tx.rollback().await?;
            return Ok(Some(WindowOutcome::Order(CreateOutcome::Existing(
                order_from_row(row)?,
            ))));
        }
        let taken = sqlx::query::<DB>(DECREMENT_STOCK)
            .bind(quantity)
            .bind(sku)
            .execute(&mut *tx)
            .await?;
        if DB::rows_affected(&taken) == 0 {
            let known: i64 = sqlx::query_scalar::<DB, i64>(COUNT_SKU)
                .bind(sku)
                .fetch_one(&mut *tx)
                .await?;
            tx.rollback().await?;
            return Ok(Some(WindowOutcome::Order(if known > 0 {
                CreateOutcome::OutOfStock
            } else {
                CreateOutcome::UnknownSku
            })));
        }
        let order = new_order(user, sku, quantity, biz_id);
        let inserted = sqlx::query::<DB>(INSERT_ORDER_SAFE)
            .bind(order.order_id.as_str())
            .bind(order.biz_id.as_str())
            .bind(order.user_id.as_str())
            .bind(order.sku.as_str())
            .bind(order.quantity)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        if DB::rows_affected(&inserted) == 0 {
            // A concurrent request with the same (user, bizId) committed
            // first: give the stock back and answer with its order.
            tx.rollback().await?;
            return Ok(self
                .find_by_biz(user, biz_id)
                .await?
                .map(|o| WindowOutcome::Order(CreateOutcome::Existing(o))));
        }
        tx.commit().await?;
        Ok(Some(WindowOutcome::Order(CreateOutcome::Created(order))))
    }

    pub(super) async fn create_order(
        &self,
        user: &str,
        sku: &str,
        quantity: i64,
        biz_id: &str,
        window: Option<&OrderWindow>,
    ) -> Result<WindowOutcome, DbError> {
        for _ in 0..MAX_ATTEMPTS {
            if let Some(outcome) =
                retry(|| self.create_order_once(user, sku, quantity, biz_id, window)).await?
            {
                return Ok(outcome);
            }
        }
        Err(DbError::Corrupt(format!(
            "order ({user}, {biz_id}) kept conflicting but could not be read"
        )))
    }

    /// Deletes every ended window (a claim takes an ended row over, so
    /// these are the rows of submissions not sent again). Outside any
    /// order's transaction: there it would lock other submissions' rows in
    /// no fixed order. How many.
    pub(super) async fn drop_all_ended_windows(&self) -> Result<u64, DbError> {
        let dropped = retry(|| async {
            Ok(sqlx::query::<DB>(DROP_ALL_ENDED_WINDOWS)
                .bind(now_ms())
                .execute(self.pool)
                .await?)
        })
        .await?;
        Ok(DB::rows_affected(&dropped))
    }

    pub(super) async fn create_order_naive(
        &self,
        user: &str,
        sku: &str,
        quantity: i64,
        biz_id: &str,
        gap: Duration,
    ) -> Result<CreateOutcome, DbError> {
        // Check ...
        let available: Option<i64> = retry(|| {
            sqlx::query_scalar::<DB, i64>(SELECT_STOCK)
                .bind(sku)
                .fetch_optional(self.pool)
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
            sqlx::query::<DB>(WRITE_STOCK)
                .bind(available - quantity)
                .bind(sku)
                .execute(self.pool)
                .map_err(DbError::from)
        })
        .await?;
        let order = new_order(user, sku, quantity, biz_id);
        let created_at = now_ms();
        retry(|| {
            sqlx::query::<DB>(INSERT_ORDER_NAIVE)
                .bind(order.order_id.as_str())
                .bind(order.biz_id.as_str())
                .bind(order.user_id.as_str())
                .bind(order.sku.as_str())
                .bind(order.quantity)
                .bind(created_at)
                .execute(self.pool)
                .map_err(DbError::from)
        })
        .await?;
        Ok(CreateOutcome::Created(order))
    }

    pub(super) async fn orders_of(&self, user: &str) -> Result<Vec<Order>, DbError> {
        sqlx::query_as::<DB, OrderRow>(SELECT_ORDERS_OF)
            .bind(user)
            .fetch_all(self.pool)
            .await?
            .into_iter()
            .map(order_from_row)
            .collect()
    }

    pub(super) async fn order(&self, order_id: &str) -> Result<Option<Order>, DbError> {
        sqlx::query_as::<DB, OrderRow>(SELECT_ORDER_BY_ID)
            .bind(order_id)
            .fetch_optional(self.pool)
            .await?
            .map(order_from_row)
            .transpose()
    }

    pub(super) async fn stock(&self, sku: &str) -> Result<Option<i64>, DbError> {
        Ok(sqlx::query_scalar::<DB, i64>(SELECT_STOCK)
            .bind(sku)
            .fetch_optional(self.pool)
            .await?)
    }

    pub(super) async fn set_stock(&self, sku: &str, available: i64) -> Result<(), DbError> {
        retry(|| async {
            sqlx::query::<DB>(UPSERT_STOCK)
                .bind(sku)
                .bind(available)
                .execute(self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    async fn transition_once(
        &self,
        order_id: &str,
        from: OrderStatus,
        to: OrderStatus,
    ) -> Result<Transition, DbError> {
        let mut tx = self.begin().await?;
        let changed = sqlx::query::<DB>(TRANSITION_ORDER)
            .bind(to.as_str())
            .bind(now_ms())
            .bind(order_id)
            .bind(from.as_str())
            .execute(&mut *tx)
            .await?;
        if DB::rows_affected(&changed) == 1 {
            if to == OrderStatus::Paid {
                Self::ensure_outbox(&mut tx, order_id).await?;
            }
            tx.commit().await?;
            return Ok(Transition::Applied);
        }
        let current: Option<String> = sqlx::query_scalar::<DB, String>(SELECT_ORDER_STATUS)
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

    pub(super) async fn transition_order(
        &self,
        order_id: &str,
        from: OrderStatus,
        to: OrderStatus,
    ) -> Result<Transition, DbError> {
        retry(|| self.transition_once(order_id, from, to)).await
    }

    /// Extra orders sharing a `(user_id, biz_id)` with an earlier one.
    pub(super) async fn duplicates(&self) -> Result<i64, DbError> {
        Ok(sqlx::query_scalar::<DB, i64>(DUPLICATES)
            .fetch_one(self.pool)
            .await?)
    }

    /// Number of orders, safe and naive.
    pub(super) async fn orders_count(&self) -> Result<i64, DbError> {
        Ok(sqlx::query_scalar::<DB, i64>(ORDERS_COUNT)
            .fetch_one(self.pool)
            .await?)
    }

    /// Units ordered of `sku` over all orders.
    pub(super) async fn units_ordered(&self, sku: &str) -> Result<i64, DbError> {
        Ok(sqlx::query_scalar::<DB, i64>(UNITS_ORDERED)
            .bind(sku)
            .fetch_one(self.pool)
            .await?)
    }
}
