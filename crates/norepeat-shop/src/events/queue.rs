//! The instance's event machinery: started once, woken when an order is
//! paid.

use super::points::Points;
use super::{OrderPaid, local, nats};
use crate::config::ShopConfig;
use crate::db::Db;
use norepeat::store::AnyStore;
use std::sync::Arc;
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
    /// Starts the publisher and the consumer of this instance: on NATS
    /// JetStream when `cfg.nats_url` is set, in process otherwise. `store` is
    /// the guard store the points consumer's `#[guard]` uses.
    ///
    /// # Errors
    /// When the queue cannot be reached.
    pub async fn start(cfg: &ShopConfig, db: Db, store: AnyStore) -> Result<Self, String> {
        let points = Arc::new(Points::new(db.clone(), store, cfg.store_timeout()));
        let kick = Arc::new(Notify::new());
        let copies = cfg.duplicate_events.max(1);
        match &cfg.nats_url {
            Some(url) => nats::start(url, db, points, Arc::clone(&kick), copies).await?,
            None => {
                let (tx, rx) = mpsc::channel::<OrderPaid>(10_000);
                tokio::spawn(local::publish(db, tx.clone(), Arc::clone(&kick), copies));
                tokio::spawn(local::consume(points, tx, rx));
            }
        }
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
