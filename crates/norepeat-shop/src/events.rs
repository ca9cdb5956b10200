//! `order.paid` events: an outbox in the database, a queue, consumers that
//! award points once per order.
//!
//! The outbox row is written in the same transaction that marks the order
//! PAID, so no event is lost. A publisher moves outbox rows to the queue
//! (publishing each `NOREPEAT_DUPLICATE_EVENTS` times, to show the consumer's
//! de-duplication) and marks them published. The consumer awards points
//! through the ledger's unique key (one row per order); an event whose
//! processing fails goes back on the queue.

use crate::config::ShopConfig;
use crate::db::{Db, OutboxEvent};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// A handle on the instance's event machinery.
#[derive(Clone)]
pub struct Events {
    kick: Arc<Notify>,
}

/// Wakes the publisher (an order just became PAID).
pub fn kick(events: &Events) {
    events.kick.notify_one();
}

impl Events {
    /// Starts the publisher and the consumer of this instance.
    ///
    /// # Errors
    /// When the queue cannot be reached.
    pub async fn start(cfg: &ShopConfig, db: Db) -> Result<Self, String> {
        let kick = Arc::new(Notify::new());
        let (tx, rx) = mpsc::channel::<OutboxEvent>(10_000);
        tokio::spawn(publish(
            db.clone(),
            tx.clone(),
            Arc::clone(&kick),
            cfg.duplicate_events.max(1),
        ));
        tokio::spawn(consume(db, tx, rx));
        Ok(Self { kick })
    }

    /// A handle that publishes nothing (for tests that build the app by hand).
    #[must_use]
    pub fn disabled() -> Self {
        Self {
            kick: Arc::new(Notify::new()),
        }
    }
}

async fn publish(db: Db, tx: mpsc::Sender<OutboxEvent>, kick: Arc<Notify>, copies: u32) {
    loop {
        let _ = tokio::time::timeout(Duration::from_millis(500), kick.notified()).await;
        let pending = match db.pending_events(100).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "outbox read failed; retrying");
                continue;
            }
        };
        for ev in pending {
            for _ in 0..copies {
                if tx.send(ev.clone()).await.is_err() {
                    return;
                }
            }
            if let Err(e) = db.mark_event_published(&ev.event_id).await {
                tracing::warn!(error = %e, "could not mark event published; it will be published again");
            }
        }
    }
}

async fn consume(db: Db, tx: mpsc::Sender<OutboxEvent>, mut rx: mpsc::Receiver<OutboxEvent>) {
    while let Some(ev) = rx.recv().await {
        match db.award_points(&ev.user_id, &ev.event_id, ev.points).await {
            Ok(awarded) => {
                let outcome = if awarded { "awarded" } else { "duplicate" };
                metrics::counter!("shop_events_consumed_total", "outcome" => outcome).increment(1);
            }
            Err(e) => {
                // Not acknowledged: back on the queue after a pause.
                tracing::warn!(error = %e, event = %ev.event_id, "event processing failed; redelivering");
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = tx.send(ev).await;
                });
            }
        }
    }
}
