//! The task that deletes expired rows in batches.

use crate::store::StoreError;
use std::time::Duration;

/// A running reaper, from [`SqlStore::spawn_reaper`](super::SqlStore::spawn_reaper). The task stops when
/// this handle is dropped (or [`stop`](Self::stop)ped); a batch cut off
/// mid-statement is rolled back by the database, never half applied.
#[derive(Debug)]
#[must_use = "the reaper stops when its handle is dropped"]
pub struct Reaper {
    task: tokio::task::JoinHandle<()>,
}

impl Reaper {
    /// Stops the reaper (the same as dropping the handle).
    pub fn stop(self) {}

    pub(super) fn spawn<F, Fut>(every: Duration, kind: &'static str, mut reap: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<u64, StoreError>> + Send,
    {
        let every = every.max(Duration::from_millis(1));
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match reap().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::debug!(store = kind, rows = n, "reaped expired rows");
                        metrics::counter!("norepeat_reaped_rows_total", "store" => kind)
                            .increment(n);
                    }
                    Err(e) => {
                        tracing::warn!(store = kind, error = %e, "reaper failed; retrying next interval")
                    }
                }
            }
        });
        Self { task }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.task.abort();
    }
}
