//! Payments: creating one (committed, or left in an open transaction for the
//! idempotency record), reading one, and applying the provider's notice.

use sqlx::{ColumnIndex, Encode, Executor, Transaction, Type};

use super::backend::{Backend, Field, Queries};
use super::ids::{new_id, now_ms};
use super::retry::{MAX_ATTEMPTS, retry};
use super::types::{DbError, NoticeOutcome, PaymentOutcome};
use crate::domain::{OrderStatus, Payment, PaymentStatus};

/// A payment row as selected by [`SELECT_PAYMENT`].
type PaymentRow = (String, String, i64, String);

const SELECT_PAYMENT: &str = "SELECT payment_id, order_id, amount, status \
     FROM payments WHERE payment_id = $1";
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
const FORCE_PAYMENT_STATUS: &str =
    "UPDATE payments SET status = $1, updated_at = $2 WHERE payment_id = $3";

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

impl<DB> Queries<'_, DB>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    String: Field<DB>,
    i64: Field<DB>,
    usize: ColumnIndex<DB::Row>,
{
    /// Creates the payment and commits it: [`begin_payment`](Self::begin_payment)
    /// and a commit when the payment was created (a refusal's transaction is
    /// dropped, so rolled back), retried whole when the database is busy.
    pub(super) async fn create_payment(
        &self,
        user: &str,
        order_id: &str,
        amount: i64,
    ) -> Result<PaymentOutcome, DbError> {
        retry(|| async {
            let (tx, outcome) = self.begin_payment(user, order_id, amount).await?;
            if matches!(outcome, PaymentOutcome::Created(_)) {
                tx.commit().await?;
            }
            Ok(outcome)
        })
        .await
    }

    /// Creates the payment on `conn` (inside a transaction, left
    /// uncommitted for the idempotency record to commit with it). `None`:
    /// the order is payable but the insert found a live payment that has
    /// failed since; the caller tries again. No retry of single statements:
    /// a failed statement spoils a PostgreSQL transaction.
    async fn payment_in_tx(
        conn: &mut DB::Connection,
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
        let inserted = sqlx::query::<DB>(INSERT_PAYMENT)
            .bind(payment.payment_id.as_str())
            .bind(amount)
            .bind(now_ms())
            .bind(order_id)
            .bind(user)
            .execute(&mut *conn)
            .await?;
        if DB::rows_affected(&inserted) == 1 {
            return Ok(Some(PaymentOutcome::Created(payment)));
        }
        let order: Option<(String, String)> =
            sqlx::query_as::<DB, (String, String)>(SELECT_ORDER_OWNER_STATUS)
                .bind(order_id)
                .fetch_optional(&mut *conn)
                .await?;
        let Some((owner, status)) = order.filter(|(owner, _)| owner == user) else {
            return Ok(Some(PaymentOutcome::OrderNotFound));
        };
        let order_status = OrderStatus::parse(&status).ok_or_else(|| {
            DbError::Corrupt(format!(
                "order {order_id} of {owner} has unknown status {status:?}"
            ))
        })?;
        let live_payment: Option<String> = sqlx::query_scalar::<DB, String>(SELECT_LIVE_PAYMENT)
            .bind(order_id)
            .fetch_optional(&mut *conn)
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
    pub(super) async fn begin_payment(
        &self,
        user: &str,
        order_id: &str,
        amount: i64,
    ) -> Result<(Transaction<'static, DB>, PaymentOutcome), DbError> {
        for _ in 0..MAX_ATTEMPTS {
            let mut tx = self.begin().await?;
            if let Some(outcome) = Self::payment_in_tx(&mut tx, user, order_id, amount).await? {
                return Ok((tx, outcome));
            }
        }
        Err(DbError::Corrupt(format!(
            "payment for order {order_id} kept conflicting with a payment that could not be read"
        )))
    }

    pub(super) async fn payment(&self, payment_id: &str) -> Result<Option<Payment>, DbError> {
        sqlx::query_as::<DB, PaymentRow>(SELECT_PAYMENT)
            .bind(payment_id)
            .fetch_optional(self.pool)
            .await?
            .map(payment_from_row)
            .transpose()
    }

    async fn notice_once(&self, payment_id: &str, success: bool) -> Result<NoticeOutcome, DbError> {
        let (target, settle) = if success {
            (PaymentStatus::Succeeded, SUCCEED_PAYMENT)
        } else {
            (PaymentStatus::Failed, FAIL_PAYMENT)
        };
        let now = now_ms();
        let mut tx = self.begin().await?;
        let settled: Option<String> = sqlx::query_scalar::<DB, String>(settle)
            .bind(now)
            .bind(payment_id)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(order_id) = settled {
            if success {
                sqlx::query::<DB>(MARK_ORDER_PAID)
                    .bind(now)
                    .bind(order_id.as_str())
                    .execute(&mut *tx)
                    .await?;
                Self::ensure_outbox(&mut tx, &order_id).await?;
            }
            tx.commit().await?;
            return Ok(NoticeOutcome::Applied);
        }
        let current: Option<(String, i64)> =
            sqlx::query_as::<DB, (String, i64)>(SELECT_PAYMENT_STATUS)
                .bind(payment_id)
                .fetch_optional(&mut *tx)
                .await?;
        tx.rollback().await?;
        Ok(match current {
            None => NoticeOutcome::NotFound,
            Some((s, _)) if s == target.as_str() => NoticeOutcome::AlreadyApplied,
            Some((s, superseded)) if superseded != 0 && s == PaymentStatus::Pending.as_str() => {
                NoticeOutcome::NotLive
            }
            Some(_) => NoticeOutcome::InvalidTransition,
        })
    }

    pub(super) async fn apply_payment_notice(
        &self,
        payment_id: &str,
        success: bool,
    ) -> Result<NoticeOutcome, DbError> {
        retry(|| self.notice_once(payment_id, success)).await
    }

    /// Sets a payment's status without touching its order (a test hook).
    pub(super) async fn force_payment_status(
        &self,
        payment_id: &str,
        status: PaymentStatus,
    ) -> Result<(), DbError> {
        let now = now_ms();
        retry(|| async {
            sqlx::query::<DB>(FORCE_PAYMENT_STATUS)
                .bind(status.as_str())
                .bind(now)
                .bind(payment_id)
                .execute(self.pool)
                .await?;
            Ok(())
        })
        .await
    }
}
