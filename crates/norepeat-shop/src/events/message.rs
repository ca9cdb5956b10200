//! The `order.paid` event as it travels on the queue.

use crate::db::OutboxEvent;
use serde::{Deserialize, Serialize};

/// An `order.paid` event as it travels on the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderPaid {
    /// The order (and message) id.
    pub order_id: String,
    /// The buyer who earns the points.
    pub user_id: String,
    /// Points to award: 10 per unit ordered.
    pub points: i64,
}

impl From<&OutboxEvent> for OrderPaid {
    fn from(ev: &OutboxEvent) -> Self {
        Self {
            order_id: ev.event_id.clone(),
            user_id: ev.user_id.clone(),
            points: ev.points,
        }
    }
}
