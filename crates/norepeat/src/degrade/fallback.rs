//! A primary store with a local memory store behind it.

use crate::store::{MemoryStore, RateDecision, Store, StoreError};
use bytes::Bytes;
use std::time::Duration;

/// Answers from `local` whenever `primary` fails, so one instance keeps
/// catching its own repeats (and keeps its tokens single-use) through an
/// outage. Releases and renewals go to both, so a key taken during the outage
/// is released where it lives.
///
/// Use it for fail-open routes; a fail-closed route uses the primary alone.
#[derive(Debug, Clone)]
pub struct Fallback<S> {
    primary: S,
    local: MemoryStore,
}

impl<S: Store> Fallback<S> {
    /// `primary`, falling back to `local`.
    #[must_use]
    pub fn new(primary: S, local: MemoryStore) -> Self {
        Self { primary, local }
    }

    /// The primary store.
    #[must_use]
    pub fn primary(&self) -> &S {
        &self.primary
    }

    /// The local fallback.
    #[must_use]
    pub fn local(&self) -> &MemoryStore {
        &self.local
    }

    fn degraded(&self, e: &StoreError) {
        metrics::counter!("norepeat_fallback_decisions_total").increment(1);
        tracing::debug!(error = %e, "store unavailable: deciding against the local fallback");
    }
}

impl<S: Store> Store for Fallback<S> {
    async fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> Result<Option<Bytes>, StoreError> {
        match self.primary.put_if_absent(key, value, ttl).await {
            Err(e) => {
                self.degraded(&e);
                self.local.put_if_absent(key, value, ttl).await
            }
            ok => ok,
        }
    }

    async fn delete_if_equals(&self, key: &str, expected: &[u8]) -> Result<bool, StoreError> {
        let local = self.local.delete_if_equals(key, expected).await?;
        match self.primary.delete_if_equals(key, expected).await {
            Ok(p) => Ok(p || local),
            Err(_) if local => Ok(true),
            Err(e) => Err(e),
        }
    }

    async fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let local = self.local.expire_if_equals(key, expected, ttl).await?;
        match self.primary.expire_if_equals(key, expected, ttl).await {
            Ok(p) => Ok(p || local),
            Err(_) if local => Ok(true),
            Err(e) => Err(e),
        }
    }

    async fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let local = self
            .local
            .replace_if_equals(key, expected, value, ttl)
            .await?;
        match self
            .primary
            .replace_if_equals(key, expected, value, ttl)
            .await
        {
            Ok(p) => Ok(p || local),
            Err(_) if local => Ok(true),
            Err(e) => Err(e),
        }
    }

    async fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        match self.primary.fixed_window(key, limit, window).await {
            Err(e) => {
                self.degraded(&e);
                self.local.fixed_window(key, limit, window).await
            }
            ok => ok,
        }
    }

    async fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> Result<RateDecision, StoreError> {
        match self.primary.sliding_window(key, limit, window).await {
            Err(e) => {
                self.degraded(&e);
                self.local.sliding_window(key, limit, window).await
            }
            ok => ok,
        }
    }

    async fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> Result<RateDecision, StoreError> {
        match self.primary.gcra(key, emission, burst).await {
            Err(e) => {
                self.degraded(&e);
                self.local.gcra(key, emission, burst).await
            }
            ok => ok,
        }
    }

    fn kind(&self) -> &'static str {
        self.primary.kind()
    }
}
