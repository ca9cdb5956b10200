//! The outbox of `order.paid` events: writing an order's event in the
//! transaction that made it PAID, reading and marking events for the
//! publisher, and reconciliation (repairing paid orders and missing events).

use futures_util::TryFutureExt as _;
use sqlx::{ColumnIndex, Encode, Executor, Type};

use super::backend::{Backend, Field, Queries};
use super::ids::now_ms;
use super::points::POINTS_PER_UNIT;
use super::retry::retry;
use super::types::{DbError, DuplicatePayments, OutboxEvent, ReconcileReport};
use crate::domain::OrderStatus;

const SELECT_ORDER_FOR_EVENT: &str =
    "SELECT user_id, quantity, status FROM orders WHERE order_id = $1";
const INSERT_OUTBOX: &str = "INSERT INTO outbox \
     (event_id, event_type, user_id, points, payload, published, created_at) \
     VALUES ($1, 'order.paid', $2, $3, $4, 0, $5) ON CONFLICT (event_id) DO NOTHING";
const PENDING_EVENTS: &str = "SELECT event_id, user_id, points FROM outbox \
     WHERE published = 0 ORDER BY seq LIMIT $1";
const MARK_PUBLISHED: &str =
    "UPDATE outbox SET published = 1, published_at = $1 WHERE event_id = $2";
const REPAIR_ORDER_PAID: &str = "UPDATE orders SET status = 'PAID', updated_at = $1 \
     WHERE order_id = $2 AND status = 'UNPAID' AND EXISTS \
     (SELECT 1 FROM payments p WHERE p.order_id = $2 AND p.status = 'SUCCEEDED')";
const FIND_UNPAID_WITH_SUCCESS: &str = "SELECT DISTINCT o.order_id FROM orders o \
     JOIN payments p ON p.order_id = o.order_id \
     WHERE p.status = 'SUCCEEDED' AND o.status = 'UNPAID' ORDER BY o.order_id";
const FIND_PAID_WITHOUT_EVENT: &str = "SELECT o.order_id FROM orders o \
     LEFT JOIN outbox e ON e.event_id = o.order_id \
     WHERE o.status IN ('PAID', 'COMPLETED') AND e.event_id IS NULL ORDER BY o.order_id";
/// Every non-failed payment of an order that has more than one, the live
/// one first.
const FIND_DUPLICATE_PAYMENTS: &str = "SELECT order_id, payment_id FROM payments \
     WHERE status <> 'FAILED' AND order_id IN (SELECT order_id FROM payments \
     WHERE status <> 'FAILED' GROUP BY order_id HAVING COUNT(*) > 1) \
     ORDER BY order_id, superseded, created_at, payment_id";

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

impl<DB> Queries<'_, DB>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    String: Field<DB>,
    i64: Field<DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// Inserts the `order.paid` outbox row of `order_id` on `conn` (inside
    /// the caller's transaction) if the order is PAID or COMPLETED and has
    /// none; true if inserted now.
    pub(super) async fn ensure_outbox(
        conn: &mut DB::Connection,
        order_id: &str,
    ) -> Result<bool, DbError> {
        let row: Option<(String, i64, String)> =
            sqlx::query_as::<DB, (String, i64, String)>(SELECT_ORDER_FOR_EVENT)
                .bind(order_id)
                .fetch_optional(&mut *conn)
                .await?;
        let Some((user_id, quantity, status)) = row else {
            return Ok(false);
        };
        if status != OrderStatus::Paid.as_str() && status != OrderStatus::Completed.as_str() {
            return Ok(false);
        }
        let points = quantity.saturating_mul(POINTS_PER_UNIT);
        let inserted = sqlx::query::<DB>(INSERT_OUTBOX)
            .bind(order_id)
            .bind(user_id.as_str())
            .bind(points)
            .bind(event_payload(order_id, &user_id, points))
            .bind(now_ms())
            .execute(&mut *conn)
            .await?;
        Ok(DB::rows_affected(&inserted) == 1)
    }

    pub(super) async fn pending_events(&self, limit: i64) -> Result<Vec<OutboxEvent>, DbError> {
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as::<DB, (String, String, i64)>(PENDING_EVENTS)
                .bind(limit.max(0))
                .fetch_all(self.pool)
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

    pub(super) async fn mark_event_published(&self, event_id: &str) -> Result<(), DbError> {
        let now = now_ms();
        retry(|| {
            sqlx::query::<DB>(MARK_PUBLISHED)
                .bind(now)
                .bind(event_id)
                .execute(self.pool)
                .map_ok(drop)
                .map_err(DbError::from)
        })
        .await
    }

    async fn repair_paid_once(&self, order_id: &str) -> Result<bool, DbError> {
        let mut tx = self.begin().await?;
        let changed = sqlx::query::<DB>(REPAIR_ORDER_PAID)
            .bind(now_ms())
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        if DB::rows_affected(&changed) == 1 {
            Self::ensure_outbox(&mut tx, order_id).await?;
            tx.commit().await?;
            Ok(true)
        } else {
            tx.rollback().await?;
            Ok(false)
        }
    }

    async fn requeue_once(&self, order_id: &str) -> Result<bool, DbError> {
        let mut tx = self.begin().await?;
        let inserted = Self::ensure_outbox(&mut tx, order_id).await?;
        tx.commit().await?;
        Ok(inserted)
    }

    pub(super) async fn reconcile(&self) -> Result<ReconcileReport, DbError> {
        let mut report = ReconcileReport::default();
        let unpaid: Vec<String> = sqlx::query_scalar::<DB, String>(FIND_UNPAID_WITH_SUCCESS)
            .fetch_all(self.pool)
            .await?;
        for order_id in unpaid {
            if retry(|| self.repair_paid_once(&order_id)).await? {
                tracing::info!(%order_id, "reconcile: order marked PAID");
                report.orders_marked_paid.push(order_id);
            }
        }
        let missing: Vec<String> = sqlx::query_scalar::<DB, String>(FIND_PAID_WITHOUT_EVENT)
            .fetch_all(self.pool)
            .await?;
        for order_id in missing {
            if retry(|| self.requeue_once(&order_id)).await? {
                tracing::info!(%order_id, "reconcile: order.paid event requeued");
                report.events_requeued.push(order_id);
            }
        }
        let rows: Vec<(String, String)> =
            sqlx::query_as::<DB, (String, String)>(FIND_DUPLICATE_PAYMENTS)
                .fetch_all(self.pool)
                .await?;
        report.duplicate_payments = group_duplicates(rows);
        for d in &report.duplicate_payments {
            tracing::warn!(order_id = %d.order_id, payments = ?d.payment_ids,
                "reconcile: order has more than one non-failed payment");
        }
        Ok(report)
    }
}
