//! A switch that takes the guard store down, for the storm's outage scenario.
//!
//! While down, every call fails as a refused connection would, before
//! reaching the store: what an instance sees when Redis dies. It works the
//! same over the memory store and over a Redis the storm must not kill.

use bytes::Bytes;
use norepeat::store::{RateDecision, Store, StoreError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `S`, unless the switch is down.
#[derive(Debug, Clone)]
pub struct Outage<S> {
    inner: S,
    down: Arc<AtomicBool>,
}

impl<S> Outage<S> {
    /// `inner`, up.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            down: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Takes the store down (`true`) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::Relaxed) {
            Err(StoreError::Connection("store down (outage switch)".into()))
        } else {
            Ok(())
        }
    }
}

impl<S: Store> Store for Outage<S> {
    async fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<Option<Bytes>, StoreError> {
        self.check()?;
        self.inner.put_if_absent(key, value, ttl).await
    }
    async fn delete_if_equals(&self, key: &str, expected: &[u8]) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.delete_if_equals(key, expected).await
    }
    async fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.expire_if_equals(key, expected, ttl).await
    }
    async fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.check()?;
        self.inner
            .replace_if_equals(key, expected, value, ttl)
            .await
    }
    async fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        self.check()?;
        self.inner.fixed_window(key, limit, window).await
    }
    async fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        self.check()?;
        self.inner.sliding_window(key, limit, window).await
    }
    async fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> Result<RateDecision, StoreError> {
        self.check()?;
        self.inner.gcra(key, emission, burst).await
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn reconnect(&self) {
        self.inner.reconnect();
    }
}
