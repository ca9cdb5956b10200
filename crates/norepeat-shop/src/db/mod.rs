// Over 400 lines on purpose: the database layer's one type over PostgreSQL and SQLite, its connection, migration and shared queries.
//! The shop's database layer: orders, stock, payments, the outbox, the points
//! ledger and a shared secret, on SQLite or PostgreSQL.
//!
//! Every write that must be correct under concurrency from several processes is
//! one conditional statement whose "rows affected" decides the outcome, backed by
//! a unique key where a duplicate could otherwise slip in:
//!
//! * stock: `UPDATE stock SET available = available - q WHERE sku = ? AND available >= q`;
//! * one order per `(user_id, biz_id)`: a unique index, plus `ON CONFLICT DO NOTHING`;
//! * order and payment state machines: `UPDATE ... WHERE id = ? AND status = <from>`;
//! * one live (PENDING/SUCCEEDED) payment per order: a partial unique index,
//!   plus `ON CONFLICT DO NOTHING`;
//! * `order.paid` events: an outbox row written in the same transaction as the
//!   state change (unique `event_id` = order id);
//! * points: a ledger keyed by order id.
//!
//! [`Db::create_order_naive`] is the deliberate exception: the unprotected
//! check-then-write baseline the storm demo uses to reproduce the incident.
//!
//! Transient errors (SQLite busy/locked, PostgreSQL serialization failures and
//! deadlocks) are retried, whole transaction at a time, a bounded number of times.
//!
//! The queries live in one private module per aggregate (`orders` and stock,
//! `payments`, `outbox` and reconciliation, `points`, and `meta` for the
//! shared secret and the demo reset), each written once and generic over the
//! sqlx backend (`backend` holds what differs). [`Db`] picks the backend and
//! calls them.

mod backend;
mod ids;
mod meta;
mod orders;
mod outbox;
mod payments;
mod points;
mod retry;
mod types;

use backend::Queries;
use orders::OrderWindow;

use std::time::{Duration, SystemTime};

use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

pub use types::{
    CreateOutcome, DbError, DuplicatePayments, NoticeOutcome, OutboxEvent, PaymentOutcome,
    ReconcileReport, Transition, WindowOutcome,
};

use crate::domain::{Order, OrderStatus, Payment, PaymentStatus};

/// The SQLite file used when no database URL is given (in the working directory).
pub const DEFAULT_SQLITE_FILE: &str = "norepeat-shop.db";

/// Products a fresh database is stocked with (sku, units), if absent.
pub const SEED_STOCK: [(&str, i64); 3] = [("SKU-1", 100), ("SKU-2", 100), ("SKU-3", 100)];

/// Points awarded per unit ordered when an order is paid.
pub const POINTS_PER_UNIT: i64 = points::POINTS_PER_UNIT;

/// An open write transaction from [`Db::begin_payment`], not yet committed.
#[derive(Debug)]
pub enum PaymentTx {
    /// On SQLite (`BEGIN IMMEDIATE`).
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
    /// On PostgreSQL.
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

/// A connection pool to the shop's database. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub enum Db {
    /// A SQLite file (or in-memory database).
    Sqlite(SqlitePool),
    /// A PostgreSQL database.
    Postgres(PgPool),
}

/// Runs `$body` with `$q` bound to the [`Queries`] on the pool, whichever
/// backend it is: the same (generic) code, instantiated for each.
macro_rules! dispatch {
    ($self:expr, $q:ident => $body:expr) => {
        match $self {
            Db::Sqlite(pool) => {
                let $q = Queries::new(pool);
                $body
            }
            Db::Postgres(pool) => {
                let $q = Queries::new(pool);
                $body
            }
        }
    };
}

// After `dispatch!`, which it uses.
mod connect;

impl Db {
    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            Db::Sqlite(_) => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        match self {
            Db::Sqlite(pool) => pool.close().await,
            Db::Postgres(pool) => pool.close().await,
        }
    }

    /// Creates an order, safely: in one transaction, an existing order of
    /// `(user, biz_id)` is returned as [`CreateOutcome::Existing`] with nothing
    /// else done; otherwise stock is taken with a conditional decrement
    /// ([`CreateOutcome::OutOfStock`] / [`CreateOutcome::UnknownSku`] if it
    /// cannot be) and the order inserted. If a concurrent request inserted the
    /// same `(user, biz_id)` first, the transaction is rolled back (stock given
    /// back) and that order returned as `Existing`.
    ///
    /// `biz_id` `None` generates a fresh one (`biz_...`). A quantity below 1 is
    /// [`DbError::InvalidInput`].
    pub async fn create_order(
        &self,
        user: &str,
        sku: &str,
        quantity: i64,
        biz_id: Option<&str>,
    ) -> Result<CreateOutcome, DbError> {
        check_quantity(quantity)?;
        let biz_id = biz_id.map_or_else(|| ids::new_id("biz_"), str::to_owned);
        match dispatch!(self, q => q.create_order(user, sku, quantity, &biz_id, None).await)? {
            WindowOutcome::Order(outcome) => Ok(outcome),
            // Only a window can be repeated.
            WindowOutcome::Repeated { .. } => Err(DbError::Corrupt(format!(
                "order ({user}, {biz_id}) answered as a repeat without a window"
            ))),
        }
    }

    /// Creates an order that has no business id of its own, once per
    /// submission and `window`: in the order's transaction, the
    /// `(user, fingerprint)` pair is claimed until `window` after `since`
    /// (the request's arrival, so that the database's window never outlasts
    /// an entry guard's that started later; clocks of the instances are
    /// assumed close). The same pair again inside the window is
    /// [`WindowOutcome::Repeated`] with the time left, nothing written; past
    /// it, a new order. The claim commits or rolls back with the order, so
    /// an order that was not written (out of stock, an error) does not hold
    /// the window.
    ///
    /// This is the database's line behind a fingerprint guard: it holds over
    /// every instance even when the guard's store is down or slow and each
    /// instance admitted one. Windows are kept per pair (an ended one is
    /// taken over by the next claim) until
    /// [`drop_ended_windows`](Self::drop_ended_windows) sweeps them. A
    /// quantity below 1 is [`DbError::InvalidInput`].
    pub async fn create_order_in_window(
        &self,
        user: &str,
        sku: &str,
        quantity: i64,
        fingerprint: &[u8; 32],
        since: SystemTime,
        window: Duration,
    ) -> Result<WindowOutcome, DbError> {
        check_quantity(quantity)?;
        let biz_id = ids::new_id("biz_");
        let until = since.checked_add(window).unwrap_or(since);
        let window = OrderWindow {
            fingerprint: ids::hex_encode(fingerprint),
            until_ms: ids::unix_ms(until),
        };
        dispatch!(self, q => q.create_order(user, sku, quantity, &biz_id, Some(&window)).await)
    }

    /// Deletes every ended window of [`create_order_in_window`](Self::create_order_in_window):
    /// housekeeping for the periodic reconciler, so that the orders
    /// themselves pay no statement for it. How many rows went.
    pub async fn drop_ended_windows(&self) -> Result<u64, DbError> {
        dispatch!(self, q => q.drop_all_ended_windows().await)
    }

    /// The NAIVE path, only for the storm demo's baseline: no unique key (the
    /// row is marked `naive` and left out of the unique index) and
    /// check-then-write stock: read `available`, sleep `gap` (to widen the
    /// race), write back `read - quantity`, insert the order. Oversells and
    /// duplicates on purpose; never [`CreateOutcome::Existing`].
    pub async fn create_order_naive(
        &self,
        user: &str,
        sku: &str,
        quantity: i64,
        biz_id: Option<&str>,
        gap: Duration,
    ) -> Result<CreateOutcome, DbError> {
        check_quantity(quantity)?;
        let biz_id = biz_id.map_or_else(|| ids::new_id("biz_"), str::to_owned);
        dispatch!(self, q => q.create_order_naive(user, sku, quantity, &biz_id, gap).await)
    }

    /// The user's orders, oldest first.
    pub async fn orders_of(&self, user: &str) -> Result<Vec<Order>, DbError> {
        dispatch!(self, q => q.orders_of(user).await)
    }

    /// One order by id.
    pub async fn order(&self, order_id: &str) -> Result<Option<Order>, DbError> {
        dispatch!(self, q => q.order(order_id).await)
    }

    /// Units available of `sku`, `None` if the sku is unknown.
    pub async fn stock(&self, sku: &str) -> Result<Option<i64>, DbError> {
        dispatch!(self, q => q.stock(sku).await)
    }

    /// Sets the units available of `sku`, creating the sku if needed. A
    /// negative value is [`DbError::InvalidInput`].
    pub async fn set_stock(&self, sku: &str, available: i64) -> Result<(), DbError> {
        if available < 0 {
            return Err(DbError::InvalidInput(format!(
                "available must not be negative, got {available}"
            )));
        }
        dispatch!(self, q => q.set_stock(sku, available).await)
    }

    /// Moves an order `from -> to` with one conditional update
    /// (`WHERE order_id = ? AND status = from`).
    ///
    /// Returns [`Transition::Applied`] if it moved now,
    /// [`Transition::AlreadyInState`] if it already was in `to`,
    /// [`Transition::Invalid`] with the current state otherwise and
    /// [`Transition::NotFound`] for an unknown order. A pair outside the table
    /// (`UNPAID->PAID`, `PAID->COMPLETED`, `UNPAID->CANCELLED`) is
    /// [`DbError::InvalidTransition`] without touching the database. Moving to
    /// PAID also writes the order's `order.paid` outbox event in the same
    /// transaction.
    pub async fn transition_order(
        &self,
        order_id: &str,
        from: OrderStatus,
        to: OrderStatus,
    ) -> Result<Transition, DbError> {
        if !from.can_transition_to(to) {
            return Err(DbError::InvalidTransition { from, to });
        }
        dispatch!(self, q => q.transition_order(order_id, from, to).await)
    }

    /// Creates a PENDING payment (`pay_...`) of `amount` for the user's order.
    ///
    /// [`PaymentOutcome::OrderNotFound`] if the order is unknown or another
    /// user's; [`PaymentOutcome::NotPayable`] (naming the live payment) if
    /// the order is not UNPAID or already has a live (PENDING/SUCCEEDED)
    /// payment. The checks and the insert are one statement, and a partial
    /// unique index keeps one live payment per order against any number of
    /// concurrent callers in any number of processes. An `amount` outside
    /// [`PAYMENT_AMOUNTS`](crate::domain::PAYMENT_AMOUNTS) is [`DbError::InvalidInput`].
    pub async fn create_payment(
        &self,
        user: &str,
        order_id: &str,
        amount: i64,
    ) -> Result<PaymentOutcome, DbError> {
        check_amount(amount)?;
        dispatch!(self, q => q.create_payment(user, order_id, amount).await)
    }

    /// [`create_payment`](Self::create_payment) inside a write transaction
    /// that is left open: the caller commits it together with its
    /// idempotency record (or drops it, which rolls the payment back).
    pub async fn begin_payment(
        &self,
        user: &str,
        order_id: &str,
        amount: i64,
    ) -> Result<(PaymentTx, PaymentOutcome), DbError> {
        check_amount(amount)?;
        Ok(match self {
            Db::Sqlite(pool) => {
                let (tx, out) = Queries::new(pool)
                    .begin_payment(user, order_id, amount)
                    .await?;
                (PaymentTx::Sqlite(tx), out)
            }
            Db::Postgres(pool) => {
                let (tx, out) = Queries::new(pool)
                    .begin_payment(user, order_id, amount)
                    .await?;
                (PaymentTx::Postgres(tx), out)
            }
        })
    }

    /// One payment by id.
    pub async fn payment(&self, payment_id: &str) -> Result<Option<Payment>, DbError> {
        dispatch!(self, q => q.payment(payment_id).await)
    }

    /// Applies the provider's notice (`success`: SUCCESS, else FAILED):
    /// PENDING -> SUCCEEDED / FAILED with one conditional update. When
    /// SUCCEEDED is applied, the same transaction moves the order UNPAID -> PAID
    /// (conditionally) and writes its `order.paid` outbox event, so the event
    /// cannot be lost.
    ///
    /// [`NoticeOutcome::Applied`] when the state changed now,
    /// [`NoticeOutcome::AlreadyApplied`] if the payment already is in the
    /// target state, [`NoticeOutcome::InvalidTransition`] if it is in the other
    /// final state, [`NoticeOutcome::NotLive`] for SUCCESS on a pending payment
    /// that is not its order's live payment (nothing changes),
    /// [`NoticeOutcome::NotFound`] for an unknown payment. Any
    /// number of concurrent identical notices, from any number of processes,
    /// give exactly one `Applied`.
    pub async fn apply_payment_notice(
        &self,
        payment_id: &str,
        success: bool,
    ) -> Result<NoticeOutcome, DbError> {
        dispatch!(self, q => q.apply_payment_notice(payment_id, success).await)
    }

    /// One reconciliation pass: orders still UNPAID although a payment for them
    /// SUCCEEDED are moved to PAID (conditional update, plus the outbox event),
    /// and PAID/COMPLETED orders without an outbox event get one. Only the pass
    /// whose statement changed a row reports it, so passes running at once (in
    /// several processes) report each repair once in total.
    ///
    /// Every pass also reports (and logs) each order with more than one
    /// non-failed payment in [`ReconcileReport::duplicate_payments`]: written
    /// before the one-live-payment constraint, and left for a person to
    /// settle.
    pub async fn reconcile(&self) -> Result<ReconcileReport, DbError> {
        dispatch!(self, q => q.reconcile().await)
    }

    /// Unpublished outbox events, oldest first, at most `limit`.
    pub async fn pending_events(&self, limit: i64) -> Result<Vec<OutboxEvent>, DbError> {
        dispatch!(self, q => q.pending_events(limit).await)
    }

    /// Marks an outbox event published (idempotent; unknown ids are ignored).
    pub async fn mark_event_published(&self, event_id: &str) -> Result<(), DbError> {
        dispatch!(self, q => q.mark_event_published(event_id).await)
    }

    /// Awards `points` to `user` for `order_id` once: true if awarded now,
    /// false if that order's points were already awarded (one
    /// `INSERT ... ON CONFLICT DO NOTHING` keyed by order id).
    pub async fn award_points(
        &self,
        user: &str,
        order_id: &str,
        points: i64,
    ) -> Result<bool, DbError> {
        dispatch!(self, q => q.award_points(user, order_id, points).await)
    }

    /// The user's total points.
    pub async fn points(&self, user: &str) -> Result<i64, DbError> {
        dispatch!(self, q => q.points(user).await)
    }

    /// 32 random bytes shared by every instance using this database (for
    /// signing repeat tokens): generated once by whoever asks first, then read
    /// back, so all instances agree.
    pub async fn shared_secret(&self) -> Result<[u8; 32], DbError> {
        dispatch!(self, q => q.shared_secret().await)
    }

    /// Extra orders sharing a `(user_id, biz_id)` with an earlier one (the
    /// storm's "duplicates").
    pub async fn duplicates(&self) -> Result<i64, DbError> {
        dispatch!(self, q => q.duplicates().await)
    }

    /// Number of orders (all users, safe and naive).
    pub async fn orders_count(&self) -> Result<i64, DbError> {
        dispatch!(self, q => q.orders_count().await)
    }

    /// Units ordered of `sku` over all orders; compare with the stock you set
    /// to find units oversold.
    pub async fn units_ordered(&self, sku: &str) -> Result<i64, DbError> {
        dispatch!(self, q => q.units_ordered(sku).await)
    }

    /// Test hook: sets a payment's status WITHOUT touching its order (simulates
    /// a crash between the two writes, for reconciliation tests). Unknown ids
    /// are ignored.
    pub async fn force_payment_status_for_test(
        &self,
        payment_id: &str,
        status: PaymentStatus,
    ) -> Result<(), DbError> {
        dispatch!(self, q => q.force_payment_status(payment_id, status).await)
    }

    /// Deletes all orders, payments, points and outbox rows (the storm resets
    /// between scenarios). Stock and the shared secret are kept.
    pub async fn reset_for_demo(&self) -> Result<(), DbError> {
        dispatch!(self, q => q.reset().await)
    }
}

fn check_quantity(quantity: i64) -> Result<(), DbError> {
    if quantity < 1 {
        return Err(DbError::InvalidInput(format!(
            "quantity must be at least 1, got {quantity}"
        )));
    }
    Ok(())
}

fn check_amount(amount: i64) -> Result<(), DbError> {
    crate::domain::amount_refusal(amount).map_or(Ok(()), |r| Err(DbError::InvalidInput(r)))
}
