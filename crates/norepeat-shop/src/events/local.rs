//! The in-process queue of an instance without `NATS_URL`: a failed
//! delivery goes back on the queue after [`RETRY_DELAY`].

use super::OrderPaid;
use super::pending::{RETRY_DELAY, next_pending};
use super::points::{Points, record};
use crate::db::Db;
use std::sync::Arc;
use tokio::sync::{Notify, mpsc};

pub(super) async fn publish(db: Db, tx: mpsc::Sender<OrderPaid>, kick: Arc<Notify>, copies: u32) {
    loop {
        for ev in next_pending(&db, &kick).await {
            let msg = OrderPaid::from(&ev);
            for _ in 0..copies {
                if tx.send(msg.clone()).await.is_err() {
                    return;
                }
            }
            if let Err(e) = db.mark_event_published(&ev.event_id).await {
                tracing::warn!(error = %e, "could not mark event published; it will be published again");
            }
        }
    }
}

pub(super) async fn consume(
    points: Arc<Points>,
    tx: mpsc::Sender<OrderPaid>,
    mut rx: mpsc::Receiver<OrderPaid>,
) {
    while let Some(ev) = rx.recv().await {
        let outcome = points.handle(&ev).await;
        record(&outcome);
        if let Err(e) = outcome {
            // Not acknowledged: back on the queue after a pause.
            tracing::warn!(error = %e, order = %ev.order_id, "event processing failed; redelivering");
            let tx = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(RETRY_DELAY).await;
                let _ = tx.send(ev).await;
            });
        }
    }
}
