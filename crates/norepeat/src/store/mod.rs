//! Where the guards keep their state: a small trait and its backends.
//!
//! Every method of [`Store`] is one atomic state change. On Redis each is one
//! command or one Lua script (the scripts live in `src/store/lua/`, one file
//! each, with their `KEYS` and `ARGV` documented); in memory each is one
//! per-key critical section. Nothing here reads a value and then writes it in a
//! second step, nothing deletes a key without checking who owns it, and every
//! key is written with a time to live.
//!
//! Backends:
//! - [`MemoryStore`]: bounded, TTL-expiring, in-process. The embedded default
//!   and the local fallback during an outage.
//! - [`RedisStore`] (feature `redis`): one Redis through a reconnecting
//!   `ConnectionManager`.
//! - [`ClusterStore`] (feature `redis`): Redis Cluster.
//! - [`AnyStore`]: one of the above, chosen at run time (for example from a URL).
//!
//! ```
//! use norepeat::store::{MemoryStore, Store};
//! use std::time::Duration;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), norepeat::store::StoreError> {
//! let store = MemoryStore::new(10_000);
//! let ttl = Duration::from_secs(3);
//! assert_eq!(store.put_if_absent("k", b"owner-a", ttl).await?, None);
//! // Someone else holds it: we learn who, and nothing changes.
//! assert_eq!(store.put_if_absent("k", b"owner-b", ttl).await?.as_deref(), Some(&b"owner-a"[..]));
//! // Only the owner can delete it.
//! assert!(!store.delete_if_equals("k", b"owner-b").await?);
//! assert!(store.delete_if_equals("k", b"owner-a").await?);
//! # Ok(()) }
//! ```

mod any;
mod memory;
#[cfg(feature = "redis")]
mod redis;

pub use any::AnyStore;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{ClusterStore, DEFAULT_CONNECTIONS, RedisStore};

use bytes::Bytes;
use std::future::Future;
use std::time::Duration;

/// Why a store call failed.
///
/// A failure is never a decision: a guard that gets one does not answer
/// "duplicate", it applies its route's failure policy instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its time budget.
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// The circuit breaker is open: the store was not asked.
    #[error("store circuit breaker is open")]
    CircuitOpen,
    /// The connection failed or was refused.
    #[error("store connection failed: {0}")]
    Connection(String),
    /// The store answered with an error (for example `OOM` or `READONLY`).
    #[error("store answered with an error: {0}")]
    Server(String),
    /// The store answered something this crate does not understand.
    #[error("unexpected answer from store: {0}")]
    Protocol(String),
}

/// The answer of a rate limiter's store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateDecision {
    /// Whether this request is admitted.
    pub allowed: bool,
    /// Requests still allowed in the current state (0 when rejected).
    pub remaining: u64,
    /// When rejected: how long until a request would be admitted. When
    /// admitted: how long until the limiter is back to its full allowance.
    pub reset: Duration,
}

/// The state a guard keeps, as a handful of atomic operations.
///
/// Implement this to add a backend. Each method must be atomic with respect
/// to every other call on the same key, from any process sharing the store,
/// and must never leave a key without an expiry.
pub trait Store: Send + Sync + 'static {
    /// Stores `value` under `key` for `ttl` if the key is absent
    /// (`SET key value NX PX ttl GET`).
    ///
    /// Returns `None` when the value was stored, or the value already there
    /// (unchanged) when it was not.
    fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;

    /// Deletes `key` only if it still holds `expected`. Returns whether it did.
    fn delete_if_equals(
        &self,
        key: &str,
        expected: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Sets a new time to live on `key` only if it still holds `expected`.
    /// Returns whether it did.
    fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Replaces the value of `key` with `value` (and a new `ttl`) only if it
    /// still holds `expected`. Returns whether it did.
    fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Fixed window: counts this request in the window `key` names and admits
    /// it while the count stays within `limit`. The counter expires with its
    /// window.
    fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send;

    /// Sliding window (two weighted fixed windows): admits the request while
    /// `previous * (1 - elapsed/window) + current < limit`.
    fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send;

    /// GCRA: one stored number per key, the theoretical arrival time.
    /// `emission` is the interval between requests at the sustained rate,
    /// `burst` how many may come at once.
    fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send;

    /// A short name for logs and metrics (`"memory"`, `"redis"`, `"cluster"`).
    fn kind(&self) -> &'static str;

    /// Drops the store's connections and makes fresh ones. Called by
    /// [`Resilient`](crate::degrade::Resilient) after repeated timeouts, the
    /// sign of a connection whose replies will never come. The default does
    /// nothing.
    fn reconnect(&self) {}
}

impl<S: Store> Store for std::sync::Arc<S> {
    fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send {
        (**self).put_if_absent(key, value, ttl)
    }
    fn delete_if_equals(
        &self,
        key: &str,
        expected: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).delete_if_equals(key, expected)
    }
    fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).expire_if_equals(key, expected, ttl)
    }
    fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).replace_if_equals(key, expected, value, ttl)
    }
    fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        (**self).fixed_window(key, limit, window)
    }
    fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        (**self).sliding_window(key, limit, window)
    }
    fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        (**self).gcra(key, emission, burst)
    }
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn reconnect(&self) {
        (**self).reconnect();
    }
}

/// Milliseconds in `d`, at least 1 (Redis refuses `PX 0`).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn ttl_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
