//! What the publishers share (locally and over NATS): the unpublished
//! events of the outbox, read when kicked, and the pause before a failed
//! delivery is tried again.

use crate::db::{Db, OutboxEvent};
use std::time::Duration;
use tokio::sync::Notify;

/// How long a failed delivery waits before it is delivered again.
pub(super) const RETRY_DELAY: Duration = Duration::from_millis(200);

/// Waits for a kick (or half a second) and reads the unpublished events.
pub(super) async fn next_pending(db: &Db, kick: &Notify) -> Vec<OutboxEvent> {
    let _ = tokio::time::timeout(Duration::from_millis(500), kick.notified()).await;
    match db.pending_events(100).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "outbox read failed; retrying");
            Vec::new()
        }
    }
}
