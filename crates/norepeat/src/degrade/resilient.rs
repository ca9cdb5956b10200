//! A store call with a time budget, behind a circuit breaker.

use super::Breaker;
use crate::store::{RateDecision, Store, StoreError};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Wraps a store: every call gets a time budget (default 50 ms) and goes
/// through a [`Breaker`] (default: opens after 5 consecutive failures, probes
/// after 1 s). An error answer (`OOM`, `READONLY`, ...) counts as a failure,
/// exactly like a timeout; it is never taken for a decision.
///
/// Clones share the breaker.
///
/// ```
/// use norepeat::degrade::Resilient;
/// use norepeat::store::MemoryStore;
/// use std::time::Duration;
/// let store = Resilient::new(MemoryStore::default())
///     .timeout(Duration::from_millis(20))
///     .breaker(3, Duration::from_millis(500));
/// ```
#[derive(Debug, Clone)]
pub struct Resilient<S> {
    inner: S,
    budget: Duration,
    breaker: Arc<Breaker>,
    /// Timeouts since the last answer; past [`RECONNECT_AFTER`] the store is
    /// asked to reconnect.
    timeouts: Arc<AtomicU32>,
}

/// Consecutive timed-out calls after which the store's connections are
/// replaced: a connection whose replies stopped coming never heals itself.
const RECONNECT_AFTER: u32 = 3;

impl<S: Store> Resilient<S> {
    /// `inner` with the default budget and breaker.
    #[must_use]
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            budget: Duration::from_millis(50),
            breaker: Arc::new(Breaker::new(5, Duration::from_secs(1))),
            timeouts: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Sets the time budget of each call.
    #[must_use]
    pub fn timeout(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// Replaces the breaker: opens after `threshold` consecutive failures,
    /// probes after `cool_down`.
    #[must_use]
    pub fn breaker(mut self, threshold: u32, cool_down: Duration) -> Self {
        self.breaker = Arc::new(Breaker::new(threshold, cool_down));
        self
    }

    /// The breaker, to read its state.
    #[must_use]
    pub fn circuit(&self) -> &Breaker {
        &self.breaker
    }

    /// The wrapped store.
    #[must_use]
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn call<T>(
        &self,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.breaker.allow() {
            return Err(StoreError::CircuitOpen);
        }
        let started = Instant::now();
        let result = match tokio::time::timeout(self.budget, f).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.budget)),
        };
        metrics::histogram!("norepeat_store_seconds", "store" => self.inner.kind())
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            metrics::counter!("norepeat_store_errors_total", "store" => self.inner.kind(), "kind" => error_kind(e))
                .increment(1);
            tracing::debug!(error = %e, "store call failed");
        }
        self.breaker.record(result.is_ok());
        match &result {
            Err(StoreError::Timeout(_)) => {
                if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= RECONNECT_AFTER {
                    self.timeouts.store(0, Ordering::Relaxed);
                    self.inner.reconnect();
                }
            }
            Ok(_) => self.timeouts.store(0, Ordering::Relaxed),
            Err(_) => {}
        }
        result
    }
}

fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Timeout(_) => "timeout",
        StoreError::CircuitOpen => "circuit_open",
        StoreError::Connection(_) => "connection",
        StoreError::Server(_) => "server",
        StoreError::Protocol(_) => "protocol",
    }
}

impl<S: Store> Store for Resilient<S> {
    async fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<Option<Bytes>, StoreError> {
        self.call(self.inner.put_if_absent(key, value, ttl)).await
    }
    async fn delete_if_equals(&self, key: &str, expected: &[u8]) -> Result<bool, StoreError> {
        self.call(self.inner.delete_if_equals(key, expected)).await
    }
    async fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.call(self.inner.expire_if_equals(key, expected, ttl))
            .await
    }
    async fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.call(self.inner.replace_if_equals(key, expected, value, ttl))
            .await
    }
    async fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        self.call(self.inner.fixed_window(key, limit, window)).await
    }
    async fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        self.call(self.inner.sliding_window(key, limit, window))
            .await
    }
    async fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> Result<RateDecision, StoreError> {
        self.call(self.inner.gcra(key, emission, burst)).await
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn reconnect(&self) {
        self.inner.reconnect();
    }
}
