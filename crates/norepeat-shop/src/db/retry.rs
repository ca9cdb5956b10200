//! Retry of whole transactions on transient errors (SQLite busy/locked,
//! PostgreSQL serialization failures and deadlocks).

use std::future::Future;
use std::time::Duration;

use super::DbError;

/// Attempts of one transaction before a transient error is returned.
pub(super) const MAX_ATTEMPTS: u32 = 16;

/// Runs `op` again on transient errors (busy, locked, serialization, deadlock),
/// with a jittered exponential back-off, at most [`MAX_ATTEMPTS`] times.
pub(super) async fn retry<T, F, Fut>(mut op: F) -> Result<T, DbError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbError>>,
{
    let mut attempt = 1u32;
    loop {
        match op().await {
            Err(e) if attempt < MAX_ATTEMPTS && e.is_transient() => {
                tracing::debug!(attempt, error = %e, "transient database error, retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    let base = 2u64.saturating_pow(attempt.min(7)).min(100);
    let jitter = rand::random::<u64>() % (base + 1);
    Duration::from_millis(base + jitter)
}
