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
//! - `SqlStore` (features `postgres`, `sqlite`): a table in PostgreSQL or
//!   SQLite. It keeps records but has no rate algorithms, so it implements
//!   [`KeyValueStore`] and not [`Store`].
//!
//! # Two traits
//!
//! [`Store`] is everything a guard or a limiter asks of a backend: four
//! conditional key-value operations, three rate algorithms, a name and a
//! reconnect hook. [`KeyValueStore`] is the narrow part: the four key-value
//! operations and the name, with the same signatures and semantics. Every
//! [`Store`] is a [`KeyValueStore`] through a blanket implementation, so
//! every backend and wrapper has both.
//!
//! The narrow trait exists for stores that keep idempotency records well and
//! rate counters badly or not at all, such as a SQL table: a record must
//! last as long as the effect it describes, a counter is hot and
//! disposable. Such a store implements only [`KeyValueStore`]; a rate
//! limiter built over it is refused by the compiler, because the limiter
//! requires [`Store`]. Code that only claims and completes records should
//! ask for [`KeyValueStore`].
//!
//! Both traits name their methods alike. Import the one you call through;
//! with both in scope, a call on a [`Store`] is ambiguous and needs the
//! fully qualified form (`KeyValueStore::put_if_absent(&store, ...)`).
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
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub mod sql;

pub use any::AnyStore;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{ClusterStore, DEFAULT_CONNECTIONS, RedisStore};
#[cfg(feature = "postgres")]
pub use sql::PgStore;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use sql::SqlStore;
#[cfg(feature = "sqlite")]
pub use sql::SqliteStore;

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
        Store::put_if_absent(&**self, key, value, ttl)
    }
    fn delete_if_equals(
        &self,
        key: &str,
        expected: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        Store::delete_if_equals(&**self, key, expected)
    }
    fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        Store::expire_if_equals(&**self, key, expected, ttl)
    }
    fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        Store::replace_if_equals(&**self, key, expected, value, ttl)
    }
    fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        Store::fixed_window(&**self, key, limit, window)
    }
    fn sliding_window(
        &self,
        key: &str,
        limit: u64,
        window: Duration,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        Store::sliding_window(&**self, key, limit, window)
    }
    fn gcra(
        &self,
        key: &str,
        emission: Duration,
        burst: u64,
    ) -> impl Future<Output = Result<RateDecision, StoreError>> + Send {
        Store::gcra(&**self, key, emission, burst)
    }
    fn kind(&self) -> &'static str {
        Store::kind(&**self)
    }
    fn reconnect(&self) {
        Store::reconnect(&**self);
    }
}

/// The four conditional key-value operations of a [`Store`], and its name:
/// what keeping idempotency records and claims needs, and nothing more.
///
/// Every [`Store`] implements it (a blanket implementation forwards to the
/// [`Store`] methods). A backend that cannot run the rate algorithms, such
/// as `SqlStore` (features `postgres`, `sqlite`), implements only this
/// trait, so a rate limiter over it does not compile. The contract of each
/// method is the one documented on [`Store`]: atomic against every other
/// call on the same key, from any process sharing the store; an expired key
/// is absent; no key is written without an expiry.
///
/// ```
/// use norepeat::store::{KeyValueStore, MemoryStore};
/// use std::time::Duration;
///
/// /// Claims `key` for `owner`; returns the current owner when taken.
/// async fn claim<S: KeyValueStore>(store: &S, key: &str, owner: &[u8]) -> Option<Vec<u8>> {
///     let held = store.put_if_absent(key, owner, Duration::from_secs(30)).await.ok()?;
///     held.map(|b| b.to_vec())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::default();
/// assert_eq!(claim(&store, "order-7", b"a").await, None);
/// assert_eq!(claim(&store, "order-7", b"b").await.as_deref(), Some(&b"a"[..]));
/// # }
/// ```
pub trait KeyValueStore: Send + Sync + 'static {
    /// Stores `value` under `key` for `ttl` if the key is absent or
    /// expired. Returns `None` when the value was stored, or the value
    /// already there (unchanged) when it was not. See
    /// [`Store::put_if_absent`].
    fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;

    /// Deletes `key` only if it still holds `expected`. Returns whether it
    /// did. See [`Store::delete_if_equals`].
    fn delete_if_equals(
        &self,
        key: &str,
        expected: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Sets a new time to live on `key` only if it still holds `expected`.
    /// Returns whether it did. See [`Store::expire_if_equals`].
    fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Replaces the value of `key` with `value` (and a new `ttl`) only if
    /// it still holds `expected`. Returns whether it did. See
    /// [`Store::replace_if_equals`].
    fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// A short name for logs and metrics (`"memory"`, `"redis"`,
    /// `"postgres"`, `"sqlite"`, ...).
    fn kind(&self) -> &'static str;
}

impl<S: Store> KeyValueStore for S {
    fn put_if_absent(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send {
        Store::put_if_absent(self, key, value, ttl)
    }
    fn delete_if_equals(
        &self,
        key: &str,
        expected: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        Store::delete_if_equals(self, key, expected)
    }
    fn expire_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        Store::expire_if_equals(self, key, expected, ttl)
    }
    fn replace_if_equals(
        &self,
        key: &str,
        expected: &[u8],
        value: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        Store::replace_if_equals(self, key, expected, value, ttl)
    }
    fn kind(&self) -> &'static str {
        Store::kind(self)
    }
}

/// Milliseconds in `d`, at least 1 (Redis refuses `PX 0`).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn ttl_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
