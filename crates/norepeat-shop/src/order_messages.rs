//! Orders that arrive as broker messages, delivered at least once.
//!
//! A broker redelivers after a crash or a missed ack, and may deliver one
//! message to consumers on two instances. [`OrderConsumer::handle`] places
//! the order at most once per message id, whatever the deliveries: the
//! order is written by a function guarded with
//! `#[norepeat::guard(mode = once, key = "{msg.user_id}/{msg.message_id}")]`, whose stored
//! result answers every later delivery without touching the database, and
//! the message id is the order's business id, so the database's unique key
//! holds alone when the guard store fails open. The storm's `redelivery`
//! scenario drives this path.

use crate::app::{AppState, OpenStore};
use crate::config::Defence;
use crate::db::{CreateOutcome, Db, DbError};
use norepeat::attribute::Rejected;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// An order message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderMessage {
    /// The broker's message id: the same on every delivery of the message.
    pub message_id: String,
    /// The buyer.
    pub user_id: String,
    /// The product.
    pub sku: String,
    /// Units.
    pub quantity: i64,
}

/// What one delivery did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Delivered {
    /// This delivery placed the order (its id).
    Placed(String),
    /// The order of this message was already placed (its id): acknowledge.
    AlreadyPlaced(String),
    /// Out of stock or unknown product: acknowledge, nothing to retry.
    Refused,
}

/// Why a delivery must not be acknowledged (it will come again).
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// Another delivery of the message is being processed right now.
    #[error("guard: {0}")]
    Guard(#[from] Rejected),
    /// The database failed.
    #[error("database: {0}")]
    Db(String),
}

impl From<DbError> for ConsumeError {
    fn from(e: DbError) -> Self {
        ConsumeError::Db(e.to_string())
    }
}

/// Places orders from messages for one shop instance.
#[derive(Clone)]
pub struct OrderConsumer {
    db: Db,
    store: OpenStore,
    defence: Defence,
    naive_gap: Duration,
}

impl OrderConsumer {
    /// A consumer writing to `db`, guarded by `store` (the fail-open store),
    /// with the instance's `defence` (and, for the naive one, the read-write
    /// gap `naive_gap`).
    #[must_use]
    pub fn new(db: Db, store: OpenStore, defence: Defence, naive_gap: Duration) -> Self {
        Self {
            db,
            store,
            defence,
            naive_gap,
        }
    }

    /// The consumer of the instance `state`.
    #[must_use]
    pub fn of(state: &AppState) -> Self {
        Self::new(
            state.db.clone(),
            state.open.clone(),
            state.cfg.defence,
            Duration::from_millis(state.cfg.naive_gap_ms),
        )
    }

    /// Handles one delivery, with the instance's defences: guarded and on
    /// the safe database path normally; unguarded (and, for the naive
    /// defence, on the naive path) in the storm's comparison rows.
    ///
    /// # Errors
    /// When the delivery must come again (see [`ConsumeError`]).
    pub async fn handle(&self, msg: &OrderMessage) -> Result<Delivered, ConsumeError> {
        // A control character (NUL above all) is refused by PostgreSQL on
        // every delivery: refuse the message once instead of redelivering a
        // poison message forever.
        let control = |s: &str| s.chars().any(|c| c <= '\u{1f}' || c == '\u{7f}');
        if [&msg.message_id, &msg.user_id, &msg.sku]
            .iter()
            .any(|s| control(s))
        {
            return Ok(Delivered::Refused);
        }
        if self.defence.guard() {
            self.place_once(msg).await
        } else {
            self.place(msg).await
        }
    }

    /// [`place`](Self::place), once per message id.
    #[norepeat::guard(
        store = self.store,
        key = "{msg.user_id}/{msg.message_id}",
        mode = once,
        scope = "shop.order-message",
        retention = "1d",
        lease = "10s",
        on_store_failure = fail_open
    )]
    async fn place_once(&self, msg: &OrderMessage) -> Result<Delivered, ConsumeError> {
        self.place(msg).await
    }

    async fn place(&self, msg: &OrderMessage) -> Result<Delivered, ConsumeError> {
        let db = &self.db;
        let outcome = if self.defence.safe_db() {
            db.create_order(&msg.user_id, &msg.sku, msg.quantity, Some(&msg.message_id))
                .await?
        } else {
            db.create_order_naive(
                &msg.user_id,
                &msg.sku,
                msg.quantity,
                Some(&msg.message_id),
                self.naive_gap,
            )
            .await?
        };
        Ok(match outcome {
            CreateOutcome::Created(o) => Delivered::Placed(o.order_id),
            CreateOutcome::Existing(o) => Delivered::AlreadyPlaced(o.order_id),
            CreateOutcome::OutOfStock | CreateOutcome::UnknownSku => Delivered::Refused,
        })
    }
}
