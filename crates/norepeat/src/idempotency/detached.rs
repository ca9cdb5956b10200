//! [`DetachedTasks`]: the handlers an [`IdempotencyLayer`](super::IdempotencyLayer)
//! runs in tasks of their own, for a server to wait for at shutdown.

use tokio_util::task::TaskTracker;

/// The handlers an [`IdempotencyLayer`](super::IdempotencyLayer) carries to
/// their end (in their request's future, or in a task of their own once
/// their client left), and the retries of completions the store refused,
/// tracked from the claim on so that a server shutting down can wait for
/// them instead of killing them half-way.
///
/// A server's graceful shutdown waits for the requests in flight, but a
/// handler whose client left (or whose request a timeout layer dropped) is
/// no request any more: it runs on, detached, and stores its result for
/// the retry. Killed half-way, its effect may have happened without its
/// record. So, once the server has stopped accepting and its requests
/// ended: [`close`](Self::close), then [`wait`](Self::wait), with a time
/// limit of your own.
///
/// Clones share one set. Every layer has its own set unless given one with
/// [`IdempotencyLayer::detached_tasks_in`](super::IdempotencyLayer::detached_tasks_in),
/// so that one handle waits for all of a server's layers.
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use norepeat::idempotency::{DetachedTasks, IdempotencyLayer};
/// use norepeat::store::MemoryStore;
/// use std::time::Duration;
///
/// # #[tokio::main] async fn main() -> std::io::Result<()> {
/// let detached = DetachedTasks::new();
/// let layer = IdempotencyLayer::new(MemoryStore::default())
///     .detached_tasks_in(&detached)
///     .max_detached(1024);
/// let app: Router = Router::new().route("/payments", post(|| async { "paid" }).layer(layer));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// axum::serve(listener, app)
///     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// // Stopped accepting, requests ended: now the handlers left running.
/// detached.close();
/// if tokio::time::timeout(Duration::from_secs(10), detached.wait()).await.is_err() {
///     eprintln!("{} handlers still running at exit", detached.len());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct DetachedTasks {
    tracker: TaskTracker,
}

impl DetachedTasks {
    /// An empty, open set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Closes the set: [`wait`](Self::wait) then ends once no task is left.
    /// Tasks may still start after it (a request already past the door);
    /// `wait` waits for them too. Returns whether this call closed it.
    pub fn close(&self) -> bool {
        self.tracker.close()
    }

    /// Waits until the set is closed and no task is left running.
    pub async fn wait(&self) {
        self.tracker.wait().await;
    }

    /// How many are running: handlers whose key is claimed (their client
    /// waiting or gone) and completions being retried.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether none is running.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    pub(crate) fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }
}
