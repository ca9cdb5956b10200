//! The consumer: awards an order's points once, whatever the deliveries.

use super::hook::FailHook;
use super::message::OrderPaid;
use crate::db::Db;
use norepeat::attribute::Rejected;
use norepeat::store::{AnyStore, Fallback, MemoryStore, Resilient};
use std::time::Duration;

/// Why an event was not processed; the delivery is not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The guard refused (another delivery of the order is in progress).
    #[error("guard: {0}")]
    Refused(#[from] Rejected),
    /// The database failed.
    #[error("database: {0}")]
    Db(String),
    /// `NOREPEAT_FAIL_FIRST_EVENT` (test hook) failed this attempt.
    #[error("injected failure (NOREPEAT_FAIL_FIRST_EVENT={0})")]
    Injected(&'static str),
}

/// The store of the points guard: the configured store with a time budget,
/// and a local fallback while it fails.
pub type PointsStore = Fallback<Resilient<AnyStore>>;

/// Awards the points of paid orders, once per order.
#[derive(Debug)]
pub struct Points {
    db: Db,
    store: PointsStore,
    hook: FailHook,
}

impl Points {
    /// Points awarded through `db`, guarded by `store`.
    #[must_use]
    pub fn new(db: Db, store: AnyStore, budget: Duration) -> Self {
        Self {
            db,
            store: Fallback::new(
                Resilient::new(store).timeout(budget),
                MemoryStore::default(),
            ),
            hook: FailHook::from_env(),
        }
    }

    /// Awards the event's points: at most once per order with success (the
    /// guard's stored result answers repeats; the ledger's unique key holds
    /// when the store cannot). Returns whether this order's points were
    /// written by the run that succeeded.
    ///
    /// # Errors
    /// The database failed (the claim is released, so a redelivery runs
    /// again), or another delivery of the order is being processed.
    #[norepeat::guard(
        store = self.store,
        key = "{ev.order_id}",
        mode = once,
        scope = "shop.order-paid.points",
        retention = "7d",
        lease = "10s",
        on_store_failure = fail_open
    )]
    pub async fn award(&self, ev: &OrderPaid) -> Result<bool, EventError> {
        if self.hook.before() {
            return Err(EventError::Injected("before"));
        }
        self.db
            .award_points(&ev.user_id, &ev.order_id, ev.points)
            .await
            .map_err(|e| EventError::Db(e.to_string()))
    }

    /// Processes one delivery. `Ok` means the effect is committed and the
    /// delivery may be acknowledged; `Err`, that it must be delivered again.
    ///
    /// # Errors
    /// See [`award`](Self::award); and the `after` test hook.
    pub async fn handle(&self, ev: &OrderPaid) -> Result<bool, EventError> {
        let awarded = self.award(ev).await?;
        if self.hook.after() {
            return Err(EventError::Injected("after"));
        }
        Ok(awarded)
    }
}

/// Counts one processed delivery by its outcome.
pub(super) fn record(outcome: &Result<bool, EventError>) {
    let outcome = match outcome {
        Ok(true) => "awarded",
        Ok(false) => "duplicate",
        Err(_) => "failed",
    };
    metrics::counter!("shop_events_consumed_total", "outcome" => outcome).increment(1);
}
