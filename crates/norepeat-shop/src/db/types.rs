//! What the database layer answers: outcomes, reports, outbox rows and
//! errors. The shop's own data (orders, payments, their states) is in
//! [`crate::domain`].

use serde::Serialize;

use crate::domain::{Order, OrderStatus, Payment};

/// What [`Db::create_order`](super::Db::create_order) did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub enum CreateOutcome {
    /// A new order was written and stock taken.
    Created(Order),
    /// The user already has an order with this business id; nothing changed.
    Existing(Order),
    /// Not enough stock; nothing changed.
    OutOfStock,
    /// No such sku; nothing changed.
    UnknownSku,
}

/// What [`Db::create_order_in_window`](super::Db::create_order_in_window) did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub enum WindowOutcome {
    /// The window was free: what creating the order did.
    Order(CreateOutcome),
    /// The same submission (user and fingerprint) made an order inside its
    /// window; nothing changed.
    Repeated {
        /// Time left in the window.
        retry_after: std::time::Duration,
    },
}

/// What [`Db::transition_order`](super::Db::transition_order) did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub enum Transition {
    /// The order moved to the target state now.
    Applied,
    /// The order already was in the target state (a repeat); nothing changed.
    AlreadyInState,
    /// The order is in another state that does not allow the transition.
    Invalid {
        /// The order's state as found.
        current: OrderStatus,
    },
    /// No such order.
    NotFound,
}

/// What [`Db::create_payment`](super::Db::create_payment) did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub enum PaymentOutcome {
    /// A new payment in state `PENDING`.
    Created(Payment),
    /// The order does not exist or belongs to another user.
    OrderNotFound,
    /// The order cannot take a payment: it is not `UNPAID`, or it already
    /// has a live (`PENDING`/`SUCCEEDED`) payment. Nothing was written.
    NotPayable {
        /// The order's state as found.
        order_status: OrderStatus,
        /// The order's live payment, if it has one.
        live_payment: Option<String>,
    },
}

/// What [`Db::apply_payment_notice`](super::Db::apply_payment_notice) did.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub enum NoticeOutcome {
    /// The payment changed state now (and, on success, the order became PAID).
    Applied,
    /// The payment already was in the notice's target state; nothing changed.
    AlreadyApplied,
    /// The payment is in the other final state (e.g. FAILED after SUCCEEDED).
    InvalidTransition,
    /// A SUCCESS notice for a payment that is not its order's live payment
    /// (one an earlier version let in beside it, see
    /// [`ReconcileReport::duplicate_payments`]); nothing changed.
    NotLive,
    /// No such payment.
    NotFound,
}

/// What one reconciliation pass repaired.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileReport {
    /// Orders moved UNPAID -> PAID because a payment for them had succeeded.
    pub orders_marked_paid: Vec<String>,
    /// PAID orders whose missing `order.paid` outbox event was added.
    pub events_requeued: Vec<String>,
    /// Orders found with more than one non-failed payment (written before
    /// the one-live-payment constraint existed). Reported on every pass, not
    /// repaired: settling them (a refund) is a person's decision. Not
    /// counted in [`total`](Self::total).
    pub duplicate_payments: Vec<DuplicatePayments>,
}

/// An order with more than one non-failed payment.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DuplicatePayments {
    /// The order.
    pub order_id: String,
    /// Its non-failed payments, the live one first, then oldest first.
    pub payment_ids: Vec<String>,
}

impl ReconcileReport {
    /// Total number of repairs in this pass.
    pub fn total(&self) -> usize {
        self.orders_marked_paid.len() + self.events_requeued.len()
    }
}

/// An unpublished `order.paid` event from the outbox.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OutboxEvent {
    /// The event id, equal to the order id (the message id for de-duplication).
    pub event_id: String,
    /// The buyer who earns the points.
    pub user_id: String,
    /// Points to award: 10 per unit ordered.
    pub points: i64,
}

/// Errors of the database layer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// An error from the driver or the database.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// Applying the embedded migrations failed.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The requested order transition is not in the state machine's table.
    #[error("invalid order transition {from} -> {to}")]
    InvalidTransition {
        /// Source state asked for.
        from: OrderStatus,
        /// Target state asked for.
        to: OrderStatus,
    },
    /// An argument the database layer refuses (quantity below 1, negative
    /// stock, unsupported database URL).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The database holds something this code cannot read (e.g. an unknown status).
    #[error("corrupt data: {0}")]
    Corrupt(String),
}

impl DbError {
    /// True for errors worth retrying the whole transaction for: SQLite
    /// `SQLITE_BUSY`/`SQLITE_LOCKED`, PostgreSQL serialization failures,
    /// deadlocks and lock-not-available.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Sqlx(e) => is_transient_sqlx(e),
            Self::Migrate(
                sqlx::migrate::MigrateError::Execute(e)
                | sqlx::migrate::MigrateError::ExecuteMigration(e, _),
            ) => is_transient_sqlx(e),
            _ => false,
        }
    }
}

pub(crate) fn is_transient_sqlx(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(d) = e else {
        return false;
    };
    if d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Extended result codes: the primary code is the low byte.
        // 5 = SQLITE_BUSY (incl. BUSY_SNAPSHOT, BUSY_RECOVERY), 6 = SQLITE_LOCKED.
        return d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6));
    }
    // PostgreSQL SQLSTATEs: serialization_failure, deadlock_detected, lock_not_available.
    d.code()
        .is_some_and(|c| matches!(c.as_ref(), "40001" | "40P01" | "55P03"))
}
